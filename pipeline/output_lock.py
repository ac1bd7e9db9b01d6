"""One writer per output folder: a lock taken before anything in the folder is deleted or written.

``<output>/.eaglewatch.lock`` is held with ``flock``: exclusively by a run with ``--world-size 1``, shared by the
ranks of a data-parallel run, each of which also holds ``.eaglewatch.rank{r}.lock`` exclusively (ranks share a
folder by design, two processes for one rank do not). The holder writes who it is into the file it holds
exclusively (pid, host, start time, command), so that a refused run can say whom it waits for. The kernel releases
a ``flock`` when the holder dies, even by ``kill -9``: a lock is never left stuck, and the holder information of a
dead run is simply overwritten by the next one. The files stay in place (deleting a lock file while another process
waits on it would let two runs in).
"""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eaglewatch.errors import UserError
from eaglewatch.pipeline.proctree import alive

FOLDER_LOCK = ".eaglewatch.lock"
# How long a refused run waits for a holder that has just taken the lock to write who it is.
HOLDER_INFO_WAIT_S = 1.0


def rank_lock_name(rank: int) -> str:
    return f".eaglewatch.rank{rank}.lock"


class FolderBusy(UserError):
    """Another run holds the output folder."""


@dataclass(frozen=True)
class Holder:
    """Who holds (or last held) a lock file, as it wrote itself there."""

    pid: int | None
    host: str
    started_at: float | None
    command: str
    rank: int | None = None

    def describe(self) -> str:
        who = f"pid {self.pid}" if self.pid is not None else "another process"
        if self.pid is not None and self.host == socket.gethostname() and not alive(self.pid):
            who += " (gone; a process it started still holds the lock)"
        when = (time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started_at))
                if self.started_at is not None else "an unknown time")
        command = self.command if len(self.command) <= 1000 else self.command[:997] + "..."
        rank = f"rank {self.rank}: " if self.rank is not None else ""
        return f"{rank}{who} on {self.host or 'an unknown host'} since {when} (command: {command or '?'})"




def _this_command() -> str:
    return "eaglewatch " + shlex.join(sys.argv[1:]) if sys.argv else "eaglewatch"


def _open(path: Path) -> int:
    """The lock file's descriptor (created if missing; never truncated here: a live holder's words are in it)."""
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except IsADirectoryError:
        raise UserError(f"{path} is a folder; eaglewatch keeps its lock file there: move it away") from None
    except OSError as exc:
        raise UserError(f"cannot open the lock file {path}: {exc.strerror or exc}") from None


def _try_flock(fd: int, mode: int) -> bool:
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def _flock_soon(fd: int, mode: int, within_s: float = 0.2) -> bool:
    """The lock, retried briefly: a reader that probes the lock (verify, preflight) holds it for microseconds."""
    deadline = time.monotonic() + within_s
    while not _try_flock(fd, mode):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


def read_holder(path: Path, wait_s: float = 0.0) -> Holder | None:
    """The holder information in ``path``; waits up to ``wait_s`` for a holder that has not written it yet."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            record: Any = json.loads(path.read_text(encoding="utf-8", errors="replace") or "null")
        except (OSError, ValueError):
            record = None
        if isinstance(record, dict):
            pid = record.get("pid")
            started = record.get("started_at")
            rank = record.get("rank")
            return Holder(pid if isinstance(pid, int) else None, str(record.get("host") or ""),
                          float(started) if isinstance(started, (int, float)) else None,
                          str(record.get("command") or ""), rank if isinstance(rank, int) else None)
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.02)


class OutputLock:
    """The lock of one writer (a whole run, or one rank of a data-parallel run) on one output folder."""

    def __init__(self, folder: Path, rank: int = 0, world_size: int = 1) -> None:
        self.folder = Path(folder)
        self.rank = rank
        self.world_size = world_size
        self._fds: list[int] = []

    @property
    def held(self) -> bool:
        return bool(self._fds)

    @property
    def own_path(self) -> Path:
        """The file this writer holds exclusively and writes its holder information into."""
        return self.folder / (FOLDER_LOCK if self.world_size == 1 else rank_lock_name(self.rank))

    def acquire(self) -> None:
        """Take the lock at once or raise :class:`FolderBusy` naming the holder. The folder must exist."""
        if self._fds:
            return
        try:
            folder_fd = _open(self.folder / FOLDER_LOCK)
            self._fds.append(folder_fd)
            if not _flock_soon(folder_fd, fcntl.LOCK_EX if self.world_size == 1 else fcntl.LOCK_SH):
                raise FolderBusy(self._busy_message(describe_writers(self.folder)))
            if self.world_size > 1:
                rank_fd = _open(self.own_path)
                self._fds.append(rank_fd)
                if not _flock_soon(rank_fd, fcntl.LOCK_EX):
                    holder = read_holder(self.own_path, HOLDER_INFO_WAIT_S)
                    raise FolderBusy(self._busy_message([holder.describe() if holder else
                                                         f"rank {self.rank}: another process"]))
        except BaseException:
            self.release()
            raise
        self._write_holder(self._fds[-1])

    def _write_holder(self, fd: int) -> None:
        record = {"pid": os.getpid(), "host": socket.gethostname(), "started_at": time.time(),
                  "command": _this_command(), "rank": self.rank if self.world_size > 1 else None}
        data = (json.dumps(record) + "\n").encode()
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
        except OSError:
            pass  # a full disk: the lock holds all the same, only the holder's description is missing

    def _busy_message(self, holders: list[str]) -> str:
        who = "; ".join(holders) if holders else "another process"
        them = "them" if len(holders) > 1 else "it"
        return f"{self.folder} is being written by {who}; wait for {them} or stop {them}"

    def release(self) -> None:
        """Let go (closing the descriptors releases the locks, taken or not)."""
        fds, self._fds = self._fds, []
        for fd in reversed(fds):
            os.close(fd)

    def __enter__(self) -> "OutputLock":
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def describe_writers(folder: Path) -> list[str]:
    """Who is writing ``folder`` now (empty when nobody is), without taking or disturbing anyone's lock."""
    folder_lock = Path(folder) / FOLDER_LOCK
    if not folder_lock.is_file():
        return []
    try:
        fd = os.open(folder_lock, os.O_RDONLY)
    except OSError:
        return []
    try:
        if _try_flock(fd, fcntl.LOCK_EX):
            fcntl.flock(fd, fcntl.LOCK_UN)
            return []  # nobody holds it
        if not _try_flock(fd, fcntl.LOCK_SH):
            # Held exclusively: a whole run, which wrote who it is into this file.
            holder = read_holder(folder_lock, HOLDER_INFO_WAIT_S)
            return [holder.describe() if holder else "another process"]
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
    # Held shared: the ranks of a data-parallel run, each named in its own file.
    found = []
    for path in sorted(Path(folder).glob(".eaglewatch.rank*.lock")):
        try:
            rank_fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            if _try_flock(rank_fd, fcntl.LOCK_SH):
                fcntl.flock(rank_fd, fcntl.LOCK_UN)
                continue  # that rank is not running
        finally:
            os.close(rank_fd)
        holder = read_holder(path, HOLDER_INFO_WAIT_S)
        found.append(holder.describe() if holder else f"a rank ({path.name})")
    return found or ["the ranks of a data-parallel run"]
