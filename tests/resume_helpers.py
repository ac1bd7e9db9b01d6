"""Start a real extraction, kill -9 its whole process group part-way, and let the caller resume it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import TEST_SEED, read_events, seeded_rng


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


class KillPoints:
    """The random kill points of one test, drawn from the run's seed (EAGLEWATCH_TEST_SEED) and the test's name,
    and a record of each attempt, for the failure message: a rerun with the same seed draws the same points."""

    def __init__(self, test_name: str) -> None:
        self.test_name = test_name
        self.seed = TEST_SEED
        self.rng = seeded_rng(test_name)
        self.attempts: list[str] = []

    def draw(self, upper: int) -> tuple[int, float]:
        """(samples written, then extra delay in seconds) of the next kill."""
        return self.rng.randint(1, upper), self.rng.random() * 0.05

    def note(self, text: str) -> None:
        self.attempts.append(text)
        print(f"[kill points] {text}", flush=True)

    def __str__(self) -> str:
        tried = "; ".join(self.attempts) or "none yet"
        return f"EAGLEWATCH_TEST_SEED={self.seed} ({self.test_name}), kill points: {tried}"


def kill_mid_run(args: list[str], out: Path, points: KillPoints, total: int, upper: int, attempts: int = 3) -> int:
    """kill_part_way at a random point below ``upper`` samples; when the run finished before the kill landed (a
    tiny model writes its last batches within the poll interval), start over with a lower point. Returns how many
    sample files the killed run left (0 < left < total unless every attempt overshot). Each attempt is printed and
    noted in ``points``; a failure here names the seed and the points."""
    print(f"[kill points] EAGLEWATCH_TEST_SEED={points.seed} for {points.test_name}", flush=True)
    left = total
    for _ in range(attempts):
        if out.exists():
            shutil.rmtree(out)
        after, delay = points.draw(upper)
        try:
            left = kill_part_way(args, out, after_samples=after, extra_delay_s=delay)
        except AssertionError as exc:
            points.note(f"after {after} samples + {delay:.3f} s: {exc}")
            raise AssertionError(f"{exc} ({points})") from None
        points.note(f"after {after} samples + {delay:.3f} s: {left} of {total} files left")
        if left < total:
            return left
        upper = max(1, upper // 2)
    return left
