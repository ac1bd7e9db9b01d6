"""Data-parallel jobs on a real Slurm (tests/slurm_cluster.py: one node, 2 CPUs), driven through the agent as the
operator side drives it: a local agent, the job ops of the protocol, real sbatch/squeue/scancel, real extractions."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

from agent_support import run_root, wait_for  # noqa: F401  (run_root: fixture)
from conftest import read_events
from eaglewatch import protocol
from eaglewatch.pipeline.agent import slurm
from eaglewatch.pipeline.agent.rundir import write_json_atomic
from eaglewatch.pipeline.agent.slurm_state import FINISHED_STATES
from eaglewatch.tui.connection import Connection
from slurm_cluster import SlurmCluster

pytestmark = pytest.mark.slurm

ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # one CPU per rank (cpus_per_task 1, 2 CPUs)
JOB_WAIT_S = 300.0


@pytest.fixture
def agent(slurm_cluster: SlurmCluster, run_root: Path, monkeypatch: pytest.MonkeyPatch):
    for key, value in slurm_cluster.env.items():
        monkeypatch.setenv(key, value)
    connection = Connection("local", run_root=str(run_root))
    connection.connect()
    yield connection
    connection.close()
    _cancel_jobs_of(slurm_cluster, run_root)


def _cancel_jobs_of(cluster: SlurmCluster, root: Path) -> None:
    """What a failed test left in the queue: every array its jobs submitted, cancelled, and waited out."""
    arrays = set()
    for path in (root / "jobs").glob("*.json"):
        record = json.loads(path.read_text())
        for rank in record["ranks"]:
            for attempt in [rank, *rank.get("attempts", [])]:
                if attempt.get("scheduler_job_id"):
                    arrays.add(int(attempt["scheduler_job_id"].split("_")[0]))
    if not arrays:
        return
    cluster.run("scancel", *map(str, sorted(arrays)))
    wait_for(lambda: not [job for job in cluster.jobs() if job["array_job_id"] in arrays
                          and job["job_state"] not in FINISHED_STATES], 60.0, 0.2, "the test's jobs to end")


def _launch(agent: Connection, ranks: int, argv: list[str], cwd: Path, **more: Any) -> dict[str, Any]:
    args: dict[str, Any] = {"scheduler": "slurm", "ranks": ranks, "argv": argv, "cwd": str(cwd), "env": {},
                            "name": None, "python": None, "installed": False, "slurm": {"cpus_per_task": 1}}
    args.update(more)
    return agent.request(protocol.OP_JOB_LAUNCH, **args)


def _wait_job(agent: Connection, job: str, predicate: Callable[[dict[str, Any]], object], what: str,
              timeout_s: float = JOB_WAIT_S) -> dict[str, Any]:
    last: list[dict[str, Any]] = []

    def check() -> dict[str, Any] | None:
        snapshot = agent.request(protocol.OP_JOB_STATUS, job=job)
        last[:] = [snapshot]
        return snapshot if predicate(snapshot) else None

    try:
        return wait_for(check, timeout_s, 0.2, what)  # type: ignore[return-value]
    except AssertionError as exc:
        states = [(r["rank"], r["sched_state"], r["sched_reason"], r["exit_code"]) for r in last[0]["ranks"]]
        raise AssertionError(f"{exc}; ranks (rank, state, reason, exit code): {states}") from None


def _all_finished(snapshot: dict[str, Any]) -> bool:
    return all(rank["sched_state"] in FINISHED_STATES for rank in snapshot["ranks"])


def _extract_argv(model: Path, data: Path, out: Path, *more: str) -> list[str]:
    return ["eaglewatch", "extract", "--engine", "hf", "--model-path", str(model), "--prepared-data", str(data),
            "--output-dir", str(out), "--layer-ids", "1", "2", "4", "--no-preflight", *more]


def _samples(events: Path) -> int:
    """Sample events in a run's events file, complete lines only (the run may be writing the last one)."""
    data = events.read_bytes() if events.exists() else b""
    lines = data[:data.rfind(b"\n") + 1].splitlines()
    return sum(1 for line in lines if line.strip() and json.loads(line).get("kind") == protocol.EVENT_SAMPLE)


@pytest.fixture(scope="module")
def slow_llama(tmp_path_factory) -> Path:
    """A Llama wide enough (hidden 768) that a rank takes seconds over its samples on one CPU: time for a
    cancel to land between its first sample and its last."""
    pytest.importorskip("torch")
    from eaglewatch.pipeline.tiny_model import BASE_CONFIGS, make_tiny_model

    config = dict(BASE_CONFIGS["llama"], hidden_size=768, intermediate_size=2048)
    return make_tiny_model(tmp_path_factory.mktemp("models") / "llama-768", config, shards=2)


def test_three_ranks_extract_their_shares_and_complete(agent: Connection, slurm_cluster: SlurmCluster,
                                                      run_root: Path, tiny_llama: Path, prepared_data: Path,
                                                      tmp_path: Path) -> None:
    out = tmp_path / "hidden-states"
    job = _launch(agent, 3, _extract_argv(tiny_llama, prepared_data, out), tmp_path, env=ONE_THREAD, name="dp3",
                  python=sys.executable)
    assert job["scheduler"] == "slurm" and job["world_size"] == 3 and job["output_dir"] == str(out)
    assert job["name"] == "dp3" and job["scheduler_job_id"].isdigit()
    assert [rank["rank"] for rank in job["ranks"]] == [0, 1, 2]
    assert {rank["sched_state"] for rank in job["ranks"]} <= {"PENDING", "RUNNING"}

    done = _wait_job(agent, job["job"], _all_finished, "every rank to finish")
    total = 0
    for rank in done["ranks"]:
        r = rank["rank"]
        assert rank["sched_state"] == "COMPLETED" and rank["exit_code"] == 0, rank
        assert rank["node"] == slurm_cluster.node and rank["host"] == slurm_cluster.node
        assert rank["elapsed_s"] > 0 and rank["pending_s"] >= 0 and rank["sched_reason"] is None
        assert rank["scheduler_job_id"] == f"{job['scheduler_job_id']}_{r}"
        summary = rank["summary"]
        assert summary["state"] == "exited" and summary["exit"]["code"] == 0 and summary["name"] == "dp3"
        assert summary["argv"][-4:] == ["--rank", str(r), "--world-size", "3"]
        run_dir = Path(rank["run_dir"])
        assert run_dir.parent == run_root and run_dir.name == rank["run"]
        assert all((run_dir / name).is_file() for name in ("cmd.json", "log", "events.jsonl", "exit.json"))
        assert json.loads((run_dir / "cmd.json").read_text())["slurm"]["rank"] == r
        assert any(e.get("output_dir") == str(out) for e in read_events(run_dir / "events.jsonl"))
        manifest = json.loads((out / f"manifest.rank{r}.json").read_text())
        assert manifest["status"] == "done" and manifest["rank"] == r and manifest["world_size"] == 3
        assert manifest["samples_done"] == manifest["samples_total"] > 0
        assert (out / f"events.rank{r}.jsonl").is_file()
        total += manifest["samples_total"]
    samples = len(prepared_data.read_text().splitlines())
    assert total == samples and len(list(out.glob("hs_*.safetensors"))) == samples

    listed = agent.request(protocol.OP_JOBS)
    assert listed[0]["job"] == job["job"] and [r["sched_state"] for r in listed[0]["ranks"]] == ["COMPLETED"] * 3
    record = json.loads((run_root / "jobs" / f"{job['job']}.json").read_text())
    assert record["scheduler_job_id"] == job["scheduler_job_id"]
    assert [rank["final"]["state"] for rank in record["ranks"]] == ["COMPLETED"] * 3  # kept for after MinJobAge
    assert {run.name for run in run_root.iterdir() if run.name != "jobs"} == {r["run"] for r in done["ranks"]}


def test_a_cancelled_rank_restarted_resumes_where_it_stopped(agent: Connection, slurm_cluster: SlurmCluster,
                                                            run_root: Path, slow_llama: Path, prepared_data: Path,
                                                            tmp_path: Path) -> None:
    out = tmp_path / "hidden-states"
    argv = _extract_argv(slow_llama, prepared_data, out, "--batch-size", "1", "--max-samples", "32")
    job = _launch(agent, 2, argv, tmp_path, env=ONE_THREAD, python=sys.executable)
    started = _wait_job(agent, job["job"], lambda s: s["ranks"][1]["run_dir"], "rank 1 to have its run directory")
    old = started["ranks"][1]
    old_events = Path(old["run_dir"]) / "events.jsonl"
    wait_for(lambda: _samples(old_events) >= 1, 120.0, 0.02, "rank 1 to write its first sample")
    cancel = slurm_cluster.run("scancel", old["scheduler_job_id"])
    assert cancel.returncode == 0, cancel.stderr

    cancelled = _wait_job(agent, job["job"], lambda s: s["ranks"][1]["sched_state"] == "CANCELLED"
                          and s["ranks"][1]["summary"]["state"] == "exited", "rank 1 to be cancelled")
    rank1 = cancelled["ranks"][1]
    assert rank1["summary"]["exit"]["signal_name"] == "SIGTERM" and rank1["exit_code"] is None
    info = next(e for e in read_events(old_events) if "resumed_samples" in e)
    share, written = info["samples"], _samples(old_events)
    print(f"rank 1 wrote {written} of its {share} samples before the cancel landed", flush=True)
    assert 1 <= written < share

    restarted = agent.request(protocol.OP_JOB_RESTART_RANK, job=job["job"], rank=1)
    again = restarted["ranks"][1]
    assert again["scheduler_job_id"] != old["scheduler_job_id"] and again["run"] != old["run"]
    assert again["sched_state"] in ("PENDING", "RUNNING")

    done = _wait_job(agent, job["job"], _all_finished, "both ranks to finish")
    assert [(r["sched_state"], r["exit_code"]) for r in done["ranks"]] == [("COMPLETED", 0), ("COMPLETED", 0)]
    resumed = done["ranks"][1]
    assert resumed["run"] != old["run"]
    new_dir = Path(resumed["run_dir"])
    assert json.loads((new_dir / "cmd.json").read_text())["restart_of"] == old["run"]
    new_info = next(e for e in read_events(new_dir / "events.jsonl") if "resumed_samples" in e)
    assert new_info["resumed_samples"] >= written  # what the cancelled run wrote is skipped, not redone
    assert _samples(new_dir / "events.jsonl") == share - new_info["resumed_samples"]
    manifest = json.loads((out / "manifest.rank1.json").read_text())
    assert manifest["status"] == "done" and manifest["samples_done"] == share
    record = json.loads((run_root / "jobs" / f"{job['job']}.json").read_text())
    assert [a["run"] for a in record["ranks"][1]["attempts"]] == [old["run"]]


def test_a_job_that_cannot_get_its_cpus_is_pending_with_the_reason_until_cancelled(
        agent: Connection, slurm_cluster: SlurmCluster, run_root: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    job = _launch(agent, 2, [sys.executable, "-c", "pass"], tmp_path,
                  slurm={"cpus_per_task": slurm_cluster.cpus + 1})
    pending = _wait_job(agent, job["job"], lambda s: all(r["sched_state"] == "PENDING" and r["sched_reason"]
                                                         for r in s["ranks"]), "a pending reason for every rank")
    first_wait = pending["ranks"][0]["pending_s"]
    for rank in pending["ranks"]:
        # More CPUs than any node of the partition has: Slurm keeps it, and says why.
        assert rank["sched_reason"] in ("PartitionConfig", "Resources"), rank
        assert rank["run"] is None and rank["summary"] is None and rank["elapsed_s"] is None
        assert rank["pending_s"] >= 0 and rank["exit_code"] is None
    _wait_job(agent, job["job"], lambda s: s["ranks"][0]["pending_s"] > first_wait, "the pending time to grow")

    cancelled = agent.request(protocol.OP_JOB_CANCEL, job=job["job"])
    assert [(r["sched_state"], r["run"], r["exit_code"]) for r in cancelled["ranks"]] == [("CANCELLED", None, None)] * 2
    array = int(job["scheduler_job_id"])
    assert {j["job_state"] for j in slurm_cluster.jobs() if j["array_job_id"] == array} == {"CANCELLED"}
    assert not list(run_root.glob("2*"))  # no rank ever started

    # An agent where no Slurm command is installed still tells the finished job, from its record.
    empty = tmp_path / "bin"
    empty.mkdir()
    with monkeypatch.context() as patch:
        patch.setenv("PATH", str(empty))
        with Connection("local", run_root=str(run_root)) as elsewhere:
            told = elsewhere.request(protocol.OP_JOB_STATUS, job=job["job"])
    assert [r["sched_state"] for r in told["ranks"]] == ["CANCELLED"] * 2 and "scheduler_error" not in told


def test_a_job_slurm_no_longer_holds_is_told_from_its_ranks_files(agent: Connection, slurm_cluster: SlurmCluster,
                                                                  run_root: Path, tmp_path: Path) -> None:
    code = ("import sys, time; rank = int(sys.argv[2]); print('rank', rank, flush=True); "
            "time.sleep(120 if rank == 2 else 0); sys.exit(3 if rank == 1 else 0)")
    job = _launch(agent, 3, [sys.executable, "-c", code], tmp_path)
    running = _wait_job(agent, job["job"], lambda s: (s["ranks"][2]["summary"] or {}).get("state") == "running",
                        "rank 2 to run")
    assert slurm_cluster.run("scancel", running["ranks"][2]["scheduler_job_id"]).returncode == 0
    done = _wait_job(agent, job["job"], _all_finished, "every rank to finish")
    told = [(r["sched_state"], r["exit_code"]) for r in done["ranks"]]
    assert told == [("COMPLETED", 0), ("FAILED", 3), ("CANCELLED", None)]

    # Where squeue --json is missing, scontrol's words give the same facts.
    keys = {(int(job["scheduler_job_id"]), task) for task in range(3)}
    from_json, error = slurm.query(keys)
    assert error is None and set(from_json) == keys
    assert slurm.query_scontrol(keys) == (from_json, None)

    # After MinJobAge the controller forgets the job (and without slurmdbd sacct knows nothing): the record as it
    # is when no look caught the ends, pointed at array ids the controller never had.
    path = run_root / "jobs" / f"{job['job']}.json"
    record = json.loads(path.read_text())
    unknown = max(j["job_id"] for j in slurm_cluster.jobs()) + 100_000
    for rank in record["ranks"]:
        rank["scheduler_job_id"], rank["final"] = f"{unknown}_{rank['rank']}", None
    write_json_atomic(path, record)
    assert slurm.query({(unknown, 0)}) == ({}, None) and slurm.query_scontrol({(unknown, 0)}) == ({}, None)
    forgotten = agent.request(protocol.OP_JOB_STATUS, job=job["job"])
    # Ranks 0 and 1 from exit.json; rank 2 from slurmstepd's "CANCELLED" line in its batch output.
    assert [(r["sched_state"], r["exit_code"]) for r in forgotten["ranks"]] == told
    assert all(r["node"] == slurm_cluster.node and r["elapsed_s"] is not None for r in forgotten["ranks"])
    assert "scheduler_error" not in forgotten


RANK_ALERTS = """\
import json, os, sys, time
rank, flag = int(sys.argv[-3]), sys.argv[1]
if rank == 1:
    raise ValueError("rank 1 could not read its share")
with open(os.environ["EAGLEWATCH_EVENTS_FILE"], "a") as events:
    events.write(json.dumps({"v": 1, "kind": "phase", "t": time.time(), "phase": "extracting"}) + "\\n")
    events.write(json.dumps({"v": 1, "kind": "progress", "t": time.time(), "done": 1, "total": 100,
                             "eta_s": 7200}) + "\\n")
while not os.path.exists(flag):
    time.sleep(0.1)
"""


def test_each_rank_alerts_from_its_node_a_failure_the_time_limit_and_the_end(
        agent: Connection, slurm_cluster: SlurmCluster, run_root: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from webhook_support import PROXY_VARIABLES, Webhook

    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    hook = Webhook()
    try:
        flag = tmp_path / "finish"
        script = tmp_path / "rank.py"
        script.write_text(RANK_ALERTS)
        alerts = {"webhook": hook.url, "format": "json", "stall_after_s": 600.0}
        job = _launch(agent, 2, [sys.executable, str(script), str(flag)], tmp_path, alerts=alerts,
                      slurm={"cpus_per_task": 1, "time": "5"})
        late = hook.wait_for(lambda a: a.get("kind") == "time_limit", JOB_WAIT_S, "time limit")
        assert "ETA 2 h 00 min" in late["title"] and late["eta_s"] == 7200 and late["time_left_s"] <= 300
        failed = hook.wait_for(lambda a: a.get("kind") == "end" and a.get("outcome") == "failed", JOB_WAIT_S,
                               "failed rank's end")
        assert "ValueError: rank 1 could not read its share" in failed["title"]
        flag.touch()
        hook.wait_for(lambda a: a.get("kind") == "end" and a.get("outcome") == "finished", JOB_WAIT_S,
                      "finished rank's end")
        _wait_job(agent, job["job"], _all_finished, "every rank to finish")
        # The URL is in the job's alerts.json (its owner's only), in no record and no log.
        record = (run_root / "jobs" / f"{job['job']}.json").read_text()
        assert "secret-token" not in record
        assert (run_root / "jobs" / job["job"] / "alerts.json").stat().st_mode & 0o077 == 0
    finally:
        hook.close()
