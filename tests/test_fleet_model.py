"""FleetModel: a job's snapshot and its ranks' RunModels folded into rows, totals, an ETA and alerts. Plain Python."""

from __future__ import annotations

from app_support import WORKER_ASSERT_LOG

from eaglewatch import protocol as p
from eaglewatch.tui.runstate import RunModel, Thresholds
from eaglewatch.tui.runstate.fleet import (
    ALERT_RANK_FAILED,
    ALERT_RANK_PENDING,
    ALERT_RANK_STALLED,
    FleetModel,
    FleetThresholds,
)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def summary(run: str, state: str = "running", exit: dict | None = None, started_at: float = 1_000.0, **more):
    return {"run": run, "state": state, "exit": exit, "started_at": started_at, "argv": ["eaglewatch", "extract"],
            **more}


def rank(r: int, host: str | None = "local", run: str | None = None, node: str | None = None, **fields):
    entry = {"rank": r, "host": host, "run": run, "run_dir": None, "node": node, "sched_state": None,
             "sched_reason": None, "pending_s": None, "elapsed_s": None, "exit_code": None, "summary": None}
    entry.update(fields)
    return entry


def job(*ranks, scheduler: str = "ssh", **fields):
    snap = {"job": "20261201-100000-abcdef-llama", "name": "llama", "scheduler": scheduler, "target": "gpu1,gpu2",
            "created_at": 900.0, "world_size": len(ranks), "output_dir": "/data/out", "scheduler_job_id": None,
            "ranks": list(ranks)}
    snap.update(fields)
    return snap


def extracting(run: str, done: int, total: int, tokens_per_s: float, eta_s: float | None, clock=None,
               host: str = "local") -> RunModel:
    model = RunModel(host, summary(run), clock=clock or (lambda: 0.0), wall=lambda: 1_060.0)
    for phase in (p.PHASE_VALIDATING, p.PHASE_LOADING, p.PHASE_EXTRACTING):
        model.feed_event(p.make_event(p.EVENT_PHASE, phase=phase))
    model.feed_event(p.make_event(p.EVENT_INFO, samples=total, tokens=total * 100, resumed_samples=0))
    model.feed_event(p.make_event(p.EVENT_PROGRESS, done=done, total=total, tokens=done * 100, bytes=done * 1000,
                                  tokens_per_s=tokens_per_s, samples_per_s=tokens_per_s / 100, eta_s=eta_s))
    return model


def kinds(fleet: FleetModel) -> list[str]:
    return [alert.kind for alert in fleet.alerts_since(0)]


def test_a_snapshot_alone_gives_each_rank_its_state_and_how_it_ended():
    fleet = FleetModel()
    fleet.set_snapshot(job(
        rank(0, "gpu1", "r0", summary=summary("r0", "exited", {"code": 0, "ended_at": 1_050.0})),
        rank(1, "gpu2", "r1", summary=summary("r1")),
        rank(2, "gpu2", "r2", summary=summary("r2", "exited", {"code": 1, "ended_at": 1_040.0})),
        rank(3, "gpu3", None, error="launch failed: no such folder: /data"),
    ))
    view = fleet.snapshot()
    rows = {row.rank: row for row in view.rows}
    assert [(r.where, r.state, r.phase, r.outcome) for r in view.rows] == [
        ("gpu1", "exited", "done", "done"),
        ("gpu2", "running", "running", "running"),
        ("gpu2", "exited", "failed", "failed"),
        ("gpu3", "not launched", "failed", "failed"),
    ]
    assert rows[2].root_cause == "exit code 1" and rows[3].root_cause.startswith("launch failed")
    assert rows[0].eta_s == 0.0 and rows[0].end_text == "exit code 0"
    assert view.state == "running" and dict(view.counts) == {"running": 1, "done": 1, "failed": 2}
    assert (view.done, view.total, view.tokens_per_s) == (None, None, None)
    # Two failed ranks, two alerts, each naming its rank and why.
    alerts = fleet.alerts_since(0)
    assert [a.kind for a in alerts] == [ALERT_RANK_FAILED] * 2
    assert alerts[0].message == "rank 2 on gpu2 failed: exit code 1"


def test_rows_take_progress_from_the_rank_models_and_the_eta_is_the_slowest_ranks():
    fleet = FleetModel()
    fleet.set_snapshot(job(rank(0, run="r0", summary=summary("r0")), rank(1, run="r1", summary=summary("r1"))))
    fleet.set_rank_model(0, extracting("r0", done=30, total=32, tokens_per_s=2_000.0, eta_s=5.0))
    fleet.set_rank_model(1, extracting("r1", done=10, total=32, tokens_per_s=1_000.0, eta_s=40.0))
    view = fleet.snapshot()
    assert [(r.phase, r.done, r.total, r.tokens_per_s, r.eta_s) for r in view.rows] == [
        ("extracting", 30, 32, 2_000.0, 5.0), ("extracting", 10, 32, 1_000.0, 40.0)]
    assert (view.done, view.total, view.tokens_per_s) == (40, 64, 3_000.0)
    # The job ends when its last rank does: rank 1, whatever the average says.
    assert (view.eta_s, view.eta_rank, view.eta_note) == (40.0, 1, "slowest: rank 1")


def test_the_eta_waits_for_a_rank_that_is_not_extracting_and_stops_at_a_failed_one():
    fleet = FleetModel()
    fleet.set_snapshot(job(rank(0, run="r0", summary=summary("r0")), rank(1, run="r1", summary=summary("r1"))))
    fleet.set_rank_model(0, extracting("r0", done=30, total=32, tokens_per_s=2_000.0, eta_s=5.0))
    loading = RunModel("local", summary("r1"))
    loading.feed_event(p.make_event(p.EVENT_PHASE, phase=p.PHASE_LOADING))
    fleet.set_rank_model(1, loading)
    view = fleet.snapshot()
    assert (view.eta_s, view.eta_note) == (None, "rank 1 loading")
    assert view.tokens_per_s == 2_000.0  # only the ranks extracting now
    loading.feed_job(p.JOB_EXITED, {"code": 1, "ended_at": 1_030.0}, {})
    view = fleet.snapshot()
    assert (view.eta_s, view.eta_note, view.state) == (None, "rank 1 failed", "running")


def test_without_a_token_eta_a_rank_falls_back_to_samples_over_its_sample_rate():
    fleet = FleetModel()
    fleet.set_snapshot(job(rank(0, run="r0", summary=summary("r0"))))
    fleet.set_rank_model(0, extracting("r0", done=20, total=32, tokens_per_s=400.0, eta_s=None))
    assert fleet.snapshot().rows[0].eta_s == 12 / 4.0


def test_a_rank_that_fails_alerts_once_and_again_after_a_restart_fails_too():
    fleet = FleetModel()
    first = RunModel("local", summary("r1"))
    first.feed_log(WORKER_ASSERT_LOG.read_bytes())
    first.feed_job(p.JOB_EXITED, {"code": 1, "ended_at": 1_095.0}, {})
    fleet.set_snapshot(job(rank(0, run="r0", summary=summary("r0")), rank(1, run="r1", summary=summary("r1"))))
    fleet.set_rank_model(1, first)
    row = fleet.snapshot().rows[1]
    # The root cause is the rank's own top failure, as its run screen shows it.
    assert row.outcome == "failed" and row.root_cause == first.snapshot().failures[0].summary
    assert row.root_cause.startswith("AssertionError at vllm_connector.py:142")
    fleet.tick()
    fleet.set_snapshot(job(rank(0, run="r0", summary=summary("r0")), rank(1, run="r1", summary=summary("r1"))))
    assert kinds(fleet) == [ALERT_RANK_FAILED]
    # Restarted: a new run, running; then it fails as well.
    again = RunModel("local", summary("r1b", restart_of="r1"))
    fleet.set_snapshot(job(rank(0, run="r0", summary=summary("r0")),
                           rank(1, run="r1b", summary=summary("r1b", restart_of="r1"))))
    fleet.set_rank_model(1, again)
    row = fleet.snapshot().rows[1]
    assert (row.outcome, row.run, row.restart_of, row.root_cause) == ("running", "r1b", "r1", None)
    again.feed_job(p.JOB_EXITED, {"code": 2, "ended_at": 1_200.0}, {})
    fleet.tick()
    alerts = fleet.alerts_since(0)
    assert [a.kind for a in alerts] == [ALERT_RANK_FAILED] * 2 and alerts[1].message.endswith("exit code 2")


def test_a_model_of_the_ranks_previous_run_is_not_shown_for_its_new_one():
    fleet = FleetModel()
    old = RunModel("local", summary("r1"))
    old.feed_job(p.JOB_EXITED, {"code": 1}, {})
    fleet.set_rank_model(1, old)
    fleet.set_snapshot(job(rank(1, run="r1b", summary=summary("r1b", restart_of="r1"))))
    row = fleet.snapshot().rows[0]
    assert (row.outcome, row.phase, row.run) == ("running", "running", "r1b")


def test_a_stalled_rank_alerts_once_per_stall():
    clock = Clock()
    thresholds = Thresholds(stall_after_s=60)
    model = RunModel("local", summary("r0"), thresholds=thresholds, clock=clock)
    model.feed_event(p.make_event(p.EVENT_PHASE, phase=p.PHASE_EXTRACTING))
    fleet = FleetModel()
    fleet.set_snapshot(job(rank(0, run="r0", summary=summary("r0"))))
    fleet.set_rank_model(0, model)
    clock.now = 59
    model.tick()
    fleet.tick()
    assert kinds(fleet) == []
    clock.now = 61
    model.tick()
    fleet.tick()
    fleet.tick()
    row = fleet.snapshot().rows[0]
    assert row.stalled and row.phase == "stalled" and row.outcome == "running"
    assert kinds(fleet) == [ALERT_RANK_STALLED]
    assert fleet.alerts_since(0)[0].message == "rank 0 on local stalled: no progress while extracting"
    model.feed_event(p.make_event(p.EVENT_PROGRESS, done=1, total=2, tokens=10, bytes=1))  # it moves again
    fleet.tick()
    clock.now = 200
    model.tick()
    fleet.tick()
    assert kinds(fleet) == [ALERT_RANK_STALLED] * 2


def test_slurm_ranks_say_slurms_word_and_a_long_pending_one_alerts():
    fleet = FleetModel(FleetThresholds(pending_after_s=300))
    pending = rank(1, host=None, sched_state="PENDING", sched_reason="Resources", pending_s=120.0)
    running = rank(0, host=None, run="r0", node="gpu-node-3", sched_state="RUNNING", summary=summary("r0"))
    fleet.set_snapshot(job(running, pending, scheduler="slurm", target="login1", scheduler_job_id="4242"))
    rows = fleet.snapshot().rows
    assert [(r.where, r.state, r.reason, r.phase, r.outcome) for r in rows] == [
        ("gpu-node-3", "RUNNING", None, "running", "running"), ("—", "PENDING", "Resources", "pending", "pending")]
    assert kinds(fleet) == []
    fleet.set_snapshot(job(running, {**pending, "pending_s": 301.0}, scheduler="slurm"))
    fleet.set_snapshot(job(running, {**pending, "pending_s": 320.0}, scheduler="slurm"))
    assert [(a.kind, a.message) for a in fleet.alerts_since(0)] == [
        (ALERT_RANK_PENDING, "rank 1 pending for 5 min (Resources)")]
    assert (fleet.snapshot().eta_s, fleet.snapshot().eta_note) == (None, "rank 0 running")
    # GPUs of a node, from its telemetry or its run's recorded history.
    fleet.feed_node_gpus("gpu-node-3", [{"index": 0, "mem_used": 60e9, "mem_total": 80e9},
                                        {"index": 1, "mem_used": 20e9, "mem_total": 80e9}])
    row = fleet.snapshot().rows[0]
    assert (row.gpu_used, row.gpu_total) == (80_000_000_000, 160_000_000_000)


def test_slurms_end_states_map_to_outcomes_and_the_runs_own_end_wins():
    fleet = FleetModel()
    fleet.set_snapshot(job(
        rank(0, host=None, node="n1", sched_state="COMPLETED"),
        rank(1, host=None, node="n2", sched_state="CANCELLED by 1000"),
        rank(2, host=None, node="n3", sched_state="OUT_OF_MEMORY"),
        # The node died: the agent still had the run as running; Slurm knows better.
        rank(3, host=None, node="n4", run="r3", sched_state="NODE_FAIL", summary=summary("r3")),
        # The run's own exit came before Slurm's word moved on.
        rank(4, host=None, node="n5", run="r4", sched_state="COMPLETING",
             summary=summary("r4", "exited", {"code": 0})),
        scheduler="slurm"))
    rows = fleet.snapshot().rows
    assert [(r.state, r.outcome) for r in rows] == [("COMPLETED", "done"), ("CANCELLED by 1000", "cancelled"),
                                                   ("OUT_OF_MEMORY", "failed"), ("NODE_FAIL", "failed"),
                                                   ("COMPLETING", "done")]
    assert rows[2].root_cause == "OUT_OF_MEMORY"
    # A cancelled rank is no failure: only the two that failed ring.
    assert kinds(fleet) == [ALERT_RANK_FAILED] * 2


def test_an_ssh_job_cancelled_by_the_operator_shows_cancelled_ranks_and_rings_nothing():
    ended = {"signal": 15, "signal_name": "SIGTERM", "ended_at": 1_101.0}
    fleet = FleetModel()
    fleet.set_snapshot(job(
        rank(0, run="r0", summary=summary("r0", "exited", {"code": 0, "ended_at": 1_050.0})),
        rank(1, run="r1", summary=summary("r1", "exited", ended)),
        # Restarted after the cancel, then killed: that one failed on its own.
        rank(2, run="r2", summary=summary("r2", "exited", ended, started_at=1_200.0)),
        cancelled_at=1_100.0))
    view = fleet.snapshot()
    assert [(r.state, r.phase, r.outcome) for r in view.rows] == [
        ("exited", "done", "done"), ("cancelled", "cancelled", "cancelled"), ("exited", "failed", "failed")]
    assert view.cancelled and view.state == "failed"
    assert [a.message for a in fleet.alerts_since(0)] == ["rank 2 on local failed: killed by SIGTERM"]


def test_the_job_is_done_when_every_rank_is_and_the_version_moves_with_any_rank():
    model = extracting("r0", done=31, total=32, tokens_per_s=2_000.0, eta_s=0.5)
    fleet = FleetModel()
    fleet.set_snapshot(job(rank(0, run="r0", summary=summary("r0"))))
    fleet.set_rank_model(0, model)
    seen = fleet.version_key()
    model.feed_event(p.make_event(p.EVENT_PROGRESS, done=32, total=32, tokens=3_200, bytes=1, tokens_per_s=2_000.0,
                                  eta_s=0.0))
    assert fleet.version_key() != seen
    model.feed_event(p.make_event(p.EVENT_PHASE, phase=p.PHASE_DONE))
    model.feed_job(p.JOB_EXITED, {"code": 0, "ended_at": 1_070.0}, {})
    view = fleet.snapshot()
    assert (view.state, view.eta_s, view.eta_note, view.done, view.total) == ("done", 0.0, "all ranks done", 32, 32)
    assert view.tokens_per_s is None and kinds(fleet) == []


def test_a_run_the_operator_stopped_from_its_run_screen_is_cancelled_not_failed():
    fleet = FleetModel()
    model = RunModel("local", summary("r1"))
    fleet.set_snapshot(job(rank(1, run="r1", summary=summary("r1"))))
    fleet.set_rank_model(1, model)
    fleet.ended_by_operator("r1")
    model.feed_job(p.JOB_EXITED, {"signal": 15, "signal_name": "SIGTERM", "ended_at": 1_010.0}, {})
    fleet.tick()
    row = fleet.snapshot().rows[0]
    assert (row.state, row.phase, row.outcome, row.end_text) == ("cancelled", "cancelled", "cancelled",
                                                                 "killed by SIGTERM")
    assert kinds(fleet) == []


def test_a_run_whose_exit_says_the_operator_stopped_it_is_cancelled_with_or_without_its_model():
    # Stopped outside this dashboard (``eaglewatch stop``, another screen): only its exit.json says who ended it.
    stopped = {"signal": 15, "signal_name": "SIGTERM", "stopped": True, "ended_at": 1_010.0}
    killed = {"signal": 15, "signal_name": "SIGTERM", "ended_at": 1_010.0}
    fleet = FleetModel()
    fleet.set_snapshot(job(rank(0, run="r0", summary=summary("r0", "exited", stopped)),
                           rank(1, run="r1", summary=summary("r1")),
                           rank(2, run="r2", summary=summary("r2", "exited", killed))))
    model = RunModel("local", summary("r1"))
    fleet.set_rank_model(1, model)
    model.feed_job(p.JOB_EXITED, stopped, {})
    fleet.tick()
    rows = fleet.snapshot().rows
    assert [(r.phase, r.outcome, r.end_text) for r in rows] == [
        ("cancelled", "cancelled", "stopped by the operator (SIGTERM)"),
        ("cancelled", "cancelled", "stopped by the operator (SIGTERM)"),
        ("failed", "failed", "killed by SIGTERM")]  # a kill nobody asked for is still a failure
    assert [a.message for a in fleet.alerts_since(0)] == ["rank 2 on local failed: killed by SIGTERM"]
