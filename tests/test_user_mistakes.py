"""A user's mistakes that used to end in a traceback or a hang, each a row: what it damages in a copy of a real
folder, the command, and the one line it must end in (exit 2). The folder is unchanged afterwards."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Callable

import pytest
from conftest import run_cli


def _truncated_model_shard(tiny_llama: Path, hf_reference: Path, prepared_data: Path, tmp: Path) -> list[object]:
    model = tmp / "model"
    shutil.copytree(tiny_llama, model)
    shard = sorted(model.glob("*.safetensors"))[3]
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])  # a download cut half-way
    out = tmp / "out"
    shutil.copytree(hf_reference, out)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["model_path"] = str(model)
    (out / "manifest.json").write_text(json.dumps(manifest))
    return ["verify", out, "--against-hf", "2", "--prepared-data", prepared_data]


# name: (damage and command, what the one error line says)
CASES: dict[str, tuple[Callable[[Path, Path, Path, Path], list[object]], str]] = {
    "verify --against-hf on a truncated model shard": (
        _truncated_model_shard, "--against-hf cannot load the model: {tmp}/model/model-00004-of-00008.safetensors"),
}


def _tree(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("case", list(CASES))
def test_a_users_mistake_ends_in_one_clear_line(case, tiny_llama, hf_reference, prepared_data, tmp_path):
    make, expected = CASES[case]
    args = make(tiny_llama, hf_reference, prepared_data, tmp_path)
    before = _tree(tmp_path)
    proc = run_cli(*args, timeout=120)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if ": error: " in line]
    assert len(errors) == 1, proc.stderr[-3000:]
    assert expected.format(tmp=tmp_path) in errors[0], errors[0]
    assert _tree(tmp_path) == before


def _fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _config_fifo(tiny_llama: Path, hf_reference: Path, prepared_data: Path, tmp: Path) -> list[object]:
    model = tmp / "model"
    shutil.copytree(tiny_llama, model)
    _fifo(model / "config.json")  # opened plainly, a FIFO with no writer waits for ever
    return ["preflight", "--engine", "hf", "--model-path", model, "--prepared-data", prepared_data, "--output-dir",
            tmp / "o", "--no-miniature"]


def _shard_is_dev_zero(tiny_llama: Path, hf_reference: Path, prepared_data: Path, tmp: Path) -> list[object]:
    model = tmp / "model"
    shutil.copytree(tiny_llama, model)
    shard = sorted(model.glob("*.safetensors"))[0]
    shard.unlink()
    shard.symlink_to("/dev/zero")  # read whole, it never ends
    return ["preflight", "--engine", "hf", "--model-path", model, "--prepared-data", prepared_data, "--output-dir",
            tmp / "o", "--no-miniature"]


def _sample_fifo(tiny_llama: Path, hf_reference: Path, prepared_data: Path, tmp: Path) -> list[object]:
    out = tmp / "out"
    shutil.copytree(hf_reference, out)
    _fifo(sorted(out.glob("hs_*.safetensors"))[0])
    return ["verify", out]


def _manifest_fifo(tiny_llama: Path, hf_reference: Path, prepared_data: Path, tmp: Path) -> list[object]:
    out = tmp / "out"
    shutil.copytree(hf_reference, out)
    _fifo(out / "manifest.json")
    return ["verify", out]


# Files that are not regular files, where a plain read would hang or never end: (damage and command, exit code, what
# the output says). Each must end within seconds.
NOT_REGULAR: dict[str, tuple[Callable[[Path, Path, Path, Path], list[object]], int, str]] = {
    "a model's config.json is a FIFO, preflight": (
        _config_fifo, 2, "cannot read {tmp}/model/config.json: it is a FIFO, not a regular file"),
    "a shard is a link to /dev/zero, preflight": (
        _shard_is_dev_zero, 2, "the shard model-00001-of-00008.safetensors named in model.safetensors.index.json "
                               "is not a regular file"),
    "a sample file is a FIFO, verify": (_sample_fifo, 1, "it is a FIFO, not a regular file"),
    "the manifest is a FIFO, verify": (_manifest_fifo, 2, "manifest.json: it is a FIFO, not a regular file"),
}


@pytest.mark.parametrize("case", list(NOT_REGULAR))
def test_a_file_that_is_not_a_regular_file_is_named_not_read(case, tiny_llama, hf_reference, prepared_data,
                                                                tmp_path):
    make, code, expected = NOT_REGULAR[case]
    args = make(tiny_llama, hf_reference, prepared_data, tmp_path)
    proc = run_cli(*args, timeout=60)
    assert proc.returncode == code, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr
    assert expected.format(tmp=tmp_path) in proc.stdout + proc.stderr, proc.stdout[-2000:] + proc.stderr[-2000:]
