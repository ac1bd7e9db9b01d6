import json

import pytest

from eaglewatch.errors import UserError
from eaglewatch.pipeline import model_info as mi


def test_layer_ids_in_range_pass():
    assert mi.check_layer_ids([0, 2, 4], 4) == [0, 2, 4]


@pytest.mark.parametrize("ids, why", [
    ([-1, 2], "out of range"),
    ([1, 10], "out of range"),  # vLLM would silently return layer 1 again in the second slot
    ([5], "out of range"),
    ([2, 2, 3], "repeated"),
    ([], "empty"),
])
def test_impossible_layer_ids_are_rejected(ids, why):
    with pytest.raises(UserError, match=why):
        mi.check_layer_ids(ids, 4)


def test_default_layer_ids_follow_the_convention():
    assert mi.default_layer_ids(61) == [2, 30, 58, 61]
    assert mi.default_layer_ids(4) == [1, 2, 4]
    assert all(0 <= i <= 2 for i in mi.default_layer_ids(2))


def test_model_info_reads_config_and_shards(tiny_llama):
    info = mi.load_model_info(tiny_llama)
    assert (info.num_hidden_layers, info.hidden_size, info.num_attention_heads) == (4, 128, 4)
    assert len(info.shards) == 8
    assert info.weights_bytes == sum((tiny_llama / s).stat().st_size for s in info.shards)


def test_missing_folder_and_missing_shard(tmp_path, tiny_llama):
    with pytest.raises(UserError, match="does not exist"):
        mi.load_model_info(tmp_path / "absent")
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in tiny_llama.iterdir():
        if f.name != "model-00003-of-00008.safetensors":
            (broken / f.name).write_bytes(f.read_bytes())
    with pytest.raises(UserError, match=r"1 of 8 shards .* missing: model-00003-of-00008"):
        mi.load_model_info(broken)


def test_bad_config_json(tmp_path):
    (tmp_path / "config.json").write_text("{nope")
    with pytest.raises(UserError, match="not valid JSON"):
        mi.load_model_info(tmp_path)


def test_multimodal_wrapper_reads_the_text_config(tmp_path):
    config = {"architectures": ["KimiK25ForConditionalGeneration"], "text_config": {
        "model_type": "deepseek_v3", "num_hidden_layers": 61, "hidden_size": 7168, "num_attention_heads": 64,
        "num_key_value_heads": 64, "vocab_size": 163840, "kv_lora_rank": 512, "torch_dtype": "bfloat16"}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    info = mi.load_model_info(tmp_path, check_shards=False)
    assert info.num_hidden_layers == 61 and info.is_mla
    # About 56 KiB of output per token for the seed's four layers.
    assert mi.bytes_per_token(4, info.hidden_size, info.dtype) // 1024 == 56
