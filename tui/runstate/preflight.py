"""The preflight's ``check`` events, folded: one entry per check, its latest word, in the order checks first came.

A long check (the miniature) sends a ``check_stage`` event as each stage starts (``stage``, ``elapsed_s``): it shows
as running until its ``check`` event, the result, comes.
Times come from the events' own ``t`` (the host's clock, as the run's start time does), so a reattach shows how
long the check has been running, not how long the dashboard has watched it. Plain Python, no IO.
"""

from __future__ import annotations

from typing import Any, Optional

from eaglewatch import protocol as p
from eaglewatch.tui.runstate.view import CheckView

RUNNING = "running"  # the status shown for a check whose stages have begun and whose result has not come


def _float(value: Any) -> Optional[float]:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


class Preflight:
    def __init__(self) -> None:
        self._latest: dict[str, dict[str, Any]] = {}  # check name -> its latest event; insertion order is arrival
        self._began: dict[str, float] = {}  # check name -> host time its first stage began
        self.version = 0

    def feed(self, event: dict[str, Any]) -> None:
        """A ``check`` or ``check_stage`` event."""
        name = str(event.get("name") or "check")
        if event.get("kind") == p.EVENT_CHECK_STAGE:
            event = {**event, "status": RUNNING}
            if name not in self._began:
                t = _float(event.get("t"))
                if t is not None:
                    self._began[name] = t - max(0.0, _float(event.get("elapsed_s")) or 0.0)
        self._latest[name] = event
        self.version += 1

    @property
    def running(self) -> bool:
        return any(event.get("status") == RUNNING for event in self._latest.values())

    def failed(self) -> list[tuple[str, dict[str, Any]]]:
        return [(name, event) for name, event in self._latest.items() if event.get("status") == p.CHECK_FAIL]

    def _elapsed(self, name: str, event: dict[str, Any], now: float) -> tuple[Optional[float], Optional[float]]:
        """How long the check ran (or has been running), and for a running one how long its stage has."""
        began = self._began.get(name)
        if event.get("status") == RUNNING:
            t = _float(event.get("t"))
            stage = max(0.0, now - t) if t is not None else None
            return (max(0.0, now - began) if began is not None else stage), stage
        details = event.get("details")
        seconds = _float(details.get("seconds")) if isinstance(details, dict) else None
        if seconds is None and began is not None and _float(event.get("t")) is not None:
            seconds = max(0.0, float(event["t"]) - began)
        return seconds, None

    def views(self, now: float) -> tuple[CheckView, ...]:
        """The checks; ``now`` is the wall clock, for the running ones' ticking times."""
        out = []
        for name, event in self._latest.items():
            elapsed, stage_elapsed = self._elapsed(name, event, now)
            running = event.get("status") == RUNNING
            out.append(CheckView(
                name=name,
                status=str(event.get("status") or "?"),
                reason=str(event.get("reason") or ""),
                fix=str(event.get("fix") or ""),
                stage=str(event.get("stage")) if running and event.get("stage") else None,
                elapsed_s=elapsed,
                stage_elapsed_s=stage_elapsed,
            ))
        return tuple(out)

    def running_seconds(self, now: float) -> int:
        """Whole seconds the running checks have run, summed: moves once a second while one runs (the redraw cue
        for their ticking times)."""
        total = 0
        for name, event in self._latest.items():
            if event.get("status") == RUNNING:
                elapsed, _ = self._elapsed(name, event, now)
                total += int(elapsed or 0)
        return total
