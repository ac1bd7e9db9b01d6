"""The real vLLM engine (CPU build) on the 8-shard tiny Llama: fidelity against HF, the progress the dashboard
shows, TP=2, and ``--exact``'s bit-identical kill -9 and resume. The stream's own kill -9 test is
tests/test_feeding_stream.py.

Each engine start costs ~30-50 s on two cores, so the uninterrupted run is shared by the tests of this module.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import file_bytes, load_outputs, read_events, run_cli
from resume_helpers import KillPoints, kill_mid_run

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
pytest.importorskip("vllm")


def vllm_args(model, data, out, *extra):
    """The default flags: the stream."""
    return ["extract", "--engine", "vllm", "--model-path", str(model), "--prepared-data", str(data),
            "--output-dir", str(out), "--layer-ids", "1", "2", "4", "--max-seq-len", "512", *extra]


def exact_args(model, data, out, *extra):
    return vllm_args(model, data, out, "--exact", "--batch-size", "8", *extra)


def no_preflight(*args):
    """The shared run already proved preflight (with a vLLM miniature) on this model; the others skip it."""
    return [*args, "--no-preflight"]


@pytest.fixture(scope="module")
def vllm_run(tiny_llama, prepared_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("vllm")
    proc = run_cli(*vllm_args(tiny_llama, prepared_data, out))
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out, proc


def max_abs_diff(a_dir, b_dir):
    a, b = load_outputs(a_dir), load_outputs(b_dir)
    assert a.keys() == b.keys() and len(a) == 64
    worst = 0.0
    for name in a:
        assert a[name]["token_ids"].tolist() == b[name]["token_ids"].tolist()
        assert a[name]["loss_mask"].tolist() == b[name]["loss_mask"].tolist()
        worst = max(worst, (a[name]["hidden_states"] - b[name]["hidden_states"]).abs().max().item())
    return worst


def test_vllm_matches_hf_within_1e_5(vllm_run, hf_reference):
    out, proc = vllm_run
    assert "Loading safetensors checkpoint shards: 100% Completed | 8/8" in proc.stderr
    assert max_abs_diff(out, hf_reference) < 1e-5
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["engine"] == "vllm" and manifest["versions"]["vllm"].startswith("0.")
    events = read_events(out / "events.jsonl")
    assert [e["phase"] for e in events if e["kind"] == "phase"] == ["validating", "loading", "extracting", "done"]
    miniature = [e for e in events if e["kind"] == "check" and e["name"] == "miniature"]
    assert miniature and miniature[0]["status"] == "pass" and "real vllm path" in miniature[0]["reason"]


def test_the_default_is_the_stream_with_a_periodic_sync(vllm_run):
    out, proc = vllm_run
    manifest = json.loads((out / "manifest.json").read_text())
    assert (manifest["feeding"], manifest["exact"], manifest["batch_size"]) == ("stream", False, None)
    assert manifest["engine_core_process"] is False  # on CPU the engine core stays in-process
    assert manifest["fsync"] is True and manifest["sync_interval"] == 10.0
    # The closing sync covered every sample, on this boot.
    assert manifest["durable"]["samples"] == 64 and manifest["syncs"] >= 1 and manifest["sync_s"] >= 0
    assert manifest["durable"]["boot_id"] == Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def test_progress_events_give_the_dashboard_right_figures(vllm_run):
    """A real stream's progress events: batched (a few per second at most), each one's figures what the sample
    events before it add up to, the ETA the tokens still to extract over the token rate; and the dashboard's model
    shows what the last one says."""
    from eaglewatch import protocol as p
    from eaglewatch.tui.runstate.model import RunModel

    out, _ = vllm_run
    events = read_events(out / "events.jsonl")
    info = next(e for e in events if e["kind"] == "info" and "tokens" in e)
    total_tokens = info["tokens"]
    progress = [e for e in events if e["kind"] == "progress"]
    samples = [e for e in events if e["kind"] == "sample"]
    assert len(samples) == 64
    span = progress[-1]["elapsed_s"]
    assert 1 <= len(progress) <= 2 * span + 2 and len(progress) < len(samples)
    model = RunModel("h", {"run": "r", "state": "running"})
    seen = {"n": 0, "tokens": 0, "bytes": 0}
    for event in events:
        if event["kind"] == "sample":
            seen["n"] += 1
            seen["tokens"] += event["tokens"]
            seen["bytes"] += event["bytes"]
        if event["kind"] == "phase" and event["phase"] == p.PHASE_DONE:
            break
        model.feed_event(event)
        if event["kind"] != "progress":
            continue
        assert (event["done"], event["total"]) == (seen["n"], 64)
        assert (event["tokens"], event["bytes"]) == (seen["tokens"], seen["bytes"])
        # elapsed_s is rounded to the millisecond: the rates are known to that much.
        within = 1e-3 + 0.0006 / event["elapsed_s"]
        rate = event["tokens"] / event["elapsed_s"]
        assert event["tokens_per_s"] == pytest.approx(rate, rel=within, abs=0.1)
        assert event["samples_per_s"] == pytest.approx(event["done"] / event["elapsed_s"], rel=within, abs=1e-3)
        # The ETA follows the last minute's rate once two looks give one (rounded to 0.1 token/s in the event).
        recent = event.get("recent_tokens_per_s")
        eta = (total_tokens - event["tokens"]) / (recent or rate)
        assert event["eta_s"] == pytest.approx(eta, rel=within + (0.1 / recent if recent else 0), abs=0.06)
        shown = model.snapshot().extraction
        assert (shown.done, shown.tokens, shown.tokens_per_s, shown.eta_s) == (
            event["done"], event["tokens"], recent or event["tokens_per_s"], event["eta_s"])
    last = progress[-1]
    assert (last["done"], last["tokens"], last["eta_s"]) == (64, total_tokens, 0.0)
    manifest = json.loads((out / "manifest.json").read_text())
    assert last["tokens_per_s"] == pytest.approx(manifest["tokens_per_s"], rel=0.05)


def test_verify_against_hf_passes(vllm_run):
    out, _ = vllm_run
    proc = run_cli("verify", out, "--against-hf", "4")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "against HF on 4 samples" in proc.stdout and ": pass" in proc.stdout


def test_tensor_parallel_2(tiny_llama, prepared_data, hf_reference, tmp_path, monkeypatch):
    # No binding given, as a user runs it: on a machine with one NUMA node vLLM's own binding would stop the run
    # ("Not enough allowed NUMA nodes"), and extract splits the CPUs between the ranks instead, saying so.
    from eaglewatch.pipeline.engines.cpu_binding import allowed_numa_nodes

    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    out = tmp_path / "tp2"
    proc = run_cli(*no_preflight(*vllm_args(tiny_llama, prepared_data, out, "--tp-size", "2")))
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "(Worker_TP1 pid=" in proc.stdout + proc.stderr
    if len(allowed_numa_nodes()) < 2:
        assert "each rank's threads bound to its own CPUs (VLLM_CPU_OMP_THREADS_BIND=" in proc.stderr
    assert max_abs_diff(out, hf_reference) < 1e-5


@pytest.fixture(scope="module")
def exact_run(tiny_llama, prepared_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("exact")
    proc = run_cli(*no_preflight(*exact_args(tiny_llama, prepared_data, out)))
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


def test_exact_kill_9_during_extraction_then_resume_is_bit_identical(tiny_llama, prepared_data, exact_run,
                                                                     tmp_path, request):
    points = KillPoints(request.node.nodeid)
    out = tmp_path / "killed"
    args = no_preflight(*exact_args(tiny_llama, prepared_data, out))
    left = kill_mid_run(args, out, points, total=64, upper=48)
    assert 0 < left < 64, points
    resumed = run_cli(*args)
    assert resumed.returncode == 0, f"{points}\n{resumed.stderr[-4000:]}"
    assert not [p.name for p in out.iterdir() if ".tmp" in p.name or p.name.endswith(".failed")], points
    assert file_bytes(out) == file_bytes(exact_run), points
    manifest = json.loads((out / "manifest.json").read_text())
    assert (manifest["feeding"], manifest["exact"], manifest["batch_size"]) == ("batches", True, 8)
