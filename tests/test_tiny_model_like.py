"""``make-tiny-model --like`` on multimodal wrappers: the text backbone is built, or the config is refused."""

from __future__ import annotations

import json

from conftest import FIXTURES, run_cli

KIMI = FIXTURES / "configs" / "kimi_k25_config.json"


def test_like_a_wrapper_builds_its_text_backbone_and_says_so(tmp_path):
    llava_like = {"architectures": ["LlavaForConditionalGeneration"], "model_type": "llava",
                  "vision_config": {"model_type": "clip_vision_model", "hidden_size": 1024},
                  "text_config": {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008,
                                  "num_attention_heads": 32, "num_key_value_heads": 32, "num_hidden_layers": 32,
                                  "vocab_size": 32064}}
    config = tmp_path / "config.json"
    config.write_text(json.dumps(llava_like))
    out = tmp_path / "tiny"
    proc = run_cli("make-tiny-model", "--like", config, "--out", out, "--shards", "2", "--platform", "cpu")
    assert proc.returncode == 0, proc.stderr
    assert "text backbone LlamaForCausalLM of LlavaForConditionalGeneration" in proc.stdout
    small = json.loads((out / "config.json").read_text())
    assert small["architectures"] == ["LlamaForCausalLM"] and small["head_dim"] == 128  # 4096 / 32, kept


def test_like_kimi_without_quantization_keeps_its_mla_dims(tmp_path):
    out = tmp_path / "kimi"
    proc = run_cli("make-tiny-model", "--like", KIMI, "--out", out, "--shards", "2", "--quantization", "none",
                   "--platform", "gpu", "--dtype", "bfloat16")
    assert proc.returncode == 0, proc.stderr
    small = json.loads((out / "config.json").read_text())
    assert (small["qk_nope_head_dim"], small["qk_rope_head_dim"], small["v_head_dim"], small["kv_lora_rank"]) == (
        128, 64, 128, 512)
    assert small["hidden_size"] == 512 and "quantization_config" not in small
    assert "gpu sizes, kept MLA 128/64/128 kv_lora_rank 512 with q_lora" in proc.stdout


def test_a_wrapper_whose_text_config_is_not_an_object_is_refused_clearly(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "kimi_k25", "text_config": "deepseek"}))
    proc = run_cli("make-tiny-model", "--like", config, "--out", tmp_path / "x")
    assert proc.returncode != 0
    assert "text_config is a str, not an object" in proc.stderr and "Traceback" not in proc.stderr


def test_experts_and_their_width_can_be_set_for_an_engine_bench(tmp_path):
    out = tmp_path / "kimi"
    proc = run_cli("make-tiny-model", "--like", KIMI, "--out", out, "--shards", "2", "--quantization", "none",
                   "--platform", "cpu", "--layers", "2", "--experts", "16", "--moe-intermediate-size", "256")
    assert proc.returncode == 0, proc.stderr
    small = json.loads((out / "config.json").read_text())
    assert (small["n_routed_experts"], small["moe_intermediate_size"]) == (16, 256)
    assert "then 16 experts of MLP 256" in proc.stdout


def test_experts_on_a_dense_family_is_refused_in_one_line(tmp_path):
    proc = run_cli("make-tiny-model", "--arch", "llama", "--experts", "4", "--out", tmp_path / "x")
    assert proc.returncode == 2 and proc.stderr.strip() == "error: --experts: this family has no routed experts"
    assert not (tmp_path / "x").exists()
