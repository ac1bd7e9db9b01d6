"""INT4 pack-quantized tiny models: the packing round-trips exactly, and HF reads what the integers mean."""

from __future__ import annotations

import json

import pytest

from conftest import FIXTURES, run_cli
from eaglewatch.pipeline.tiny_quant import (KIMI_INT4_SCHEME, WeightScheme, compress_weight, decompress_weight,
                                            pack_int32, packed_scheme, quantize_rtn, unpack_int32)

torch = pytest.importorskip("torch")

KIMI = FIXTURES / "configs" / "kimi_k25_config.json"


@pytest.mark.parametrize("symmetric", [True, False], ids=["symmetric", "asymmetric"])
@pytest.mark.parametrize("shape, group", [((50, 96), 32), ((128, 256), 32), ((8, 128), 128)])
def test_pack_unpack_round_trip_is_exact(shape, group, symmetric):
    scheme = WeightScheme(num_bits=4, group_size=group, symmetric=symmetric)
    weight = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    q, scale, zero = quantize_rtn(weight, scheme)
    assert q.dtype == torch.int8 and q.min() >= -8 and q.max() <= 7
    packed = pack_int32(q, 4)
    assert packed.dtype == torch.int32 and packed.shape == (shape[0], shape[1] // 8)
    assert torch.equal(unpack_int32(packed, 4, shape), q)
    if zero is not None:
        packed_zero = pack_int32(zero, 4, dim=0)
        assert packed_zero.shape == ((shape[0] + 7) // 8, shape[1] // group)
        assert torch.equal(unpack_int32(packed_zero, 4, tuple(zero.shape), dim=0), zero)
    # Round-to-nearest: every weight within half a step of what its integer means.
    meant = decompress_weight(compress_weight(weight, scheme, torch.float32), scheme)
    step = scale.repeat_interleave(group, dim=1)
    assert torch.all((meant - weight).abs() <= step / 2 + 1e-6)


def test_packing_matches_the_compressed_tensors_library():
    """compressed-tensors defines the format: its packer gives the same int32 words, its unpacker the values."""
    helpers = pytest.importorskip("compressed_tensors.compressors.pack_quantized.helpers")
    q = torch.randint(-8, 8, (40, 64), dtype=torch.int8, generator=torch.Generator().manual_seed(2))
    assert torch.equal(pack_int32(q, 4), helpers.pack_to_int32(q, 4))
    assert torch.equal(pack_int32(q, 4, dim=0), helpers.pack_to_int32(q, 4, packed_dim=0))
    assert torch.equal(helpers.unpack_from_int32(pack_int32(q, 4), 4, q.shape), q)


def test_scheme_from_kimi_config_and_ignore_rules():
    scheme = packed_scheme(json.loads(KIMI.read_text())["text_config"]["quantization_config"])
    assert scheme is not None and scheme.assumed  # the fixture names the format only
    assert scheme.weights == WeightScheme(4, 32, True)
    assert scheme.quantizes("model.layers.3.mlp.experts.17.down_proj")
    for kept_dense in ("lm_head", "model.layers.3.self_attn.kv_b_proj", "model.layers.3.mlp.shared_experts.up_proj",
                       "model.layers.0.mlp.gate_proj", "model.layers.3.mlp.gate", "model.embed_tokens"):
        assert not scheme.quantizes(kept_dense), kept_dense
    assert packed_scheme({"quant_method": "fp8"}) is None
    full = packed_scheme(KIMI_INT4_SCHEME)
    assert full is not None and not full.assumed


@pytest.fixture(scope="module")
def int4_kimi(tmp_path_factory):
    """The Kimi-K2.5 config's text backbone at CPU sizes, INT4 as its config says, float32 scales."""
    out = tmp_path_factory.mktemp("int4") / "kimi-int4"
    proc = run_cli("make-tiny-model", "--like", KIMI, "--out", out, "--shards", "3", "--platform", "cpu")
    assert proc.returncode == 0, proc.stderr
    return out, proc.stdout


def test_make_tiny_model_writes_kimi_int4_format(int4_kimi):
    out, stdout = int4_kimi
    assert "INT4 pack-quantized group 32 symmetric" in stdout
    config = json.loads((out / "config.json").read_text())
    quant = config["quantization_config"]
    assert quant["format"] == "pack-quantized" and quant["quant_method"] == "compressed-tensors"
    assert quant["ignore"] == [*KIMI_INT4_SCHEME["ignore"], "re:.*mlp\\.gate$"]  # routers stay dense
    names = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    expert = "model.layers.1.mlp.experts.0.gate_proj"
    assert {f"{expert}.weight_packed", f"{expert}.weight_scale", f"{expert}.weight_shape"} <= set(names)
    assert f"{expert}.weight" not in names
    # Attention, the shared expert and the dense first layer stay dense, as in Kimi-K2.5's checkpoint.
    for dense in ("model.layers.1.self_attn.kv_b_proj.weight", "model.layers.1.mlp.shared_experts.up_proj.weight",
                  "model.layers.0.mlp.gate_proj.weight", "model.layers.1.mlp.gate.weight", "lm_head.weight"):
        assert dense in names, dense


def test_dequantized_copy_in_hf_is_what_the_packed_weights_mean(int4_kimi, tmp_path):
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    from eaglewatch.pipeline.tiny_model import dequantize_checkpoint

    packed_dir, _ = int4_kimi
    dense_dir = dequantize_checkpoint(packed_dir, tmp_path / "dense")
    assert "quantization_config" not in json.loads((dense_dir / "config.json").read_text())
    weight_map = json.loads((packed_dir / "model.safetensors.index.json").read_text())["weight_map"]

    def packed(module: str) -> dict:
        tensors = {}
        for suffix in ("weight_packed", "weight_scale", "weight_shape"):
            with safe_open(str(packed_dir / weight_map[f"{module}.{suffix}"]), "pt") as f:
                tensors[suffix] = f.get_tensor(f"{module}.{suffix}")
        return tensors

    scheme = WeightScheme(4, 32, True)
    dense = AutoModelForCausalLM.from_pretrained(dense_dir, dtype=torch.float32).eval()
    state = dense.state_dict()
    # transformers holds the experts fused: gate_up_proj [experts, 2 * inter, hidden], down_proj [experts, ...].
    for e in (0, 5):
        gate = decompress_weight(packed(f"model.layers.1.mlp.experts.{e}.gate_proj"), scheme)
        up = decompress_weight(packed(f"model.layers.1.mlp.experts.{e}.up_proj"), scheme)
        down = decompress_weight(packed(f"model.layers.1.mlp.experts.{e}.down_proj"), scheme)
        assert torch.equal(state["model.layers.1.mlp.experts.gate_up_proj"][e], torch.cat([gate, up]))
        assert torch.equal(state["model.layers.1.mlp.experts.down_proj"][e], down)
        # The values are on the INT4 grid: 16 levels per group of 32 inputs.
        assert all(len(torch.unique(row)) <= 16 for row in down.reshape(-1, 32)[:64])

    # transformers also reads the packed folder itself (compressed-tensors decompresses it): the same model.
    direct = AutoModelForCausalLM.from_pretrained(packed_dir, dtype=torch.float32).eval()
    ids = torch.tensor([[1, 17, 230, 5, 90, 42, 7, 3]])
    with torch.no_grad():
        a = dense(ids, output_hidden_states=True).hidden_states[-1]
        b = direct(ids, output_hidden_states=True).hidden_states[-1]
    assert torch.allclose(a, b, rtol=1e-4, atol=1e-5), (a - b).abs().max()
