"""Which live processes belong to a run.

Every process of a run carries ``EAGLEWATCH_RUN_ID=<run id>`` in its environment (the supervisor puts it there and
children inherit it), and the job leads its own process group. A pid or pgid read from the run directory is only
trusted when a process in it still carries that marker: pids get reused, and signalling a stranger's process group
is the one mistake stop must never make.

Linux reads /proc directly; elsewhere psutil is used when it is importable.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable

RUN_ID_ENV = "EAGLEWATCH_RUN_ID"
RUN_DIR_ENV = "EAGLEWATCH_RUN_DIR"


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    pgrp: int
    state: str


def _has_proc() -> bool:
    return os.path.isdir("/proc/self")


def _read_stat(pid: int) -> ProcInfo | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    # The command name sits in parentheses and may itself hold spaces or parentheses.
    rest = data[data.rfind(b")") + 2 :].split()
    try:
        return ProcInfo(pid=pid, state=rest[0].decode(), pgrp=int(rest[2]))
    except (IndexError, ValueError):
        return None


def _all_pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def environ_has(pid: int, run_id: str) -> bool:
    """True when the process's environment holds the run's marker."""
    marker = f"{RUN_ID_ENV}={run_id}".encode()
    if _has_proc():
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                data = fh.read()
        except OSError:
            return False
        return marker in data.split(b"\0")
    try:
        import psutil

        return psutil.Process(pid).environ().get(RUN_ID_ENV) == run_id
    except Exception:
        return False


def _environ_value(data: bytes, name: bytes) -> str | None:
    prefix = name + b"="
    for entry in data.split(b"\0"):
        if entry.startswith(prefix):
            return os.fsdecode(entry[len(prefix):])
    return None


def run_marks(pid: int) -> tuple[str, str | None] | None:
    """(run id, run directory) from a process's environment, when it carries a run's marker."""
    if _has_proc():
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                data = fh.read()
        except OSError:
            return None
        run_id = _environ_value(data, RUN_ID_ENV.encode())
        return (run_id, _environ_value(data, RUN_DIR_ENV.encode())) if run_id else None
    try:
        import psutil

        env = psutil.Process(pid).environ()
    except Exception:
        return None
    run_id = env.get(RUN_ID_ENV)
    return (run_id, env.get(RUN_DIR_ENV)) if run_id else None


@dataclass(frozen=True)
class MarkedProcess:
    pid: int
    pgrp: int
    run_id: str
    run_dir: str | None


def marked_processes(table: list[ProcInfo] | None = None) -> list[MarkedProcess]:
    """Every live process that carries a run's marker (whatever its run directory holds, or whether it exists)."""
    table = snapshot() if table is None else table
    found = []
    for info in table:
        marks = run_marks(info.pid)
        if marks is not None:
            found.append(MarkedProcess(info.pid, info.pgrp, marks[0], marks[1]))
    return found


def snapshot() -> list[ProcInfo]:
    """Every live (non-zombie) process that can be seen."""
    if _has_proc():
        infos = (_read_stat(pid) for pid in _all_pids())
        return [info for info in infos if info is not None and info.state not in ("Z", "X")]
    try:
        import psutil
    except ImportError:
        return []
    out = []
    for proc in psutil.process_iter():
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            out.append(ProcInfo(pid=proc.pid, pgrp=os.getpgid(proc.pid), state="R"))
        except Exception:
            continue
    return out


def run_processes(run_id: str, pgid: int | None, table: list[ProcInfo] | None = None) -> list[int]:
    """Live pids of the run: members of its process group that carry its marker, plus any marked process that
    left the group. An empty list also when the group is held by processes that are not the run's."""
    table = snapshot() if table is None else table
    in_group = [info.pid for info in table if pgid is not None and info.pgrp == pgid]
    group_is_ours = any(environ_has(pid, run_id) for pid in in_group)
    pids = set(in_group) if group_is_ours else set()
    for info in table:
        if info.pid not in pids and info.pgrp != pgid and environ_has(info.pid, run_id):
            pids.add(info.pid)
    return sorted(pids)


def group_members(pgid: int, table: list[ProcInfo] | None = None) -> list[int]:
    table = snapshot() if table is None else table
    return [info.pid for info in table if info.pgrp == pgid]


def pid_alive(pid: int) -> bool:
    info = _read_stat(pid) if _has_proc() else None
    if info is not None:
        return info.state not in ("Z", "X")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _has_proc()


def group_alive(run_id: str, pgid: int | None, table: list[ProcInfo] | None = None) -> bool:
    """Cheaper than run_processes, for listings: does the run's own process group still have a member?"""
    if pgid is None:
        return False
    return any(environ_has(pid, run_id) for pid in group_members(pgid, table))


def wait_until(predicate: Callable[[], object], timeout_s: float, step_s: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(step_s)


class RunTargets:
    """The processes of a run that stop (or the supervisor, after the job's exit) signals, fixed once ownership
    was checked.

    Ownership (a member carrying the run's marker) is checked once, before the first signal. After that the group
    is waited on by pgid alone: a process group id cannot be reused while any member lives, and a process that
    is exiting may already show an empty environment.
    """

    def __init__(self, run_id: str, pgid: int | None) -> None:
        self.pgid = pgid
        table = snapshot()
        pids = run_processes(run_id, pgid, table)
        group = set(group_members(pgid, table)) if pgid is not None else set()
        self.group_is_ours = bool(group & set(pids))
        self.escaped = [pid for pid in pids if pid not in group]
        self.run_id = run_id
        self.count = len(pids)

    def remaining(self) -> list[int]:
        left = group_members(self.pgid) if self.group_is_ours and self.pgid is not None else []
        return left + [pid for pid in self.escaped if pid_alive(pid)]

    def send(self, signum: int) -> None:
        if self.group_is_ours and self.pgid is not None:
            try:
                os.killpg(self.pgid, signum)
            except ProcessLookupError:
                pass
        for pid in self.escaped:
            if environ_has(pid, self.run_id):
                try:
                    os.kill(pid, signum)
                except ProcessLookupError:
                    pass
