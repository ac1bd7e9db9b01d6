"""The pipeline's structured events: one protocol JSON line per event, written whether or not anyone watches.

Events go to ``<output>/events.jsonl`` and, when the agent launched the job, also to the file named by
``EAGLEWATCH_EVENTS_FILE`` (the run directory's copy). Each line is flushed as it is written, so a reader that
tails the file sees it at once and a crash loses nothing already said.
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path
from typing import Any, TextIO

from eaglewatch import protocol
from eaglewatch.safetext import safe_text

EVENTS_FILE_ENV = "EAGLEWATCH_EVENTS_FILE"


class EventLog:
    """Appends events to one or more JSONL files and echoes a readable line to the human log."""

    def __init__(self, *paths: str | Path | None, echo: TextIO | None = sys.stderr, include_env: bool = True):
        targets = [Path(p) for p in paths if p]
        env_path = os.environ.get(EVENTS_FILE_ENV) if include_env else None
        if env_path:
            targets.append(Path(env_path))
        self._files = []
        seen: set[str] = set()
        for target in targets:
            key = os.path.abspath(target)
            if key in seen:
                continue
            seen.add(key)
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                self._files.append(open(target, "ab", buffering=0))
            except OSError:
                # An unwritable output folder is reported by the run's own checks, with a clear message;
                # the events still reach the other targets (the agent's run directory).
                continue
        self._echo = echo

    def emit(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = protocol.make_event(kind, **fields)
        line = protocol.encode(event)
        for f in self._files:
            f.write(line)
        return event

    def phase(self, phase: str, detail: str = "") -> None:
        self.emit(protocol.EVENT_PHASE, phase=phase, detail=detail)
        self.say(f"phase: {phase}" + (f" ({detail})" if detail else ""))

    def warning(self, message: str, code: str = "") -> None:
        self.emit(protocol.EVENT_WARNING, message=message, code=code)
        self.say(f"warning: {message}")

    def error(self, exc: BaseException) -> None:
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        self.emit(protocol.EVENT_ERROR, exc_type=type(exc).__name__, message=str(exc), traceback=text)
        self.phase(protocol.PHASE_FAILED, f"{type(exc).__name__}: {exc}")

    def say(self, message: str) -> None:
        if self._echo is not None:
            # Messages quote paths and config fields: a job run in a terminal shows them through the gate too.
            print(f"[eaglewatch] {safe_text(message)}", file=self._echo, flush=True)

    def close(self) -> None:
        for f in self._files:
            f.close()
        self._files = []

    def __enter__(self) -> "EventLog":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
