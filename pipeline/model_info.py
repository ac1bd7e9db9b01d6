"""What eaglewatch needs to know about a model folder, read from its JSON files alone (no weights, no torch).

Everything here runs in milliseconds, before any engine is imported, so that a wrong path, a missing shard or an
impossible layer id fails the run at once rather than after an 18-minute load.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from eaglewatch.errors import UserError

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "fp8": 1}
DTYPE_ALIASES = {"fp32": "float32", "float": "float32", "half": "float16", "fp16": "float16", "bf16": "bfloat16"}


@dataclass(frozen=True)
class ModelInfo:
    path: Path
    config: dict[str, Any] = field(repr=False)
    model_type: str
    architectures: tuple[str, ...]
    num_hidden_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    dtype: str
    config_hash: str
    shards: tuple[str, ...]
    weights_bytes: int

    @property
    def is_mla(self) -> bool:
        return "kv_lora_rank" in self.text_config

    @property
    def text_config(self) -> dict[str, Any]:
        return self.config.get("text_config") or self.config


def normalise_dtype(dtype: str) -> str:
    dtype = DTYPE_ALIASES.get(dtype, dtype)
    if dtype not in DTYPE_BYTES:
        raise UserError(f"unknown dtype {dtype!r}; use one of {', '.join(sorted(DTYPE_BYTES))}")
    return dtype


def load_model_info(model_path: str | Path, *, check_shards: bool = True) -> ModelInfo:
    path = Path(model_path).expanduser()
    if not path.exists():
        raise UserError(f"model folder {path} does not exist")
    if not path.is_dir():
        raise UserError(f"model path {path} is not a folder")
    config_path = path / "config.json"
    try:
        raw = config_path.read_bytes()
        config = json.loads(raw)
    except FileNotFoundError:
        raise UserError(f"{config_path} is missing: is {path} a Hugging Face model folder?") from None
    except ValueError as exc:
        raise UserError(f"{config_path} is not valid JSON: {exc}") from None
    text = config.get("text_config") or config

    def need(key: str, *alts: str) -> int:
        for k in (key, *alts):
            if isinstance(text.get(k), int):
                return int(text[k])
        raise UserError(f"{config_path} has no {key!r}; cannot size the extraction")

    layers = need("num_hidden_layers", "n_layers", "num_layers")
    heads = need("num_attention_heads", "n_heads")
    kv_heads = int(text.get("num_key_value_heads") or heads)
    dtype_name = str(text.get("torch_dtype") or text.get("dtype") or config.get("torch_dtype") or "bfloat16")
    shards, weights_bytes = _shards(path) if check_shards else ((), 0)
    return ModelInfo(
        path=path,
        config=config,
        model_type=str(text.get("model_type") or config.get("model_type") or ""),
        architectures=tuple(config.get("architectures") or ()),
        num_hidden_layers=layers,
        hidden_size=need("hidden_size", "d_model", "n_embd"),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        vocab_size=need("vocab_size"),
        dtype=DTYPE_ALIASES.get(dtype_name, dtype_name),
        config_hash=hashlib.sha256(raw).hexdigest()[:16],
        shards=shards,
        weights_bytes=weights_bytes,
    )


def _shards(path: Path) -> tuple[tuple[str, ...], int]:
    """The weight files and their total size, checked against the safetensors index when there is one."""
    index_path = path / "model.safetensors.index.json"
    if index_path.exists():
        try:
            index = json.loads(index_path.read_text())
            names = sorted(set(index["weight_map"].values()))
        except (ValueError, KeyError, AttributeError) as exc:
            raise UserError(f"{index_path} is not a valid safetensors index: {exc}") from None
        missing = [n for n in names if not (path / n).is_file()]
        if missing:
            shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
            raise UserError(f"{path}: {len(missing)} of {len(names)} shards named in {index_path.name} are missing: "
                            f"{shown}")
        return tuple(names), sum((path / n).stat().st_size for n in names)
    singles = sorted(p.name for p in path.glob("*.safetensors"))
    if not singles:
        raise UserError(f"{path} holds no *.safetensors weights")
    return tuple(singles), sum((path / n).stat().st_size for n in singles)


def default_layer_ids(num_hidden_layers: int) -> list[int]:
    """The common EAGLE-3 choice: an early, a middle and a late layer, plus the last one."""
    n = num_hidden_layers
    return sorted({min(2, n), max(n // 2, 1), max(n - 3, 1), n})


def check_layer_ids(layer_ids: Sequence[int], num_hidden_layers: int) -> list[int]:
    """Reject ids vLLM would silently accept: negative, beyond the last layer, or repeated.

    Id k is the residual stream after k decoder layers (0 = embeddings, ``num_hidden_layers`` = last layer,
    before the final norm), in both engines.
    """
    ids = list(layer_ids)
    if not ids:
        raise UserError("--layer-ids is empty")
    bad = [i for i in ids if i < 0 or i > num_hidden_layers]
    if bad:
        raise UserError(
            f"layer ids {bad} are out of range for a model with {num_hidden_layers} layers: valid ids are "
            f"0..{num_hidden_layers} (0 = embeddings, {num_hidden_layers} = output of the last layer)"
        )
    repeated = sorted({i for i in ids if ids.count(i) > 1})
    if repeated:
        raise UserError(f"layer ids {repeated} are repeated in --layer-ids {' '.join(map(str, ids))}")
    return ids


def bytes_per_token(num_layers: int, hidden_size: int, dtype: str) -> int:
    """Output bytes per token: the hidden states dominate (token id and mask add 9 bytes)."""
    return num_layers * hidden_size * DTYPE_BYTES[normalise_dtype(dtype)] + 9
