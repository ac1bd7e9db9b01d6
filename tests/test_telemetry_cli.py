"""The command line (python -m eaglewatch.pipeline.telemetry) and the sampler's loop, on this machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

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


def test_run_emits_on_a_fixed_grid_and_stops_on_request() -> None:
    sampler = TelemetrySampler(interval_s=0.1)
    times: list[float] = []
    assert sampler.run(lambda line: times.append(time.monotonic()), count=5) == 5
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert all(0.05 < gap < 0.3 for gap in gaps) and sum(gaps) >= 0.35
    stop = threading.Event()
    threading.Timer(0.25, stop.set).start()
    lines: list[bytes] = []
    emitted = sampler.run(lines.append, stop=stop)
    assert 2 <= emitted <= 5 and all(protocol.decode(line)["type"] == "telemetry" for line in lines)
