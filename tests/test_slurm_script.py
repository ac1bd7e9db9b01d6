"""The batch script and the rank launcher without a cluster: the script is run by a real ``sh`` with the variables
Slurm would set, so quoting, rank selection and the exit status are the real thing; and what Slurm prints, parsed
from lines captured on the cluster of tests/slurm_cluster.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from agent_support import run_root  # noqa: F401  (run_root: fixture)
from eaglewatch import protocol
from eaglewatch.pipeline.agent import jobpython
from eaglewatch.pipeline.agent.jobs import BadRequest
from eaglewatch.pipeline.agent.rundir import RunDir, new_run_id
from eaglewatch.pipeline.agent.slurm_script import RankCommand, SbatchOptions, batch_script, sbatch_argv
from eaglewatch.pipeline.agent.slurm_state import (
    CANCELLED,
    NODE_FAIL,
    TIMEOUT,
    expand_task_string,
    parse_scontrol,
    parse_squeue_json,
    stepd_end,
)
from eaglewatch.tui.connection import AgentError, Connection

HOSTILE = ["it's", "$(touch pwned)", "`touch pwned2`", "a\nb", "*", "--output-dir", "x y", "\\", '"', ""]
PRINT_ARGV = "import json, sys; print(json.dumps(sys.argv[1:]), flush=True); sys.exit(int(sys.argv[1]))"


def _script(root: Path, cwd: Path, argv: list[str], env: dict[str, str], runs: dict[int, str],
            import_root: str | None = None) -> Path:
    text = batch_script(job_id=new_run_id("quoting"), run_root=str(root), world_size=2, runs=runs,
                        command=RankCommand(argv=tuple(argv), cwd=str(cwd), env=env, name="it's a \"job\"",
                                            python=None, installed=False),
                        launcher_python=sys.executable, import_root=import_root or jobpython.import_root())
    path = cwd / "batch.sh"
    path.write_text(text)
    return path


def _as_task(script: Path, task: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "SLURM_ARRAY_TASK_ID": task, "SLURM_JOB_ID": "41", "SLURM_ARRAY_JOB_ID": "40"}
    return subprocess.run(["sh", str(script)], env=env, cwd=str(cwd), capture_output=True, text=True, timeout=60)


def test_every_word_reaches_the_rank_exactly_and_the_task_exits_as_the_rank(run_root: Path, tmp_path: Path) -> None:
    runs = {0: new_run_id("r0"), 1: new_run_id("r1")}
    env = {"QUOTED": "a'b \"c\" $(touch pwned3)\nnext"}
    script = _script(run_root, tmp_path, [sys.executable, "-c", PRINT_ARGV, "3", *HOSTILE], env, runs)
    proc = _as_task(script, "1", tmp_path)
    assert proc.returncode == 3, proc.stderr
    run = RunDir(run_root / runs[1])
    assert json.loads(run.log_path.read_text()) == ["3", *HOSTILE, "--rank", "1", "--world-size", "2"]
    assert not list(tmp_path.glob("pwned*")) and not list(run.path.glob("pwned*"))
    cmd = run.cmd()
    assert cmd["env"] == env and cmd["name"] == "it's a \"job\"" and cmd["cwd"] == str(tmp_path)
    assert cmd["slurm"]["rank"] == 1 and cmd["slurm"]["array_task_id"] == "1" and cmd["slurm"]["job_id"] == "41"
    assert run.exit_info()["code"] == 3
    assert not (run_root / runs[0]).exists()


def test_the_launcher_runs_from_the_uploaded_agent_file(run_root: Path, tmp_path: Path) -> None:
    from eaglewatch.tui.connection import bundle

    agent_file = bundle.write(tmp_path / "agent.pyz")  # what the operator side uploads to a login host
    runs = {0: new_run_id("r0"), 1: new_run_id("r1")}
    script = _script(run_root, tmp_path, [sys.executable, "-c", PRINT_ARGV, "0"], {}, runs, str(agent_file))
    proc = _as_task(script, "0", tmp_path)
    assert proc.returncode == 0, proc.stderr
    run = RunDir(run_root / runs[0])
    assert json.loads(run.log_path.read_text()) == ["0", "--rank", "0", "--world-size", "2"]
    assert run.exit_info()["recorded_by"] == "supervisor"


def test_a_rank_ended_by_a_signal_ends_its_task_by_the_same_signal(run_root: Path, tmp_path: Path) -> None:
    runs = {0: new_run_id("r0"), 1: new_run_id("r1")}
    kill_self = "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"
    proc = _as_task(_script(run_root, tmp_path, [sys.executable, "-c", kill_self], {}, runs), "0", tmp_path)
    assert proc.returncode == -signal.SIGTERM, proc.stderr
    assert RunDir(run_root / runs[0]).exit_info()["signal_name"] == "SIGTERM"


def test_a_task_that_is_no_rank_or_ran_before_is_refused(run_root: Path, tmp_path: Path) -> None:
    runs = {0: new_run_id("r0"), 1: new_run_id("r1")}
    script = _script(run_root, tmp_path, [sys.executable, "-c", PRINT_ARGV, "0"], {}, runs)
    other = _as_task(script, "7", tmp_path)
    assert other.returncode == 2 and "array task '7' is not a rank" in other.stderr
    assert _as_task(script, "0", tmp_path).returncode == 0
    again = _as_task(script, "0", tmp_path)  # a requeued task would find its run directory taken
    assert again.returncode == 2 and "exists already" in again.stderr


def test_a_rank_that_cannot_start_on_its_node_is_a_run_that_could_not_start(run_root: Path, tmp_path: Path) -> None:
    runs = {0: new_run_id("r0"), 1: new_run_id("r1")}
    cwd = tmp_path / "gone"
    cwd.mkdir()
    script = _script(run_root, cwd, ["true"], {}, runs)
    moved = tmp_path / "script.sh"
    script.rename(moved)
    cwd.rmdir()  # the job's folder is not there on this node
    proc = _as_task(moved, "0", tmp_path)
    run = RunDir(run_root / runs[0])
    assert proc.returncode == 2 and "cannot start the rank" in proc.stderr
    assert run.exit_info()["code"] == 2 and "does not exist" in run.exit_info()["error"]


def test_sbatch_gets_the_options_as_words_and_refuses_what_the_layout_sets() -> None:
    options = SbatchOptions.from_request({"partition": "gpu a", "account": "proj", "time": "1:00:00",
                                          "gpus_per_task": 1, "cpus_per_task": 8, "mem": "64G",
                                          "extra": ["--qos=high", "--constraint=h200|a100", "-x", "--exclusive"]})
    argv = sbatch_argv(job_id="20260101-000000-abcdef", tasks=[0, 1, 2, 3], folder="/r/jobs/j%1", cwd="/w",
                       options=options, script="/r/jobs/j%1/submit.sh")
    assert argv[0] == "sbatch" and argv[-1] == "/r/jobs/j%1/submit.sh"
    assert "--array=0-3" in argv and "--output=/r/jobs/j%%1/slurm-%A_%a.out" in argv and "--no-requeue" in argv
    assert ["--partition=gpu a", "--account=proj", "--time=1:00:00", "--gpus-per-task=1", "--cpus-per-task=8",
            "--mem=64G", "--qos=high", "--constraint=h200|a100", "-x", "--exclusive"] == argv[-11:-1]
    assert "--array=2" in sbatch_argv(job_id="20260101-000000-abcdef", tasks=[2], folder="/r", cwd="/w",
                                      options=SbatchOptions(), script="/s")
    for bad in (["--array=5"], ["--arr=5"], ["-o/tmp/x"], ["--requeue"], ["myscript.sh"], ["--mem", "4G"],
                ["--x\n--array=1"]):
        with pytest.raises(BadRequest):
            SbatchOptions.from_request({"extra": bad})
    for bad_request in ({"cpus_per_task": 0}, {"gpus_per_task": True}, {"mem": ""}, {"partition": "a\nb"},
                        {"nodes": 2}):
        with pytest.raises(BadRequest):
            SbatchOptions.from_request(bad_request)


def test_job_launch_without_slurm_is_a_clear_error_reply(run_root: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    with Connection("local", run_root=str(run_root)) as agent:
        with pytest.raises(AgentError) as refused:
            agent.request(protocol.OP_JOB_LAUNCH, scheduler="slurm", ranks=2, argv=["true"], cwd=str(tmp_path),
                          env={}, name=None, python=None, installed=False, slurm={})
        assert refused.value.code == protocol.ERR_FAILED
        assert "sbatch is not installed on this host" in str(refused.value)
        with pytest.raises(AgentError) as bad:
            agent.request(protocol.OP_JOB_LAUNCH, scheduler="slurm", ranks=0, argv=["true"], slurm={})
        assert bad.value.code == protocol.ERR_BAD_REQUEST
        with pytest.raises(AgentError) as extra:
            agent.request(protocol.OP_JOB_LAUNCH, scheduler="slurm", ranks=1, argv=["true"],
                          slurm={"extra": ["--array=0-9"]})
        assert extra.value.code == protocol.ERR_BAD_REQUEST and "--array" in str(extra.value)
        assert agent.request(protocol.OP_JOBS) == []
        with pytest.raises(AgentError) as missing:
            agent.request(protocol.OP_JOB_STATUS, job="20260101-000000-abcdef")
        assert missing.value.code == protocol.ERR_NOT_FOUND


# --- what Slurm 22.05 printed on the test cluster ---------------------------------------------------------------
SQUEUE_JSON = {
    "meta": {"plugin": {"type": "openapi/v0.0.38"}}, "errors": [],
    "jobs": [
        {"job_id": 2, "array_job_id": 1, "array_task_id": 0, "array_task_string": "", "job_state": "COMPLETED",
         "state_reason": "None", "nodes": "vm", "submit_time": 1796141452, "start_time": 1796141452,
         "end_time": 1796141473, "exit_code": 0},
        {"job_id": 3, "array_job_id": 1, "array_task_id": 1, "array_task_string": "", "job_state": "CANCELLED",
         "state_reason": "None", "nodes": "vm", "submit_time": 1796141452, "start_time": 1796141452,
         "end_time": 1796141458, "exit_code": 15},
        {"job_id": 4, "array_job_id": 4, "array_task_id": 0, "array_task_string": "", "job_state": "FAILED",
         "state_reason": "NonZeroExitCode", "nodes": "vm", "submit_time": 1796141479, "start_time": 1796141479,
         "end_time": 1796141479, "exit_code": 768},
        {"job_id": 9, "array_job_id": 9, "array_task_id": None, "array_task_string": "0-3", "job_state": "PENDING",
         "state_reason": "PartitionConfig", "nodes": "", "submit_time": 1796141579, "start_time": 0,
         "end_time": 0, "exit_code": 0},
        {"job_id": 8, "array_job_id": 0, "array_task_id": None, "array_task_string": "", "job_state": "TIMEOUT",
         "state_reason": "TimeLimit", "nodes": "vm", "submit_time": 1796141485, "start_time": 1796141485,
         "end_time": 1796141564, "exit_code": 15},
    ],
}


def test_squeue_json_gives_each_array_task_its_state_reason_and_exit() -> None:
    tasks = parse_squeue_json(json.dumps(SQUEUE_JSON))
    assert set(tasks) == {(1, 0), (1, 1), (4, 0), (9, 0), (9, 1), (9, 2), (9, 3)}  # job 8 is no array task
    assert tasks[(1, 0)].state == "COMPLETED" and tasks[(1, 0)].exit_code == 0 and tasks[(1, 0)].node == "vm"
    assert tasks[(1, 1)].state == CANCELLED and tasks[(1, 1)].exit_code is None and tasks[(1, 1)].exit_signal == 15
    assert tasks[(4, 0)].exit_code == 3 and tasks[(4, 0)].reason == "NonZeroExitCode"
    pending = tasks[(9, 2)]
    assert pending.state == "PENDING" and pending.reason == "PartitionConfig" and pending.start_time is None
    assert pending.exit_code is None and pending.active and not pending.finished


def test_scontrol_lines_give_the_same_facts() -> None:
    line = ("JobId=3 ArrayJobId=1 ArrayTaskId=1 JobName=wrap UserId=root(0) GroupId=root(0) MCS_label=N/A "
            "Priority=4294901759 Nice=0 Account=(null) QOS=(null) JobState=CANCELLED Reason=None Dependency=(null) "
            "Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:15 RunTime=00:00:06 TimeLimit=UNLIMITED "
            "SubmitTime=2026-12-01T16:10:52 StartTime=2026-12-01T16:10:52 EndTime=2026-12-01T16:10:58 "
            "Partition=debug NodeList=vm BatchHost=vm NumNodes=1 Command=/a path/with spaces=x.sh WorkDir=/w")
    pending = ("JobId=9 ArrayJobId=9 ArrayTaskId=0-3 JobName=wrap JobState=PENDING Reason=PartitionConfig "
               "ExitCode=0:0 SubmitTime=2026-12-01T16:12:59 StartTime=Unknown EndTime=Unknown NodeList=(null)")
    tasks = parse_scontrol(line + "\n" + pending + "\n")
    cancelled = tasks[(1, 1)]
    assert cancelled.state == CANCELLED and cancelled.exit_signal == 15 and cancelled.node == "vm"
    assert cancelled.end_time is not None and cancelled.start_time is not None
    assert cancelled.end_time - cancelled.start_time == 6
    assert [tasks[(9, t)].reason for t in range(4)] == ["PartitionConfig"] * 4 and tasks[(9, 0)].node is None


def test_the_batch_output_tells_how_slurm_ended_a_task_it_has_forgotten() -> None:
    timeout = b"task 1\nslurmstepd-vm: error: *** JOB 8 ON vm CANCELLED AT 2026-12-01T16:12:44 DUE TO TIME LIMIT ***\n"
    assert stepd_end(timeout).state == TIMEOUT and stepd_end(timeout).node == "vm"
    plain = b"slurmstepd-vm: error: *** JOB 3 ON vm CANCELLED AT 2026-12-01T16:10:58 ***\n"
    assert stepd_end(plain).state == CANCELLED
    assert stepd_end(b"*** JOB 5 ON n1 CANCELLED AT 2026-12-01T16:10:58 DUE TO NODE FAILURE ***").state == NODE_FAIL
    assert stepd_end(b"extracted 22 samples\n") is None
    assert expand_task_string("0-3,7,10-14:2%4") == [0, 1, 2, 3, 7, 10, 12, 14]
