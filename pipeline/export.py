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
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from eaglewatch.errors import UserError
from eaglewatch.pipeline import output
from eaglewatch.pipeline.prepared_data import iter_prepared

HELP = "turn a finished output folder into the layout a trainer reads (speculators), without copying tensors"
FORMATS = ("speculators",)
HIDDEN_STATES_DIR = "hidden_states"
EXPORT_RECORD = "speculators.json"
TOKEN_FREQ = "token_freq.pt"
DATASET_FILES = ("dataset_info.json", "state.json")  # besides data-*.arrow


@dataclass
class ExportReport:
    folder: Path
    rows: int
    tokens: int
    target_layer_ids: list[int]
    final_layer_id: int
    draft_vocab_size: int | None
    files: list[str] = field(default_factory=list)

    def train_command(self, verifier: str) -> str:
        words = ["speculators", "train", "--verifier-name-or-path", verifier, "--data-path", str(self.folder),
                 "--target-layer-ids", *map(str, self.target_layer_ids)]
        if self.draft_vocab_size:
            words += ["--draft-vocab-size", str(self.draft_vocab_size)]
        return " ".join(shlex.quote(w) for w in words)


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


def _manifests(folder: Path) -> list[dict[str, Any]]:
    found = []
    for path in sorted(folder.glob("manifest*.json")):
        manifest = output.read_manifest_file(path, fix="run extract again into this folder")
        if manifest is not None:
            found.append(manifest)
    if not found:
        raise UserError(f"{folder} holds no manifest.json: it is not an extract output folder")
    return found


def _agreed(manifests: list[dict[str, Any]], key: str) -> Any:
    values = {json.dumps(m.get(key)) for m in manifests}
    if len(values) > 1:
        raise UserError(f"the manifests in this folder disagree on {key}: {sorted(values)}")
    return manifests[0].get(key)


def _rows(folder: Path, prepared: Path) -> Iterator[tuple[str, Path]]:
    """(sample id, file) in the prepared data's order, for each sample that has a file; the file must hold the
    same tokens as the prepared sample (its stored hash), or the export stops."""
    for sample in iter_prepared(prepared):
        path = output.sample_path(folder, sample.id)
        if not path.exists():
            continue
        stored = output.stored_sample_hash(path, output.read_header(path))
        if stored is not None and stored != output.sample_hash(sample.input_ids, sample.loss_mask):
            raise UserError(f"{path.name} holds other tokens than sample {sample.id} at line {sample.line_no} of "
                            f"{prepared}: export with the prepared data this folder was extracted from")
        yield sample.id, path


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


def _verifier_vocab_size(manifest: dict[str, Any]) -> int | None:
    config_path = Path(str(manifest.get("model_path", ""))) / "config.json"
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError):
        return None
    config = config.get("text_config") or config
    size = config.get("vocab_size")
    return int(size) if isinstance(size, int) else None


def export_speculators(folder: str | Path, *, prepared_data: str | Path | None = None,
                       draft_vocab_size: int | None = None, verifier_vocab_size: int | None = None) -> ExportReport:
    """Write the speculators layout into ``folder`` (a finished extract output). Raises UserError for a folder
    that cannot be exported as it is (unfinished, layers in the wrong order, data that does not match)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(f"{folder} is not a folder")
    manifests = _manifests(folder)
    unfinished = [m for m in manifests if m.get("status") != "done"]
    if unfinished:
        raise UserError(f"the extraction in {folder} has not finished (status {unfinished[0].get('status')!r}): "
                        "run the same extract command to finish it, then export")
    layer_ids = [int(k) for k in _agreed(manifests, "layer_ids")]
    num_layers = int(_agreed(manifests, "num_hidden_layers"))
    problem = layer_order_problem(layer_ids, num_layers)
    if problem:
        raise UserError(problem)
    prepared = Path(prepared_data or _agreed(manifests, "prepared_data") or "")
    if not prepared.is_file():
        raise UserError(f"the prepared data {prepared} is not there: pass --prepared-data with the file this "
                        "folder was extracted from (it gives the rows their order)")
    if draft_vocab_size is not None:
        verifier_vocab_size = verifier_vocab_size or _verifier_vocab_size(manifests[0])
        if verifier_vocab_size is None:
            raise UserError("cannot read the verifier's vocab_size from the model folder the manifest names: "
                            "pass --verifier-vocab-size")
    _clear_earlier_export(folder)
    work = Path(tempfile.mkdtemp(prefix=".export-", dir=folder))
    try:
        report = _write(folder, work, prepared, layer_ids, num_layers, draft_vocab_size, verifier_vocab_size)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return report


def _write(folder: Path, work: Path, prepared: Path, layer_ids: list[int], num_layers: int,
           draft_vocab_size: int | None, verifier_vocab_size: int | None) -> ExportReport:
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

    def generate() -> Iterator[dict[str, Any]]:
        nonlocal rows, tokens
        for sample_id, path in _rows(folder, prepared):
            with safe_open(str(path), framework="pt") as f:
                ids = f.get_tensor("token_ids").to(torch.int64)
                mask = f.get_tensor("loss_mask").to(torch.int64)
            masked = ids[mask.bool()].tolist()
            freq.update(masked)
            os.symlink(os.path.join("..", path.name), links / f"hs_{rows}.safetensors")
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
    report = ExportReport(folder, rows, tokens, layer_ids[:-1], layer_ids[-1], draft_vocab_size)
    record = {"format": "speculators", "rows": rows, "tokens": tokens, "row_to_sample": "sample_id column",
              "target_layer_ids": report.target_layer_ids, "final_layer_id": report.final_layer_id,
              "num_hidden_layers": num_layers, "draft_vocab_size": draft_vocab_size,
              "prepared_data": str(prepared.resolve())}
    (work / EXPORT_RECORD).write_text(json.dumps(record, indent=2) + "\n")
    written.append(EXPORT_RECORD)
    # Into place: the dataset's files, the links, the vocabulary files, the record last (it says the export is whole).
    for item in sorted((work / "dataset").iterdir()):
        os.replace(item, folder / item.name)
        report.files.append(item.name)
    os.replace(links, folder / HIDDEN_STATES_DIR)
    for name in written:
        os.replace(work / name, folder / name)
    report.files += [HIDDEN_STATES_DIR, *written]
    return report


def _clear_earlier_export(folder: Path) -> None:
    """Remove what an earlier export wrote; refuse to touch a ``hidden_states/`` that holds more than links."""
    links = folder / HIDDEN_STATES_DIR
    if links.is_symlink() or (links.exists() and not links.is_dir()):
        raise UserError(f"{links} is not a folder of this export's links; move it away")
    if links.is_dir():
        foreign = [p for p in links.iterdir() if not p.is_symlink()]
        if foreign:
            raise UserError(f"{links} holds files that are not links to this folder's samples (e.g. "
                            f"{foreign[0].name}); move it away before exporting")
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
