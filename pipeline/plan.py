"""Planning an extraction: what it is asked (``ExtractConfig``) and what it will do (``Plan``), before any engine.

``make_plan`` validates the model folder, dtype, layer ids, parallelism, the prepared data, the output folder
(writable, manifest of an earlier run, free space) and works out which batches are still to run. Both ``extract``
and ``preflight`` build on this module; it imports neither, and no engine.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import itertools
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eaglewatch.errors import UserError
from eaglewatch.pipeline import model_info as mi
from eaglewatch.pipeline import output
from eaglewatch.pipeline.engines import durability
from eaglewatch.pipeline.engines.options import EngineOptions, add_engine_arguments, at_least
from eaglewatch.pipeline.export import layer_order_problem
from eaglewatch.pipeline.flags import add_flags, flag, from_args
from eaglewatch.pipeline.output_lock import OutputLock
from eaglewatch.pipeline.prepared_data import LONG_POLICIES, DataReport, Sample, iter_prepared, load_prepared


DEFAULT_BATCH_SIZE = 16
# What extract leaves in the output folder: eaglewatch's own files, or those plus the layout ``speculators train
# --data-path`` reads (export.py), written at the end from the same files.
FORMAT_NATIVE, FORMAT_SPECULATORS = "native", "speculators"
OUTPUT_FORMATS = (FORMAT_NATIVE, FORMAT_SPECULATORS)
# When the miniature runs: beside the real load (both start together), before it, or as the host allows (auto).
MINIATURE_AUTO, MINIATURE_BESIDE, MINIATURE_BEFORE = "auto", "beside", "before"
MINIATURE_ORDERS = (MINIATURE_AUTO, MINIATURE_BESIDE, MINIATURE_BEFORE)


@dataclass(frozen=True, kw_only=True)
class ExtractConfig(EngineOptions):
    """An extraction as asked for: the engine options, plus the model, data, output and run options."""

    model_path: str = flag(help="Hugging Face model folder (local)")
    prepared_data: str = flag(help="JSONL from `eaglewatch prepare`")
    output_dir: str = flag(help="where hs_{id}.safetensors files go")
    output_format: str = flag(
        FORMAT_NATIVE, "native: eaglewatch's files (default); speculators: also the layout `speculators train "
                       "--data-path OUTPUT_DIR` reads (an Arrow dataset, hidden_states/hs_{row}, token_freq.pt), "
                       "written at the end; needs the final layer last in --layer-ids",
        name="--format", choices=OUTPUT_FORMATS)
    draft_vocab_size: int | None = flag(
        None, "with --format speculators: also write d2t-N.npy / t2d-N.npy for a draft vocabulary of N tokens",
        type=int)
    layer_ids: list[int] | None = flag(
        None, "layers to keep: k = residual stream after k layers, 0 = embeddings, L = last layer before the final "
              "norm (default: 2, L//2, L-3, L)", type=int, nargs="+")
    batch_size: int | None = flag(None, "samples per engine call with --exact and with the hf engine (default 16); "
                                        "the vllm stream has a window instead (--max-in-flight)", type=int)
    long_samples: str = flag("truncate", "what to do with samples longer than --max-seq-len (default truncate)",
                             choices=LONG_POLICIES)
    max_samples: int | None = flag(None, "use only the first N samples of the prepared data", type=int)
    rank: int = flag(0, "this host's share of the data (data parallel)", type=int)
    world_size: int = flag(1, "number of shares the data is split into", type=int)
    force_new: bool = flag(False, "delete earlier outputs in --output-dir first", action="store_true")
    no_preflight: bool = flag(False, "skip the preflight checks and the miniature", action="store_true")
    no_miniature: bool = flag(False, "run the preflight checks but not the miniature", action="store_true")
    miniature_samples: int = flag(4, "samples the miniature runs (default 4)", type=int)
    miniature_order: str = flag(
        MINIATURE_AUTO, "extract: run the miniature beside the real load or before it; auto (default): beside on "
                        "GPUs with the free memory for both, before elsewhere (the reason is printed)",
        choices=MINIATURE_ORDERS)

    def problems(self) -> list[str]:
        found = super().problems()
        found += [p for p in (at_least("--batch-size", self.batch_size, 1),
                              at_least("--max-samples", self.max_samples, 1),
                              at_least("--world-size", self.world_size, 1),
                              at_least("--miniature-samples", self.miniature_samples, 1),
                              at_least("--draft-vocab-size", self.draft_vocab_size, 1)) if p]
        if self.output_format not in OUTPUT_FORMATS:
            found.append(f"--format must be one of {', '.join(OUTPUT_FORMATS)} (got {self.output_format!r})")
        if self.draft_vocab_size is not None and self.output_format != FORMAT_SPECULATORS:
            found.append("--draft-vocab-size is for --format speculators")
        if self.world_size >= 1 and not 0 <= self.rank < self.world_size:
            found.append(f"--rank {self.rank} must be in 0..{self.world_size - 1} for --world-size {self.world_size}")
        for name in ("model_path", "prepared_data", "output_dir"):
            if not str(getattr(self, name)).strip():
                found.append(f"--{name.replace('_', '-')} is empty")
        return found

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "ExtractConfig":
        return from_args(cls, args)

    @property
    def streams(self) -> bool:
        """The engine is fed as a stream (vllm without --exact), not in fixed batches."""
        return self.engine == "vllm" and not self.exact

    @property
    def fixed_batch_size(self) -> int | None:
        """Samples per engine call when the engine is fed fixed batches; None for the stream."""
        return None if self.streams else (self.batch_size or DEFAULT_BATCH_SIZE)

    @property
    def output_path(self) -> Path:
        """``--output-dir`` as an absolute path (what the job reports and writes to)."""
        return Path(os.path.abspath(os.path.expanduser(self.output_dir)))

    @property
    def rank_suffix(self) -> str:
        """Ranks sharing one output folder keep their own manifest and events file."""
        return "" if self.world_size == 1 else f".rank{self.rank}"

    @property
    def manifest_name(self) -> str:
        return f"manifest{self.rank_suffix}.json"

    @property
    def events_name(self) -> str:
        return f"events{self.rank_suffix}.jsonl"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``extract`` (and ``preflight``): the extraction's own, then the engine options."""
    add_flags(parser, ExtractConfig, exclude=[EngineOptions])
    add_engine_arguments(parser.add_argument_group("engine options"))


@dataclass
class Plan:
    """Everything validated, before any engine loads."""

    info: mi.ModelInfo
    layer_ids: list[int]
    dtype: str
    samples: list[Sample]
    # The units of resume: fixed batches of --batch-size (--exact, hf), or one sample each (the vllm stream).
    batches: list[list[Sample]]
    todo: list[int]  # indexes into batches still to run
    output_dir: Path
    manifest_name: str
    events_name: str
    truncated: int
    total_tokens: int
    bytes_per_token: int
    warnings: list[str] = field(default_factory=list)
    # Samples whose files hold other token ids or another loss mask than the prepared data: extracted again.
    changed: list[Sample] = field(default_factory=list)
    # Samples whose files looked complete but were written after the last sync before the machine restarted
    # (the manifest's durable watermark): extracted again, their files may not have reached the disk.
    unsynced: int = 0
    # The folder's manifest as this run found it (None: none, or --force-new).
    existing_manifest: dict[str, Any] | None = None
    # This run selects part of what the folder's manifest describes: the manifest is left as it is.
    narrower: bool = False


def check_parallelism(info: mi.ModelInfo, cfg: ExtractConfig, visible_gpus: int | None) -> None:
    """``--tp-size`` against the model's heads and the visible GPUs (the options' own ranges are checked when the
    config is made)."""
    tp = cfg.tp_size
    if info.num_attention_heads % tp:
        raise UserError(f"--tp-size {tp} does not divide the model's {info.num_attention_heads} attention heads")
    kv = info.num_key_value_heads
    if not info.is_mla and (kv % tp if kv >= tp else tp % kv):
        raise UserError(f"--tp-size {tp} does not fit the model's {kv} KV heads (one must divide the other)")
    if visible_gpus is not None and tp > visible_gpus:
        raise UserError(f"--tp-size {tp} needs {tp} GPUs, but {visible_gpus} are visible "
                        f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})")


def shard_for_rank(samples: list[Sample], rank: int, world_size: int) -> list[Sample]:
    """A contiguous share of the samples, so that each host's outputs are one run of ids."""
    chunk = math.ceil(len(samples) / world_size)
    return samples[rank * chunk : (rank + 1) * chunk]


def identity(plan_info: mi.ModelInfo, layer_ids: list[int], dtype: str, max_seq_len: int,
             storage: str = output.STORAGE_DTYPE) -> dict[str, Any]:
    return {"model_config_hash": plan_info.config_hash, "layer_ids": layer_ids, "dtype": dtype,
            "max_seq_len": max_seq_len, "storage": storage}


def stored_bytes_per_token(num_layers: int, hidden_size: int, dtype: str, storage: str) -> int:
    """Bytes a token takes in a sample file: FP8 keeps one byte per value and a float32 scale per token."""
    if storage == output.STORAGE_FP8:
        return num_layers * hidden_size + 4 + 9
    return mi.bytes_per_token(num_layers, hidden_size, dtype)


def check_output_format(cfg: ExtractConfig, info: mi.ModelInfo) -> None:
    """What ``--format speculators`` needs, checked before anything is loaded: the final layer last in the layer
    ids (its trainer takes a file's last layer for the verifier's final state), a draft vocabulary that fits the
    model's, and the ``datasets`` package the Arrow dataset is written with."""
    if cfg.output_format != FORMAT_SPECULATORS:
        return
    layer_ids = mi.check_layer_ids(cfg.layer_ids or mi.default_layer_ids(info.num_hidden_layers),
                                   info.num_hidden_layers)
    problem = layer_order_problem(layer_ids, info.num_hidden_layers)
    if problem:
        raise UserError(problem)
    if cfg.draft_vocab_size is not None and cfg.draft_vocab_size > info.vocab_size:
        raise UserError(f"--draft-vocab-size {cfg.draft_vocab_size} is larger than the model's vocabulary "
                        f"({info.vocab_size})")
    if importlib.util.find_spec("datasets") is None:
        raise UserError("--format speculators writes its dataset with the datasets package, which is not "
                        "installed: pip install 'datasets>=4,<=5.1' (or extract without --format, and export later)")


def read_data(cfg: ExtractConfig, info: mi.ModelInfo) -> DataReport:
    """Every line of the prepared data, checked against the model, under the run's length policy and limit.

    The one read of the data in a run: preflight does it and hands the report on to ``make_plan``."""
    return load_prepared(cfg.prepared_data, vocab_size=info.vocab_size, max_seq_len=cfg.max_seq_len,
                         long_samples=cfg.long_samples, max_samples=cfg.max_samples)


def selection(cfg: ExtractConfig) -> dict[str, Any]:
    """What a run selects of the data; the manifest keeps it, and ``verify`` checks the folder against it."""
    return {"prepared_data": str(Path(cfg.prepared_data).resolve()), "max_samples": cfg.max_samples,
            "rank": cfg.rank, "world_size": cfg.world_size}


def _selected_ids(manifest: dict[str, Any], cfg: ExtractConfig, report: DataReport) -> set[str] | None:
    """The ids an earlier run's manifest selects, or None when that can no longer be known (its data is gone, or
    the manifest does not say)."""
    path, limit = manifest.get("prepared_data"), manifest.get("max_samples")
    rank, world = manifest.get("rank", 0), manifest.get("world_size", 1)
    if (not isinstance(path, str) or not (limit is None or isinstance(limit, int) and limit >= 1)
            or not isinstance(rank, int) or not isinstance(world, int) or not 0 <= rank < world):
        return None
    if path == selection(cfg)["prepared_data"] and (cfg.max_samples is None
                                                    or (limit is not None and limit <= cfg.max_samples)):
        pool = report.samples[:limit]  # this run read that much of the same file already
    else:
        try:
            lines = iter_prepared(path)
            pool = list(itertools.islice(lines, limit))
            lines.close()
        except UserError:
            return None
    return {s.id for s in shard_for_rank(pool, rank, world)}


def _is_narrower(existing: dict[str, Any], cfg: ExtractConfig, report: DataReport, samples: list[Sample],
                 out: Path) -> bool:
    """Whether this run selects a strict part of what the folder's manifest describes (then the manifest stays).

    A run that would leave out samples the folder holds files for, without selecting a part of the folder's
    selection, is refused: the folder would then describe only part of what it holds."""
    old = {k: existing.get(k, default) for k, default in
           (("prepared_data", None), ("max_samples", None), ("rank", 0), ("world_size", 1))}
    new = selection(cfg)
    if old == new:
        return False
    if (old["prepared_data"] == new["prepared_data"] and old["world_size"] == new["world_size"] == 1
            and cfg.max_samples is not None and len(report.samples) == cfg.max_samples
            and (old["max_samples"] is None
                 or isinstance(old["max_samples"], int) and old["max_samples"] > cfg.max_samples)):
        return True  # the first N samples of the file the folder holds more of: no need to read it again
    old_ids = _selected_ids(existing, cfg, report)
    if old_ids is None:
        return False
    new_ids = {s.id for s in samples}
    if new_ids < old_ids:
        return True
    outside = sorted(i for i in old_ids - new_ids if output.sample_path(out, i).exists())
    if outside:
        limit = f"the first {old['max_samples']} samples of " if old["max_samples"] else ""
        share = f"rank {old['rank']} of {old['world_size']}'s share of " if old["world_size"] != 1 else ""
        raise UserError(
            f"{out} holds {len(outside)} samples this run does not select (e.g. "
            f"{output.sample_path(out, outside[0]).name}; the folder was extracted from {share}{limit}"
            f"{old['prepared_data']}): use data and --max-samples that include them, another --output-dir, "
            "or --force-new to start over")
    return False


def make_plan(cfg: ExtractConfig, visible_gpus: int | None = None, *, info: mi.ModelInfo | None = None,
              data: DataReport | None = None, lock: OutputLock | None = None) -> Plan:
    """Validate ``cfg`` and work out the batches still to run. ``info`` and ``data`` are the model folder and the
    prepared data when preflight already read them; otherwise they are read here.

    With ``--force-new`` this deletes the earlier outputs, and it always removes a killed writer's temporaries:
    both only while holding the folder's lock (``lock``, held by the caller; else taken here for the while)."""
    info = info if info is not None else mi.load_model_info(cfg.model_path)
    dtype = mi.normalise_dtype(cfg.dtype or info.dtype)
    layer_ids = mi.check_layer_ids(cfg.layer_ids or mi.default_layer_ids(info.num_hidden_layers),
                                   info.num_hidden_layers)
    check_output_format(cfg, info)
    check_parallelism(info, cfg, visible_gpus)
    report = data if data is not None else read_data(cfg, info)
    samples = shard_for_rank(report.samples, cfg.rank, cfg.world_size)
    if not samples:
        raise UserError(f"--rank {cfg.rank} of --world-size {cfg.world_size} gets no samples "
                        f"({len(report.samples)} in all)")
    out = cfg.output_path
    output.check_writable(out)
    held = lock if lock is not None and lock.held else OutputLock(out, cfg.rank, cfg.world_size)
    with contextlib.nullcontext() if held is lock else held:
        plan = _plan_folder(cfg, info, layer_ids, dtype, report, samples, out)
    if report.truncated:
        plan.warnings.append(f"{report.truncated} samples were longer than --max-seq-len {cfg.max_seq_len} "
                             "and were truncated")
    return plan


def _plan_folder(cfg: ExtractConfig, info: mi.ModelInfo, layer_ids: list[int], dtype: str, report: DataReport,
                 samples: list[Sample], out: Path) -> Plan:
    """The part of planning that reads (and, for --force-new and leftovers, deletes) in the output folder."""
    share = [s.id for s in samples] if cfg.world_size > 1 else None  # ranks touch their own share only
    existing = None
    narrower = False
    if cfg.force_new:
        output.clear_outputs(out, cfg.manifest_name, share)
    else:
        existing = output.read_manifest_file(out / cfg.manifest_name)
        if existing is not None:
            output.check_resume(existing, identity(info, layer_ids, dtype, cfg.max_seq_len, cfg.storage), out)
            narrower = _is_narrower(existing, cfg, report, samples, out)
    hidden = info.hidden_size
    status: dict[str, str] = {}
    for s in samples:
        path = output.sample_path(out, s.id)
        expected = output.ExpectedSample(s.num_tokens, len(layer_ids), hidden, dtype,
                                         output.sample_hash(s.input_ids, s.loss_mask), cfg.storage)
        status[s.id] = output.sample_status(path, expected)
        if status[s.id] == output.INCOMPLETE and path.is_dir():
            raise UserError(f"{path} is a folder where this sample's file goes; move it away")
    changed = [s for s in samples if status[s.id] == output.CHANGED]
    if changed:
        _check_changed(changed, sum(v == output.COMPLETE for v in status.values()), narrower, cfg, out)
    for stale in output.stale_temporaries(out, share):  # only once the run is sure to go ahead
        stale.unlink(missing_ok=True)

    unsynced = durability.distrust_unsynced(existing, [s.id for s in samples], status)
    unit = cfg.fixed_batch_size or 1
    batches = [samples[i : i + unit] for i in range(0, len(samples), unit)]
    todo = [b for b, batch in enumerate(batches) if any(status[s.id] != output.COMPLETE for s in batch)]
    per_token = stored_bytes_per_token(len(layer_ids), hidden, dtype, cfg.storage)
    remaining_tokens = sum(s.num_tokens for b in todo for s in batches[b])
    output.check_free_space(out, remaining_tokens * per_token)
    return Plan(info=info, layer_ids=layer_ids, dtype=dtype, samples=samples, batches=batches, todo=todo,
                output_dir=out, manifest_name=cfg.manifest_name, events_name=cfg.events_name,
                truncated=report.truncated, total_tokens=sum(s.num_tokens for s in samples),
                bytes_per_token=per_token, changed=changed, unsynced=unsynced, existing_manifest=existing,
                narrower=narrower)


def _check_changed(changed: list[Sample], unchanged: int, narrower: bool, cfg: ExtractConfig, out: Path) -> None:
    """Samples of the same id whose token ids or loss mask changed are extracted again, unless the change looks
    like other data altogether (most of the files that are there), or this run covers only part of the folder."""
    first = changed[0]
    example = (f"e.g. {output.sample_path(out, first.id).name}, line {first.line_no} of {cfg.prepared_data}")
    if narrower:
        raise UserError(
            f"{len(changed)} samples in {out} hold other token ids or loss masks than this run's data ({example}), "
            "and this run selects only part of the folder's data: run it over the data the folder was extracted "
            "from (its manifest names it), or use --force-new to start over")
    if 2 * len(changed) > len(changed) + unchanged:
        raise UserError(
            f"{out} was extracted from other data: {len(changed)} of its {len(changed) + unchanged} files for this "
            f"run's samples hold other token ids or loss masks than the prepared data has for the same ids "
            f"({example}). Use another --output-dir, or --force-new to delete them and start over.")
