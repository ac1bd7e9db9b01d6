"""The target family on a real H200 (bench/gpu_family_run.sh, vLLM 0.26.0, 2026-12-01), decoded by today's decoder.

Fixtures in tests/fixtures/gpu/h200_family/: `eaglewatch extract` with default flags (preflight and miniature
included) of a 6-layer DeepSeek-V3 MoE with DeepSeek-V3's MLA dimensions and of a Qwen3-MoE, each in 8 shards, in
bf16 and in compressed-tensors INT4 (`make-tiny-model --quantization int4`, loaded with vLLM's
CompressedTensorsWNA16MarlinMoEMethod); `eaglewatch preflight` of the Kimi-K2.5 config, bf16 and INT4; the
`verify --against-hf 8 --json` reports and the step times. A correct run must decode to no failure (no false alarm),
show its 8 shards loaded, and its verify report must pass every layer within the noise floor's limit.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eaglewatch.decode import BarUpdate, decode_bytes

FIXTURES = Path(__file__).parent / "fixtures" / "gpu" / "h200_family"
EXTRACTS = ["deepseek_v3_bf16", "deepseek_v3_int4", "qwen3_moe_bf16", "qwen3_moe_int4"]
SHARDS = "Loading safetensors checkpoint shards"


@pytest.mark.parametrize("name", EXTRACTS)
def test_a_correct_family_run_decodes_to_no_failure_with_its_shards_loaded(name: str) -> None:
    events, state = decode_bytes((FIXTURES / f"{name}_extract.log").read_bytes())
    assert state.failures_ranked() == [] and state.root_cause() is None
    assert state.facts["vllm_version"] == "0.26.0"
    shards = [(e.n, e.total) for e in events if isinstance(e, BarUpdate) and e.desc == SHARDS]
    assert shards and shards[-1] == (8, 8)
    text = (FIXTURES / f"{name}_extract.log").read_text()
    assert "[ok  ] miniature" in text and "phase: done (64 samples" in text
    if name.endswith("int4"):
        assert "CompressedTensorsWNA16MarlinMoEMethod" in text  # the quantized MoE kernels ran, not a fallback


@pytest.mark.parametrize("name", ["kimi_k25_bf16", "kimi_k25_int4"])
def test_the_kimi_miniature_passes_on_the_h200_and_says_what_it_kept(name: str) -> None:
    text = (FIXTURES / f"{name}_preflight.log").read_text()
    assert "preflight: passed (0 failed" in text
    line = next(line for line in text.splitlines() if "] miniature" in line)
    assert line.lstrip().startswith("[ok  ]") and "kept MLA 128/64/128 kv_lora_rank 512" in line
    assert "KimiK25ForConditionalGeneration" in line  # says it ran the text backbone, and why
    _, state = decode_bytes(text.encode())
    assert state.failures_ranked() == []


@pytest.mark.parametrize("name", EXTRACTS)
def test_verify_passes_every_layer_within_the_floor(name: str) -> None:
    report = json.loads((FIXTURES / f"{name}_verify.json").read_text())
    assert report["ok"] == report["files"] == 64 and not report["problems"]
    against = report["against_hf"]
    assert against["passed"] and against["samples"] == 8
    for layer in against["layers"]:
        assert layer["passed"] and layer["engine_error"] <= layer["limit"]
        # The engine is as close to the float32 truth as HF's own bf16, within the factor.
        assert 0.4 < layer["ratio"] < 1.5, layer
