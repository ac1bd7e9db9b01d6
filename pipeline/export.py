"""``eaglewatch export --format speculators``: make an output folder one that ``speculators train`` reads unchanged.

speculators (0.9) reads, under ``--data-path D``:

- an Arrow dataset saved with ``datasets.save_to_disk`` (columns ``input_ids`` and ``loss_mask``, int64 lists, and
  ``seq_len``; torch format), whose row ``r`` is a training sample;
- ``D/hidden_states/hs_{r}.safetensors`` for row ``r``: ``hidden_states [seq, layers, hidden]`` whose **last** layer
  is the verifier's final state and the others the draft's auxiliary inputs, and ``token_ids`` equal to the row's
  ``input_ids`` (the loss mask comes from the row, never from the file);
- ``token_freq.pt`` (``{token_id: count}`` over masked tokens) and, for a draft vocabulary of N tokens,
  ``d2t-N.npy`` / ``t2d-N.npy``.

The export writes all of that into the output folder itself, beside eaglewatch's own files: the dataset's files at
the top, and ``hidden_states/`` holding one relative symbolic link per row to the sample's file (no tensor is
copied). Rows follow the prepared data's order; the dataset's ``sample_id`` column and ``speculators.json`` lead
from a row back to eaglewatch's sample. eaglewatch's files are left as they are, so resume and ``verify`` work as
before; exporting again replaces what an earlier export wrote.

``extract --format speculators`` writes this same view at the end of its run (``export_speculators``): one writer
of sample files, and the view over them. FP8 files (``--storage fp8``) are speculators' own FP8 layout; its trainer
reads them with ``--hidden-states-backend fp8``, which the record and the printed command carry. Exports into one
folder take turns (an exclusive ``flock`` on the folder itself): the ranks of a data-parallel run that finish
together, or an export by hand beside them, never write the view at the same time.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shlex
import shutil
import stat
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from eaglewatch.errors import UserError
from eaglewatch.pipeline import output
from eaglewatch.pipeline.prepared_data import iter_prepared
from eaglewatch.pipeline.regular import NotRegularFile, open_regular

HELP = "turn a finished output folder into the layout a trainer reads (speculators), without copying tensors"
FORMATS = ("speculators",)
HIDDEN_STATES_DIR = "hidden_states"
EXPORT_RECORD = "speculators.json"
TOKEN_FREQ = "token_freq.pt"
DATASET_FILES = ("dataset_info.json", "state.json")  # besides data-*.arrow
WORK_PREFIX = ".export-"
# speculators train's backend that dequantizes FP8 files as it reads them (hs_connectors' FP8Transfer).
FP8_BACKEND = "fp8"


@dataclass
class ExportReport:
    folder: Path
    rows: int
    tokens: int
    target_layer_ids: list[int]
    final_layer_id: int
    draft_vocab_size: int | None
    files: list[str] = field(default_factory=list)
    hidden_states_backend: str | None = None  # None: speculators' default ("file")

    def train_command(self, verifier: str) -> str:
        words = ["speculators", "train", "--verifier-name-or-path", verifier, "--data-path", str(self.folder),
                 "--target-layer-ids", *map(str, self.target_layer_ids)]
        if self.draft_vocab_size:
            words += ["--draft-vocab-size", str(self.draft_vocab_size)]
        if self.hidden_states_backend:
            words += ["--hidden-states-backend", self.hidden_states_backend]
        return " ".join(shlex.quote(w) for w in words)

    def describe(self, verifier: str) -> list[str]:
        """What the operator needs to train on the folder: where, which layer ids to pass, the command."""
        return [f"speculators layout: {self.rows} samples ({self.tokens} tokens) in {self.folder}",
                f"pass --target-layer-ids {' '.join(map(str, self.target_layer_ids))} (the auxiliary layers; the "
                f"final layer {self.final_layer_id} is last in each file)",
                "train with: " + self.train_command(verifier)]


def layer_order_problem(layer_ids: list[int], num_hidden_layers: int) -> str | None:
    """Why ``layer_ids`` cannot feed speculators (None when they can): its trainer takes the file's last layer for
    the verifier's final state, so the final layer (id ``num_hidden_layers``) must be there, and last."""
    final = num_hidden_layers
    if final not in layer_ids:
        return (f"the speculators format needs the final layer's states (layer id {final}) as the last of "
                f"--layer-ids; these are {layer_ids}: add {final} at the end")
    if layer_ids[-1] != final:
        order = [k for k in layer_ids if k != final] + [final]
        return (f"the speculators format takes the last layer in each file as the final state (layer id {final}), "
                f"but --layer-ids {' '.join(map(str, layer_ids))} puts {layer_ids[-1]} last: extract with "
                f"--layer-ids {' '.join(map(str, order))}")
    if len(layer_ids) < 2:
        return "the speculators format needs at least one auxiliary layer before the final one"
    return None


# Bounded reads: a JSON file the export reads is a regular file of at most this many bytes. A manifest or a model's
# config is a few KB; a hostile one (a FIFO that never ends, a 50 MB file) is refused instead of read.
JSON_LIMIT = 4 << 20
# The view's record lists one sample id per row: it grows with the data set, so it has a limit of its own.
RECORD_LIMIT = 1 << 30
_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _shown(value: Any, width: int = 60) -> str:
    """A value from a file, in an error line: its repr (one line, whatever it holds), cut to ``width``."""
    text = repr(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def _not_regular(mode: int) -> str | None:
    """What a file that is not a regular file is (None for a regular file)."""
    return next((kind for is_kind, kind in _KINDS if is_kind(mode)), None if stat.S_ISREG(mode) else "not a file")


def _regular_size(path: Path, what: str, fix: str = "move it away") -> int:
    """The size of ``path``, a regular file (a link to one is fine); anything else is a UserError naming what it is.
    FileNotFoundError passes through: a missing file is for the caller to judge."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if path.is_symlink():
            raise UserError(f"{path} is a symbolic link to nothing ({_shown(os.readlink(path))})") from None
        raise
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
    kind = _not_regular(st.st_mode)
    if kind:
        raise UserError(f"{path} is {kind}, not {what}: {fix}")
    return st.st_size


def read_json_file(path: Path, what: str, limit: int = JSON_LIMIT) -> Any:
    """The JSON in ``path``, read only when it is a regular file of at most ``limit`` bytes, so that no FIFO,
    device or giant file can hang or swamp the export. UserError for anything else; FileNotFoundError passes."""
    size = _regular_size(path, what)
    if size > limit:
        raise UserError(f"{path} is {size} bytes, more than {what} can be ({limit} bytes): move it away")
    try:
        with open_regular(path) as f:  # should the path turn into a FIFO after the check, this does not wait
            raw = f.read(limit + 1)
    except NotRegularFile:
        raise UserError(f"{path} changed while it was read: not {what}") from None
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(raw) > limit:
        raise UserError(f"{path} grew beyond {limit} bytes while it was read: not {what}")
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:  # bad JSON, bad UTF-8, nesting deeper than the parser goes
        raise UserError(f"{path} is not valid JSON ({type(exc).__name__}: {_shown(str(exc), 120)})") from None


@dataclass(frozen=True)
class Field:
    """One row of what the export reads from a manifest: the check its value must pass, and what it must be."""

    name: str
    check: Callable[[Any], bool]
    wanted: str
    required: bool = False  # the others may be absent (an older manifest), but when there they must be right


def _whole(low: int) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= low


def _path(v: Any) -> bool:
    return isinstance(v, str) and v != "" and "\0" not in v


def _or_null(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: v is None or check(v)


def _layer_ids(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(map(_whole(0), v)) and len(set(v)) == len(v)


_COUNT = "a whole number ≥ 0"
# Every field of a manifest the export (or its record, or its printed command) uses, checked once, on reading.
MANIFEST_FIELDS = (
    Field("status", lambda v: isinstance(v, str), "a status text", required=True),
    Field("layer_ids", _layer_ids, "a list of distinct layer numbers", required=True),
    Field("num_hidden_layers", _whole(1), "a whole number ≥ 1", required=True),
    Field("world_size", _whole(1), "a whole number ≥ 1"),
    Field("rank", _whole(0), _COUNT),
    Field("hidden_size", _whole(1), "a whole number ≥ 1"),
    Field("max_seq_len", _whole(1), "a whole number ≥ 1"),
    Field("max_samples", _or_null(_whole(1)), "null or a whole number ≥ 1"),
    Field("samples_total", _whole(0), _COUNT),
    Field("samples_done", _whole(0), _COUNT),
    Field("samples_written", _whole(0), _COUNT),
    Field("tokens_total", _whole(0), _COUNT),
    Field("tokens_written", _whole(0), _COUNT),
    Field("model_path", _path, "a path"),
    Field("prepared_data", _or_null(_path), "null or a path"),
    Field("model_config_hash", lambda v: isinstance(v, str), "a text"),
    Field("dtype", lambda v: isinstance(v, str), "a dtype name"),
    Field("storage", lambda v: v in output.STORAGES, f"one of {', '.join(output.STORAGES)}"),
    Field("finished_at", _or_null(lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)), "a time"),
)
# What the manifests of one folder must agree on: their files are one extraction's (verify's RANK_AGREEMENT).
AGREEMENT = (*output.IDENTITY_FIELDS, "num_hidden_layers", "hidden_size", "world_size", "max_samples")
NOT_OURS = "extract does not write it so; move it away, or extract into this folder again"


def _manifest_problem(name: str, m: Any) -> str | None:
    """Why the manifest in file ``name`` cannot be read as one (None when it can): the table, then how its fields
    and its file name go together."""
    if not isinstance(m, dict):
        kind = {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number"}
        return f"it is {kind.get(type(m), 'null')} in JSON, not an object"
    for f in MANIFEST_FIELDS:
        if f.name not in m:
            if f.required:
                return f"it has no {f.name}"
        elif not f.check(m[f.name]):
            return f"{f.name} is {_shown(m[f.name])}, not {f.wanted}"
    rank, world = m.get("rank", 0), m.get("world_size", 1)
    if rank >= world:
        return f"rank {rank} is not one of world_size {world}"
    if max(m["layer_ids"]) > m["num_hidden_layers"]:
        return f"layer_ids {_shown(m['layer_ids'])} go beyond num_hidden_layers {m['num_hidden_layers']}"
    expected = output.MANIFEST if world == 1 else f"manifest.rank{rank}.json"
    if name != expected:
        return f"it says rank {rank} of {world}, whose manifest is {expected}"
    return None


def _agreement(m: dict[str, Any], key: str) -> str:
    value = output.identity_value(m, key) if key in output.IDENTITY_FIELDS else m.get(key)
    if key == "world_size" and value is None:
        value = 1  # what a manifest without it means
    return json.dumps(value, sort_keys=True)


def _named_manifests(folder: Path) -> list[tuple[str, dict[str, Any]]]:
    """Every manifest of the folder (one, or one per rank), by file name, each read within bounds and checked
    against ``MANIFEST_FIELDS``, and all of them describing one extraction; a UserError names the first that is
    not."""
    found = []
    for path in sorted(folder.glob("manifest*.json")):
        try:
            manifest = read_json_file(path, "a manifest")
        except FileNotFoundError:  # gone since the listing
            continue
        why = _manifest_problem(path.name, manifest)
        if why:
            name = path.name if path.name.isprintable() else _shown(path.name)
            raise UserError(f"{name} in {folder} is not a usable manifest: {why}; {NOT_OURS}")
        found.append((path.name, manifest))
    if not found:
        raise UserError(f"{folder} holds no manifest.json: it is not an extract output folder")
    for key in AGREEMENT:
        values: dict[str, list[str]] = {}
        for name, m in found:
            values.setdefault(_agreement(m, key), []).append(name)
        if len(values) > 1:
            said = "; ".join(f"{', '.join(names)}: {_shown(json.loads(v))}" for v, names in values.items())
            raise UserError(f"the manifests in {folder} disagree on {key} ({said}): they are files of more than "
                            "one extraction; move the other run's files away or extract again with --force-new")
    return found


def _manifests(folder: Path) -> list[dict[str, Any]]:
    return [m for _, m in _named_manifests(folder)]


def unfinished_ranks(folder: Path) -> list[str]:
    """Why the folder's extraction is not whole yet, one phrase per rank (empty when every rank is done): a rank
    still running, or one of ``world_size`` ranks without a manifest."""
    manifests = _manifests(folder)
    why = [f"rank {m.get('rank', 0)} is {_shown(m['status'])}" for m in manifests if m["status"] != "done"]
    world = manifests[0].get("world_size", 1)  # agreed by all of them
    seen = {m.get("rank", 0) for m in manifests}
    # The missing ranks are found among the first len(seen) + 3, and the rest only counted: a world_size of 10**9
    # costs no more than one of 2.
    missing = [r for r in range(min(world, len(seen) + 3)) if r not in seen][:3]
    why += [f"rank {r} of {world} has no manifest yet" for r in missing]
    more = world - len(seen) - len(missing)
    if more > 0:
        why.append(f"{more} more ranks of {world} have no manifest yet")
    return why


def _agreed(manifests: list[dict[str, Any]], key: str) -> Any:
    values = {json.dumps(m.get(key)) for m in manifests}
    if len(values) > 1:
        raise UserError(f"the manifests in this folder disagree on {key}: {sorted(values)}")
    return manifests[0].get(key)


def _sample_files(folder: Path) -> int:
    """How many sample files the folder holds, counted from one listing before anything loops over the
    manifests' counts; a sample name that is not a regular file (a FIFO, a device, a folder) is refused here,
    before any read could hang on it."""
    count = 0
    with os.scandir(folder) as entries:
        for entry in entries:
            if entry.name.startswith("hs_") and entry.name.endswith(".safetensors"):
                try:
                    _regular_size(Path(entry.path), "a sample file")
                except FileNotFoundError:  # gone since the listing
                    continue
                count += 1
    return count


def _rows(folder: Path, prepared: Path, max_seq_len: int | None) -> Iterator[tuple[str, Path]]:
    """(sample id, file) in the prepared data's order, for each sample that has a file; the file must hold the
    same tokens as the prepared sample (its stored hash; cut to ``max_seq_len``, as extract truncates), or the
    export stops."""
    for sample in iter_prepared(prepared):
        path = output.sample_path(folder, sample.id)
        try:
            _regular_size(path, "a sample file")  # never open a FIFO or a device, even one put there just now
        except FileNotFoundError:
            continue
        try:
            stored = output.stored_sample_hash(path, output.read_header(path))
        except (OSError, ValueError) as exc:
            raise UserError(_damaged(path, folder, exc)) from None
        ids, mask = sample.input_ids[:max_seq_len], sample.loss_mask[:max_seq_len]
        if stored is not None and stored != output.sample_hash(ids, mask):
            raise UserError(f"{path.name} holds other tokens than sample {sample.id} at line {sample.line_no} of "
                            f"{prepared}: export with the prepared data this folder was extracted from")
        yield sample.id, path


def _damaged(path: Path, folder: Path, exc: BaseException) -> str:
    return (f"{path.name} cannot be read ({type(exc).__name__}: {exc}); `eaglewatch verify {folder}` lists every "
            "damaged file")


def vocab_mapping(token_freq: dict[int, int], draft_vocab_size: int, verifier_vocab_size: int) -> tuple[Any, Any]:
    """speculators' draft vocabulary: the ``draft_vocab_size`` most frequent masked tokens (ties to the lower id),
    topped up with the lowest unused ids, in id order. ``d2t[i]`` is the offset from draft index ``i`` to its
    target id; ``t2d`` marks the target ids the draft keeps."""
    import numpy as np

    if not 0 < draft_vocab_size <= verifier_vocab_size:
        raise UserError(f"--draft-vocab-size must be between 1 and the verifier's vocabulary ({verifier_vocab_size})")
    chosen = sorted(token_freq, key=lambda t: (-token_freq[t], t))[:draft_vocab_size]
    kept = set(chosen)
    next_id = 0
    while len(chosen) < draft_vocab_size:
        if next_id not in kept:
            chosen.append(next_id)
            kept.add(next_id)
        next_id += 1
    ids = np.array(sorted(chosen), dtype=np.int64)
    d2t = ids - np.arange(draft_vocab_size, dtype=np.int64)
    t2d: Any = np.zeros(verifier_vocab_size, dtype=bool)
    t2d[ids] = True
    return d2t, t2d


def _verifier_vocab_size(manifest: dict[str, Any]) -> int:
    """The verifier's vocabulary, from the config of the model the manifest names (read within bounds)."""
    fix = "pass --verifier-vocab-size"
    if "model_path" not in manifest:  # not the current folder's config.json
        raise UserError(f"the manifest names no model folder to read the verifier's vocab_size from: {fix}")
    path = Path(manifest["model_path"]) / "config.json"
    try:
        config = read_json_file(path, "a model's config")
    except FileNotFoundError:
        raise UserError(f"cannot read the verifier's vocab_size: {path} is not there; {fix}") from None
    except UserError as exc:
        raise UserError(f"cannot read the verifier's vocab_size ({exc}); {fix}") from None
    config = config if isinstance(config, dict) else {}
    text_config = config.get("text_config")  # a multimodal model's language part
    size = (text_config if isinstance(text_config, dict) else config).get("vocab_size")
    if not (isinstance(size, int) and not isinstance(size, bool) and size > 0):
        raise UserError(f"cannot read the verifier's vocab_size from {path} (it is {_shown(size)}): {fix}")
    return size


def export_speculators(folder: str | Path, *, prepared_data: str | Path | None = None,
                       draft_vocab_size: int | None = None, verifier_vocab_size: int | None = None) -> ExportReport:
    """Write the speculators layout into ``folder`` (a finished extract output). Raises UserError for a folder
    that cannot be exported as it is (unfinished, layers in the wrong order, data that does not match)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(f"{folder} is not a folder")
    manifests = _manifests(folder)
    unfinished = unfinished_ranks(folder)
    if unfinished:
        raise UserError(f"the extraction in {folder} has not finished ({'; '.join(unfinished)}): "
                        "run the same extract command to finish it, then export")
    # The manifests were checked on reading (types, ranks, file names) and agree on these.
    layer_ids: list[int] = manifests[0]["layer_ids"]
    num_layers: int = manifests[0]["num_hidden_layers"]
    problem = layer_order_problem(layer_ids, num_layers)
    if problem:
        raise UserError(problem)
    # Counts against the disk, before anything loops over them: a done rank has a file for each of its samples.
    counted = sum(m.get("samples_total", 0) for m in manifests)
    on_disk = _sample_files(folder)
    if counted > on_disk:
        raise UserError(f"the manifests in {folder} count {counted} samples, but it holds {on_disk} sample files: "
                        f"`eaglewatch verify {folder}` names the missing ones, and the same extract command writes "
                        "them again")
    prepared = Path(prepared_data or _agreed(manifests, "prepared_data") or "")
    fix = "pass --prepared-data with the file this folder was extracted from (it gives the rows their order)"
    try:
        if prepared == Path(""):
            raise FileNotFoundError
        _regular_size(prepared, "a prepared data file", fix)
    except FileNotFoundError:
        raise UserError(f"the prepared data {prepared} is not there: {fix}") from None
    if draft_vocab_size is not None:
        verifier_vocab_size = verifier_vocab_size or _verifier_vocab_size(manifests[0])
        if not 0 < draft_vocab_size <= verifier_vocab_size:  # before anything is built, not after
            raise UserError(f"--draft-vocab-size must be between 1 and the verifier's vocabulary "
                            f"({verifier_vocab_size}), not {draft_vocab_size}")
    storage = output.identity_value(manifests[0], "storage")
    max_seq_len = manifests[0].get("max_seq_len")
    _check_view_folder(folder)
    # Everything checked, nothing written yet: a refused export leaves the folder as it was. The new view is
    # built whole in a work folder beside the old one, which stays until the new one is ready (a failure on the
    # way leaves it as it was): then the old one goes, record first, and the new one moves in, record last.
    with _export_lock(folder):
        _remove_leftovers(folder)
        work = Path(tempfile.mkdtemp(prefix=WORK_PREFIX, dir=folder))
        try:
            return _write(folder, work, prepared, layer_ids, num_layers, draft_vocab_size, verifier_vocab_size,
                          max_seq_len, FP8_BACKEND if storage == output.STORAGE_FP8 else None, manifests, counted)
        finally:
            shutil.rmtree(work, ignore_errors=True)


@contextlib.contextmanager
def _export_lock(folder: Path) -> Iterator[None]:
    """One export at a time into a folder (the lock waits): the view is cleared and moved into place whole. The
    lock is on the folder itself, so that an export adds no file of its own (a refused one leaves the folder as it
    was), and it is apart from the writers' lock files, which a running extract holds."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def view_record(folder: Path) -> dict[str, Any] | None:
    """The record of the view in ``folder`` (``speculators.json``), or None when there is none or it is damaged."""
    try:
        record = read_json_file(Path(folder) / EXPORT_RECORD, "an export record", RECORD_LIMIT)
    except (OSError, UserError):
        return None
    return record if isinstance(record, dict) else None


def _extractions(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    """What the view was made from: each rank's end of extraction. Any later run that writes a file ends with a
    new one, so a view whose record still names these is the view of the files there."""
    return {str(m.get("rank", 0)): m.get("finished_at") for m in manifests}


def view_is_current(folder: Path, draft_vocab_size: int | None) -> bool:
    """Whether the folder's view was written from its files as they are now (and with this draft vocabulary)."""
    record = view_record(folder)
    if record is None or record.get("draft_vocab_size") != draft_vocab_size:
        return False
    try:
        manifests = _manifests(Path(folder))
    except UserError:
        return False
    return record.get("extractions") == _extractions(manifests) and (Path(folder) / HIDDEN_STATES_DIR).is_dir()


def report_of_view(folder: Path) -> ExportReport:
    """The report of the view already in ``folder``, from its record."""
    record = view_record(folder)
    if record is None:
        raise UserError(f"{folder} holds no speculators view ({EXPORT_RECORD})")
    backend = record.get("hidden_states_backend")
    try:
        return ExportReport(Path(folder), int(record["rows"]), int(record["tokens"]),
                            [int(k) for k in record["target_layer_ids"]], int(record["final_layer_id"]),
                            record.get("draft_vocab_size"),
                            hidden_states_backend=None if backend in (None, "file") else str(backend))
    except (KeyError, TypeError, ValueError) as exc:
        raise UserError(f"{Path(folder) / EXPORT_RECORD} is damaged ({type(exc).__name__}: {_shown(str(exc))}): "
                        "export again") from None


def remove_view(folder: Path) -> None:
    """Remove the folder's view (waiting for an export in progress to end first)."""
    with _export_lock(Path(folder)):
        clear_view(Path(folder))


def _write(folder: Path, work: Path, prepared: Path, layer_ids: list[int], num_layers: int,
           draft_vocab_size: int | None, verifier_vocab_size: int | None, max_seq_len: int | None,
           backend: str | None, manifests: list[dict[str, Any]], counted: int) -> ExportReport:
    try:
        import datasets
    except ImportError:
        raise UserError("the speculators format needs the datasets package: pip install 'datasets>=4,<=5.1'") from None
    import torch
    from safetensors import safe_open

    links = work / HIDDEN_STATES_DIR
    links.mkdir()
    freq: Counter[int] = Counter()
    rows = tokens = 0
    row_ids: list[str] = []

    def generate() -> Iterator[dict[str, Any]]:
        nonlocal rows, tokens
        for sample_id, path in _rows(folder, prepared, max_seq_len):
            try:
                with safe_open(str(path), framework="pt") as f:
                    ids = f.get_tensor("token_ids").to(torch.int64)
                    mask = f.get_tensor("loss_mask").to(torch.int64)
            except Exception as exc:  # a damaged file: name it; the view in place (if any) stays as it was
                raise UserError(_damaged(path, folder, exc)) from None
            masked = ids[mask.bool()].tolist()
            freq.update(masked)
            os.symlink(os.path.join("..", path.name), links / f"hs_{rows}.safetensors")
            row_ids.append(sample_id)
            rows += 1
            tokens += len(ids)
            yield {"input_ids": ids.tolist(), "loss_mask": mask.tolist(), "seq_len": len(ids), "sample_id": sample_id}

    features = datasets.Features({"input_ids": datasets.Sequence(datasets.Value("int64")),
                                  "loss_mask": datasets.Sequence(datasets.Value("int64")),
                                  "seq_len": datasets.Value("int64"), "sample_id": datasets.Value("string")})
    datasets.disable_progress_bars()
    from datasets.arrow_writer import ArrowWriter

    # Rows streamed to one Arrow file as they are read: memory stays flat on a million samples.
    staged = str(work / "rows.arrow")
    with ArrowWriter(features=features, path=staged) as writer:
        for row in generate():
            writer.write(row)
        writer.finalize()
    dataset = datasets.Dataset.from_file(staged)
    if rows == 0:
        raise UserError(f"no sample of {prepared} has a file in {folder}")
    if rows < counted:  # a partial view would train on part of the data without a word: refused, nothing moved
        raise UserError(f"only {rows} samples of {prepared} have a file in {folder}, but its manifests count "
                        f"{counted}: export with the prepared data this folder was extracted from")
    dataset.set_format(type="torch")
    dataset.save_to_disk(str(work / "dataset"))
    torch.save(dict(freq), work / TOKEN_FREQ)
    written = [TOKEN_FREQ]
    if draft_vocab_size is not None and verifier_vocab_size is not None:
        import numpy as np

        d2t, t2d = vocab_mapping(dict(freq), draft_vocab_size, verifier_vocab_size)
        for name, array in ((f"d2t-{draft_vocab_size}.npy", d2t), (f"t2d-{draft_vocab_size}.npy", t2d)):
            np.save(work / name, array)
            written.append(name)
    report = ExportReport(folder, rows, tokens, layer_ids[:-1], layer_ids[-1], draft_vocab_size,
                          hidden_states_backend=backend)
    record = {"format": "speculators", "rows": rows, "tokens": tokens,
              "row_to_sample": "row r is sample_ids[r] (also the dataset's sample_id column)",
              "target_layer_ids": report.target_layer_ids, "final_layer_id": report.final_layer_id,
              "num_hidden_layers": num_layers, "draft_vocab_size": draft_vocab_size,
              "hidden_states_backend": backend or "file", "prepared_data": str(prepared.resolve()),
              "extractions": _extractions(manifests), "sample_ids": row_ids}
    (work / EXPORT_RECORD).write_text(json.dumps(record, indent=2) + "\n")
    written.append(EXPORT_RECORD)
    # Built whole: the old view goes (its record first, so that a crash from here on leaves no view that claims to
    # be whole), then into place: the dataset's files, the links, the vocabulary files, the record last (it says
    # the export is whole).
    clear_view(folder, keep=work)
    for item in sorted((work / "dataset").iterdir()):
        os.replace(item, folder / item.name)
        report.files.append(item.name)
    os.replace(links, folder / HIDDEN_STATES_DIR)
    for name in written:
        os.replace(work / name, folder / name)
    report.files += [HIDDEN_STATES_DIR, *written]
    return report


def _check_view_folder(folder: Path) -> None:
    """Refuse a ``hidden_states/`` that is not this export's: something else, or a folder with more than links."""
    links = folder / HIDDEN_STATES_DIR
    if links.is_symlink() or (links.exists() and not links.is_dir()):
        raise UserError(f"{links} is not a folder of this export's links; move it away")
    if links.is_dir():
        foreign = [p for p in links.iterdir() if not p.is_symlink()]
        if foreign:
            raise UserError(f"{links} holds files that are not links to this folder's samples (e.g. "
                            f"{foreign[0].name}); move it away before exporting")


def _remove_leftovers(folder: Path, keep: Path | None = None) -> None:
    """A killed export's work folders (not ``keep``, this export's own)."""
    for leftover in folder.glob(WORK_PREFIX + "*"):
        if leftover != keep and leftover.is_dir() and not leftover.is_symlink():
            shutil.rmtree(leftover, ignore_errors=True)


def clear_view(folder: Path, keep: Path | None = None) -> None:
    """Remove what an earlier export wrote (and a killed one's work folder, not ``keep``), its record first;
    refuse to touch a ``hidden_states/`` that holds more than links. Called with the export lock held, or by the
    folder's only writer."""
    _check_view_folder(folder)
    (folder / EXPORT_RECORD).unlink(missing_ok=True)
    _remove_leftovers(folder, keep)
    links = folder / HIDDEN_STATES_DIR
    if links.is_dir():
        shutil.rmtree(links)
    for path in [folder / EXPORT_RECORD, folder / TOKEN_FREQ, *(folder / n for n in DATASET_FILES),
                 *folder.glob("data-*-of-*.arrow"), *folder.glob("d2t-*.npy"), *folder.glob("t2d-*.npy")]:
        path.unlink(missing_ok=True)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("output_dir", help="a finished extract output folder")
    parser.add_argument("--format", choices=FORMATS, default="speculators", help="the trainer's layout")
    parser.add_argument("--draft-vocab-size", type=int, default=None,
                        help="also write d2t-N.npy / t2d-N.npy for a draft vocabulary of N tokens")
    parser.add_argument("--verifier-vocab-size", type=int, default=None,
                        help="the target's vocabulary size (default: read from the model folder in the manifest)")
    parser.add_argument("--prepared-data", default=None,
                        help="the prepared data the folder was extracted from (default: the one its manifest names)")


def run(args: argparse.Namespace) -> int:
    if args.draft_vocab_size is not None and args.draft_vocab_size < 1:
        raise UserError("--draft-vocab-size must be a whole number ≥ 1")
    report = export_speculators(args.output_dir, prepared_data=args.prepared_data,
                                draft_vocab_size=args.draft_vocab_size, verifier_vocab_size=args.verifier_vocab_size)
    manifest = _manifests(report.folder)[0]
    print(f"exported {report.rows} samples ({report.tokens} tokens) in the speculators layout into {report.folder}")
    print(f"target layer ids (auxiliary): {' '.join(map(str, report.target_layer_ids))}; final layer "
          f"{report.final_layer_id} is last in each file")
    print("train with: " + report.train_command(str(manifest.get("model_path", "MODEL"))))
    return 0
