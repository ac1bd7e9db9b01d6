"""What eaglewatch needs to know about a model folder, read from its JSON files alone (no weights, no torch).

Everything here runs in milliseconds, before any engine is imported, so that a wrong path, a missing shard or an
impossible layer id fails the run at once rather than after an 18-minute load.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from eaglewatch.errors import UserError
from eaglewatch.pipeline.regular import open_regular, read_regular

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "fp8": 1}
DTYPE_ALIASES = {"fp32": "float32", "float": "float32", "half": "float16", "fp16": "float16", "bf16": "bfloat16"}
INDEX = "model.safetensors.index.json"
# Bits per element of the safetensors dtypes; a dtype not listed here is not size-checked (a newer format).
SAFETENSORS_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "F8_E8M0": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "I64": 64, "U64": 64,
    "F64": 64, "C64": 64, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}
MAX_HEADER_BYTES = 100_000_000  # safetensors' own limit


@dataclass(frozen=True)
class Index:
    """The safetensors index: which shard holds each tensor, and the total it declares."""
    weight_map: dict[str, str]  # tensor name -> shard file name
    total_size: int | None


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
    index: Index | None = field(default=None, repr=False)  # None: a single-file model, or shards not read

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


# Bounds on what a model folder's JSON files are read of: far above any published config (kilobytes) or index
# (a few MB for a 1T-parameter checkpoint's tens of thousands of tensors).
CONFIG_LIMIT = 64 << 20
INDEX_LIMIT = 256 << 20


def load_model_info(model_path: str | Path, *, check_shards: bool = True) -> ModelInfo:
    path = Path(model_path).expanduser()
    if not path.exists():
        raise UserError(f"model folder {path} does not exist")
    if not path.is_dir():
        raise UserError(f"model path {path} is not a folder")
    config_path = path / "config.json"
    try:
        raw = read_regular(config_path, CONFIG_LIMIT)
        config = json.loads(raw)
    except FileNotFoundError:
        raise UserError(f"{config_path} is missing: is {path} a Hugging Face model folder?") from None
    except ValueError as exc:
        raise UserError(f"{config_path} is not valid JSON: {exc}") from None
    except OSError as exc:
        raise UserError(f"cannot read {config_path}: {exc.strerror or exc}") from None
    if not isinstance(config, dict):
        raise UserError(f"{config_path} holds a JSON {type(config).__name__}, not an object")
    text = config.get("text_config") or config
    if not isinstance(text, dict):
        raise UserError(f"{config_path}: text_config is a {type(text).__name__}, not an object")

    def count(key: str, value: Any) -> int:
        if type(value) is not int or value < 1:
            raise UserError(f"{config_path} has {key} {json.dumps(value)}, not a positive whole number")
        return value

    def need(key: str, *alts: str) -> int:
        for k in (key, *alts):
            if text.get(k) is not None:
                return count(k, text[k])
        raise UserError(f"{config_path} has no {key!r}; cannot size the extraction")

    layers = need("num_hidden_layers", "n_layers", "num_layers")
    heads = need("num_attention_heads", "n_heads")
    kv_value = text.get("num_key_value_heads")
    kv_heads = count("num_key_value_heads", kv_value) if kv_value else heads
    architectures = config.get("architectures") or []
    if isinstance(architectures, str):
        architectures = [architectures]
    if not isinstance(architectures, list) or not all(isinstance(a, str) for a in architectures):
        raise UserError(f"{config_path} has architectures {json.dumps(architectures)[:100]}, not a list of names")
    dtype_name = str(text.get("torch_dtype") or text.get("dtype") or config.get("torch_dtype") or "bfloat16")
    shards, weights_bytes, index = _shards(path) if check_shards else ((), 0, None)
    return ModelInfo(
        path=path,
        config=config,
        model_type=str(text.get("model_type") or config.get("model_type") or ""),
        architectures=tuple(architectures),
        num_hidden_layers=layers,
        hidden_size=need("hidden_size", "d_model", "n_embd"),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        vocab_size=need("vocab_size"),
        dtype=DTYPE_ALIASES.get(dtype_name, dtype_name),
        config_hash=hashlib.sha256(raw).hexdigest()[:16],
        shards=shards,
        weights_bytes=weights_bytes,
        index=index,
    )


def read_index(path: Path) -> Index | None:
    """The folder's safetensors index, checked for shape; None when the folder has none."""
    index_path = path / INDEX
    if not index_path.exists():
        return None
    try:
        index = json.loads(read_regular(index_path, INDEX_LIMIT))
    except ValueError as exc:
        raise UserError(f"{index_path} is not valid JSON: {exc}") from None
    except OSError as exc:
        raise UserError(f"cannot read {index_path}: {exc.strerror or exc}") from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise UserError(f"{index_path} is not a valid safetensors index: no weight_map object naming the shards")
    odd = next((k for k, v in weight_map.items() if not isinstance(v, str) or not v), None)
    if odd is not None:
        raise UserError(f"{index_path} is not a valid safetensors index: tensor {odd!r} maps to "
                        f"{weight_map[odd]!r}, not a file name")
    metadata = index.get("metadata")
    total = metadata.get("total_size") if isinstance(metadata, dict) else None
    if total is not None and (not isinstance(total, (int, float)) or isinstance(total, bool)):
        total = None  # some exporters write it as a string; only a number can be compared
    return Index(weight_map=weight_map, total_size=int(total) if total is not None else None)


def _shards(path: Path) -> tuple[tuple[str, ...], int, Index | None]:
    """The weight files and their total size, checked against the safetensors index when there is one."""
    index = read_index(path)
    if index is not None:
        names = sorted(set(index.weight_map.values()))
        odd = next((n for n in names if (path / n).exists() and not (path / n).is_file()), None)
        if odd is not None:  # a FIFO or a device (a link to /dev/zero): never opened, let alone read
            raise UserError(f"{path}: the shard {odd} named in {INDEX} is not a regular file")
        missing = [n for n in names if not (path / n).is_file()]
        if missing:
            shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
            raise UserError(f"{path}: {len(missing)} of {len(names)} shards named in {INDEX} are missing: "
                            f"{shown}")
        return tuple(names), sum((path / n).stat().st_size for n in names), index
    singles = sorted(p.name for p in path.glob("*.safetensors"))
    if not singles:
        raise UserError(f"{path} holds no *.safetensors weights")
    return tuple(singles), sum((path / n).stat().st_size for n in singles), None


class ShardError(ValueError):
    """A weight file that a loader would reject; the message says what is wrong with it (after the file's name).
    A file whose size disagrees with its header also carries both sizes."""

    def __init__(self, message: str, *, expected_size: int | None = None, actual_size: int | None = None) -> None:
        super().__init__(message)
        self.expected_size = expected_size
        self.actual_size = actual_size


@dataclass(frozen=True)
class ShardLayout:
    """What a safetensors file's header says, checked against the file itself."""
    tensors: dict[str, dict[str, Any]]  # name -> {"dtype", "shape", "data_offsets"}
    data_bytes: int
    file_size: int


def read_shard_layout(path: Path) -> ShardLayout:
    """Read a safetensors header and check it the way the loader will: sane offsets that tile the data without
    gaps or overlaps, each tensor's bytes matching its dtype and shape, and 8 + header + data == the file's size.
    Reads the header only (kilobytes), never the weights."""
    with open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(8)
        if len(head) < 8:
            raise ShardError(f"is {size} bytes, too short to hold a safetensors header")
        (length,) = struct.unpack("<Q", head)
        if length > MAX_HEADER_BYTES:
            raise ShardError(f"declares a {length}-byte header, beyond safetensors' limit: not a safetensors file")
        if 8 + length > size:
            raise ShardError(f"is truncated: {size} bytes, but its header alone needs {8 + length}",
                             expected_size=8 + length, actual_size=size)
        raw = f.read(length)
    try:
        header = json.loads(raw)
    except ValueError as exc:
        raise ShardError(f"has a header that is not valid JSON ({exc})") from None
    if not isinstance(header, dict):
        raise ShardError("has a header that is not a JSON object")
    header.pop("__metadata__", None)
    spans = []
    bits_of = SAFETENSORS_BITS.get
    # One pass over often 100k entries: plain type tests, no helpers per tensor, so that checking every shard of a
    # large checkpoint stays a fraction of a second.
    for name, entry in header.items():
        try:
            begin, end = entry["data_offsets"]
            dtype, shape = entry["dtype"], entry["shape"]
        except (TypeError, KeyError, ValueError):
            raise ShardError(f"has a malformed entry for tensor {name!r}: {_shown(entry)}") from None
        if type(begin) is not int or type(end) is not int or type(dtype) is not str or type(shape) is not list:
            raise ShardError(f"has a malformed entry for tensor {name!r}: {_shown(entry)}")
        if not 0 <= begin <= end:
            raise ShardError(f"has bad offsets for tensor {name!r}: [{begin}, {end}]")
        bits = bits_of(dtype)
        if bits is not None:  # a dtype unknown here (a newer format) is not size-checked
            count = math.prod(shape)
            if type(count) is not int or (shape and min(shape) < 0):
                raise ShardError(f"has a malformed shape for tensor {name!r}: {_shown(shape)}")
            if count * bits != (end - begin) * 8:
                need = count * bits / 8 if count * bits % 8 else count * bits // 8
                raise ShardError(f"has bad offsets for tensor {name!r}: {dtype} {shape} needs {need} bytes, its "
                                 f"offsets give {end - begin}")
        spans.append((begin, end, name))
    spans.sort()
    at = 0
    for begin, end, name in spans:
        if begin != at:
            what = "overlaps the tensor before it" if begin < at else f"leaves a {begin - at}-byte gap before it"
            raise ShardError(f"has bad offsets: tensor {name!r} starts at byte {begin} and {what}")
        at = end
    expected = 8 + length + at
    if size != expected:
        what = (f"is truncated: {size} bytes, but its header describes {expected} ({expected - size} bytes missing)"
                if size < expected else
                f"is {size} bytes, but its header describes {expected} ({size - expected} bytes too many)")
        raise ShardError(what, expected_size=expected, actual_size=size)
    return ShardLayout(tensors=header, data_bytes=at, file_size=size)


def _shown(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 200 else text[:197] + "..."


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
