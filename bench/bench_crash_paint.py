"""Crash to paint: from a crash's lines entering a local run's log to the failure painted in the dashboard.

    .venv/bin/python bench/bench_crash_paint.py [--reps 120] [--size 120x40] [--warm-s 2]

The real app (``DashboardApp``, headless under ``run_test()``) on the real local agent, the path a local run takes:
the job writes to its run directory's ``log`` (the supervisor gives it the file as stdout), the agent follows the
file (inotify) and sends log messages over its pipe, the connection's reader hands them to ``feed.follow_run``
(the run screen's thread worker), which decodes them into the RunModel; the run screen polls the model 15 times a
second and redraws its panels; Textual composes the frame.

Each repetition is a fresh run (a crash is a run's first failure, the one an operator waits for): the job prints
steady INFO lines on 4 worker lanes until it is told to crash, then writes a traceback in one lane with one
``write()``, taking ``t0 = time.monotonic()`` just before it (CLOCK_MONOTONIC: one clock for every process of the
machine) and noting it in a side file. Two cases, alternating, side by side in one run:

* ``keeps``: every lane, the crashed one too, keeps printing after the traceback (the report is closed by the
  lane's next line);
* ``quiet``: nothing more is written after the traceback (the worker died; only the decoder's provisional failure,
  or its 2 s idle flush, can show it).

The paint is detected in the frames themselves: ``App._display`` is handed every compositor update (Textual skips
writing it to a terminal when headless, and does everything before that); this app applies each update (a full
layout or changed spans of lines) to a character grid, the screen a terminal would show, and the end of a
repetition is the first frame after which the failure panel's region of that grid holds the exception's text
(``AssertionError: crash N case``; the log panel shows the same line, so only the panel's region counts).

When the crash comes: by default as soon as the new run streams (eight lines in, two redraws), while its screen is
still settling (its first layout, the collection ``gcpolicy.settle`` makes when a run screen opens, the log's first
fill). ``--warm-s S`` lets the run stream S seconds first, as a crash minutes into a job finds the dashboard.

Besides the paint, each repetition notes when the run's model first held the failure (the feed thread's decode,
end of transport and decoding), so that the time is split into what comes before the UI and the UI's part (the
screen's redraw, the layout and the frame).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

CASES = ("keeps", "quiet")

JOB = r"""
import os, sys, time
case, trigger, stamps, done, rep = sys.argv[1:6]
lanes = [f"(Worker_TP{i} pid={4000 + i}) " for i in range(4)]
n = 0

def steady(lines):
    global n
    out = []
    for _ in range(lines):
        out.append(f"{lanes[n % 4]}INFO 12-01 13:20:00 [gpu_model_runner.py:{n % 4000}] step {n} ok\n")
        n += 1
    os.write(1, "".join(out).encode())

while not os.path.exists(trigger):  # about 400 lines/s until the crash
    steady(4)
    time.sleep(0.01)
head = f"{lanes[int(rep) % 4]}ERROR 12-01 13:20:01 [multiproc_executor.py:1063] "
crash = "".join(head + part + "\n" for part in (
    "Traceback (most recent call last):",
    f'  File "/srv/eagle/worker.py", line {10 + int(rep)}, in execute_model',
    "    assert self.ok",
    f"AssertionError: crash {rep} {case}"))
t0 = time.monotonic()
os.write(1, crash.encode())
with open(stamps, "a") as fh:
    fh.write(f"{rep} {t0!r}\n")
while not os.path.exists(done):
    if case == "keeps":
        steady(4)
    time.sleep(0.01)
"""


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def make_app(run_root: Path, argv: list[str]) -> Any:
    from textual._compositor import ChopsUpdate, LayoutUpdate

    from eaglewatch.tui.app.app import DashboardApp, LaunchRequest
    from eaglewatch.tui.app.screens.run import RunScreen
    from eaglewatch.tui.app.widgets.panels import FailurePanel
    from eaglewatch.tui.runstate import RunModel

    class TimedModel(RunModel):
        """Notes when the decoded failure first enters the model (on the feed thread)."""

        decoded_at: Optional[float] = None

        def _take(self, events: list[Any]) -> None:
            super()._take(events)
            if self.decoded_at is None and self.decoder.state.version and self._failures():
                self.decoded_at = time.monotonic()

    class PaintWatch(DashboardApp):
        """The dashboard, keeping the screen a terminal would show and noting when a text reaches the panel."""

        def __init__(self) -> None:
            super().__init__("local", launch=LaunchRequest(argv, name="crash-paint-0"),
                             connect_kwargs={"run_root": str(run_root)})
            self.grid: list[list[str]] = []
            self.wanted: Optional[str] = None
            self.painted_at: Optional[float] = None
            self.painted = asyncio.Event()

        def _put(self, x: int, y: int, text: str, end: Optional[int] = None) -> None:
            if not 0 <= y < len(self.grid):
                return
            row = self.grid[y]
            stop = min(len(row), x + len(text), end if end is not None else len(row))
            if stop > x:
                row[x:stop] = text[: stop - x]

        def _display(self, screen, renderable) -> None:
            super()._display(screen, renderable)
            if renderable is None or screen is not self.screen:
                return
            width, height = self.size
            if len(self.grid) != height or (self.grid and len(self.grid[0]) != width):
                self.grid = [[" "] * width for _ in range(height)]
            if isinstance(renderable, LayoutUpdate):
                for y, line in enumerate(renderable.strips, renderable.region.y):
                    x = renderable.region.x
                    for strip in line:
                        self._put(x, y, strip.text)
                        x += strip.cell_length
            elif isinstance(renderable, ChopsUpdate):
                for y, x1, x2 in renderable.spans:
                    for end, (x, strip) in zip(renderable.chop_ends[y], renderable.chops[y].items()):
                        if strip is None or x > x2 or end <= x1:
                            continue
                        self._put(x, y, strip.text, min(end, x2 + 1))
            if self.wanted is not None and self.painted_at is None:
                panels = screen.query(FailurePanel)
                if panels:
                    region = panels.first().region
                    rows = ("".join(self.grid[y][region.x:region.right]) for y in range(region.y, region.bottom)
                            if 0 <= y < len(self.grid))
                    if any(self.wanted in row for row in rows):
                        self.painted_at = time.monotonic()
                        self.painted.set()

        def open_run(self, summary, replace: bool) -> None:
            """As the dashboard's own, with a model that notes when the failure came in."""
            self.opened_runs.append(summary["run"])
            screen = RunScreen(summary["run"], TimedModel(self.host, summary, thresholds=self.thresholds))
            if replace and isinstance(self.screen, RunScreen):
                self.switch_screen(screen)
            else:
                self.push_screen(screen)

        def expect(self, text: str) -> None:
            self.wanted = text
            self.painted_at = None
            self.painted.clear()

    return PaintWatch()


def job_argv(case: str, work: Path, rep: int) -> list[str]:
    return [sys.executable, "-c", JOB, case, str(work / f"crash-{rep}"), str(work / "stamps"),
            str(work / f"done-{rep}"), str(rep)]


def stamp_of(work: Path, rep: int) -> Optional[float]:
    path = work / "stamps"
    if not path.exists():
        return None
    for line in path.read_text().splitlines():
        number, _, t0 = line.partition(" ")
        if number == str(rep):
            return float(t0)
    return None


async def measure(args: argparse.Namespace, work: Path) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    from app_support import wait_until

    from eaglewatch.tui.app.screens.run import RunScreen

    width, height = (int(part) for part in args.size.split("x"))
    app = make_app(work / "runs", job_argv(CASES[0], work, 0))
    results: dict[str, list[float]] = {case: [] for case in CASES}
    decoded: dict[str, list[float]] = {case: [] for case in CASES}
    async with app.run_test(size=(width, height)) as pilot:
        for rep in range(2 * args.reps):
            case = CASES[rep % 2]
            if rep:  # a fresh run, opened the way a restart opens its new run
                summary = await asyncio.to_thread(app.live_connection().launch, job_argv(case, work, rep),
                                                  name=f"crash-paint-{rep}")
                app.open_run(summary, True)
            screen = await wait_until(
                pilot, lambda rep=rep: isinstance(app.screen, RunScreen)
                and app.screen.run_id and app.screen.model.snapshot().lines >= 8 and app.screen.redraws > 1
                and f"crash-paint-{rep}" in (app.screen.model.snapshot().name or "") and app.screen,
                60, step_s=0.02, what=f"run {rep} streaming")
            warm_s = getattr(args, "warm_s", 0.0)
            if warm_s:
                # The run has been on screen a while, as a crash minutes into a job finds it: its screen's first
                # layout, collection and log fill are over.
                streaming_since = time.monotonic()
                await wait_until(pilot, lambda since=streaming_since, warm=warm_s: time.monotonic() - since >= warm,
                                 warm_s + 30, step_s=0.05, what="the run on screen for a while")
            app.expect(f"AssertionError: crash {rep} {case}")
            (work / f"crash-{rep}").touch()
            try:
                await asyncio.wait_for(app.painted.wait(), 30)
            except asyncio.TimeoutError:
                raise AssertionError(f"crash {rep} ({case}) not painted in 30 s; model: "
                                     f"{[f.summary for f in screen.model.snapshot().failures]}") from None
            t0 = stamp_of(work, rep)
            while t0 is None:
                await asyncio.sleep(0.001)
                t0 = stamp_of(work, rep)
            assert app.painted_at is not None
            results[case].append(1000 * (app.painted_at - t0))
            if screen.model.decoded_at is not None:
                decoded[case].append(1000 * (screen.model.decoded_at - t0))
            (work / f"done-{rep}").touch()
        await pilot.press("q")
    return results, decoded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=120, help="repetitions of each case")
    parser.add_argument("--size", default="120x40", help="terminal size, COLUMNSxROWS")
    parser.add_argument("--warm-s", type=float, default=0.0,
                        help="seconds the run streams on screen before its crash (0: as soon as it streams)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-crash-paint-", dir=os.environ.get("TMPDIR")))
    load_before = os.getloadavg()
    started = time.monotonic()
    results, decoded = asyncio.run(measure(args, work))
    load_after = os.getloadavg()
    print(f"crash to paint, real app headless at {args.size}, local agent, {args.reps} runs per case, "
          f"crash {args.warm_s:g} s after the run streams, "
          f"{time.monotonic() - started:.0f} s; nproc {os.cpu_count()}, load average before "
          f"{load_before[0]:.2f}/{load_before[1]:.2f}/{load_before[2]:.2f}, after "
          f"{load_after[0]:.2f}/{load_after[1]:.2f}/{load_after[2]:.2f}")
    print(f"{'case':<6} {'until':<8} {'n':>4} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'max ms':>8} {'mean ms':>8}")
    for case in CASES:
        for until, ms in (("in model", decoded[case]), ("painted", results[case])):
            print(f"{case:<6} {until:<8} {len(ms):>4} {percentile(ms, .5):>8.1f} {percentile(ms, .9):>8.1f} "
                  f"{percentile(ms, .99):>8.1f} {max(ms):>8.1f} {statistics.mean(ms):>8.1f}")
    keeps, quiet = results["keeps"], results["quiet"]
    print(f"quiet / keeps: p50 {percentile(quiet, .5) / percentile(keeps, .5):.2f}x, "
          f"p99 {percentile(quiet, .99) / percentile(keeps, .99):.2f}x")


if __name__ == "__main__":
    main()
