"""A Slurm task ends as its rank's command did, so that Slurm records what happened: the code, or the signal
(``killed by SIGKILL`` in the fleet's root-cause column, not ``FAILED 1:0`` after a traceback)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

ENDINGS = [  # exit.json -> how the task process ends (a negative return code: that signal)
    ({"code": 3, "signal": None}, 3),
    ({"code": None, "signal": signal.SIGKILL, "signal_name": "SIGKILL"}, -signal.SIGKILL),
    ({"code": None, "signal": signal.SIGTERM, "signal_name": "SIGTERM"}, -signal.SIGTERM),
    ({"code": None, "signal": signal.SIGSEGV, "signal_name": "SIGSEGV"}, -signal.SIGSEGV),
]


@pytest.mark.parametrize(("record", "ending"), ENDINGS, ids=[str(e) for _, e in ENDINGS])
def test_the_task_ends_as_the_rank_did(record, ending, tmp_path):
    (tmp_path / "exit.json").write_text(json.dumps(record))
    code = ("import sys\nfrom eaglewatch.pipeline.agent.rundir import RunDir\n"
            "from eaglewatch.pipeline.agent.slurm_task import _exit_like\n"
            "from pathlib import Path\nsys.exit(_exit_like(RunDir(Path(sys.argv[1])), 0))\n")
    proc = subprocess.run([sys.executable, "-X", "faulthandler=0", "-c", code, str(tmp_path)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == ending, proc.stderr
    assert "Traceback" not in proc.stderr
