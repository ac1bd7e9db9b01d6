"""Submitting a Slurm job when sbatch says something other than a job id (docs/slurm.md, "Operations").

sbatch options that change sbatch's own behaviour or output (``--wait``, ``--test-only``, ``--help`` …) are refused
in one line before anything is submitted. When sbatch's answer does not confirm a submission (it timed out, exited
non-zero, printed no job id), the agent asks squeue by the job's name before it says anything: submitted as job N
(the record kept), or not submitted. The sbatch here is a wrapper in front of the real one (tests/slurm_cluster.py):
it submits for real, or not, then answers the way each row says.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agent_support import run_root, wait_for  # noqa: F401  (run_root: fixture)
from eaglewatch.pipeline.agent import slurm
from eaglewatch.pipeline.agent.jobs import BadRequest
from eaglewatch.pipeline.agent.slurm_record import job_folder, job_ids, read_record
from eaglewatch.pipeline.agent.slurm_script import REFUSED_OPTIONS, SbatchOptions
from eaglewatch.pipeline.agent.slurm_state import FINISHED_STATES
from slurm_cluster import SlurmCluster

JOB_WAIT_S = 120.0
SBATCH_TIMEOUT_S = 10.0  # the hanging wrappers' sbatch is given up on after this (real sbatch answers in < 1 s)

# (extra sbatch word, the option it is, a piece of the reason)
REFUSED = [
    ("--wait", "--wait", "block until the job ends"),
    ("-W", "--wait", "block until the job ends"),
    ("-vW", "--wait", "block until the job ends"),
    ("--test-only", "--test-only", "submit nothing"),
    ("--te", "--test-only", "submit nothing"),
    ("--array=0-3", "--array", "one array task per rank"),
    ("-a1", "--array", "one array task per rank"),
    ("--parsable", "--parsable", "reads the job id"),
    ("--hold", "--hold", "scontrol release"),
    ("-H", "--hold", "scontrol release"),
    ("--quiet", "--quiet", "job id"),
    ("--help", "--help", "submit nothing"),
    ("--usage", "--usage", "submit nothing"),
    ("--version", "--version", "submit nothing"),
    ("-V", "--version", "submit nothing"),
]
# Words that look close to a refused one and are sbatch options of their own.
ALLOWED = ["--wait-all-nodes=1", "-pWide", "-x", "--qos=high", "--exclusive", "-v", "--time=1:00"]

# (case, the sbatch wrapper's body after "#!/bin/sh", submitted?, a piece of what is said)
ANSWERS = [
    ("fails after queuing", '"$REAL" "$@"; echo "sbatch: error: Socket timed out on send/recv" >&2; exit 1',
     True, "sbatch exited with status 1: sbatch: error: Socket timed out"),
    ("garbled after queuing", '"$REAL" "$@" >/dev/null; echo "job queued (site wrapper)"', True,
     "sbatch's answer is not a job id: job queued (site wrapper)"),
    ("hangs after queuing", '"$REAL" "$@" >/dev/null; exec sleep 600', True, "sbatch did not answer within"),
    ("refused", 'echo "sbatch: error: invalid partition specified: x" >&2; exit 1', False,
     "invalid partition specified"),
    ("garbled, nothing queued", 'echo "no such thing"', False, "sbatch's answer is not a job id"),
    ("hangs, nothing queued", "exec sleep 600", False, "sbatch did not answer within"),
]


@pytest.mark.parametrize("word,option,why", REFUSED, ids=[row[0] for row in REFUSED])
def test_an_option_that_changes_what_sbatch_does_is_refused(word: str, option: str, why: str) -> None:
    with pytest.raises(BadRequest) as refused:
        SbatchOptions.from_request({"extra": [word]})
    message = str(refused.value)
    assert "\n" not in message and option in message and why in message and "refused" in message


def test_the_refused_options_are_one_table_and_close_words_pass() -> None:
    longs = [row[0] for row in REFUSED_OPTIONS]
    assert len(set(longs)) == len(longs) and all(row[2] for row in REFUSED_OPTIONS)
    assert {"--wait", "--test-only", "--array", "--parsable", "--help", "--usage", "--version"} <= set(longs)
    assert list(SbatchOptions.from_request({"extra": ALLOWED}).extra) == ALLOWED


def _fake_sbatch(folder: Path, body: str, real: str | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "sbatch"
    path.write_text(f"#!/bin/sh\nREAL={real or 'false'}\n{body}\n")
    path.chmod(0o755)
    return folder


def test_the_command_line_refuses_wait_before_anything_is_submitted(tmp_path: Path, run_root: Path) -> None:
    called = tmp_path / "sbatch-was-called"
    fake = _fake_sbatch(tmp_path / "bin", f"touch {called}; echo 1")
    env = {**os.environ, "HOME": str(tmp_path), "EAGLEWATCH_CONFIG": "", "EAGLEWATCH_JOBS_DIR": str(tmp_path / "j"),
           "PATH": f"{fake}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run([sys.executable, "-m", "eaglewatch", "job", "launch", "--slurm", "local", "--ranks", "1",
                           "--run-root", str(run_root), "--sbatch-arg=--wait", "--no-tui", "--",
                           sys.executable, "-c", "pass"], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith("eaglewatch job: error: ") and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert "--wait is refused" in proc.stderr and "Traceback" not in proc.stderr
    assert not called.exists() and not job_ids(run_root) and not list((tmp_path / "j").glob("*.json"))


# --- on the test cluster ---------------------------------------------------------------------------------------
@pytest.fixture
def cluster(slurm_cluster: SlurmCluster, run_root: Path, monkeypatch: pytest.MonkeyPatch):
    for key, value in slurm_cluster.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(slurm, "SBATCH_TIMEOUT_S", SBATCH_TIMEOUT_S)
    yield slurm_cluster
    # Whatever a failed test left queued: every job of this run root, by the names eaglewatch gave them.
    names = {f"eaglewatch-{job}" for job in os.listdir(run_root / "jobs")} if (run_root / "jobs").is_dir() else set()
    ours = [job for job in slurm_cluster.jobs() if job["name"] in names]
    if ours:
        slurm_cluster.run("scancel", *{str(job["array_job_id"] or job["job_id"]) for job in ours})


def _request(cwd: Path) -> dict[str, Any]:
    return {"scheduler": "slurm", "ranks": 1, "argv": [sys.executable, "-c", "pass"], "cwd": str(cwd), "env": {},
            "name": "confirm", "python": None, "installed": False, "slurm": {"cpus_per_task": 1}}


def _queued_as(cluster: SlurmCluster, job: str) -> set[str]:
    return {str(item["array_job_id"] or item["job_id"]) for item in cluster.jobs()
            if item["name"] == f"eaglewatch-{job}"}


def _wait_finished(root: Path, job: str) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        snapshot = slurm.status(root, job)
        return snapshot if all(r["sched_state"] in FINISHED_STATES for r in snapshot["ranks"]) else None

    return wait_for(done, JOB_WAIT_S, 0.2, f"job {job} to finish")  # type: ignore[return-value]


@pytest.mark.slurm
@pytest.mark.parametrize("case,body,submitted,said", ANSWERS, ids=[row[0] for row in ANSWERS])
def test_an_unconfirmed_submission_is_looked_up_before_anything_is_said(
        case: str, body: str, submitted: bool, said: str, cluster: SlurmCluster, run_root: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    real = shutil.which("sbatch")
    assert real is not None
    monkeypatch.setenv("PATH", f"{_fake_sbatch(tmp_path / 'bin', body, real)}{os.pathsep}{os.environ['PATH']}")
    if not submitted:
        with pytest.raises(slurm.SlurmError) as failed:
            slurm.launch(run_root, _request(tmp_path))
        message = str(failed.value)
        assert said in message and "Slurm holds no job named eaglewatch-" in message and message.endswith(
            ": not submitted"), message
        assert not job_ids(run_root) and not list((run_root / "jobs").iterdir())
        assert not [job for job in cluster.jobs() if str(job["name"]).startswith("eaglewatch-")
                    and job["job_state"] not in FINISHED_STATES and str(job["name"]).endswith("-confirm")]
        return
    snapshot = slurm.launch(run_root, _request(tmp_path))
    job = snapshot["job"]
    array = snapshot["scheduler_job_id"]
    assert _queued_as(cluster, job) == {array}
    note = snapshot["submit_note"]
    assert said in note and f"squeue shows it queued as Slurm job {array}" in note and "record kept" in note
    record = read_record(run_root, job)
    assert record is not None and record["ranks"][0]["scheduler_job_id"] == f"{array}_0"
    assert (job_folder(run_root, job)).is_dir()
    done = _wait_finished(run_root, job)
    assert done["ranks"][0]["sched_state"] == "COMPLETED" and done["ranks"][0]["exit_code"] == 0


@pytest.mark.slurm
def test_a_resubmitted_rank_is_told_from_the_job_s_earlier_arrays(cluster: SlurmCluster, run_root: Path,
                                                                   tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                   ) -> None:
    """Every submission of a job has the job's name: the lookup takes the one array the record does not hold."""
    first = slurm.launch(run_root, _request(tmp_path))
    _wait_finished(run_root, first["job"])
    real = shutil.which("sbatch")
    assert real is not None
    monkeypatch.setenv("PATH", f"{_fake_sbatch(tmp_path / 'bin', ANSWERS[0][1], real)}{os.pathsep}"
                               f"{os.environ['PATH']}")
    notes: list[str] = []
    again = slurm.restart_rank(run_root, first["job"], 0, notes.append)
    array = again["ranks"][0]["scheduler_job_id"].split("_")[0]
    assert array != first["scheduler_job_id"]
    assert _queued_as(cluster, first["job"]) == {first["scheduler_job_id"], array}
    assert any(f"squeue shows it queued as Slurm job {array}" in note for note in notes), notes
    assert _wait_finished(run_root, first["job"])["ranks"][0]["sched_state"] == "COMPLETED"


@pytest.mark.slurm
def test_the_command_line_says_what_squeue_found(cluster: SlurmCluster, run_root: Path, tmp_path: Path) -> None:
    real = shutil.which("sbatch")
    assert real is not None
    fake = _fake_sbatch(tmp_path / "bin", ANSWERS[0][1], real)
    env = {**os.environ, **cluster.env, "HOME": str(tmp_path), "EAGLEWATCH_CONFIG": "",
           "EAGLEWATCH_JOBS_DIR": str(tmp_path / "j"), "PATH": f"{fake}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run([sys.executable, "-m", "eaglewatch", "job", "launch", "--slurm", "local", "--ranks", "1",
                           "--cpus-per-task", "1", "--run-root", str(run_root), "--no-tui", "--",
                           sys.executable, "-c", "pass"], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job = proc.stdout.strip()
    record = read_record(run_root, job)
    assert record is not None
    array = record["scheduler_job_id"]
    assert f"squeue shows it queued as Slurm job {array}" in proc.stderr and "record kept" in proc.stderr
    assert _wait_finished(run_root, job)["ranks"][0]["sched_state"] == "COMPLETED"
