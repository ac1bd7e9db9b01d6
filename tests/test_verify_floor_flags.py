"""`verify --floor-factor` takes a factor of 1 or more: below 1 a correct output would fail its own floor."""

from __future__ import annotations

import pytest

from eaglewatch.cli import main


@pytest.mark.parametrize("value", ["0.5", "nan", "inf"])
def test_a_floor_factor_below_1_or_not_finite_is_refused(tmp_path, capsys, value):
    with pytest.raises(SystemExit) as exc:
        main(["verify", str(tmp_path), "--floor-factor", value])
    assert exc.value.code == 2
    assert f"argument --floor-factor: must be a finite number, 1 or more (got {value})" in capsys.readouterr().err
