"""Planning an extraction: what it is asked (``ExtractConfig``) and what it will do (``Plan``), before any engine.

``make_plan`` validates the model folder, dtype, layer ids, parallelism, the prepared data, the output folder
(writable, manifest of an earlier run, free space) and works out which batches are still to run. Both ``extract``
and ``preflight`` build on this module; it imports neither, and no engine.
"""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eaglewatch.errors import UserError
from eaglewatch.pipeline import model_info as mi
from eaglewatch.pipeline import output
from eaglewatch.pipeline.engines.options import EngineOptions, add_engine_arguments
from eaglewatch.pipeline.flags import add_flags, flag, from_args
from eaglewatch.pipeline.prepared_data import LONG_POLICIES, DataReport, Sample, load_prepared


@dataclass(frozen=True, kw_only=True)
class ExtractConfig(EngineOptions):
    """An extraction as asked for: the engine options, plus the model, data, output and run options."""

    model_path: str = flag(help="Hugging Face model folder (local)")
    prepared_data: str = flag(help="JSONL from `eaglewatch prepare`")
    output_dir: str = flag(help="where hs_{id}.safetensors files go")
    layer_ids: list[int] | None = flag(
        None, "layers to keep: k = residual stream after k layers, 0 = embeddings, L = last layer before the final "
              "norm (default: 2, L//2, L-3, L)", type=int, nargs="+")
    batch_size: int = flag(16, "samples per engine call (default 16)", type=int)
    long_samples: str = flag("truncate", "what to do with samples longer than --max-seq-len (default truncate)",
                             choices=LONG_POLICIES)
    max_samples: int | None = flag(None, "use only the first N samples of the prepared data", type=int)
    rank: int = flag(0, "this host's share of the data (data parallel)", type=int)
    world_size: int = flag(1, "number of shares the data is split into", type=int)
    force_new: bool = flag(False, "delete earlier outputs in --output-dir first", action="store_true")
    no_preflight: bool = flag(False, "skip the preflight checks and the miniature", action="store_true")
    no_miniature: bool = flag(False, "run the preflight checks but not the miniature", action="store_true")
    miniature_samples: int = flag(4, "samples the miniature runs (default 4)", type=int)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "ExtractConfig":
        return from_args(cls, args)

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
    batches: list[list[Sample]]
    todo: list[int]  # indexes into batches still to run
    output_dir: Path
    manifest_name: str
    events_name: str
    truncated: int
    total_tokens: int
    bytes_per_token: int
    warnings: list[str] = field(default_factory=list)


def check_parallelism(info: mi.ModelInfo, cfg: ExtractConfig, visible_gpus: int | None) -> None:
    tp = cfg.tp_size
    if tp < 1:
        raise UserError("--tp-size must be at least 1")
    if cfg.engine == "hf" and tp != 1:
        raise UserError("the hf engine runs on one device; use --tp-size 1 or --engine vllm")
    if info.num_attention_heads % tp:
        raise UserError(f"--tp-size {tp} does not divide the model's {info.num_attention_heads} attention heads")
    kv = info.num_key_value_heads
    if not info.is_mla and (kv % tp if kv >= tp else tp % kv):
        raise UserError(f"--tp-size {tp} does not fit the model's {kv} KV heads (one must divide the other)")
    if visible_gpus is not None and tp > visible_gpus:
        raise UserError(f"--tp-size {tp} needs {tp} GPUs, but {visible_gpus} are visible "
                        f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})")
    if not 0 <= cfg.rank < cfg.world_size:
        raise UserError(f"--rank {cfg.rank} must be in 0..{cfg.world_size - 1} for --world-size {cfg.world_size}")
    if cfg.batch_size < 1:
        raise UserError("--batch-size must be at least 1")


def shard_for_rank(samples: list[Sample], rank: int, world_size: int) -> list[Sample]:
    """A contiguous share of the samples, so that each host's outputs are one run of ids."""
    chunk = math.ceil(len(samples) / world_size)
    return samples[rank * chunk : (rank + 1) * chunk]


def identity(plan_info: mi.ModelInfo, layer_ids: list[int], dtype: str, max_seq_len: int) -> dict[str, Any]:
    return {"model_config_hash": plan_info.config_hash, "layer_ids": layer_ids, "dtype": dtype,
            "max_seq_len": max_seq_len}


def read_data(cfg: ExtractConfig, info: mi.ModelInfo) -> DataReport:
    """Every line of the prepared data, checked against the model, under the run's length policy and limit.

    The one read of the data in a run: preflight does it and hands the report on to ``make_plan``."""
    return load_prepared(cfg.prepared_data, vocab_size=info.vocab_size, max_seq_len=cfg.max_seq_len,
                         long_samples=cfg.long_samples, max_samples=cfg.max_samples)


def make_plan(cfg: ExtractConfig, visible_gpus: int | None = None, *, info: mi.ModelInfo | None = None,
              data: DataReport | None = None) -> Plan:
    """Validate ``cfg`` and work out the batches still to run. ``info`` and ``data`` are the model folder and the
    prepared data when preflight already read them; otherwise they are read here.

    With ``--force-new`` this deletes the earlier outputs, and it always removes a killed writer's temporaries."""
    info = info if info is not None else mi.load_model_info(cfg.model_path)
    dtype = mi.normalise_dtype(cfg.dtype or info.dtype)
    layer_ids = mi.check_layer_ids(cfg.layer_ids or mi.default_layer_ids(info.num_hidden_layers),
                                   info.num_hidden_layers)
    check_parallelism(info, cfg, visible_gpus)
    report = data if data is not None else read_data(cfg, info)
    samples = shard_for_rank(report.samples, cfg.rank, cfg.world_size)
    if not samples:
        raise UserError(f"--rank {cfg.rank} of --world-size {cfg.world_size} gets no samples "
                        f"({len(report.samples)} in all)")
    out = cfg.output_path
    output.check_writable(out)

    wanted = identity(info, layer_ids, dtype, cfg.max_seq_len)
    existing = output.read_manifest_file(out / cfg.manifest_name)
    if cfg.force_new:
        output.clear_outputs(out, cfg.manifest_name)
    elif existing is not None:
        output.check_resume(existing, wanted, out)
    for stale in output.stale_temporaries(out):
        stale.unlink(missing_ok=True)

    batches = [samples[i : i + cfg.batch_size] for i in range(0, len(samples), cfg.batch_size)]
    hidden = info.hidden_size
    todo = [
        b for b, batch in enumerate(batches)
        if not all(output.is_complete(output.sample_path(out, s.id),
                                      output.ExpectedSample(s.num_tokens, len(layer_ids), hidden, dtype))
                   for s in batch)
    ]
    per_token = mi.bytes_per_token(len(layer_ids), hidden, dtype)
    remaining_tokens = sum(s.num_tokens for b in todo for s in batches[b])
    output.check_free_space(out, remaining_tokens * per_token)
    plan = Plan(info=info, layer_ids=layer_ids, dtype=dtype, samples=samples, batches=batches, todo=todo,
                output_dir=out, manifest_name=cfg.manifest_name, events_name=cfg.events_name,
                truncated=report.truncated, total_tokens=sum(s.num_tokens for s in samples),
                bytes_per_token=per_token)
    if report.truncated:
        plan.warnings.append(f"{report.truncated} samples were longer than --max-seq-len {cfg.max_seq_len} "
                             "and were truncated")
    return plan
