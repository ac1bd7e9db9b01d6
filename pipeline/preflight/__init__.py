"""Preflight: catch a broken extraction in seconds, before the 18-minute model load.

``checks`` reads the model folder, data, disk and installed vLLM without loading anything; ``miniature`` runs the
real extract path on a toy clone of the architecture, in the background (``miniature_run``), beside the real load
or before it (``beside``). Each result is reported as it finishes: a ``check`` event, so the dashboard shows the
checklist as it fills, and a printed line. The miniature takes a minute or more: as each of its stages starts it
says so in a ``check_stage`` event (``protocol.EVENT_CHECK_STAGE``); its verdict (the engine path ran, or the
decoded root cause in ``details``) is its ``check`` event, and the comparison of its output with transformers
follows as ``miniature vs transformers``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, TextIO

from eaglewatch import protocol
from eaglewatch.pipeline.model_info import ModelInfo
from eaglewatch.pipeline.plan import ExtractConfig, shard_for_rank
from eaglewatch.pipeline.preflight.checks import FAIL, PASS, WARN, CheckResult, Context, run_checks
from eaglewatch.pipeline.prepared_data import DataReport

if TYPE_CHECKING:
    from eaglewatch.pipeline.preflight.miniature import MiniatureResult
    from eaglewatch.pipeline.preflight.miniature_run import MiniatureRun


@dataclass
class PreflightReport:
    results: list[CheckResult] = field(default_factory=list)
    # What the checks read, for the run to go on with (None where a check failed before reading it).
    info: ModelInfo | None = None
    data: DataReport | None = None

    @property
    def failed(self) -> list[CheckResult]:
        return [r for r in self.results if r.status == FAIL]

    @property
    def passed(self) -> bool:
        return not self.failed


ResultHandler = Callable[[CheckResult], None]


def run_checks_reported(cfg: ExtractConfig, events: Any | None = None, *, runs_here: bool = True,
                        on_result: ResultHandler | None = None) -> tuple[PreflightReport, Context]:
    """The checks, each told as it finishes: a ``check`` event, and ``on_result`` (a printed line)."""

    def told(result: CheckResult) -> None:
        _emit(events, result)
        if on_result is not None:
            on_result(result)

    results, ctx = run_checks(cfg, runs_here=runs_here, on_result=told)
    return PreflightReport(results, info=ctx.info, data=ctx.data), ctx


def start_miniature(cfg: ExtractConfig, report: PreflightReport, ctx: Context, events: Any | None = None, *,
                    samples: int = 4, gpu_share: float | None = None, lane: Callable[[bytes], None] | None = None,
                    on_result: ResultHandler | None = None, on_tick: Callable[[str, float, str], None] | None = None,
                    adjust: Callable[[CheckResult], CheckResult] | None = None,
                    workdir: str | None = None) -> "MiniatureRun | None":
    """Start the miniature in the background when the checks passed; each of its results (the verdict, then the
    comparison with transformers) is added to ``report``, emitted, and told to ``on_result`` as it comes.
    ``adjust`` may change a result first (a late failure of a miniature beside a run that is already writing is a
    warning)."""
    if not report.passed or ctx.info is None or ctx.layer_ids is None:
        return None
    from eaglewatch.pipeline.preflight.miniature_run import MiniatureRun

    def told(name: str, mini: "MiniatureResult") -> None:
        result = check_of_miniature(name, mini)
        if adjust is not None:
            result = adjust(result)
        report.results.append(result)
        _emit(events, result)
        if on_result is not None:
            on_result(result)

    data = shard_for_rank(ctx.data.samples, cfg.rank, cfg.world_size) if ctx.data is not None else None
    return MiniatureRun(cfg, ctx.info, ctx.layer_ids, samples=samples, data=data, gpu_share=gpu_share, lane=lane,
                        on_stage=_stage_reporter(events), on_tick=on_tick, on_result=told,
                        workdir=workdir).start()


def check_of_miniature(name: str, mini: "MiniatureResult") -> CheckResult:
    fix = ""
    if mini.status == FAIL:
        fix = "the real job runs the same engine path: fix this before loading the real model"
    details = {"layer_map": mini.layer_map, "seconds": round(mini.seconds, 1), "root_cause": mini.root_cause,
               **mini.details}
    return CheckResult(name, mini.status, mini.reason, fix, details=details)


def run_preflight(cfg: ExtractConfig, events: Any | None = None, *, miniature: bool = True,
                  miniature_samples: int = 4, workdir: str | None = None, runs_here: bool = True,
                  on_result: ResultHandler | None = None,
                  on_tick: Callable[[str, float, str], None] | None = None) -> PreflightReport:
    """The checks, then (when they all pass and ``miniature``) the miniature, to its end.

    ``events`` is an :class:`~eaglewatch.pipeline.events.EventLog` (or None): each result becomes a check event.
    ``runs_here`` is False for ``eaglewatch preflight``, which checks a job that may run elsewhere: what this
    machine's engine lacks is then a warning, not the job's failure."""
    report, ctx = run_checks_reported(cfg, events, runs_here=runs_here, on_result=on_result)
    if miniature:
        run = start_miniature(cfg, report, ctx, events, samples=miniature_samples, on_result=on_result,
                              on_tick=on_tick, workdir=workdir)
        if run is not None:
            try:
                run.wait()
            finally:
                run.stop()
    return report


def _emit(events: Any | None, result: CheckResult) -> None:
    if events is not None:
        events.emit(protocol.EVENT_CHECK, name=result.name, status=result.status, reason=result.reason,
                    fix=result.fix, details=_json_safe(result.details))


def _json_safe(value: Any) -> Any:
    """The details as the events file can hold them: what JSON has no form for (a path, a tuple key) becomes its
    text rather than failing the run's event."""
    if isinstance(value, dict):
        return {k if isinstance(k, (str, int, float, bool)) else str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def _stage_reporter(events: Any | None) -> Callable[[str, str], None]:
    """What a long check calls as each stage starts: a ``check_stage`` event, and a line in the run's log."""
    started: dict[str, float] = {}

    def report(name: str, stage: str) -> None:
        began = started.setdefault(name, time.monotonic())
        if events is None:
            return
        elapsed = round(time.monotonic() - began, 1)
        events.emit(protocol.EVENT_CHECK_STAGE, name=name, stage=stage, elapsed_s=elapsed)
        say = getattr(events, "say", None)
        if say is not None:
            say(f"preflight: {name} {stage} ({elapsed:.0f} s in)")

    return report


MARKS = {PASS: "ok  ", WARN: "warn", FAIL: "FAIL"}
NAME_WIDTH = 13  # the checks' names line up; a longer one (the miniature's comparison) pushes its reason on
TRACEBACK_LINES = 25  # of a failed miniature's traceback, printed under its line


def print_row(r: CheckResult, out: TextIO, traceback: bool = True) -> None:
    """One check's line (and its fix), as it finishes; a failed miniature's traceback under it, unless the reader
    has it already (a job's log, where the miniature's output is a lane)."""
    from eaglewatch.safetext import safe_text

    # Reasons quote the config, file names and decoded engine output: every line goes through the one gate.
    print(f"  [{MARKS[r.status]}] {safe_text(r.name):<{NAME_WIDTH}}  {safe_text(r.reason)}", file=out, flush=True)
    if r.fix and r.status != PASS:
        print(f"         {'':<{NAME_WIDTH}}  fix: {safe_text(r.fix)}", file=out, flush=True)
    text = r.details.get("traceback") if r.status == FAIL and traceback else None
    if isinstance(text, str) and text:
        lines = text.splitlines()[-TRACEBACK_LINES:]
        print(f"         {'':<{NAME_WIDTH}}  the traceback's last {len(lines)} lines:", file=out)
        for line in lines:
            print(f"         {'':<{NAME_WIDTH}}  | {safe_text(line)}", file=out)
        out.flush()


def print_progress(name: str, stage: str, elapsed: float, last_line: str, out: TextIO) -> None:
    """A running check's line: its stage, how long it has run, and the last thing its engine said."""
    from eaglewatch.safetext import safe_text

    import shutil

    head = f"  [....] {name:<{NAME_WIDTH}}  {stage}, {elapsed:.0f} s"
    # One row on the terminal (an 80-column one too); a log that is not a terminal gets up to 120 columns.
    room = max(20, shutil.get_terminal_size((120, 24)).columns - len(head) - 3)
    said = safe_text(last_line)
    said = said if len(said) <= room else said[:room - 3] + "..."
    print(head + (f": {said}" if said else ""), file=out, flush=True)


def print_summary(report: PreflightReport, out: TextIO) -> None:
    failed, warned = len(report.failed), sum(r.status == WARN for r in report.results)
    print(f"preflight: {'FAILED' if failed else 'passed'} ({failed} failed, {warned} warnings, "
          f"{len(report.results)} checks)", file=out, flush=True)


def print_table(report: PreflightReport, out: TextIO) -> None:
    """Every result at once (``--json``'s readers and tests); runs print each row as it finishes instead."""
    for r in report.results:
        print_row(r, out)
    print_summary(report, out)
