"""Short notes printed while ``eaglewatch decode --follow`` reads a growing log."""

from __future__ import annotations

import sys
import time
from typing import IO, Callable, Iterable, Optional

from eaglewatch.decode.events import BarUpdate, LineEvent, ProcessDeath, ProvisionalFailure, TracebackEvent
from eaglewatch.decode.report import fmt_seconds
from eaglewatch.decode.rootcause import summary
from eaglewatch.decode.state import DecodeState


class LiveNotes:
    """New lanes, failures, warnings, and bars (when they finish, and at most every ``bar_every_s``).

    A failure is printed as soon as its exception line arrives (a :class:`ProvisionalFailure`); when its report
    is complete it is printed again only if that changed it (a chained exception), marked "refined".
    """

    def __init__(
        self,
        state: Optional[DecodeState] = None,
        out: Optional[IO[str]] = None,
        quiet: bool = False,
        clock: Callable[[], float] = time.monotonic,
        bar_every_s: float = 10.0,
    ) -> None:
        self.state = state
        self.out = out if out is not None else sys.stdout
        self.quiet = quiet
        self.clock = clock
        self.bar_every_s = bar_every_s
        self._lanes: set[str] = set()
        self._bars: dict[tuple[str, str], tuple[float, bool]] = {}
        self._shown: dict[tuple[str, int], str] = {}  # (lane, line) of a provisional failure -> what was printed

    def say(self, text: str) -> None:
        if self.quiet:
            return
        self.out.write(text + "\n")
        self.out.flush()

    def emit(self, events: Iterable[object]) -> None:
        if self.quiet:
            return
        for event in events:
            kind = type(event)
            if kind is LineEvent:
                if event.lane not in self._lanes:  # type: ignore[attr-defined]
                    self._lanes.add(event.lane)  # type: ignore[attr-defined]
                    self.say(f"+ lane {event.lane}")  # type: ignore[attr-defined]
            elif kind is BarUpdate:
                self._bar(event)  # type: ignore[arg-type]
            elif kind is ProvisionalFailure:
                failure = event.failure  # type: ignore[attr-defined]
                key = (failure.lane, failure.line_no)
                text = summary(failure)
                if self._shown.get(key) != text:
                    refined = " (refined)" if key in self._shown else ""
                    self._shown[key] = text
                    mark = "~ warning" if failure.survived else "! failure"
                    self.say(f"{mark} [{self._who(failure)}] {text}{refined}")
            elif kind is TracebackEvent or kind is ProcessDeath:
                text = summary(event)  # type: ignore[arg-type]
                before = self._shown.pop((event.lane, event.line_no), None)  # type: ignore[attr-defined]
                if before == text:
                    continue
                refined = " (refined)" if before is not None else ""
                mark = "~ warning" if event.survived else "! failure"  # type: ignore[attr-defined]
                self.say(f"{mark} [{self._who(event)}] {text}{refined}")

    def _who(self, event: object) -> str:
        """The name the process's lane shows (it may have printed the failure under a less telling one)."""
        who = event.who  # type: ignore[attr-defined]
        pid = getattr(event, "pid", None)
        if self.state is not None and pid is not None and who == event.lane:  # type: ignore[attr-defined]
            lane = self.state.lanes.get(str(pid))
            if lane is not None:
                return lane.name
        return who

    def _bar(self, bar: BarUpdate) -> None:
        key = (bar.lane, bar.desc)
        now = self.clock()
        last = self._bars.get(key)
        done = bar.done
        if last is not None:
            printed_at, was_done = last
            if done and was_done:
                return
            if not done and now - printed_at < self.bar_every_s:
                return
        self._bars[key] = (now, done)
        total = f"/{bar.total:g}" if bar.total is not None else ""
        state = "done" if done else (f"eta {fmt_seconds(bar.eta_s)}" if bar.eta_s is not None else "")
        self.say(f"= [{bar.lane}] {bar.desc or 'progress'}: {bar.n:g}{total} {state}".rstrip())
