"""How fast the output's disk takes data, measured in a second or two, for the preflight's disk line.

A run at the target's width writes 57 KiB a token; a node extracts tens of thousands of tokens a second, faster
than many disks. The preflight writes a scratch file beside the output in blocks of up to 8 MiB for about a
second (never more than 512 MiB, nor more than a twentieth of the free space), makes it durable (``fsync``: the
page cache alone would measure memory), and deletes it. What it gives is a first figure, not a benchmark: a
disk's speed under a long run also depends on what else writes to it.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

BLOCK = 8 << 20
MIN_BLOCK = 64 << 10
MAX_BYTES = 512 << 20
WRITE_FOR_S = 1.0
SCRATCH = ".eaglewatch-disk-speed"


@dataclass(frozen=True)
class DiskSpeed:
    bytes_per_s: float
    wrote: int
    seconds: float


def measure(folder: Path, free: int, write_for_s: float = WRITE_FOR_S) -> DiskSpeed | None:
    """Bytes a second that ``folder``'s disk took, durably; None when it could not be measured (no room, not
    writable): the line then says so, and the run is not refused for it."""
    limit = min(MAX_BYTES, free // 20)
    size = min(BLOCK, limit // 4)  # a small disk is measured in smaller blocks, never filled
    if size < MIN_BLOCK:
        return None
    path = folder / f"{SCRATCH}.{os.getpid()}"
    block = os.urandom(size)  # incompressible: a filesystem that compresses must not flatter the figure
    wrote = 0
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError:
        return None
    try:
        start = time.perf_counter()
        while wrote + size <= limit and time.perf_counter() - start < write_for_s:
            wrote += os.write(fd, block)
        os.fsync(fd)
        seconds = time.perf_counter() - start
    except OSError:
        return None
    finally:
        os.close(fd)
        try:
            path.unlink()
        except OSError:
            pass
    return DiskSpeed(wrote / seconds, wrote, seconds) if wrote and seconds > 0 else None
