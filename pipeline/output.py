"""The output folder: ``hs_{id}.safetensors`` per sample, ``manifest.json``, ``events.jsonl``.

Each sample file holds ``hidden_states [seq, n_layers, hidden]`` (model dtype), ``token_ids [seq]`` (int64) and
``loss_mask [seq]`` (int8): the layout the speculators EAGLE-3 trainer reads; the header's ``__metadata__`` holds
the sha256 of the token ids and loss mask (``SAMPLE_HASH_KEY``). With FP8 storage (``--storage fp8``) the file is
speculators 0.9's FP8 layout instead: ``hidden_states`` in float8_e4m3fn and ``hidden_states_scales [seq, 1, 1]``
(float32, each token's largest |value| over all its layers / 448), plus the quantization's own error per layer in
the metadata (``FP8_ERROR_KEY``), measured against the states as computed before they were rounded.

Files are written atomically (temporary name, fsync, rename; the temporary file is removed when a write fails), so
a file under its final name is complete; resuming checks each one's header against the manifest, and its hash
against the prepared sample of the same id, before skipping its sample.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import shutil
import struct
import sys
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from eaglewatch import __version__
from eaglewatch.errors import UserError
from eaglewatch.pipeline.regular import open_regular, read_regular

# The most a manifest is read of: a finished million-sample run's is well under this.
MANIFEST_LIMIT = 256 << 20

MANIFEST = "manifest.json"
EVENTS = "events.jsonl"
# Fields that must agree for outputs of two runs to be mixed in one folder.
IDENTITY_FIELDS = ("model_config_hash", "layer_ids", "dtype", "max_seq_len", "storage")
# What a manifest written before a field existed means by it.
IDENTITY_DEFAULTS: dict[str, Any] = {"storage": "dtype"}
# How the hidden states are stored: as computed (in the manifest's dtype), or in FP8 with one scale per token.
STORAGE_DTYPE, STORAGE_FP8 = "dtype", "fp8"
STORAGES = (STORAGE_DTYPE, STORAGE_FP8)
# speculators 0.9's FP8 layout (hs_connectors/fp8_utils.py): the tensor of per-token scales, and float8_e4m3fn's
# largest finite value, which each token's largest |value| is scaled to.
FP8_SCALES_KEY = "hidden_states_scales"
FP8_MAX = 448.0
FP8_MIN_SCALE = 1e-12
# The sample file's ``__metadata__`` key holding the FP8 rounding's error per layer, as the writer measured it
# against the states before rounding: ``{"mean": [...], "max": [...], "tokens": n}``, per token ``|fp8 - x| / |x|``
# over ``n`` of the sample's tokens (``fp8_error_tokens``).
FP8_ERROR_KEY = "eaglewatch_fp8_error"
FP8_ERROR_TOKENS = 64
SAFETENSORS_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16", "I64": "int64", "I8": "int8",
                      "F64": "float64", "I32": "int32", "U8": "uint8", "BOOL": "bool", "F8_E4M3": "fp8"}
SAFETENSORS_ITEM_BYTES = {"F32": 4, "BF16": 2, "F16": 2, "I64": 8, "I8": 1, "F64": 8, "I32": 4, "U8": 1, "BOOL": 1,
                          "F8_E4M3": 1}
# The sample file's ``__metadata__`` key holding the hash of its token ids and loss mask (``sample_hash``): resume
# compares it with the prepared data's sample of the same id, so that changed data is never taken for done work.
SAMPLE_HASH_KEY = "eaglewatch_sample_sha256"
DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def sample_path(output_dir: str | Path, sample_id: str) -> Path:
    return Path(output_dir) / f"hs_{sample_id}.safetensors"


def _hash_raw(token_ids: bytes, loss_mask: bytes) -> str:
    """sha256 of a sample's ``token_ids`` (int64) and ``loss_mask`` (int8) as the file stores them (little-endian)."""
    digest = hashlib.sha256(b"eaglewatch-sample/1\0")
    digest.update(len(token_ids).to_bytes(8, "little"))
    digest.update(token_ids)
    digest.update(loss_mask)
    return digest.hexdigest()


def sample_hash(token_ids: Sequence[int], loss_mask: Sequence[int]) -> str:
    """The hash a sample file of these token ids and this loss mask carries in its ``__metadata__``."""
    ids, mask = array("q", token_ids), array("b", loss_mask)
    if sys.byteorder == "big":
        ids.byteswap()
    return _hash_raw(ids.tobytes(), mask.tobytes())


TORCH_TO_SAFETENSORS = {"float32": "F32", "bfloat16": "BF16", "float16": "F16", "float64": "F64", "int64": "I64",
                        "int32": "I32", "int8": "I8", "uint8": "U8", "bool": "BOOL", "float8_e4m3fn": "F8_E4M3"}


def quantize_fp8(states: Any) -> tuple[Any, Any]:
    """``states [seq, ...]`` in float8_e4m3fn with one float32 scale per token (``[seq, 1, ...]``): each token's
    largest |value| over all its layers becomes 448. The same arithmetic as speculators'
    ``quantize_tensor_to_fp8`` (float32 values divided by ``amax / 448``), so that its reader's ``fp8 * scale``
    gives back what this writer meant; done in place on one float32 copy, since the writer threads pay for it."""
    import torch

    values = states.to(torch.float32, copy=True)
    if values.shape[0] == 0:  # a sample of no tokens: nothing to scale (a reshape to [0, -1] is ambiguous)
        return values.to(torch.float8_e4m3fn), torch.ones(0, *([1] * (values.dim() - 1)), device=values.device)
    flat = values.reshape(values.shape[0], -1)
    if flat.shape[1] == 0:
        amax = torch.zeros(values.shape[0])
    else:  # the largest and the smallest in one pass each: cheaper than abs() then amax(), and the same value
        amax = torch.maximum(flat.amax(dim=1), flat.amin(dim=1).neg())
    # Divided by a tensor, not a Python number: CUDA divides by a scalar as a multiplication by its reciprocal,
    # which moves the last bit of some scales, so a GPU's rounding would differ from the host's (and speculators').
    scales = (amax / torch.full_like(amax, FP8_MAX)).clamp(min=FP8_MIN_SCALE).reshape(-1, *([1] * (values.dim() - 1)))
    return values.div_(scales).to(torch.float8_e4m3fn), scales


def dequantize_fp8(fp8: Any, scales: Any) -> Any:
    """The float32 values an FP8 file stands for."""
    import torch

    return fp8.to(torch.float32) * scales.to(torch.float32)


def relative_token_errors(got: Any, ref: Any) -> Any:
    """Per token and layer, ``|got - ref| / |ref|`` (L2 norms over the hidden axis): ``[seq, layers]``."""
    ref = ref.float()
    return (got.float() - ref).norm(dim=-1) / ref.norm(dim=-1).clamp_min(1e-12)


def fp8_error_tokens(num_tokens: int) -> slice:
    """The tokens whose FP8 rounding error a file records: all of a short sample, evenly spaced ones of a long one
    (at most about ``2 * FP8_ERROR_TOKENS``). The error of one rounding hardly varies between tokens of a sample,
    and measuring it costs as much as the rounding itself (float8 converts back slowly on a CPU)."""
    return slice(0, num_tokens, max(1, num_tokens // FP8_ERROR_TOKENS))


def fp8_error_stats(states: Any, fp8: Any, scales: Any) -> tuple[Any, Any]:
    """Per layer, the mean and the largest per-token error of the stored values against ``states`` (what the
    engine computed), over ``fp8_error_tokens``: two tensors, on the device the states are on (a GPU writer copies
    them to the host with the values, and formats them there: ``fp8_error_text``)."""
    pick = fp8_error_tokens(states.shape[0])
    errors = relative_token_errors(dequantize_fp8(fp8[pick], scales[pick]), states[pick])
    if errors.numel() == 0:
        return errors.new_zeros((0,)), errors.new_zeros((0,))
    return errors.mean(dim=0), errors.amax(dim=0)


def fp8_error_text(means: Any, maxes: Any, tokens: int) -> str:
    """The metadata text of an FP8 file's own rounding error (``FP8_ERROR_KEY``)."""
    if tokens == 0 or means.numel() == 0:
        return json.dumps({"mean": [], "max": [], "tokens": 0})
    return json.dumps({"mean": [float(f"{v:.4g}") for v in means.tolist()],
                       "max": [float(f"{v:.4g}") for v in maxes.tolist()],
                       "tokens": len(range(*fp8_error_tokens(tokens).indices(tokens)))}, separators=(",", ":"))


def fp8_error_record(states: Any, fp8: Any, scales: Any) -> str:
    """The metadata text of an FP8 file's own rounding error: per layer, the mean and the largest per-token error
    of the stored values against ``states`` (what the engine computed), over ``fp8_error_tokens``."""
    means, maxes = fp8_error_stats(states, fp8, scales)
    return fp8_error_text(means, maxes, states.shape[0])


def encode_storage(tensors: dict[str, Any], storage: str) -> tuple[dict[str, Any], dict[str, str]]:
    """A sample's tensors as ``storage`` keeps them, and the metadata that goes with them: FP8 rounds the hidden
    states (``quantize_fp8``) and records the rounding's error per layer; the model dtype keeps them as they are."""
    if storage == STORAGE_DTYPE:
        return tensors, {}
    if storage != STORAGE_FP8:
        raise ValueError(f"unknown storage {storage!r}")
    states = tensors["hidden_states"]
    fp8, scales = quantize_fp8(states)
    return ({**tensors, "hidden_states": fp8, FP8_SCALES_KEY: scales},
            {FP8_ERROR_KEY: fp8_error_record(states, fp8, scales)})


def write_sample_file(path: str | Path, tensors: dict[str, Any], fsync: bool = True,
                      storage: str = STORAGE_DTYPE, metadata: dict[str, str] | None = None) -> int:
    """Write torch tensors to ``path`` in safetensors format, atomically; return the bytes written.

    The header is built here and each tensor's memory is written as it lies, with no serialised copy of the whole
    file in between: this is the hot path of extraction (about 56 KiB per token for a Kimi-sized model).
    Temporary name, fsync, rename: a file under its final name is always complete. ``fsync=False`` keeps the
    rename (a killed process still never leaves a partial file under a final name) but lets the kernel write the
    data back later: faster when the disk is the bottleneck, not safe against a power loss. ``storage`` is how the
    hidden states are kept (``encode_storage``): every engine's writer comes through here, so every format is
    written the same way. Tensors already encoded (the vLLM writer rounds to FP8 on the GPU) come with
    ``storage="dtype"`` and their ``metadata`` (the rounding's error record).
    """
    path = str(path)
    tensors, extra_metadata = encode_storage(tensors, storage)
    names = sorted(tensors)
    buffers = []
    metadata = {"format": "pt", **(metadata or {}), **extra_metadata}
    header: dict[str, Any] = {"__metadata__": metadata}
    offset = 0
    raw_of: dict[str, Any] = {}
    for name in names:
        tensor = tensors[name].detach().contiguous()
        dtype = TORCH_TO_SAFETENSORS[str(tensor.dtype).removeprefix("torch.")]
        raw = tensor.reshape(-1).view(torch_uint8()).numpy() if tensor.numel() else b""
        header[name] = {"dtype": dtype, "shape": list(tensor.shape), "data_offsets": [offset, offset + len(raw)]}
        buffers.append(raw)
        raw_of[name] = (dtype, raw)
        offset += len(raw)
    if raw_of.get("token_ids", ("",))[0] == "I64" and raw_of.get("loss_mask", ("",))[0] == "I8":
        metadata[SAMPLE_HASH_KEY] = _hash_raw(bytes(raw_of["token_ids"][1]), bytes(raw_of["loss_mask"][1]))
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    tmp = f"{path}.tmp.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
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
    except BaseException:
        # A full disk (or any failure) leaves nothing behind: no partial file under any name, and the space back.
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return 8 + len(head) + offset


def torch_uint8() -> Any:
    import torch

    return torch.uint8


def read_header(path: str | Path) -> dict[str, Any]:
    """The safetensors header (tensor dtypes, shapes, offsets), read without torch and without the data."""
    with open_regular(path) as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError("file is shorter than a safetensors header")
        (length,) = struct.unpack("<Q", head)
        size = os.fstat(f.fileno()).st_size
        if length > 100_000_000 or 8 + length > size:
            raise ValueError(f"implausible safetensors header length {length} in a file of {size} bytes")
        try:
            header = json.loads(f.read(length))
        except ValueError as exc:
            raise ValueError(f"the safetensors header is not valid JSON ({exc})") from None
    end = _check_header_layout(header)
    if 8 + length + end != size:
        raise ValueError(f"file is {size} bytes but its header describes {8 + length + end}")
    return header


def _check_header_layout(header: Any) -> int:
    """Raise ValueError unless ``header`` is a well-formed safetensors header; return where its data ends."""
    if not isinstance(header, dict):
        raise ValueError(f"the safetensors header is a JSON {type(header).__name__}, not an object")
    meta = header.get("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise ValueError("the safetensors __metadata__ is not a map of strings")
    end = 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(entry, dict):
            raise ValueError(f"tensor {name!r}: its header entry is not an object")
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if not isinstance(dtype, str) or dtype not in SAFETENSORS_ITEM_BYTES:
            raise ValueError(f"tensor {name!r}: unknown dtype {dtype!r}")
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise ValueError(f"tensor {name!r}: shape {shape!r} is not a list of sizes")
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(isinstance(o, int) for o in offsets)
                or not 0 <= offsets[0] <= offsets[1]):
            raise ValueError(f"tensor {name!r}: data_offsets {offsets!r} are not [begin, end]")
        if offsets[1] - offsets[0] != math.prod(shape) * SAFETENSORS_ITEM_BYTES[dtype]:
            raise ValueError(f"tensor {name!r}: {offsets[1] - offsets[0]} bytes of data for shape {shape} {dtype}")
        end = max(end, offsets[1])
    return end


@dataclass(frozen=True)
class ExpectedSample:
    num_tokens: int
    num_layers: int
    hidden_size: int
    dtype: str
    # ``sample_hash`` of the prepared sample: a file of other token ids or another loss mask is not this sample.
    sample_hash: str | None = None
    storage: str = STORAGE_DTYPE


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
    if expected.storage == STORAGE_FP8:
        if hs["dtype"] != "F8_E4M3":
            return f"hidden_states are {dtype}, expected fp8 (float8_e4m3fn) storage"
        scales = header.get(FP8_SCALES_KEY)
        if scales is None:
            return f"no {FP8_SCALES_KEY} tensor (fp8 storage keeps one scale per token)"
        if scales.get("dtype") != "F32" or scales.get("shape") != [shape[0], 1, 1]:
            return (f"{FP8_SCALES_KEY} is {SAFETENSORS_DTYPES.get(scales.get('dtype'), scales.get('dtype'))} "
                    f"{scales.get('shape')}, expected float32 [{shape[0]}, 1, 1]")
        return None
    if dtype != expected.dtype:
        return f"dtype {dtype}, expected {expected.dtype}"
    return None


def fp8_error_of(header: dict[str, Any]) -> dict[str, list[float]] | None:
    """The FP8 rounding error an FP8 file's writer recorded (``FP8_ERROR_KEY``), or None when there is none (a
    file of another writer) or it cannot be read."""
    raw = header.get("__metadata__", {}).get(FP8_ERROR_KEY)
    if not raw:
        return None
    try:
        record = json.loads(raw)
    except ValueError:
        return None
    if (not isinstance(record, dict) or not all(isinstance(record.get(k), list) for k in ("mean", "max"))
            or not all(isinstance(v, (int, float)) for k in ("mean", "max") for v in record[k])):
        return None
    tokens = record.get("tokens")
    return {"mean": [float(v) for v in record["mean"]], "max": [float(v) for v in record["max"]],
            "tokens": [float(tokens)] if isinstance(tokens, int) and tokens >= 0 else []}


@dataclass
class Fp8ErrorSummary:
    """The FP8 rounding error of many files, per layer: the token-weighted mean of their recorded means, and the
    largest per-token error any of them recorded."""

    layer_ids: list[int]
    files: int = 0
    tokens: int = 0
    without_record: int = 0
    _sums: list[float] | None = None
    _maxes: list[float] | None = None

    def add(self, header: dict[str, Any]) -> None:
        record = fp8_error_of(header)
        hs = header.get("hidden_states") or {}
        tokens = int(record["tokens"][0]) if record and record["tokens"] else (hs.get("shape") or [0])[0]
        if record is None or len(record["mean"]) != len(self.layer_ids) or len(record["max"]) != len(self.layer_ids):
            self.without_record += 1
            return
        if self._sums is None or self._maxes is None:
            self._sums, self._maxes = [0.0] * len(self.layer_ids), [0.0] * len(self.layer_ids)
        for j, (mean, largest) in enumerate(zip(record["mean"], record["max"])):
            self._sums[j] += mean * tokens
            self._maxes[j] = max(self._maxes[j], largest)
        self.files += 1
        self.tokens += tokens

    def as_dict(self) -> dict[str, Any]:
        layers = []
        if self._sums is not None and self._maxes is not None and self.tokens:
            layers = [{"layer_id": k, "mean_error": round(total / self.tokens, 6), "max_error": largest}
                      for k, total, largest in zip(self.layer_ids, self._sums, self._maxes)]
        return {"measure": "per-token |fp8 - computed| / |computed| (L2 over hidden), recorded by the writer over "
                           "evenly spaced tokens of each file (all of a short one)",
                "files": self.files, "tokens": self.tokens, "files_without_record": self.without_record,
                "layers": layers}


def stored_sample_hash(path: Path, header: dict[str, Any]) -> str | None:
    """The ``sample_hash`` of what the file holds: from its metadata, or (files written without it) computed from
    its ``token_ids`` and ``loss_mask`` tensors. None when they are not int64 and int8."""
    recorded = header.get("__metadata__", {}).get(SAMPLE_HASH_KEY)
    if recorded:
        return str(recorded)
    ids, mask = header.get("token_ids"), header.get("loss_mask")
    if not ids or not mask or ids.get("dtype") != "I64" or mask.get("dtype") != "I8":
        return None
    with open_regular(path) as f:
        (length,) = struct.unpack("<Q", f.read(8))
        f.seek(8 + length + ids["data_offsets"][0])
        raw_ids = f.read(ids["data_offsets"][1] - ids["data_offsets"][0])
        f.seek(8 + length + mask["data_offsets"][0])
        raw_mask = f.read(mask["data_offsets"][1] - mask["data_offsets"][0])
    return _hash_raw(raw_ids, raw_mask)


# What resume finds for a sample (``sample_status``).
MISSING, INCOMPLETE, CHANGED, COMPLETE = "missing", "incomplete", "changed", "complete"


def sample_status(path: Path, expected: ExpectedSample) -> str:
    """``complete`` (the file is this sample, whole), ``changed`` (a whole file of other token ids or loss mask),
    ``incomplete`` (unreadable, or of another shape, dtype or layer count) or ``missing``."""
    try:
        header = read_header(path)
    except FileNotFoundError:
        return MISSING
    except (OSError, ValueError, KeyError, TypeError):
        return INCOMPLETE
    if check_sample_header(header, expected) is not None:
        return INCOMPLETE
    if expected.sample_hash is None:
        return COMPLETE
    try:
        stored = stored_sample_hash(path, header)
    except OSError:
        return INCOMPLETE
    return COMPLETE if stored == expected.sample_hash else CHANGED


def is_complete(path: Path, expected: ExpectedSample) -> bool:
    return sample_status(path, expected) == COMPLETE


def read_manifest_file(path: str | Path, fix: str = "move it away or use --force-new") -> dict[str, Any] | None:
    """The manifest at ``path`` (None when there is none); a damaged one is a UserError ending in ``fix``."""
    path = Path(path)
    tail = f"; {fix}" if fix else ""
    if path.is_dir():
        raise UserError(f"{path} is a folder, not a manifest file{tail}")
    try:
        raw = read_regular(path, MANIFEST_LIMIT)
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise UserError(f"{path} is a folder, not a manifest file{tail}") from None
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}{tail}") from None
    try:
        manifest = json.loads(raw)
    except ValueError as exc:
        raise UserError(f"{path} is not valid JSON ({exc}){tail}") from None
    if not isinstance(manifest, dict):
        raise UserError(f"{path} is not an eaglewatch manifest (a JSON {type(manifest).__name__}, not an object)"
                        f"{tail}")
    return manifest


def read_manifest(output_dir: str | Path) -> dict[str, Any] | None:
    return read_manifest_file(Path(output_dir) / MANIFEST)


def write_manifest_file(path: str | Path, manifest: dict[str, Any]) -> None:
    """Replace the manifest atomically, so a reader never sees half of it (nor a half-written one, disk full)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def identity_value(manifest: dict[str, Any], key: str) -> Any:
    """A manifest's identity field, with what an older manifest that lacks it means by it."""
    return manifest.get(key, IDENTITY_DEFAULTS.get(key))


def check_resume(existing: dict[str, Any], wanted: dict[str, Any], output_dir: Path) -> None:
    """Refuse to mix outputs made with another model, other layers, dtype, max-seq-len or storage."""
    diffs = [
        f"{key}: folder has {identity_value(existing, key)!r}, this run wants {identity_value(wanted, key)!r}"
        for key in IDENTITY_FIELDS
        if identity_value(existing, key) != identity_value(wanted, key)
    ]
    if diffs:
        raise UserError(
            f"{output_dir} holds outputs of a different extraction ("
            + "; ".join(diffs)
            + "). Use another --output-dir, or --force-new to delete them and start over."
        )


def clear_outputs(output_dir: Path, manifest_name: str = MANIFEST, sample_ids: Iterable[str] | None = None) -> int:
    """Delete an earlier extraction's sample files and manifest (for --force-new); return how many.

    ``sample_ids`` limits it to those samples' files (one rank's share: the other ranks' files are theirs). The
    events file is kept: it is the folder's history, and this run appends to it.
    """
    paths = _sample_files(output_dir, sample_ids, lambda name, final: True)
    manifest = output_dir / manifest_name
    if manifest.is_dir():
        raise UserError(f"{manifest} is a folder, not a manifest file; move it away")
    removed = 0
    for path in [*paths, manifest]:
        try:
            path.unlink()
            removed += 1
        except FileNotFoundError:
            pass
        except IsADirectoryError:
            raise UserError(f"{path} is a folder where a sample file goes; move it away") from None
    return removed


def _sample_files(output_dir: Path, sample_ids: Iterable[str] | None, keep: Any) -> list[Path]:
    """Files of the folder that belong to a sample (its file, temporaries, ``.failed`` marker), in one listing;
    ``keep(name, final_name)`` chooses among them, ``sample_ids`` (when given) limits them to those samples."""
    wanted = None if sample_ids is None else {sample_path(output_dir, sid).name for sid in sample_ids}
    found = []
    for name in sorted(os.listdir(output_dir)):
        if not name.startswith("hs_") or ".safetensors" not in name:
            continue
        final = name[: name.index(".safetensors") + len(".safetensors")]
        if (wanted is None or final in wanted) and keep(name, final):
            found.append(output_dir / name)
    return found


def prepare_folder(output_dir: Path) -> None:
    """Make sure ``output_dir`` is a folder (creating it), or say clearly why it cannot be one."""
    if os.path.lexists(output_dir) and not output_dir.is_dir():
        if output_dir.is_symlink():
            raise UserError(f"output folder {output_dir} is a symbolic link that leads to no folder "
                            f"(it points to {os.readlink(output_dir)!r}, missing or a loop)")
        raise UserError(f"output folder {output_dir} is a file, not a folder")
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        where = f" at {exc.filename}" if exc.filename and str(exc.filename) != str(output_dir) else ""
        raise UserError(f"output folder {output_dir} is not writable: cannot create it "
                        f"({exc.strerror or exc}{where})") from None


def check_writable(output_dir: Path) -> None:
    prepare_folder(output_dir)
    try:
        probe = output_dir / f".eaglewatch-write-test.{os.getpid()}"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as exc:
        raise UserError(f"output folder {output_dir} is not writable: {exc.strerror or exc}") from None


def filesystem_of(path: Path) -> str:
    """The mount point holding ``path`` (what a "disk full" message names)."""
    current = Path(os.path.abspath(path))
    while not os.path.ismount(current) and current != current.parent:
        current = current.parent
    return str(current)


def is_disk_full(exc: BaseException) -> bool:
    """An error of a full filesystem (or quota): OSError, or an engine's write failure that carries its errno."""
    return getattr(exc, "errno", None) in DISK_FULL_ERRNOS


def describe_os_error(exc: OSError) -> str:
    """One line for an OSError about a path the user gave (permissions, a loop of links, a folder for a file)."""
    where = " -> ".join(str(f) for f in (exc.filename, exc.filename2) if f is not None)
    return f"{where}: {exc.strerror or exc}" if where else str(exc.strerror or exc)


def check_free_space(output_dir: Path, needed_bytes: int, margin: float = 1.05) -> int:
    free = shutil.disk_usage(output_dir).free
    if free < needed_bytes * margin:
        raise UserError(
            f"not enough disk for the output: about {needed_bytes / 2**30:.2f} GiB needed, {free / 2**30:.2f} GiB free "
            f"on the filesystem of {output_dir}"
        )
    return free


def base_manifest(**fields: Any) -> dict[str, Any]:
    return {"format": "eaglewatch-hidden-states/1", "eaglewatch_version": __version__, **fields}


def stale_temporaries(output_dir: Path, sample_ids: Iterable[str] | None = None) -> list[Path]:
    """Temporary files left by a killed writer, and the ``.failed`` markers of an earlier run's failed writes (a
    resumed run writes those samples again); never under a final name, safe to delete on resume by the folder's
    lock holder. ``sample_ids`` limits them to those samples' (one rank's share)."""
    return _sample_files(output_dir, sample_ids,
                         lambda name, final: name.startswith(final + ".tmp.") or name == final + ".failed")
