"""End-to-end extraction with the transformers engine: output layout, events, resume, data-parallel shares."""

from __future__ import annotations

import json

import torch
from safetensors.torch import load_file

from conftest import file_bytes, read_events, run_cli
from eaglewatch.pipeline.prepared_data import iter_prepared
from resume_helpers import KillPoints, kill_mid_run


def hf_args(model, data, out, *extra):
    return ["extract", "--engine", "hf", "--model-path", str(model), "--prepared-data", str(data),
            "--output-dir", str(out), "--layer-ids", "1", "2", "4", "--max-seq-len", "512", "--no-miniature", *extra]


def test_output_files_manifest_and_events(hf_reference, prepared_data):
    samples = list(iter_prepared(prepared_data))
    files = sorted(hf_reference.glob("hs_*.safetensors"))
    assert len(files) == len(samples) == 64
    first = samples[0]
    tensors = load_file(str(hf_reference / f"hs_{first.id}.safetensors"))
    assert tensors["hidden_states"].shape == (first.num_tokens, 3, 128)
    assert tensors["hidden_states"].dtype == torch.float32
    assert tensors["token_ids"].tolist() == first.input_ids
    assert tensors["loss_mask"].tolist() == first.loss_mask
    manifest = json.loads((hf_reference / "manifest.json").read_text())
    assert manifest["status"] == "done" and manifest["layer_ids"] == [1, 2, 4]
    assert manifest["samples_written"] == 64 and manifest["tokens_written"] == sum(s.num_tokens for s in samples)
    assert manifest["bytes_written"] == sum(f.stat().st_size for f in files)
    assert {"torch", "transformers", "eaglewatch"} <= set(manifest["versions"])
    events = read_events(hf_reference / "events.jsonl")
    phases = [e["phase"] for e in events if e["kind"] == "phase"]
    assert phases == ["validating", "loading", "extracting", "done"]
    assert sum(e["kind"] == "sample" for e in events) == 64
    last = [e for e in events if e["kind"] == "progress"][-1]
    assert (last["done"], last["total"]) == (64, 64)


def test_last_layer_is_pre_norm_like_vllm(hf_reference, tiny_llama, prepared_data):
    """Id L is the last decoder layer's output before the final norm, not HF's hidden_states[-1]."""
    from transformers import AutoModelForCausalLM

    sample = next(iter_prepared(prepared_data))
    model = AutoModelForCausalLM.from_pretrained(str(tiny_llama), dtype=torch.float32)
    with torch.inference_mode():
        hs = model(torch.tensor([sample.input_ids]), output_hidden_states=True).hidden_states
    ours = load_file(str(hf_reference / f"hs_{sample.id}.safetensors"))["hidden_states"]
    assert torch.allclose(ours[:, 0], hs[1][0], atol=1e-6)  # id 1 == hidden_states[1]
    assert torch.allclose(ours[:, 1], hs[2][0], atol=1e-6)
    assert not torch.allclose(ours[:, 2], hs[4][0], atol=1e-3)  # HF's last entry is after the norm
    normed = model.model.norm(ours[:, 2].unsqueeze(0))[0]
    assert torch.allclose(normed, hs[4][0], atol=1e-5)


def test_resume_skips_completed_work(tmp_path, tiny_llama, prepared_data):
    out = tmp_path / "out"
    assert run_cli(*hf_args(tiny_llama, prepared_data, out, "--max-samples", "8")).returncode == 0
    again = run_cli(*hf_args(tiny_llama, prepared_data, out, "--max-samples", "12", "--batch-size", "4"))
    assert again.returncode == 0, again.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["samples_written"] == 4 and manifest["samples_done"] == 12


def test_data_parallel_shares_are_contiguous_and_complete(tmp_path, tiny_llama, prepared_data):
    out = tmp_path / "out"
    for rank in range(3):
        proc = run_cli(*hf_args(tiny_llama, prepared_data, out, "--rank", str(rank), "--world-size", "3",
                                "--max-samples", "10"))
        assert proc.returncode == 0, proc.stderr
    ids = [s.id for s in iter_prepared(prepared_data)][:10]
    assert sorted(p.name for p in out.glob("hs_*.safetensors")) == sorted(f"hs_{i}.safetensors" for i in ids)
    shares = [json.loads((out / f"manifest.rank{r}.json").read_text())["samples_total"] for r in range(3)]
    assert shares == [4, 4, 2]
    verify = run_cli("verify", out)
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_kill_9_then_resume_is_bit_identical(tmp_path, tiny_llama, prepared_data, hf_reference, request):
    points = KillPoints(request.node.nodeid)
    out = tmp_path / "out"
    args = hf_args(tiny_llama, prepared_data, out, "--batch-size", "8")
    left = kill_mid_run(args, out, points, total=64, upper=40)
    assert 0 < left < 64, points
    resumed = run_cli(*args)
    assert resumed.returncode == 0, f"{points}\n{resumed.stderr}"
    assert not list(out.glob("*.tmp.*")), points
    assert file_bytes(out) == file_bytes(hf_reference), points


def test_no_fsync_writes_the_same_files(tmp_path, tiny_llama, prepared_data, hf_reference):
    out = tmp_path / "out"
    proc = run_cli(*hf_args(tiny_llama, prepared_data, out, "--batch-size", "8", "--max-samples", "8", "--no-fsync"))
    assert proc.returncode == 0, proc.stderr
    written = file_bytes(out)
    assert len(written) == 8
    assert written == {name: data for name, data in file_bytes(hf_reference).items() if name in written}
