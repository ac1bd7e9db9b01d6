"""The dashboard's model on runs recorded on H200s (run directories as the agent wrote them, in
tests/fixtures/gpu/runs/; paths rewritten as in test_gpu_fixtures.py).

By bench/gpu_dashboard_run.sh, while the real dashboard watched them in tmux (its screens: assets/screenshots/h200/):
vLLM 0.26.0, a 1.0 B random Llama in bf16, 9 shards, 1,024 samples of 1,024 tokens, layers 2 8 13 16,
``--tp-size 2`` on two H200s, each with the extraction's manifest:

* ``h200x2_tp2_ok``: the run to the end;
* ``h200x2_tp2_fault``: the writing worker fails a bare ``assert`` after 200 samples, with vLLM's engine core in its
  own process. The main process exits; the TP1 worker, stuck in a collective, keeps 137.5 GB of GPU 1 and ignores
  SIGTERM: the supervisor ends it with SIGKILL (exit.json's ``leftovers``).

By bench/gpu_history_run.sh, on one H200 without vLLM:

* ``h200_history``: a job that holds 8, then 24 GiB and leaves a child holding 4 GiB behind; its supervisor's GPU
  history, one line a second, and what the agent's ``gpu_history`` op served of it.
"""

from __future__ import annotations

import json
from pathlib import Path

from eaglewatch import protocol as p
from eaglewatch.pipeline.telemetry.history import read_recent
from eaglewatch.tui.runstate import RunModel, Thresholds

RUNS = Path(__file__).parent / "fixtures" / "gpu" / "runs"
TELEMETRY = Path(__file__).parent / "fixtures" / "telemetry"


def replay(name: str) -> tuple[RunModel, Path]:
    """The run directory fed to a model as the agent streams it: log bytes in chunks, events, then the exit."""
    run = RUNS / name
    cmd = json.loads((run / "cmd.json").read_text())
    model = RunModel("local", {"run": cmd["run"], "argv": cmd["argv"], "started_at": cmd["started_at"],
                               "state": "running"}, clock=lambda: 0.0)
    log = (run / "log").read_bytes()
    for start in range(0, len(log), 4096):
        model.feed_log(log[start:start + 4096])
    for event in p.read_events((run / "events.jsonl").read_bytes().splitlines()):
        model.feed_event(event)
    model.feed_job(p.JOB_EXITED, json.loads((run / "exit.json").read_text()), {})
    return model, run


def test_the_tp2_run_to_the_end():
    model, run = replay("h200x2_tp2_ok")
    view = model.snapshot()
    manifest = json.loads((run / "output_manifest.json").read_text())
    assert view.phase == "done" and view.exit_text == "exit code 0" and not view.marks
    assert view.phases_seen == ("validating", "loading", "extracting", "done")
    assert {"Worker_TP0", "Worker_TP1"} <= set(view.lanes)
    (shards,) = [bar for bar in view.load if "checkpoint shards" in bar.desc]
    assert (shards.lane, shards.n, shards.total, shards.done) == ("Worker_TP0", 9, 9, True)
    ex = view.extraction
    assert (ex.done, ex.total) == (manifest["samples_written"], 1024) == (1024, 1024)
    assert abs(ex.tokens_per_s / manifest["tokens_per_s"] - 1) < 0.1  # the live figure agrees with the manifest's
    assert view.failures == () and model.alerts_since(0) == []


def test_the_tp2_worker_assert_comes_first_and_the_leftover_worker_is_reported():
    model, run = replay("h200x2_tp2_fault")
    view = model.snapshot()
    root = view.failures[0]
    assert root.summary.startswith("AssertionError at vllm_connector.py:171 in _submit")
    assert root.lanes == "Worker_TP0" and root.tier == "original"
    assert view.failures[-1].tier == "final report" and "EngineDeadError" in view.failures[-1].summary
    assert view.phase == "failed" and view.exit_text == "exit code 1"
    # The stuck worker's C++ warnings after the crash carry torch's "[rank1]:" prefix: a lane of their own.
    assert "rank1" in view.lanes
    by_kind: dict[str, list[str]] = {}
    for alert in model.alerts_since(0):
        by_kind.setdefault(alert.kind, []).append(alert.message)
    assert by_kind["failure"] == [f"failure in Worker_TP0: {root.summary}"]
    leftovers = json.loads((run / "exit.json").read_text())["leftovers"]
    pids = " ".join(str(pid) for pid in leftovers["pids"])
    assert by_kind["processes"] == [
        f"2 process(es) of the run outlived its main process (pids {pids}); SIGTERM in 15 s unless they end",
        "the leftover processes ended after SIGKILL",
    ]


def test_the_gpu_history_a_supervisor_kept_on_an_h200_reaches_the_sparklines():
    # bench/gpu_history_run.sh: 8 GiB, then 24 GiB, a child with 4 GiB more that outlives the main process, the
    # supervisor's SIGTERM after 3 s, one history line a second.
    run = RUNS / "h200_history"
    recorded = read_recent(run, 60)
    assert recorded == json.loads((run / "served.json").read_text())  # what the agent served on the H200
    gib = [sample["gpus"][0]["mem_used"] / 2**30 for sample in recorded]
    exit_record = json.loads((run / "exit.json").read_text())
    leftovers = exit_record["leftovers"]
    after_exit = [g for sample, g in zip(recorded, gib) if sample["t"] > exit_record["ended_at"]]
    assert after_exit[0] > 4 and after_exit[-1] < 0.1  # the child's memory, then none once it was ended
    assert recorded[-1]["t"] > leftovers["cleared_at"] and leftovers["ended_by"] == "SIGTERM"
    model = RunModel("local", {"run": "r", "state": "exited"}, Thresholds(gpu_history=60))
    live = json.loads((TELEMETRY / "h200_stream.jsonl").read_text().splitlines()[-1])
    model.feed_telemetry(live)
    model.feed_gpu_history(recorded)
    history = model.snapshot().gpus[0].mem_history
    total = recorded[0]["gpus"][0]["mem_total"]
    assert list(history[:-1]) == [g * 2**30 / total for g in gib] and len(history) == len(recorded) + 1
