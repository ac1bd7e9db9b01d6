"""The output folder: ``hs_{id}.safetensors`` per sample, ``manifest.json``, ``events.jsonl``.

Each sample file holds ``hidden_states [seq, n_layers, hidden]`` (model dtype), ``token_ids [seq]`` (int64) and
``loss_mask [seq]`` (int8): the layout the speculators EAGLE-3 trainer reads. Files are written atomically
(temporary name, fsync, rename), so a file under its final name is complete; resuming checks each one's header
against the manifest before skipping its sample.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from eaglewatch import __version__
from eaglewatch.errors import UserError

MANIFEST = "manifest.json"
EVENTS = "events.jsonl"
# Fields that must agree for outputs of two runs to be mixed in one folder.
IDENTITY_FIELDS = ("model_config_hash", "layer_ids", "dtype", "max_seq_len")
SAFETENSORS_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16", "I64": "int64", "I8": "int8",
                      "F64": "float64", "I32": "int32", "U8": "uint8", "BOOL": "bool", "F8_E4M3": "fp8"}


def sample_path(output_dir: str | Path, sample_id: str) -> Path:
    return Path(output_dir) / f"hs_{sample_id}.safetensors"


TORCH_TO_SAFETENSORS = {"float32": "F32", "bfloat16": "BF16", "float16": "F16", "float64": "F64", "int64": "I64",
                        "int32": "I32", "int8": "I8", "uint8": "U8", "bool": "BOOL"}


def write_sample_file(path: str | Path, tensors: dict[str, Any], fsync: bool = True) -> int:
    """Write torch tensors to ``path`` in safetensors format, atomically; return the bytes written.

    The header is built here and each tensor's memory is written as it lies, with no serialised copy of the whole
    file in between: this is the hot path of extraction (about 56 KiB per token for a Kimi-sized model).
    Temporary name, fsync, rename: a file under its final name is always complete. ``fsync=False`` keeps the
    rename (a killed process still never leaves a partial file under a final name) but lets the kernel write the
    data back later: faster when the disk is the bottleneck, not safe against a power loss.
    """
    path = str(path)
    names = sorted(tensors)
    buffers = []
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name in names:
        tensor = tensors[name].detach().contiguous()
        dtype = TORCH_TO_SAFETENSORS[str(tensor.dtype).removeprefix("torch.")]
        raw = tensor.reshape(-1).view(torch_uint8()).numpy() if tensor.numel() else b""
        header[name] = {"dtype": dtype, "shape": list(tensor.shape), "data_offsets": [offset, offset + len(raw)]}
        buffers.append(raw)
        offset += len(raw)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    tmp = f"{path}.tmp.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for chunk in (struct.pack("<Q", len(head)), head, *buffers):
            view = memoryview(chunk).cast("B")
            while view:
                view = view[os.write(fd, view):]
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return 8 + len(head) + offset


def torch_uint8() -> Any:
    import torch

    return torch.uint8


def read_header(path: str | Path) -> dict[str, Any]:
    """The safetensors header (tensor dtypes, shapes, offsets), read without torch and without the data."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError("file is shorter than a safetensors header")
        (length,) = struct.unpack("<Q", head)
        if length > 100_000_000:
            raise ValueError("implausible safetensors header length")
        header = json.loads(f.read(length))
        size = os.fstat(f.fileno()).st_size
    end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    if 8 + length + end != size:
        raise ValueError(f"file is {size} bytes but its header describes {8 + length + end}")
    return header


@dataclass(frozen=True)
class ExpectedSample:
    num_tokens: int
    num_layers: int
    hidden_size: int
    dtype: str


def check_sample_header(header: dict[str, Any], expected: ExpectedSample) -> str | None:
    """Why this header does not match the expected sample, or None when it does."""
    hs = header.get("hidden_states")
    if hs is None:
        return "no hidden_states tensor"
    for name in ("token_ids", "loss_mask"):
        if name not in header:
            return f"no {name} tensor"
    shape = hs["shape"]
    if len(shape) != 3:
        return f"hidden_states has {len(shape)} dimensions, expected 3 [seq, layers, hidden]"
    if shape[1] != expected.num_layers:
        return f"hidden_states holds {shape[1]} layers, expected {expected.num_layers}"
    if shape[0] != expected.num_tokens or header["token_ids"]["shape"] != [expected.num_tokens]:
        return f"hidden_states covers {shape[0]} tokens, expected {expected.num_tokens}"
    if shape[2] != expected.hidden_size:
        return f"hidden size {shape[2]}, expected {expected.hidden_size}"
    dtype = SAFETENSORS_DTYPES.get(hs["dtype"], hs["dtype"])
    if dtype != expected.dtype:
        return f"dtype {dtype}, expected {expected.dtype}"
    return None


def is_complete(path: Path, expected: ExpectedSample) -> bool:
    try:
        return check_sample_header(read_header(path), expected) is None
    except (OSError, ValueError, KeyError, TypeError):
        return False


def read_manifest_file(path: str | Path) -> dict[str, Any] | None:
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except ValueError as exc:
        raise UserError(f"{path} is not valid JSON ({exc}); move it away or use --force-new") from None


def read_manifest(output_dir: str | Path) -> dict[str, Any] | None:
    return read_manifest_file(Path(output_dir) / MANIFEST)


def write_manifest_file(path: str | Path, manifest: dict[str, Any]) -> None:
    """Replace the manifest atomically, so a reader never sees half of it."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def check_resume(existing: dict[str, Any], wanted: dict[str, Any], output_dir: Path) -> None:
    """Refuse to mix outputs made with another model, other layers, dtype or max-seq-len."""
    diffs = [
        f"{key}: folder has {existing.get(key)!r}, this run wants {wanted.get(key)!r}"
        for key in IDENTITY_FIELDS
        if existing.get(key) != wanted.get(key)
    ]
    if diffs:
        raise UserError(
            f"{output_dir} holds outputs of a different extraction ("
            + "; ".join(diffs)
            + "). Use another --output-dir, or --force-new to delete them and start over."
        )


def clear_outputs(output_dir: Path, manifest_name: str = MANIFEST) -> int:
    """Delete an earlier extraction's sample files and manifest (for --force-new); return how many.

    The events file is kept: it is the folder's history, and this run appends to it.
    """
    removed = 0
    for path in [*output_dir.glob("hs_*.safetensors*"), output_dir / manifest_name]:
        if path.exists():
            path.unlink()
            removed += 1
    return removed


def check_writable(output_dir: Path) -> None:
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        probe = output_dir / f".eaglewatch-write-test.{os.getpid()}"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as exc:
        raise UserError(f"output folder {output_dir} is not writable: {exc.strerror or exc}") from None


def check_free_space(output_dir: Path, needed_bytes: int, margin: float = 1.05) -> int:
    free = shutil.disk_usage(output_dir).free
    if free < needed_bytes * margin:
        raise UserError(
            f"not enough disk for the output: about {needed_bytes / 1e9:.2f} GB needed, {free / 1e9:.2f} GB free "
            f"on the filesystem of {output_dir}"
        )
    return free


def base_manifest(**fields: Any) -> dict[str, Any]:
    return {"format": "eaglewatch-hidden-states/1", "eaglewatch_version": __version__, **fields}


def stale_temporaries(output_dir: Path) -> Iterable[Path]:
    """Temporary files left by a killed writer; never under a final name, safe to delete on resume."""
    return output_dir.glob("hs_*.safetensors.tmp.*")
