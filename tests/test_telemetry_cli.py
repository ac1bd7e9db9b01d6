"""The command line (python -m eaglewatch.pipeline.telemetry) and the sampler's loop, on this machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from agent_support import wait_for
from eaglewatch import protocol
from eaglewatch.pipeline.telemetry import TelemetrySampler
from eaglewatch.pipeline.telemetry.__main__ import FileFollower


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "eaglewatch.pipeline.telemetry", *args],
                          capture_output=True, timeout=60, cwd="/")


def test_cli_follows_the_job_files(tmp_path) -> None:
    pid_file, log, events, raw = (tmp_path / n for n in ("pid", "log", "events.jsonl", "raw.jsonl"))
    pid_file.write_text(f"{os.getpid()}\n")
    log.write_bytes(b"(EngineCore pid=41) INFO start\n(Worker_TP0 pid=42) INFO loading\n(Worker_TP1 pi")
    events.write_text(
        json.dumps(protocol.make_event(protocol.EVENT_INFO, pid=43, tp_rank=2)) + "\n" + '{"kind": "info", "pid"'
    )
    result = run_cli("--count", "2", "--interval", "0.2", "--job-pid-file", str(pid_file), "--log", str(log),
                     "--events", str(events), "--raw-out", str(raw), "--output-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    messages = [protocol.decode(line) for line in result.stdout.splitlines()]
    assert len(messages) == 2
    assert any(proc["pid"] == os.getpid() for proc in messages[0]["host"]["procs"])
    records = [json.loads(line) for line in raw.read_text().splitlines()]
    assert len(records) == 2
    # The torn last lines of the log and the events file are not read as ranks.
    assert records[-1]["ranks"] == {"41": "EngineCore", "42": "Worker_TP0", "43": "Worker_TP2"}
    assert os.getpid() in records[-1]["job_pids"]


def test_cli_text_view(tmp_path) -> None:
    result = run_cli("--count", "1", "--text", "--output-dir", str(tmp_path), "--job-pid", str(os.getpid()))
    assert result.returncode == 0
    text = result.stdout.decode()
    assert text.startswith("GPU telemetry unavailable:") and "\nhost cpu " in text and f"pid {os.getpid()} " in text


def test_file_follower_reads_growth_and_restarts_after_truncation(tmp_path) -> None:
    path = tmp_path / "log"
    follower = FileFollower(str(path))
    assert follower.read_new() == b""  # not there yet
    path.write_bytes(b"abc")
    assert follower.read_new() == b"abc"
    with open(path, "ab") as fh:
        fh.write(b"def")
    assert follower.read_new() == b"def" and follower.read_new() == b""
    path.write_bytes(b"x")
    assert follower.read_new() == b"x"


class FakeClock:
    """Stands in for the sampler's clock and its stop event: waiting advances the time instead of sleeping, so the
    schedule is checked exactly, whatever else the machine is doing."""

    def __init__(self) -> None:
        self.now = 0.0
        self.waits: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return 1_000_000.0 + self.now

    def is_set(self) -> bool:
        return False

    def wait(self, timeout: float) -> bool:
        assert timeout >= 0, f"asked to wait {timeout} s"
        self.waits.append(timeout)
        self.now += timeout
        return False


def run_on_fake_clock(monkeypatch, emit_takes_s: list[float], interval_s: float = 0.1) -> list[float]:
    """The sampler's loop on a fake clock; emit i takes emit_takes_s[i] (sampling and sending). Returns the times
    the lines were emitted at."""
    from eaglewatch.pipeline.telemetry import sampler as sampler_module

    clock = FakeClock()
    monkeypatch.setattr(sampler_module, "time", clock)
    sampler = TelemetrySampler(interval_s=interval_s)
    times: list[float] = []

    def emit(line: bytes) -> None:
        times.append(clock.now)
        clock.now += emit_takes_s[len(times) - 1]

    assert sampler.run(emit, count=len(emit_takes_s), stop=clock) == len(emit_takes_s)
    return times


def test_run_emits_on_a_fixed_grid(monkeypatch) -> None:
    # The time a sample takes does not push the next one back: no drift.
    times = run_on_fake_clock(monkeypatch, [0.03] * 5)
    assert times == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4])


def test_a_sample_that_overruns_skips_the_missed_ticks(monkeypatch) -> None:
    # The second sample takes 2.5 intervals: the ticks at 0.2 and 0.3 are skipped, not sent in a burst.
    times = run_on_fake_clock(monkeypatch, [0.01, 0.25, 0.01, 0.01])
    assert times == pytest.approx([0.0, 0.1, 0.4, 0.5])


def test_run_on_the_real_clock_is_never_early_and_stops_on_request() -> None:
    sampler = TelemetrySampler(interval_s=0.1)
    times: list[float] = []
    started = time.monotonic()  # the grid starts when run does, at or after this
    assert sampler.run(lambda line: times.append(time.monotonic()), count=5) == 5
    # A loaded machine makes samples late, never early: each is sent at or after its tick on the grid (sampling
    # time varies, so ticks are counted from the start, not from the first line).
    assert all(t - started >= i * 0.1 for i, t in enumerate(times)), [t - started for t in times]
    # Stopped from the sink after the third line: no fourth.
    stop = threading.Event()
    lines: list[bytes] = []

    def emit(line: bytes) -> None:
        lines.append(line)
        if len(lines) == 3:
            stop.set()

    assert sampler.run(emit, stop=stop) == 3
    assert all(protocol.decode(line)["type"] == "telemetry" for line in lines)


def test_a_stop_ends_the_wait_between_samples() -> None:
    # An hour between samples: the run can only end this soon if the stop cuts the wait short.
    sampler = TelemetrySampler(interval_s=3600)
    stop = threading.Event()
    lines: list[bytes] = []
    result: list[int] = []
    runner = threading.Thread(target=lambda: result.append(sampler.run(lines.append, stop=stop)), daemon=True)
    runner.start()
    wait_for(lambda: lines, what="the first sample")
    stop.set()
    runner.join(60)
    assert not runner.is_alive(), "the run did not end when stopped"
    assert result == [1]
