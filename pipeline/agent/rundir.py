"""The run directory: the one place a run's state lives on the host.

Layout of ``<run root>/<run id>/`` (docs/agent.md)::

    cmd.json        argv, env overrides, cwd, name, started_at, eaglewatch_version, restart_of
    log             the job's stdout and stderr, raw bytes as written
    events.jsonl    the pipeline's structured events (EAGLEWATCH_EVENTS_FILE points here)
    pid, pgid       the job's pid and process group, written by the supervisor once the job runs
    supervisor.pid  the supervising wrapper that waits for the job and writes exit.json
    exit.json       code or signal, ended_at; written when the job ends (``stopped``: the operator's stop)
    stop.json       the operator asked this run to stop: written before the first signal (who, how, when)
    task.alive      a Slurm rank's launcher: refreshed while its task lives (runs on another node, docs/slurm.md)

Reattaching means reading this folder: nothing the agent holds in memory is needed to rebuild a run's state.
"""

from __future__ import annotations

import errno
import json
import os
import re
import secrets
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eaglewatch import protocol
from eaglewatch.protocol import JOB_EXITED, JOB_LOST, JOB_RUNNING, JOB_STARTING

RUN_ROOT_ENV = "EAGLEWATCH_RUN_ROOT"
DEFAULT_RUN_ROOT = "~/.eaglewatch/runs"

CMD_FILE = "cmd.json"
LOG_FILE = "log"
EVENTS_FILE = "events.jsonl"
PID_FILE = "pid"
PGID_FILE = "pgid"
SUPERVISOR_PID_FILE = "supervisor.pid"
EXIT_FILE = "exit.json"
TASK_ALIVE_FILE = "task.alive"
STOP_FILE = "stop.json"
# The files whose kind a summary reports when one is not a regular file (``not_regular``).
RUN_FILES = (CMD_FILE, LOG_FILE, EVENTS_FILE, PID_FILE, PGID_FILE, SUPERVISOR_PID_FILE, EXIT_FILE, TASK_ALIVE_FILE,
             STOP_FILE)

# The most a record (cmd.json, exit.json, a pid file, task.alive) is read of: far above anything the agent writes
# (cmd.json holds names and arguments of 100 KB and more), small enough that a huge or endless file costs a blink.
RECORD_LIMIT = 16 << 20
PID_LIMIT = 64

_RUN_ID = re.compile(r"^\d{8}-\d{6}-[0-9a-f]{6}(-[A-Za-z0-9._-]{1,40})?$")
_SLUG_DROP = re.compile(r"[^A-Za-z0-9._-]+")


class RunNotFound(LookupError):
    pass


class AmbiguousRun(LookupError):
    pass


def default_run_root() -> Path:
    return Path(os.path.expanduser(os.environ.get(RUN_ROOT_ENV) or DEFAULT_RUN_ROOT))


def resolve_run_root(path: str | os.PathLike[str] | None) -> Path:
    return Path(os.path.expanduser(os.fspath(path))) if path else default_run_root()


def new_run_id(name: str | None = None, now: float | None = None) -> str:
    """``YYYYMMDD-HHMMSS-<6 hex>[-slug]``: sortable by start time, safe as a file name whatever the name holds.

    The operator's name is kept verbatim in cmd.json; only a filtered slug of it reaches the file system.
    """
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now if now is not None else time.time()))
    run_id = f"{stamp}-{secrets.token_hex(3)}"
    slug = _SLUG_DROP.sub("-", name or "").strip("-.")[:40].strip("-.")
    return f"{run_id}-{slug}" if slug else run_id


def is_run_id(text: str) -> bool:
    return bool(_RUN_ID.match(text))


def write_json_atomic(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, ensure_ascii=False, indent=1)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)


class NotRegularFile(OSError):
    """A run file that is a FIFO, a device, a socket or a folder: reading one can wait forever (a FIFO nobody
    writes) or never end (/dev/zero), so it is not read. An OSError, so that every reader's "cannot read" path
    takes it."""

    def __init__(self, path: str | os.PathLike[str], kind: str) -> None:
        super().__init__(errno.EINVAL, f"not a regular file ({kind})", os.fspath(path))
        self.kind = kind


_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def not_regular(path: str | os.PathLike[str]) -> str | None:
    """What path is when it is there and not a regular file ("a FIFO", ...), following links; else None."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    return None if stat.S_ISREG(mode) else _kind(mode)


def open_run_file(path: str | os.PathLike[str]) -> int:
    """A read-only descriptor of path, which must be a regular file: the one way the agent opens a run's files.

    Raises NotRegularFile for anything else, OSError when it cannot be opened. The stat first keeps a device from
    being opened at all (an open can have effects); O_NONBLOCK keeps the open of a FIFO swapped in after that stat
    from waiting for a writer, and fstat then checks what was opened."""
    kind = not_regular(path)
    if kind is not None:
        raise NotRegularFile(path, kind)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFile(path, _kind(mode))
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_run_file(path: str | os.PathLike[str], limit: int, offset: int = 0) -> bytes:
    """At most ``limit`` bytes of the regular file path from ``offset`` (OSError, NotRegularFile as above)."""
    fd = open_run_file(path)
    try:
        parts: list[bytes] = []
        got = 0
        while got < limit:
            data = os.pread(fd, limit - got, offset + got)
            if not data:
                break
            parts.append(data)
            got += len(data)
        return b"".join(parts)
    finally:
        os.close(fd)


def read_run_record(path: str | os.PathLike[str], limit: int = RECORD_LIMIT) -> bytes:
    """The whole of a small run file; OSError when it holds more than ``limit`` bytes (not a record we wrote)."""
    data = read_run_file(path, limit + 1)
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"holds more than {limit} bytes", os.fspath(path))
    return data


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        obj = json.loads(read_run_record(path).decode("utf-8"))
    except (OSError, ValueError):  # UnicodeDecodeError is a ValueError
        return None
    return obj if isinstance(obj, dict) else None


def _read_int(path: Path) -> int | None:
    try:
        return int(read_run_record(path, PID_LIMIT).strip())
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class RunDir:
    path: Path

    @property
    def run_id(self) -> str:
        return self.path.name

    @property
    def cmd_path(self) -> Path:
        return self.path / CMD_FILE

    @property
    def log_path(self) -> Path:
        return self.path / LOG_FILE

    @property
    def events_path(self) -> Path:
        return self.path / EVENTS_FILE

    @property
    def exit_path(self) -> Path:
        return self.path / EXIT_FILE

    @property
    def task_alive_path(self) -> Path:
        return self.path / TASK_ALIVE_FILE

    def cmd(self) -> dict[str, Any]:
        return _read_json(self.cmd_path) or {}

    def exit_info(self) -> dict[str, Any] | None:
        return _read_json(self.exit_path)

    def pid(self) -> int | None:
        return _read_int(self.path / PID_FILE)

    def pgid(self) -> int | None:
        return _read_int(self.path / PGID_FILE)

    def supervisor_pid(self) -> int | None:
        return _read_int(self.path / SUPERVISOR_PID_FILE)

    def size(self, path: Path) -> int:
        try:
            return path.stat().st_size
        except OSError:
            return 0


def run_dirs(root: Path) -> list[RunDir]:
    """Every run under root, newest first (run ids sort by start time)."""
    try:
        entries = [entry for entry in os.scandir(root) if entry.is_dir() and is_run_id(entry.name)]
    except FileNotFoundError:
        return []
    runs = [RunDir(Path(entry.path)) for entry in entries if os.path.exists(os.path.join(entry.path, CMD_FILE))]
    return sorted(runs, key=lambda run: run.run_id, reverse=True)


def find_run(root: Path, ref: str) -> RunDir:
    """A run by exact id, then by name (the newest run of that name), then by unique id prefix."""
    if not isinstance(ref, str) or not ref:
        raise RunNotFound("no run given")
    if is_run_id(ref) and (root / ref / CMD_FILE).exists():
        return RunDir(root / ref)
    runs = run_dirs(root)
    cmds = [(run.cmd(), run) for run in runs]
    named = [(_number(cmd.get("started_at")), run) for cmd, run in cmds if cmd.get("name") == ref]
    if named:
        return max(named, key=lambda pair: pair[0])[1]
    by_prefix = [run for run in runs if run.run_id.startswith(ref)]
    if len(by_prefix) == 1:
        return by_prefix[0]
    if len(by_prefix) > 1:
        raise AmbiguousRun(
            f"{ref!r} matches {len(by_prefix)} runs ({', '.join(r.run_id for r in by_prefix[:5])}); give more of the id"
        )
    raise RunNotFound(f"no run {ref!r} under {root}")


def _number(value: Any) -> float:
    """A time from cmd.json, or 0 for anything else (the file may have been edited by hand)."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def summary(run: RunDir, state: str) -> dict[str, Any]:
    cmd = run.cmd()
    return {
        "run": run.run_id,
        "name": cmd.get("name"),
        "state": state,
        # The command as the operator wrote it; ``job`` says which Python and eaglewatch ran it.
        "argv": cmd.get("requested_argv") or cmd.get("argv"),
        "job": cmd.get("job") or {},
        "cwd": cmd.get("cwd"),
        "env": cmd.get("env") or {},
        "started_at": cmd.get("started_at"),
        "restart_of": cmd.get("restart_of"),
        "pid": run.pid(),
        "pgid": run.pgid(),
        "exit": run.exit_info(),
        "log_size": run.size(run.log_path),
        "events_size": run.size(run.events_path),
        "run_dir": str(run.path),
        **_reported(run),
        **_not_regular_field(run),
    }


EVENTS_TAIL = 64 << 10  # of events.jsonl, what a summary reads for the run's phase and progress


def _reported(run: RunDir) -> dict[str, Any]:
    """``phase`` and ``progress`` ({done, total}) as the run's own events last said them, from the end of its
    events file (bounded: a summary is made for every run of a list); absent when the tail holds none. A tail with
    progress but no phase event (thousands of samples since) is extracting."""
    try:
        size = run.size(run.events_path)
        data = read_run_file(run.events_path, EVENTS_TAIL, max(0, size - EVENTS_TAIL))
    except (OSError, NotRegularFile):
        return {}
    found: dict[str, Any] = {}
    for line in reversed(data.splitlines()):
        if "phase" in found and "progress" in found:
            break
        try:
            event = json.loads(line)
        except ValueError:  # the tail's cut first line, or a line being written
            continue
        if not isinstance(event, dict):
            continue
        kind = event.get("kind")
        if kind == protocol.EVENT_PHASE and "phase" not in found and isinstance(event.get("phase"), str):
            found["phase"] = event["phase"][:40]
        elif kind == protocol.EVENT_PROGRESS and "progress" not in found:
            done, total = event.get("done"), event.get("total")
            if all(isinstance(v, int) and not isinstance(v, bool) for v in (done, total)):
                found["progress"] = {"done": done, "total": total}
    if "progress" in found and "phase" not in found:
        found["phase"] = protocol.PHASE_EXTRACTING
    return found


def _not_regular_field(run: RunDir) -> dict[str, Any]:
    """``not_regular``: the run's files that are there but not regular files, by name, with what each is ("a
    FIFO"); absent when there are none, so that an ordinary summary stays as it was."""
    found = {name: kind for name in RUN_FILES if (kind := not_regular(run.path / name)) is not None}
    return {"not_regular": found} if found else {}


__all__ = [
    "AmbiguousRun",
    "NotRegularFile",
    "RunDir",
    "RunNotFound",
    "default_run_root",
    "find_run",
    "new_run_id",
    "not_regular",
    "open_run_file",
    "read_run_file",
    "read_run_record",
    "resolve_run_root",
    "run_dirs",
    "summary",
    "write_json_atomic",
    "JOB_EXITED",
    "JOB_LOST",
    "JOB_RUNNING",
    "JOB_STARTING",
]
