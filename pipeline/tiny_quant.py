"""Compressed-tensors ``pack-quantized`` INT weights for tiny models: round-to-nearest, pack, unpack, dequantize.

A quantized target (Kimi-K2.5 INT4: 4-bit, group 32, symmetric, routed experts only) loads through vLLM's
packed-weight loader and its quantized MoE kernels. A random-weight miniature exercises the same path when its
checkpoint has the same layout, and round-to-nearest is enough for that: the kernels do not care how the integers
were chosen, so no calibration data is needed.

The layout, per quantized ``Linear`` of weight ``[out, in]`` with ``g`` = group size:

- ``weight_packed``: int32 ``[out, ceil(in / (32 / bits))]``. Each value ``q`` in ``[-2^(bits-1), 2^(bits-1) - 1]``
  is stored offset by ``2^(bits-1)`` (unsigned), ``32 / bits`` of them per int32 along the input dimension, the
  first in the lowest bits.
- ``weight_scale``: ``[out, in / g]`` in the model's dtype.
- ``weight_zero_point`` (asymmetric only): the integer zero points ``[out, in / g]``, packed the same way but along
  the output dimension: int32 ``[ceil(out / (32 / bits)), in / g]``.
- ``weight_shape``: int64 ``[2]``, the unpacked shape.

The real value is ``(q - zero_point) * scale``, per group of ``g`` input columns.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any

# What Kimi-K2 / K2.5 INT4 checkpoints declare: 4-bit integer weights in groups of 32, symmetric, on the routed
# experts only (attention, shared experts, dense MLPs and lm_head stay in bf16).
KIMI_INT4_SCHEME: dict[str, Any] = {
    "quant_method": "compressed-tensors",
    "format": "pack-quantized",
    "quantization_status": "compressed",
    "kv_cache_scheme": None,
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "input_activations": None,
            "output_activations": None,
            "weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 32,
                        "dynamic": False, "actorder": None, "block_structure": None, "observer": "minmax",
                        "observer_kwargs": {}},
        }
    },
    "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"],
}

# Names of 2-D weights that are not ``Linear`` layers vLLM quantizes: embeddings, and MoE routers (vLLM builds
# its router gates without the model's quantization).
_NOT_QUANTIZED = re.compile(r"(embed_tokens|wte|embeddings?|\.mlp\.gate|\.router)(\.weight)?$")


ROUTER_IGNORE = "re:.*mlp\\.gate$"


@dataclass(frozen=True)
class WeightScheme:
    num_bits: int
    group_size: int
    symmetric: bool

    @property
    def pack_factor(self) -> int:
        return 32 // self.num_bits

    @property
    def q_min(self) -> int:
        return -(1 << (self.num_bits - 1))

    @property
    def q_max(self) -> int:
        return (1 << (self.num_bits - 1)) - 1

    def describe(self) -> str:
        kind = "symmetric" if self.symmetric else "asymmetric"
        return f"INT{self.num_bits} pack-quantized, group {self.group_size}, {kind}"


@dataclass(frozen=True)
class PackedScheme:
    """A ``quantization_config`` this module can write: one weight scheme, targets ``Linear``, an ignore list."""

    weights: WeightScheme
    ignore: tuple[str, ...]
    config: dict[str, Any]  # the quantization_config as the checkpoint's config.json carries it
    assumed: str | None = None  # what was filled in because the target's config left it out

    def quantizes(self, module: str) -> bool:
        """Whether the ``Linear`` named ``module`` (checkpoint name without ``.weight``) is quantized."""
        if _NOT_QUANTIZED.search(module):
            return False
        for rule in self.ignore:
            if rule.startswith("re:"):
                if re.match(rule[3:], module):
                    return False
            elif module == rule or module.endswith("." + rule):
                return False
        return True


def packed_scheme(quantization_config: dict[str, Any] | None) -> PackedScheme | None:
    """The scheme to write for a target's ``quantization_config``; None when it is not packed INT weights.

    A config that names ``compressed-tensors`` / ``pack-quantized`` but no ``config_groups`` (some trimmed copies
    of Kimi-K2.5's config) gets Kimi's INT4 scheme, and says so in ``assumed``.
    """
    from eaglewatch.errors import UserError

    if not quantization_config:
        return None
    if quantization_config.get("quant_method") != "compressed-tensors":
        return None
    if quantization_config.get("format", "pack-quantized") != "pack-quantized":
        return None
    config = copy.deepcopy(quantization_config)
    assumed = None
    groups = config.get("config_groups")
    if not groups:
        for key in ("config_groups", "ignore", "quantization_status", "kv_cache_scheme"):
            config.setdefault(key, copy.deepcopy(KIMI_INT4_SCHEME[key]))
        config["config_groups"] = copy.deepcopy(KIMI_INT4_SCHEME["config_groups"])
        assumed = "no config_groups in the target's quantization_config: Kimi-K2's INT4 scheme assumed"
        groups = config["config_groups"]
    if len(groups) != 1:
        raise UserError(f"quantization_config has {len(groups)} config_groups; the tiny-model factory writes one")
    group = next(iter(groups.values()))
    weights = group.get("weights") or {}
    if group.get("input_activations") or weights.get("type", "int") != "int":
        raise UserError("quantization_config is not weight-only integer quantization; pack-quantized needs it")
    if weights.get("strategy", "group") != "group" or weights.get("actorder"):
        raise UserError(f"quantization strategy {weights.get('strategy')!r} (actorder {weights.get('actorder')!r})"
                        f" is not written by the tiny-model factory: it writes grouped round-to-nearest only")
    scheme = WeightScheme(num_bits=int(weights.get("num_bits", 4)), group_size=int(weights.get("group_size", 32)),
                          symmetric=bool(weights.get("symmetric", True)))
    if not 1 <= scheme.num_bits <= 8 or 32 % scheme.num_bits:
        raise UserError(f"num_bits {scheme.num_bits} does not pack into int32")
    config["format"] = "pack-quantized"
    config["quantization_status"] = "compressed"
    # Router gates are written dense; some vLLM models (Qwen3-MoE) build theirs with the model's quantization
    # unless the config ignores them, as llm-compressor's own MoE recipes do.
    ignore = list(config.get("ignore") or ())
    if ROUTER_IGNORE not in ignore:
        ignore.append(ROUTER_IGNORE)
    config["ignore"] = ignore
    return PackedScheme(scheme, tuple(ignore), config, assumed)


def quantize_rtn(weight: Any, scheme: WeightScheme) -> tuple[Any, Any, Any | None]:
    """Round-to-nearest per group of input columns: (int8 values, scales, int8 zero points or None)."""
    import torch

    out_features, in_features = weight.shape
    if in_features % scheme.group_size:
        raise ValueError(f"input size {in_features} is not a multiple of group size {scheme.group_size}")
    groups = weight.float().reshape(out_features, in_features // scheme.group_size, scheme.group_size)
    # 0 must be representable, as compressed-tensors' observers require.
    low = groups.amin(dim=2).clamp(max=0)
    high = groups.amax(dim=2).clamp(min=0)
    span = float(scheme.q_max - scheme.q_min)
    tiny = torch.finfo(torch.float32).eps
    if scheme.symmetric:
        scale = (torch.maximum(low.abs(), high) / (span / 2)).clamp(min=tiny)
        zero = torch.zeros_like(scale)
    else:
        scale = ((high - low) / span).clamp(min=tiny)
        zero = torch.clamp(torch.round(scheme.q_min - low / scale), scheme.q_min, scheme.q_max)
    q = torch.clamp(torch.round(groups / scale.unsqueeze(2) + zero.unsqueeze(2)), scheme.q_min, scheme.q_max)
    q = q.reshape(out_features, in_features).to(torch.int8)
    return q, scale, (None if scheme.symmetric else zero.to(torch.int8))


def pack_int32(values: Any, num_bits: int, dim: int = 1) -> Any:
    """Pack signed ``num_bits`` integers (int8 tensor, 2-D) into int32 along ``dim``, lowest bits first."""
    import torch

    if values.dtype != torch.int8 or values.dim() != 2:
        raise ValueError("pack_int32 takes a 2-D int8 tensor")
    per_word = 32 // num_bits
    unsigned = (values.to(torch.int32) + (1 << (num_bits - 1))) & ((1 << num_bits) - 1)
    if dim == 0:
        unsigned = unsigned.t()
    rows, cols = unsigned.shape
    pad = (-cols) % per_word
    if pad:
        unsigned = torch.nn.functional.pad(unsigned, (0, pad))
    words = unsigned.reshape(rows, -1, per_word)
    packed = torch.zeros(words.shape[:2], dtype=torch.int32)
    for i in range(per_word):
        # Shifting into bit 31 wraps to a negative int32, which is what the format stores.
        packed |= words[:, :, i] << (num_bits * i)
    return packed.t().contiguous() if dim == 0 else packed


def unpack_int32(packed: Any, num_bits: int, shape: tuple[int, int], dim: int = 1) -> Any:
    """The inverse of ``pack_int32``: signed values as int8 of ``shape``."""
    import torch

    per_word = 32 // num_bits
    mask = (1 << num_bits) - 1
    words = packed.t() if dim == 0 else packed
    parts = [(words >> (num_bits * i)) & mask for i in range(per_word)]
    unsigned = torch.stack(parts, dim=2).reshape(words.shape[0], -1)
    rows, cols = (shape[1], shape[0]) if dim == 0 else shape
    values = (unsigned[:rows, :cols] - (1 << (num_bits - 1))).to(torch.int8)
    return values.t().contiguous() if dim == 0 else values


def compress_weight(weight: Any, scheme: WeightScheme, scale_dtype: Any) -> dict[str, Any]:
    """The checkpoint tensors (suffixes after the module name) of one quantized ``Linear`` weight."""
    import torch

    q, scale, zero = quantize_rtn(weight, scheme)
    tensors = {"weight_packed": pack_int32(q, scheme.num_bits),
               "weight_scale": scale.to(scale_dtype).contiguous(),
               "weight_shape": torch.tensor(list(weight.shape), dtype=torch.int64)}
    if zero is not None:
        tensors["weight_zero_point"] = pack_int32(zero, scheme.num_bits, dim=0)
    return tensors


def decompress_weight(tensors: dict[str, Any], scheme: WeightScheme) -> Any:
    """The float32 weight that one module's packed tensors mean: ``(q - zero_point) * scale`` per group."""
    import torch

    out_features, in_features = (int(v) for v in tensors["weight_shape"].tolist())
    q = unpack_int32(tensors["weight_packed"], scheme.num_bits, (out_features, in_features)).float()
    scale = tensors["weight_scale"].float()
    n_groups = scale.shape[1]
    if "weight_zero_point" in tensors:
        zero = unpack_int32(tensors["weight_zero_point"], scheme.num_bits, (out_features, n_groups), dim=0).float()
    else:
        zero = torch.zeros_like(scale)
    grouped = q.reshape(out_features, n_groups, in_features // n_groups)
    return ((grouped - zero.unsqueeze(2)) * scale.unsqueeze(2)).reshape(out_features, in_features)


def quantize_state(state: dict[str, Any], scheme: PackedScheme, scale_dtype: Any) -> tuple[dict[str, Any], int]:
    """Replace every quantized ``Linear`` weight in ``state`` by its packed tensors; also return how many."""
    packed: dict[str, Any] = {}
    count = 0
    for name, tensor in state.items():
        module = name[: -len(".weight")] if name.endswith(".weight") else None
        if module is None or tensor.dim() != 2 or not scheme.quantizes(module):
            packed[name] = tensor
            continue
        for suffix, value in compress_weight(tensor, scheme.weights, scale_dtype).items():
            packed[f"{module}.{suffix}"] = value
        count += 1
    return packed, count


def dequantize_state(state: dict[str, Any], scheme: WeightScheme, dtype: Any) -> dict[str, Any]:
    """A dense state dict (``.weight`` in ``dtype``) from a packed one: what an unquantized loader can read."""
    modules = {name[: -len(".weight_packed")] for name in state if name.endswith(".weight_packed")}
    dense = {name: t for name, t in state.items()
             if not any(name.startswith(m + ".weight_") for m in modules)}
    for module in sorted(modules):
        parts = {k[len(module) + 1:]: v for k, v in state.items() if k.startswith(module + ".weight_")}
        dense[f"{module}.weight"] = decompress_weight(parts, scheme).to(dtype).contiguous()
    return dense


def weight_only_int_bits(quant: dict[str, Any]) -> int | None:
    """The weights' bit width when ``quant`` is weight-only integer quantization (the activations stay in the
    model dtype as far as the checkpoint says); None for anything else (W8A8, FP8, a format not known here).
    vLLM runs 4-bit ones of these on CPU through one kernel (``cpu_gemm_wna16``, see ``engines/cpu_kernels.py``)."""
    method = quant.get("quant_method")
    if method in ("gptq", "awq"):  # AWQ checkpoints name it w_bit or bits
        return int(quant.get("bits") or quant.get("w_bit") or 4)
    if method != "compressed-tensors":
        return None
    groups = quant.get("config_groups") or {}
    if not groups:  # a trimmed pack-quantized config (Kimi-K2.5's): INT4 weights
        return 4 if quant.get("format") == "pack-quantized" else None
    bits = set()
    for group in groups.values():
        weights = group.get("weights") or {}
        if group.get("input_activations") or weights.get("type", "int") != "int":
            return None
        bits.add(int(weights.get("num_bits", 4)))
    return bits.pop() if len(bits) == 1 else None
