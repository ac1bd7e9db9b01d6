"""``eaglewatch extract``: push every prepared sample through the target model and write its hidden states.

Order of work, so that bad input fails in seconds rather than after the model load:
0. say where the job writes (an ``info`` event with ``output_dir``), as soon as the events file is open;
1. validate: preflight (unless ``--no-preflight``), then the plan (``plan.py``): model folder and shards, dtype,
   layer ids, parallelism, the whole prepared-data file, the output folder (writable, free space, manifest of an
   earlier run);
2. load the engine;
3. extract in fixed batches, skipping the batches whose files are all complete (resume is the default).

Batches are fixed by sample order, and a batch is re-run whole unless all its files are complete, so a resumed
run feeds the engine exactly the batches an uninterrupted run would: the files come out bit-identical.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from eaglewatch import protocol
from eaglewatch.errors import UserError
from eaglewatch.pipeline import output
from eaglewatch.pipeline import plan as planning
from eaglewatch.pipeline.engines import Engine, cpu_build_of_vllm, make_engine
from eaglewatch.pipeline.events import EventLog
from eaglewatch.pipeline.output_lock import OutputLock
from eaglewatch.pipeline.plan import ExtractConfig, Plan, make_plan
from eaglewatch.pipeline.preflight import PreflightReport, print_table, run_preflight
from eaglewatch.pipeline.prepared_data import Sample

HELP = "extract hidden states of chosen layers for every prepared sample (vLLM or transformers)"

class DiskFull(UserError):
    """The output's filesystem filled up during the run. Every file under a final name is whole; the same command
    resumes once there is space. Exit code 3, apart from bad input (2) and crashes (1)."""

    exit_code = 3


class JobEvents(EventLog):
    """The job's events. A target that cannot be written (its disk is full) is dropped with one warning on the
    log, instead of ending the job: the job's own writes say why it stops, and the other targets keep the story."""

    def emit(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = protocol.make_event(kind, **fields)
        line = protocol.encode(event)
        for f in list(self._files):
            try:
                f.write(line)
            except OSError as exc:
                self._files.remove(f)
                try:
                    f.close()
                except OSError:
                    pass
                self.say(f"warning: events can no longer be written to {f.name}: {exc.strerror or exc}")
        return event

    def refusal(self, exc: UserError) -> None:
        """A run stopped by its own clear message: error and phase events, no echo (the command prints the line)."""
        self.emit(protocol.EVENT_ERROR, exc_type=type(exc).__name__, message=str(exc), traceback="")
        self.emit(protocol.EVENT_PHASE, phase=protocol.PHASE_FAILED, detail=f"{type(exc).__name__}: {exc}")


@dataclass
class Progress:
    """How far the run got, for the message of a run that stops half-way."""

    plan: Plan | None = None
    started: float = 0.0

    def done_text(self) -> str:
        if self.plan is None:
            return "before any sample was written"
        changed = {s.id for s in self.plan.changed}
        done = 0
        for sample in self.plan.samples:
            try:
                written = output.sample_path(self.plan.output_dir, sample.id).stat().st_mtime
            except OSError:
                continue
            done += sample.id not in changed or written >= self.started
        return f"after {done} of {len(self.plan.samples)} samples"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    planning.add_arguments(parser)


def run_extract(cfg: ExtractConfig, echo: TextIO | None = sys.stderr) -> dict[str, Any]:
    """Validate, load, extract; return the final manifest. Raises UserError for bad input, FolderBusy when another
    run writes the folder, DiskFull when the disk fills up."""
    out = cfg.output_path
    lock = OutputLock(out, cfg.rank, cfg.world_size)
    try:
        # Before anything in the folder is written or deleted (the events file included: another run's is there).
        output.prepare_folder(out)
        lock.acquire()
    except UserError as exc:
        # Told to the agent's copy of the events only: the folder's own events file is another run's story.
        refused = JobEvents(echo=None)
        refused.emit(protocol.EVENT_INFO, output_dir=str(out))
        refused.refusal(exc)
        refused.close()
        raise
    try:
        return _run_locked(cfg, lock, echo)
    finally:
        lock.release()


def _run_locked(cfg: ExtractConfig, lock: OutputLock, echo: TextIO | None) -> dict[str, Any]:
    out = cfg.output_path
    events = JobEvents(out / cfg.events_name, echo=echo)
    progress = Progress()
    try:
        return _validate_and_extract(cfg, lock, events, progress, echo)
    except UserError as exc:
        events.refusal(exc)
        raise
    except BaseException as exc:
        if output.is_disk_full(exc):
            stopped = DiskFull(f"disk full on {output.filesystem_of(out)} {progress.done_text()}; "
                               "free space and run the same command to resume")
            events.refusal(stopped)
            raise stopped from None
        if isinstance(exc, OSError) and progress.plan is None:
            # Still validating: a path the user gave (a permission, a loop of links), not a bug.
            refused = UserError(output.describe_os_error(exc))
            events.refusal(refused)
            raise refused from None
        events.error(exc)
        raise
    finally:
        events.close()


def _validate_and_extract(cfg: ExtractConfig, lock: OutputLock, events: JobEvents, progress: Progress,
                          echo: TextIO | None) -> dict[str, Any]:
    started = progress.started = time.time()
    # Said first, before anything can fail or take long: watchers (the agent's disk telemetry, the dashboard)
    # learn where the job writes from the job itself instead of reading its command line.
    events.emit(protocol.EVENT_INFO, output_dir=str(cfg.output_path))
    events.phase(protocol.PHASE_VALIDATING)
    preflight = None if cfg.no_preflight else _preflight(cfg, events, echo)
    visible = None
    if cfg.engine == "vllm" and not cpu_build_of_vllm():
        from eaglewatch.pipeline.engines.vllm_engine import visible_gpu_count

        visible = visible_gpu_count()
    # The model folder and the data as preflight read them: each is read once per run.
    plan = make_plan(cfg, visible, info=preflight.info if preflight else None,
                     data=preflight.data if preflight else None, lock=lock)
    for message in plan.warnings:
        events.warning(message, code="truncated")
    if plan.changed:
        first = plan.changed[0]
        events.warning(f"{len(plan.changed)} samples changed since they were extracted (other token ids or loss "
                       f"mask; e.g. {first.id}, line {first.line_no} of {cfg.prepared_data}): extracting them again",
                       code="changed")
    todo = set(plan.todo)
    done_before = sum(len(b) for i, b in enumerate(plan.batches) if i not in todo)
    progress.plan = plan
    events.emit(protocol.EVENT_INFO, engine=cfg.engine, model=str(plan.info.path), layer_ids=plan.layer_ids,
                dtype=plan.dtype, samples=len(plan.samples), tokens=plan.total_tokens,
                resumed_samples=done_before, batches=len(plan.batches), batches_todo=len(plan.todo),
                bytes_per_token=plan.bytes_per_token)
    events.say(f"{len(plan.samples)} samples, {plan.total_tokens} tokens, layers {plan.layer_ids}, "
               f"{done_before} already done")
    existing = plan.existing_manifest
    # The manifest describes the folder: a run over part of its data, or one that finds a finished folder with
    # nothing to do, leaves it as it is.
    keep_manifest = plan.narrower or (not plan.todo and existing is not None and existing.get("status") == "done"
                                      and _same_selection(existing, cfg))
    if plan.narrower:
        events.say(f"this run selects part of the data {cfg.output_path} was extracted from; "
                   "its manifest stays as it is")
    manifest = output.base_manifest(
        **planning.identity(plan.info, plan.layer_ids, plan.dtype, cfg.max_seq_len),
        model_path=str(plan.info.path), architectures=list(plan.info.architectures),
        num_hidden_layers=plan.info.num_hidden_layers, hidden_size=plan.info.hidden_size,
        **planning.selection(cfg), engine=cfg.engine, tp_size=cfg.tp_size, batch_size=cfg.batch_size,
        status="running", started_at=started, samples_total=len(plan.samples), tokens_total=plan.total_tokens,
    )
    manifest_path = plan.output_dir / plan.manifest_name
    if not keep_manifest:
        output.write_manifest_file(manifest_path, manifest)
    if not plan.todo:
        events.say("every sample is already extracted; nothing to do")
        if keep_manifest and existing is not None:
            result = {**existing, "samples_written": 0}
        else:
            manifest.update(status="done", finished_at=time.time(), samples_written=0)
            output.write_manifest_file(manifest_path, manifest)
            result = manifest
        events.phase(protocol.PHASE_DONE, "nothing to do")
        return result

    events.phase(protocol.PHASE_LOADING, f"{len(plan.info.shards)} shards, {cfg.engine} engine")
    engine = make_engine(cfg.engine_options(), plan.info.path, plan.layer_ids, plan.dtype)
    t_load = time.time()
    engine.load()
    load_s = time.time() - t_load
    manifest.update(versions={"eaglewatch": manifest["eaglewatch_version"], **engine.versions()},
                    gpus=engine.device_names(), load_s=round(load_s, 3))
    events.phase(protocol.PHASE_EXTRACTING, f"{len(plan.todo)} of {len(plan.batches)} batches to run")
    stats = _extract_batches(engine, plan, cfg, events, done_before)
    engine.close()
    if keep_manifest and existing is not None:
        result = {**existing, **stats}
    else:
        manifest.update(status="done", finished_at=time.time(), **stats)
        output.write_manifest_file(manifest_path, manifest)
        result = manifest
    events.phase(protocol.PHASE_DONE, f"{stats['samples_written']} samples, {stats['tokens_per_s']:.0f} tokens/s")
    return result


def _same_selection(existing: dict[str, Any], cfg: ExtractConfig) -> bool:
    return all(existing.get(k) == v for k, v in planning.selection(cfg).items())


def _preflight(cfg: ExtractConfig, events: EventLog, echo: TextIO | None) -> PreflightReport:
    report = run_preflight(cfg, events, miniature=not cfg.no_miniature, miniature_samples=cfg.miniature_samples)
    if echo is not None:
        print_table(report, echo)
    if not report.passed:
        first = report.failed[0]
        raise UserError(f"preflight: {first.reason}" + (f" (fix: {first.fix})" if first.fix else ""))
    return report


def _extract_batches(engine: Engine, plan: Plan, cfg: ExtractConfig, events: EventLog,
                     done_before: int) -> dict[str, Any]:
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

    try:
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
    finally:
        bar.close()  # ends the bar's line, so that a message after it starts on its own
    elapsed = time.time() - t0
    return {"samples_written": written, "tokens_written": tokens, "bytes_written": nbytes,
            "extract_s": round(elapsed, 3), "tokens_per_s": round(tokens / elapsed, 1) if elapsed else 0.0,
            "samples_done": done_before + written}


def run(args: argparse.Namespace) -> int:
    manifest = run_extract(ExtractConfig.from_args(args), echo=sys.stderr)
    if manifest.get("samples_written"):
        print(f"extracted {manifest['samples_written']} samples into {args.output_dir} "
              f"({manifest.get('tokens_per_s', 0):.0f} tokens/s)")
    else:
        print(f"nothing to do: every sample is already extracted in {args.output_dir}")
    return 0
