"""The real vLLM engine (CPU build) on the 8-shard tiny Llama: fidelity against HF, TP=2, kill -9 and resume.

Each engine start costs ~30-50 s on two cores, so the uninterrupted run is shared by the tests of this module.
"""

from __future__ import annotations

import json

import pytest

from conftest import file_bytes, load_outputs, read_events, run_cli
from resume_helpers import KillPoints, kill_mid_run

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
pytest.importorskip("vllm")


def vllm_args(model, data, out, *extra):
    return ["extract", "--engine", "vllm", "--model-path", str(model), "--prepared-data", str(data),
            "--output-dir", str(out), "--layer-ids", "1", "2", "4", "--max-seq-len", "512",
            "--batch-size", "8", *extra]


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


def test_verify_against_hf_passes(vllm_run):
    out, _ = vllm_run
    proc = run_cli("verify", out, "--against-hf", "4")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "against HF on 4 samples" in proc.stdout and ": pass" in proc.stdout


def test_tensor_parallel_2(tiny_llama, prepared_data, hf_reference, tmp_path):
    out = tmp_path / "tp2"
    proc = run_cli(*no_preflight(*vllm_args(tiny_llama, prepared_data, out, "--tp-size", "2")),
                   env={"VLLM_CPU_OMP_THREADS_BIND": "0|1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "(Worker_TP1 pid=" in proc.stdout + proc.stderr
    assert max_abs_diff(out, hf_reference) < 1e-5


def test_kill_9_during_extraction_then_resume_is_bit_identical(tiny_llama, prepared_data, vllm_run, tmp_path,
                                                               request):
    points = KillPoints(request.node.nodeid)
    out = tmp_path / "killed"
    args = no_preflight(*vllm_args(tiny_llama, prepared_data, out))
    left = kill_mid_run(args, out, points, total=64, upper=48)
    assert 0 < left < 64, points
    resumed = run_cli(*args)
    assert resumed.returncode == 0, f"{points}\n{resumed.stderr[-4000:]}"
    assert file_bytes(out) == file_bytes(vllm_run[0]), points
