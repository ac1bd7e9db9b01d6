"""The run's log and its failures written to plain files, for a pager, a ticket or a colleague.

Every line is written as the dashboard shows it: through ``eaglewatch.safetext`` (host text never drives the
terminal that later ``cat``s the file). Each file is built beside its final name and swapped in, so a second save
never leaves half a file."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Iterable, Sequence

from eaglewatch.safetext import safe_text
from eaglewatch.tui.runstate import FailureView, LogLine

_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")


def file_stem(run: object) -> str:
    """A file name from a run id the host sent: letters, digits, ``._-`` only, never hidden, never empty."""
    stem = _UNSAFE_NAME.sub("_", str(run or "run")).lstrip(".")[:120]
    return stem or "run"


def log_text(lines: Iterable[LogLine]) -> str:
    return "".join(f"{safe_text(line.lane):<12} {safe_text(line.level or ''):<8} {safe_text(line.text, chr(9))}\n"
                   for line in lines)


def failures_text(failures: Sequence[FailureView]) -> str:
    parts = []
    for failure in failures:
        parts.append(f"=== failure {failure.position} ({safe_text(failure.tier)}; lanes {safe_text(failure.lanes)})\n"
                     f"{safe_text(failure.summary)}\n")
        if failure.hint_title:
            parts.append(f"hint: {safe_text(failure.hint_title)}\n{safe_text(failure.hint_text, chr(10))}\n")
        parts.append(safe_text(failure.traceback, "\n\t") + "\n\n")
    return "".join(parts)


def write_beside(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file in the same folder, then rename it into place."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def save_run(folder: Path, run: object, lines: Sequence[LogLine], failures: Sequence[FailureView]) -> list[Path]:
    """``<run>.log.txt`` (the log as the dashboard holds it) and, when there are failures,
    ``<run>.failures.txt`` (each one's traceback, root cause first), in ``folder``."""
    stem = file_stem(run)
    written = [write_beside(folder / f"{stem}.log.txt", log_text(lines))]
    if failures:
        written.append(write_beside(folder / f"{stem}.failures.txt", failures_text(failures)))
    return written
