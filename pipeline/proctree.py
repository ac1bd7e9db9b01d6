"""This process's children and their children, read from ``/proc``; and stopping a set of them.

The miniature runs beside the real load: when it fails, the real engine's processes (vLLM's engine core and its
workers, all descendants of the job) are stopped while the miniature's own are left to end by themselves. Both
kinds stay in the job's process group, so that the agent's stop reaches every one of them.
"""

from __future__ import annotations

import os
import signal
import time


def _parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read(4096)
    except OSError:
        return None
    # The command name sits in parentheses and may itself hold spaces or parentheses.
    rest = data[data.rfind(b")") + 2 :].split()
    try:
        return int(rest[1])
    except (IndexError, ValueError):
        return None


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid``, parents before their children; [] where there is no ``/proc``."""
    try:
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return []
    children: dict[int, list[int]] = {}
    for p in pids:
        parent = _parent_of(p)
        if parent is not None:
            children.setdefault(parent, []).append(p)
    found: list[int] = []
    todo = list(children.get(pid, []))
    while todo:
        p = todo.pop(0)
        found.append(p)
        todo.extend(children.get(p, []))
    return found


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is dead for every purpose here
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read(4096)
        return data[data.rfind(b")") + 2 :][:1] != b"Z"
    except OSError:
        return True


def stop(pids: list[int], grace_s: float = 3.0) -> list[int]:
    """SIGTERM each, then SIGKILL what is still alive after ``grace_s``; returns the pids that were signalled."""
    sent = []
    for p in pids:
        try:
            os.kill(p, signal.SIGTERM)
            sent.append(p)
        except OSError:
            pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(alive(p) for p in sent):
        time.sleep(0.05)
    for p in sent:
        if alive(p):
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
    return sent
