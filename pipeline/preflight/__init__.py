"""Preflight: catch a broken extraction in seconds, before the 18-minute model load.

``checks`` reads the model folder, data, disk and installed vLLM without loading anything; ``miniature`` runs the
real extract path on a toy clone of the architecture. ``run_preflight`` does both and reports each result as a
``check`` event, so the dashboard shows the checklist before loading starts. The miniature takes a minute or more:
as each of its stages starts it says so in a ``check_stage`` event (``protocol.EVENT_CHECK_STAGE``), and its result,
with the decoded root cause of a failure in ``details``, follows as its ``check`` event.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, TextIO

from eaglewatch import protocol
from eaglewatch.pipeline.model_info import ModelInfo
from eaglewatch.pipeline.plan import ExtractConfig, shard_for_rank
from eaglewatch.pipeline.preflight.checks import FAIL, PASS, WARN, CheckResult, run_checks
from eaglewatch.pipeline.prepared_data import DataReport


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


def run_preflight(cfg: ExtractConfig, events: Any | None = None, *, miniature: bool = True,
                  miniature_samples: int = 4, workdir: str | None = None, runs_here: bool = True) -> PreflightReport:
    """The checks, then (when they all pass and ``miniature``) the miniature run.

    ``events`` is an :class:`~eaglewatch.pipeline.events.EventLog` (or None): each result becomes a check event.
    ``runs_here`` is False for ``eaglewatch preflight``, which checks a job that may run elsewhere: what this
    machine's engine lacks is then a warning, not the job's failure."""
    results, ctx = run_checks(cfg, runs_here=runs_here)
    report = PreflightReport(results, info=ctx.info, data=ctx.data)
    for result in results:
        _emit(events, result)
    if miniature and report.passed and ctx.info is not None and ctx.layer_ids is not None:
        from eaglewatch.pipeline.preflight.miniature import run_miniature

        samples = shard_for_rank(ctx.data.samples, cfg.rank, cfg.world_size) if ctx.data is not None else None
        mini = run_miniature(cfg, ctx.info, ctx.layer_ids, samples=miniature_samples, workdir=workdir,
                             data=samples, on_stage=_stage_reporter(events, "miniature"))
        result = CheckResult("miniature", mini.status, mini.reason,
                             "" if mini.status == PASS else f"see {mini.log_path}" + (
                                 "; fix this before the real load" if mini.status == FAIL else ""),
                             details={"layer_map": mini.layer_map, "seconds": round(mini.seconds, 1),
                                      "root_cause": mini.root_cause, **mini.details})
        report.results.append(result)
        _emit(events, result)
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


def _stage_reporter(events: Any | None, name: str) -> Callable[[str], None]:
    """What a long check calls as each stage starts: a ``check_stage`` event, and a line in the run's log."""
    started = time.monotonic()

    def report(stage: str) -> None:
        if events is None:
            return
        elapsed = round(time.monotonic() - started, 1)
        events.emit(protocol.EVENT_CHECK_STAGE, name=name, stage=stage, elapsed_s=elapsed)
        say = getattr(events, "say", None)
        if say is not None:
            say(f"preflight: {name} {stage} ({elapsed:.0f} s in)")

    return report


MARKS = {PASS: "ok  ", WARN: "warn", FAIL: "FAIL"}


def print_table(report: PreflightReport, out: TextIO) -> None:
    from eaglewatch.safetext import safe_text

    # Reasons quote the config, file names and decoded engine output: every line goes through the one gate.
    width = max((len(r.name) for r in report.results), default=10)
    for r in report.results:
        print(f"  [{MARKS[r.status]}] {safe_text(r.name):<{width}}  {safe_text(r.reason)}", file=out)
        if r.fix and r.status != PASS:
            print(f"         {'':<{width}}  fix: {safe_text(r.fix)}", file=out)
    failed, warned = len(report.failed), sum(r.status == WARN for r in report.results)
    print(f"preflight: {'FAILED' if failed else 'passed'} ({failed} failed, {warned} warnings, "
          f"{len(report.results)} checks)", file=out)
