"""Helpers shared by the agent and SSH tests: a run root that is cleaned up, and collecting a watch's stream."""

from __future__ import annotations

import os
import platform
import signal
import sys
import time
from pathlib import Path
from typing import Callable

import pytest

from eaglewatch.tui.connection import Event, JobState, LinkState, LogChunk

PYTHON = sys.executable


def wait_for(predicate: Callable[[], object], timeout_s: float = 30.0, step_s: float = 0.02,
             what: str = "condition") -> object:
    """Poll ``predicate`` until it gives something true, and return that; fail after ``timeout_s``.

    The deadline is only there to turn a hang into a failure: it is generous so that a loaded machine passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout_s} s")
        time.sleep(step_s)


def stop_leftovers(root: Path) -> None:
    """Kill whatever a test left running under root (host-side, by the run's own records)."""
    from eaglewatch.pipeline.agent import jobs, procs
    from eaglewatch.pipeline.agent.rundir import run_dirs

    for run in run_dirs(root):
        for pid in procs.run_processes(run.run_id, run.pgid()):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        supervisor = run.supervisor_pid()
        if supervisor and jobs.supervisor_alive(run):
            try:
                os.kill(supervisor, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture
def run_root(tmp_path: Path):
    root = tmp_path / "runs"
    yield root
    stop_leftovers(root)


class Collected:
    def __init__(self) -> None:
        self.log = bytearray()
        self.offsets: list[tuple[int, int]] = []
        self.events: list[Event] = []
        self.states: list[JobState] = []
        self.links: list[LinkState] = []

    def take(self, batch: list) -> None:
        for item in batch:
            if isinstance(item, LogChunk):
                assert item.offset == len(self.log), f"chunk at {item.offset}, expected {len(self.log)}"
                self.log += item.data
                self.offsets.append((item.offset, item.end))
            elif isinstance(item, Event):
                self.events.append(item)
            elif isinstance(item, JobState):
                self.states.append(item)
            elif isinstance(item, LinkState):
                self.links.append(item)


def collect(watch, timeout_s: float = 30.0, until: Callable[[Collected], bool] | None = None,
            into: Collected | None = None) -> Collected:
    """Drain watch until the job finished (or until(collected)), checking that log chunks are contiguous."""
    got = into or Collected()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got.take(watch.get(timeout=0.1))
        if until is not None and until(got):
            return got
        if until is None and watch.finished.is_set() and watch.queue.empty():
            return got
    raise AssertionError(f"stream did not finish within {timeout_s} s; got {len(got.log)} bytes, {got.states[-1:]}")


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as fh:
        data = fh.read()
    return int(data[data.rfind(b")") + 2 :].split()[1])


def ancestors(pid: int) -> list[int]:
    out = []
    while pid > 1:
        pid = parent_of(pid)
        out.append(pid)
    return out


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                children.setdefault(parent_of(int(name)), []).append(int(name))
            except (OSError, ValueError, IndexError):
                continue
    found, frontier = [], [pid]
    while frontier:
        for child in children.get(frontier.pop(), []):
            found.append(child)
            frontier.append(child)
    return found


def socket_inodes(pid: int) -> set[str]:
    """Inodes of the sockets a process holds open."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    return inodes


def inet_socket_inodes() -> set[str]:
    """Every TCP, UDP and raw socket on the machine (listening or not), by inode, from /proc/net."""
    inodes = set()
    for name in ("tcp", "tcp6", "udp", "udp6", "raw", "raw6"):
        try:
            lines = Path(f"/proc/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        inodes.update(line.split()[9] for line in lines)
    return inodes


# System call numbers (asm/unistd.h) of the waits the tests look for, by machine.
SYSCALLS = {
    "x86_64": {"select": (23, 270), "sleep": (35, 230)},  # select, pselect6; nanosleep, clock_nanosleep
    "aarch64": {"select": (72,), "sleep": (101, 115)},  # pselect6; nanosleep, clock_nanosleep
}


def blocked_in(kind: str, pid: int, tid: int | None = None) -> bool:
    """Whether the thread (or the process's main thread) is asleep in the kernel in a ``kind`` wait ("select" or
    "sleep"), read from /proc/PID/task/TID/syscall. Skips the test on a machine where that cannot be read."""
    numbers = SYSCALLS.get(platform.machine(), {}).get(kind)
    path = f"/proc/{pid}/task/{tid or pid}/syscall"
    if numbers is None or not os.access(path, os.R_OK):
        pytest.skip(f"cannot see which system call a thread waits in here ({platform.machine()}, {path})")
    try:
        with open(path) as fh:
            fields = fh.read().split()
    except OSError:  # the thread has ended
        return False
    # "running" while on a CPU, "-1 ..." outside a system call, else the call's number and arguments.
    return bool(fields) and fields[0].isdigit() and int(fields[0]) in numbers
