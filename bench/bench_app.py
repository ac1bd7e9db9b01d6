"""Dashboard benchmarks: crash to screen over the loopback sshd, a long stream through the app, idle cost.

    .venv/bin/python bench/bench_app.py crash  [--crashes 200] [--rate 5000]
    .venv/bin/python bench/bench_app.py stream [--lines 10000000]
    .venv/bin/python bench/bench_app.py idle   [--seconds 30]

crash:  a job on the host (over the real sshd on 127.0.0.1) writes 8 lanes of vLLM-style lines at --rate lines/s;
        now and then one lane writes a traceback whose message holds the wall-clock time of its last line. The
        dashboard's own feed loop (``eaglewatch.tui.app.feed.follow_run``, the code its thread worker runs) feeds
        a RunModel; latency = the moment the model's failure state holds that traceback decoded − that time.
stream: a local job writes --lines lines as fast as it can; the real app (headless) watches it. RSS of this
        process is sampled every second, and a key press (help screen open and closed) is timed while it runs.
idle:   the real app (headless) watches a run that prints nothing; CPU time of this process over --seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

CRASH_JOB = r"""
import sys, time, random
rate, crashes = float(sys.argv[1]), int(sys.argv[2])
lanes = [f"(Worker_TP{i} pid={1000 + i}) " for i in range(8)]
out = sys.stdout
random.seed(1)
tick = 0.01
per_tick = max(1, int(rate * tick))
start = time.monotonic()
next_crash = start + 1.0
n = done = 0
while done < crashes:
    buf = []
    for _ in range(per_tick):
        lane = lanes[n % 8]
        buf.append(f"{lane}INFO 11-30 04:11:45 [gpu_model_runner.py:{n % 4000}] step {n} ok\n")
        n += 1
    out.write("".join(buf))
    out.flush()
    now = time.monotonic()
    if now >= next_crash:
        lane = random.choice(lanes)
        out.write(f"{lane}ERROR 11-30 04:12:00 [multiproc_executor.py:1063] Traceback (most recent call last):\n"
                  f"{lane}ERROR 11-30 04:12:00 [multiproc_executor.py:1063]   File \"/srv/w.py\", line {10 + done}, in step\n"
                  f"{lane}ERROR 11-30 04:12:00 [multiproc_executor.py:1063]     assert ok\n")
        out.flush()
        out.write(f"{lane}ERROR 11-30 04:12:00 [multiproc_executor.py:1063] AssertionError: crash {done} t={time.time():.6f}\n")
        out.flush()
        done += 1
        next_crash = now + random.uniform(0.1, 0.3)
    sleep = start + (n / rate) - time.monotonic()
    if sleep > 0:
        time.sleep(sleep)
out.write("end\n")
"""

STREAM_JOB = r"""
import sys
total = int(sys.argv[1])
lanes = [f"(Worker_TP{i} pid={1000 + i}) " for i in range(8)]
block = 10000
out = sys.stdout.buffer
for start in range(0, total, block):
    out.write("".join(f"{lanes[i % 8]}INFO 11-30 04:11:45 [runner.py:77] step {i} tokens 2048\n"
                      for i in range(start, min(total, start + block))).encode())
out.flush()
"""


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def bench_crash(args: argparse.Namespace) -> None:
    from sshd import Sshd

    from eaglewatch.tui.app.feed import follow_run
    from eaglewatch.tui.connection import Connection
    from eaglewatch.tui.runstate import RunModel

    work = Path(tempfile.mkdtemp(prefix="bench-app-"))
    server = Sshd(work / "sshd")
    server.start()
    latencies: list[float] = []
    seen: set[str] = set()

    class Timed(RunModel):
        """A RunModel that notes when each traceback enters its failure state (the decoder's return)."""

        def _take(self, events):
            super()._take(events)
            now = time.time()
            for event in events:
                if type(event).__name__ != "TracebackEvent" or " t=" not in event.message:
                    continue
                if event.message not in seen:
                    seen.add(event.message)
                    latencies.append(now - float(event.message.rsplit("t=", 1)[1]))

    try:
        with Connection(server.spec, run_root=str(work / "runs"), ssh_options=server.options()) as connection:
            summary = connection.launch([sys.executable, "-u", "-c", CRASH_JOB, str(args.rate), str(args.crashes)])
            model = Timed("bench", summary)
            stop = threading.Event()
            thread = threading.Thread(target=follow_run, args=(connection, model, summary["run"], stop.is_set),
                                      kwargs={"telemetry": False}, daemon=True)
            thread.start()
            deadline = time.monotonic() + args.crashes * 0.3 + 60
            while len(latencies) < args.crashes and time.monotonic() < deadline:
                time.sleep(0.1)
            stop.set()
            thread.join(5)
    finally:
        server.stop()
    ms = [1000 * v for v in latencies]
    print(f"crash to screen over loopback sshd, 8 lanes at {args.rate:g} lines/s: {len(ms)}/{args.crashes} "
          f"crashes, p50 {percentile(ms, .5):.2f} ms, p99 {percentile(ms, .99):.2f} ms, max {max(ms):.2f} ms")


def rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def bench_stream(args: argparse.Namespace) -> None:
    from app_support import wait_until

    from eaglewatch.tui.app.app import DashboardApp, LaunchRequest
    from eaglewatch.tui.app.screens.dialogs import HelpScreen
    from eaglewatch.tui.app.screens.run import RunScreen

    work = Path(tempfile.mkdtemp(prefix="bench-app-", dir=os.environ.get("TMPDIR")))
    argv = [sys.executable, "-c", STREAM_JOB, str(args.lines)]
    app = DashboardApp("local", launch=LaunchRequest(argv, name="stream"),
                       connect_kwargs={"run_root": str(work / "runs")}, telemetry=False)
    rss: list[float] = []
    keys: list[float] = []

    async def scenario():
        async with app.run_test(size=(120, 40)) as pilot:
            screen = await wait_until(pilot, lambda: isinstance(app.screen, RunScreen) and app.screen, 30)
            started = time.monotonic()
            last_sample = 0.0
            while True:
                view = screen.model.snapshot()
                if view.exit_text and screen.model.decoder.state.lines >= args.lines:
                    break
                if time.monotonic() - last_sample >= 1.0:
                    last_sample = time.monotonic()
                    rss.append(rss_mb())
                    # The key goes in as the terminal driver would post it; answered = the help screen is up.
                    t0 = time.perf_counter()
                    app.simulate_key("question_mark")
                    while not isinstance(app.screen, HelpScreen):
                        await asyncio.sleep(0.001)
                    keys.append(time.perf_counter() - t0)
                    app.simulate_key("escape")
                    while app.screen is not screen:
                        await asyncio.sleep(0.001)
                await pilot.pause(0.05)
            elapsed = time.monotonic() - started
            lines = screen.model.decoder.state.lines
            await pilot.press("q")
            return elapsed, lines, screen.redraws

    elapsed, lines, redraws = asyncio.run(scenario())
    ms = [1000 * k for k in keys]
    print(f"stream: {lines:,} lines in {elapsed:.1f} s ({lines / elapsed:,.0f} lines/s through the app), "
          f"{redraws} redraws; RSS first/median/max {rss[0]:.0f}/{statistics.median(rss):.0f}/{max(rss):.0f} MB "
          f"(peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1000:.0f} MB); "
          f"key press answered p50 {percentile(ms, .5):.0f} ms, max {max(ms):.0f} ms ({len(ms)} presses)")
    for run in (work / "runs").iterdir():
        (run / "log").unlink(missing_ok=True)


def bench_idle(args: argparse.Namespace) -> None:
    from app_support import wait_until

    from eaglewatch.tui.app.app import DashboardApp, LaunchRequest
    from eaglewatch.tui.app.screens.run import RunScreen

    work = Path(tempfile.mkdtemp(prefix="bench-app-"))
    argv = [sys.executable, "-c", "print('waiting', flush=True); import time; time.sleep(3600)"]
    app = DashboardApp("local", launch=LaunchRequest(argv, name="idle"),
                       connect_kwargs={"run_root": str(work / "runs")})

    async def scenario():
        async with app.run_test(size=(120, 40)) as pilot:
            screen = await wait_until(pilot, lambda: isinstance(app.screen, RunScreen) and app.screen, 30)
            await pilot.pause(2.0)
            before = time.process_time()
            wall = time.monotonic()
            await pilot.pause(args.seconds)
            cpu = time.process_time() - before
            elapsed = time.monotonic() - wall
            await pilot.press("Q")
            await pilot.pause(0.3)
            await pilot.press("y")
            await pilot.pause(2.0)
            return cpu / elapsed, screen.redraws

    share, redraws = asyncio.run(scenario())
    print(f"idle: the app watching a silent run (telemetry at 1 Hz) uses {100 * share:.1f} % of one core "
          f"({redraws} redraws)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    crash = sub.add_parser("crash")
    crash.add_argument("--crashes", type=int, default=200)
    crash.add_argument("--rate", type=float, default=5000)
    stream = sub.add_parser("stream")
    stream.add_argument("--lines", type=int, default=10_000_000)
    idle = sub.add_parser("idle")
    idle.add_argument("--seconds", type=float, default=30)
    args = parser.parse_args()
    {"crash": bench_crash, "stream": bench_stream, "idle": bench_idle}[args.what](args)


if __name__ == "__main__":
    main()
