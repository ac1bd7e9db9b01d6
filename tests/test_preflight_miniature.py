"""The miniature: a toy clone of the target's architecture through the real extract path."""

from __future__ import annotations

import json

import pytest

from conftest import FIXTURES, read_events, run_cli
from eaglewatch.pipeline import model_info as mi
from eaglewatch.pipeline.plan import ExtractConfig
from eaglewatch.pipeline.preflight.miniature import build_miniature, map_layer_ids
from eaglewatch.pipeline.preflight.miniature_run import run_miniature

KIMI = FIXTURES / "configs" / "kimi_k25_config.json"


@pytest.mark.parametrize("ids, layers, depth, mapping", [
    ([1, 2, 4], 4, 4, {1: 1, 2: 2, 4: 4}),  # small enough: ids keep their meaning
    ([2, 30, 58, 61], 61, 4, {2: 1, 30: 2, 58: 3, 61: 4}),  # the seed's Kimi ids, final layer kept final
    ([0, 61], 61, 4, {0: 0, 61: 4}),
])
def test_layer_mapping(ids, layers, depth, mapping):
    assert map_layer_ids(ids, layers) == (depth, mapping)


def test_mapping_never_merges_two_ids():
    depth, mapping = map_layer_ids([10, 11, 12, 13, 14, 61], 61)
    assert len(set(mapping.values())) == 6 and mapping[61] == depth


def test_kimi_like_config_is_shrunk_to_a_cpu_friendly_mla_moe_model(tmp_path):
    config = json.loads(KIMI.read_text())
    model = build_miniature(config, 4, tmp_path / "mini", "float32")
    small = json.loads((model / "config.json").read_text())
    assert small["architectures"] == ["DeepseekV3ForCausalLM"] and small["model_type"] == "deepseek_v3"
    assert small["num_hidden_layers"] == 4 and small["hidden_size"] <= 256
    # The target's own MLA dimensions, which GPU prefill backends need; 512 + 64 is also the CPU kernel's 576.
    assert (small["qk_nope_head_dim"], small["qk_rope_head_dim"], small["v_head_dim"]) == (128, 64, 128)
    assert small["kv_lora_rank"] + small["qk_rope_head_dim"] == 576
    assert small["n_routed_experts"] > small["num_experts_per_tok"] > 1 and small["first_k_dense_replace"] == 1
    assert small["scoring_func"] == "sigmoid" and small["topk_method"] == "noaux_tc"
    assert "quantization_config" not in small  # vllm-cpu has no INT4 MoE kernel for this routing
    index = json.loads((model / "model.safetensors.index.json").read_text())
    # Experts stored one by one, as real checkpoints (and vLLM's loader) have them.
    assert any(".mlp.experts.0.down_proj.weight" in name for name in index["weight_map"])


def test_gpu_miniature_of_kimi_is_int4_at_kernel_friendly_sizes(tmp_path):
    config = json.loads(KIMI.read_text())
    model = build_miniature(config, 4, tmp_path / "mini", "bfloat16", platform="gpu", tp_size=2)
    small = json.loads((model / "config.json").read_text())
    assert small["quantization_config"]["format"] == "pack-quantized"
    assert small["hidden_size"] % 128 == 0 and (small["moe_intermediate_size"] // 2) % 64 == 0
    names = json.loads((model / "model.safetensors.index.json").read_text())["weight_map"]
    assert "model.layers.1.mlp.experts.0.down_proj.weight_packed" in names


def test_hf_miniature_passes_and_reports_through_extract(tiny_llama, prepared_data, tmp_path):
    out = tmp_path / "out"
    proc = run_cli("extract", "--engine", "hf", "--model-path", tiny_llama, "--prepared-data", prepared_data,
                   "--output-dir", out, "--layer-ids", "1", "2", "4", "--max-samples", "4", "--max-seq-len", "512")
    assert proc.returncode == 0, proc.stderr
    assert "[ok  ] miniature" in proc.stderr
    checks = [e for e in read_events(out / "events.jsonl") if e["kind"] == "check"]
    assert {"model folder", "layer ids", "data", "disk", "miniature"} <= {c["name"] for c in checks}
    # A check still running (the miniature's stages as they start) is progress, not a result.
    assert all(c["status"] == "pass" for c in checks if c["status"] != "running")


@pytest.mark.vllm
def test_kimi_like_miniature_runs_on_the_vllm_cpu_engine(prepared_data, tmp_path):
    pytest.importorskip("vllm")
    folder = tmp_path / "kimi"
    folder.mkdir()
    (folder / "config.json").write_text(KIMI.read_text())
    info = mi.load_model_info(folder, check_shards=False)
    cfg = ExtractConfig(model_path=str(folder), prepared_data=str(prepared_data), output_dir=str(tmp_path / "o"),
                        engine="vllm")
    stages: list[str] = []
    result = run_miniature(cfg, info, [2, 30, 58, 61], workdir=str(tmp_path / "work"), on_stage=stages.append)
    assert result.status in ("pass", "warn"), result.reason
    assert stages == ["planning", "starting", "building", "loading the engine", "extracting"]
    assert "layer ids mapped 2->1, 30->2, 58->3" in result.reason
    # The line says what the miniature kept and where the CPU build differs from the target.
    assert "MLA 128/64/128 kv_lora_rank 512 with q_lora" in result.reason
    assert "text backbone DeepseekV3ForCausalLM of KimiK25ForConditionalGeneration" in result.reason
    assert "unquantized on vllm-cpu" in result.reason
    assert result.details["platform"] == "cpu" and result.details["quantized"] is False
    assert result.details["against_hf"]["samples"] == 1


@pytest.mark.vllm
def test_planted_engine_path_break_is_caught_with_its_root_cause(tiny_llama, prepared_data, tmp_path):
    pytest.importorskip("vllm")
    out = tmp_path / "out"
    temp = tmp_path / "temp"
    temp.mkdir()
    proc = run_cli("preflight", "--engine", "vllm", "--model-path", tiny_llama, "--prepared-data", prepared_data,
                   "--output-dir", out, "--layer-ids", "1", "2", "4", "--max-seq-len", "512",
                   env={"EAGLEWATCH_INJECT_FAULT": "worker_assert:0", "TMPDIR": str(temp)})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    line = next(text for text in lines if text.startswith("  [FAIL] miniature"))
    assert "AssertionError at vllm_connector.py" in line and "assert self._writes_submitted < self._fault_after" in line
    # While it ran, its stage every few seconds; after it, the traceback's end, without a file to go and read.
    assert any(text.startswith("  [....] miniature") for text in lines[:lines.index(line)])
    tail = [text.strip() for text in lines[lines.index(line):] if text.strip().startswith("|")]
    assert tail[-1] == "| AssertionError" and any("_submit" in text for text in tail)
    # However it ends, the miniature leaves no folder behind.
    assert list(temp.iterdir()) == []
