"""Supervision over SSH: latency, reconnect time and idle cost, against a real sshd on 127.0.0.1.

    python bench/bench_ssh.py [--idle-seconds 60] [--write]

Latency is from the moment the job writes a line on the host (CLOCK_MONOTONIC, shared by every process on this
machine) to the moment its bytes reach the operator-side client: eaglewatch's watch callback, and, side by side
in the same run, a raw ``tail -F`` on a paramiko channel over the same sshd. ``--write`` puts the figures into the
``## Supervision over SSH`` section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from sshd import Sshd  # noqa: E402

from eaglewatch.pipeline.agent.rundir import RunDir  # noqa: E402
from eaglewatch.tui.connection import Connection, LinkState, LogChunk  # noqa: E402
from eaglewatch.tui.connection.links import remote_command  # noqa: E402
from eaglewatch.tui.connection.ssh import connect as ssh_connect  # noqa: E402

SECTION = "## Supervision over SSH"

# Writes `count` lines at `rate` lines/s once the go file exists; each line carries its write time.
WRITER = textwrap.dedent(
    """
    import os, sys, time
    go, rate, count = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    os.write(1, b"READY\\n")  # the reader is only timed once it has seen this: no start-up in the figures
    while not os.path.exists(go):
        time.sleep(0.005)
    start = time.monotonic()
    for i in range(count):
        due = start + i / rate
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        os.write(1, f"{i} {time.monotonic_ns()} ........................................\\n".encode())
    os.write(1, b"END\\n")
    """
)


class LineClock:
    """Splits received bytes into lines and records now - written for each."""

    def __init__(self) -> None:
        self.partial = b""
        self.latencies_ms: list[float] = []
        self.ready = threading.Event()
        self.done = threading.Event()

    def feed(self, data: bytes) -> None:
        now = time.monotonic_ns()
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()
        for line in lines:
            if line == b"END":
                self.done.set()
                continue
            if line == b"READY":
                self.ready.set()
                continue
            fields = line.split()
            if len(fields) >= 2 and fields[1].isdigit():
                self.latencies_ms.append((now - int(fields[1])) / 1e6)


def percentiles(values: list[float]) -> tuple[float, float, float]:
    ordered = sorted(values)
    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
    return pick(0.50), pick(0.99), ordered[-1]


def eaglewatch_latency(conn: Connection, workdir: Path, rate: float, count: int) -> LineClock:
    workdir.mkdir(parents=True, exist_ok=True)
    go = workdir / f"go-ew-{rate:g}"
    clock = LineClock()
    summary = conn.launch([sys.executable, "-c", WRITER, str(go), str(rate), str(count)])

    def on_batch(batch: list) -> None:
        for item in batch:
            if isinstance(item, LogChunk):
                clock.feed(item.data)

    watch = conn.watch(summary["run"], callback=on_batch)
    if not clock.ready.wait(30):
        raise RuntimeError("eaglewatch stream did not start")
    go.touch()
    if not clock.done.wait(count / rate + 60):
        raise RuntimeError("eaglewatch stream did not finish")
    conn.unwatch(watch)
    return clock


def tail_latency(server: Sshd, conn: Connection, workdir: Path, rate: float, count: int) -> LineClock:
    workdir.mkdir(parents=True, exist_ok=True)
    go = workdir / f"go-tail-{rate:g}"
    clock = LineClock()
    summary = conn.launch([sys.executable, "-c", WRITER, str(go), str(rate), str(count)])
    log = RunDir(Path(summary["run_dir"])).log_path
    assert conn.endpoint is not None
    chain = ssh_connect(conn.endpoint, server.options())
    channel = chain.transport.open_session()
    channel.exec_command(remote_command(["tail", "-F", "-n", "+1", str(log)]))

    def reader() -> None:
        while not clock.done.is_set():
            data = channel.recv(65536)
            if not data:
                return
            clock.feed(data)

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    if not clock.ready.wait(30):
        raise RuntimeError("tail -F did not start")
    go.touch()
    clock.done.wait(count / rate + 60)
    channel.close()
    chain.close()
    return clock


def reconnect_times(server: Sshd, conn: Connection, workdir: Path, rounds: int) -> list[float]:
    summary = conn.launch(["sh", "-c", "while :; do echo tick; sleep 0.01; done"])
    resumed = threading.Event()
    state = {"connected": False}

    def on_batch(batch: list) -> None:
        for item in batch:
            if isinstance(item, LinkState) and item.state == "connected":
                state["connected"] = True
            elif isinstance(item, LogChunk) and state["connected"]:
                resumed.set()

    watch = conn.watch(summary["run"], callback=on_batch)
    times = []
    for _ in range(rounds):
        time.sleep(0.5)
        resumed.clear()
        state["connected"] = False
        killed_at = time.monotonic()
        server.kill_all()
        server.start()
        if not resumed.wait(30):
            raise RuntimeError("the stream did not resume")
        times.append(time.monotonic() - killed_at)
    conn.unwatch(watch)
    conn.stop(summary["run"], grace_s=1)
    return times


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle_cpu(conn: Connection, seconds: float) -> tuple[float, float]:
    summary = conn.launch(["sleep", str(int(seconds) + 30)])
    watch = conn.watch(summary["run"])
    agent = conn.agent_pid
    supervisor = RunDir(Path(summary["run_dir"])).supervisor_pid()
    time.sleep(1.0)
    before = cpu_seconds(agent), cpu_seconds(supervisor)
    time.sleep(seconds)
    after = cpu_seconds(agent), cpu_seconds(supervisor)
    conn.unwatch(watch)
    conn.stop(summary["run"], grace_s=1)
    return (after[0] - before[0]) / seconds * 100, (after[1] - before[1]) / seconds * 100


def write_section(text: str) -> None:
    path = ROOT / "BENCHMARKS.md"
    current = path.read_text() if path.exists() else "# Benchmarks\n"
    start = current.find(SECTION)
    if start < 0:
        updated = current.rstrip("\n") + "\n\n" + text
    else:
        following = current.find("\n## ", start + len(SECTION))
        rest = current[following + 1 :] if following >= 0 else ""
        updated = current[:start] + text + ("\n" + rest if rest else "")
    path.write_text(updated.rstrip("\n") + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--idle-seconds", type=float, default=60.0)
    parser.add_argument("--slow-lines", type=int, default=1000, help="lines at 100 lines/s")
    parser.add_argument("--fast-lines", type=int, default=20000, help="lines at 5000 lines/s")
    parser.add_argument("--reconnects", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=4, help="alternating rounds per rate, pooled")
    parser.add_argument("--write", action="store_true", help="update BENCHMARKS.md")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="eaglewatch-bench-") as tmp:
        workdir = Path(tmp)
        server = Sshd(workdir / "sshd")
        server.start()
        conn = Connection(server.spec, run_root=str(workdir / "runs"), ssh_options=server.options(),
                          backoff_initial_s=0.05, backoff_max_s=0.5)
        try:
            conn.connect()
            rows = []
            for rate, count in ((100.0, args.slow_lines), (5000.0, args.fast_lines)):
                # Alternate the two in rounds and pool them, so that a burst of load elsewhere on the machine
                # does not land on one side only.
                ours_ms: list[float] = []
                raw_ms: list[float] = []
                for index in range(args.rounds):
                    per_round = count // args.rounds
                    ours_ms += eaglewatch_latency(conn, workdir / f"r{index}", rate, per_round).latencies_ms
                    raw_ms += tail_latency(server, conn, workdir / f"r{index}", rate, per_round).latencies_ms
                rows.append((rate, count, percentiles(ours_ms), percentiles(raw_ms), len(ours_ms), len(raw_ms)))
                print(f"{rate:g} lines/s: eaglewatch p50/p99/max {percentiles(ours_ms)} ms, "
                      f"tail -F {percentiles(raw_ms)} ms", flush=True)
            reconnects = reconnect_times(server, conn, workdir, args.reconnects)
            print(f"reconnect after sshd kill: {reconnects}", flush=True)
            agent_cpu, supervisor_cpu = idle_cpu(conn, args.idle_seconds)
            print(f"idle CPU: agent {agent_cpu:.3f} %, supervisor {supervisor_cpu:.3f} %", flush=True)
        finally:
            conn.close()
            server.stop()

    lines = [
        SECTION,
        "",
        f"`python bench/bench_ssh.py --write` ({args.rounds} alternating rounds per rate, pooled) on "
        f"{os.cpu_count()} cores, Python {platform.python_version()}, "
        f"OpenSSH sshd on 127.0.0.1 (measured {time.strftime('%Y-%m-%d')}). Latency: a line written by the job on "
        "the host (CLOCK_MONOTONIC stamp in the line) to its bytes in the operator-side client; eaglewatch is the "
        "agent → JSON lines → SSH channel → watch callback, `tail -F` is a raw paramiko channel over the same sshd.",
        "",
        "| rate | lines | eaglewatch p50 / p99 / max (ms) | raw `tail -F` p50 / p99 / max (ms) | p99 ratio |",
        "| --- | --- | --- | --- | --- |",
    ]
    for rate, _count, ours, raw, got_ours, got_raw in rows:
        ratio = ours[1] / raw[1] if raw[1] else float("inf")
        lines.append(
            f"| {rate:g} lines/s | {got_ours} / {got_raw} | {ours[0]:.2f} / {ours[1]:.2f} / {ours[2]:.2f} | "
            f"{raw[0]:.2f} / {raw[1]:.2f} / {raw[2]:.2f} | {ratio:.2f}× |"
        )
    lines += [
        "",
        "Goal: eaglewatch p99 within 2× of the raw tail. Both sides use the same paramiko transport (AES-GCM "
        "preferred, see tui/connection/ssh.py). The machine is shared with other test suites, so tails move from "
        "run to run; the p50 difference (agent wake-up, JSON and base64 on both ends) is the stable part. At "
        "5,000 lines/s every line is its own write, so the agent and the client each do Python work per line "
        "(about 35 % and 40 % of a core here, besides sshd and the writer) on a 2-core machine: the tail of the "
        "distribution is queueing behind that work, where `tail -F` does it in C. The 5,000 lines/s ratio moves a "
        "lot between runs on this machine (2.0× to 3.3× in runs on one day; the raw tail's p99 alone moved from 0.18 "
        "to 0.28 ms), so the 2× goal is not reliably met. Per line the agent spends about 77 µs of CPU, of which "
        "18 µs go to reading, encoding and writing the chunk and the rest to waking up for every write.",
        "",
        f"Reconnect after killing every sshd process (listener and sessions) and starting sshd again, until the "
        f"stream delivers bytes again, {len(reconnects)} rounds: median {statistics.median(reconnects):.2f} s, "
        f"max {max(reconnects):.2f} s (goal ≤ 2 s). Most of it is the login shell the exec request goes through, "
        "the agent's Python start and the SSH handshake.",
        "",
        f"Agent CPU while it streams an idle log for {args.idle_seconds:g} s: {agent_cpu:.3f} % of one core "
        f"(goal ≤ 1 %); the per-run supervisor: {supervisor_cpu:.3f} %.",
        "",
    ]
    text = "\n".join(lines)
    if args.write:
        write_section(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
