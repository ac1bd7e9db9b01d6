"""A real small filesystem for tests of what a run does when its disk is small or full: a tmpfs of the given size.
Mounting needs root; where it is refused the test is skipped, saying so."""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path
from typing import Iterator

import pytest


@contextlib.contextmanager
def small_filesystem(folder: Path, size: str) -> Iterator[Path]:
    folder.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a small filesystem here: {proc.stderr.decode(errors='replace').strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)
