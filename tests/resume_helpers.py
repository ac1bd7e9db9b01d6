"""Start a real extraction, kill -9 its whole process group part-way, and let the caller resume it."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import read_events


def kill_part_way(args: list[str], out: Path, after_samples: int, extra_delay_s: float, timeout_s: float = 300
                  ) -> int:
    """Run ``eaglewatch ARGS``; SIGKILL its process group once ``after_samples`` files were reported written
    (plus ``extra_delay_s``). Return how many sample files exist afterwards."""
    proc = subprocess.Popen([sys.executable, "-m", "eaglewatch", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise AssertionError(f"the run ended (code {proc.returncode}) before it could be killed")
            written = sum(1 for e in read_events(out / "events.jsonl") if e["kind"] == "sample")
            if written >= after_samples:
                time.sleep(extra_delay_s)
                break
            time.sleep(0.01)
        else:
            raise AssertionError("the run did not reach the kill point in time")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    return len(list(out.glob("hs_*.safetensors")))


def kill_mid_run(args: list[str], out: Path, rng: random.Random, total: int, upper: int, attempts: int = 3) -> int:
    """kill_part_way at a random point below ``upper`` samples; when the run finished before the kill landed (a
    tiny model writes its last batches within the poll interval), start over with a lower point. Returns how many
    sample files the killed run left (0 < left < total unless every attempt overshot)."""
    left = total
    for _ in range(attempts):
        if out.exists():
            shutil.rmtree(out)
        left = kill_part_way(args, out, after_samples=rng.randint(1, upper), extra_delay_s=rng.random() * 0.05)
        if left < total:
            return left
        upper = max(1, upper // 2)
    return left
