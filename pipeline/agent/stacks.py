"""Where each process of a run is, right now: the Python stack of every thread, with nothing installed on the host.

Three ways, each used where it works (docs/agent.md, "Stacks"):

* **faulthandler on a signal** (``faulthandler``): every Python process the job starts imports a ``sitecustomize``
  that the supervisor puts in front of the job's ``PYTHONPATH`` (``hook_dir``). It registers
  ``faulthandler.register(SIGNAL, all_threads=True)`` writing to ``stacks/<pid>.txt`` in the run directory, again
  in a forked child, then runs the ``sitecustomize`` it stands in front of, if there is one. Asking is sending the
  signal; faulthandler's C handler writes the stacks even while the main thread waits in C (a collective, a lock).
  A real-time signal, which no library we know uses; it is sent only to a process whose status shows it caught
  (its default action would end the process).
* **py-spy** (``py-spy``), when it is on the host's PATH: for a Python process without the hook (started outside
  the run's environment, or with ``python -I``), and it names threads. It needs the right to trace the process.
* **/proc** (``proc``): for the rest, and for every process beside its Python stack: its state and the kernel
  function it sleeps in (``wchan``), which is what a native wait (a GPU driver call, a futex) shows.

Stdlib only, like the rest of the agent.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from eaglewatch.decode.stackgroups import parse_dump
from eaglewatch.pipeline.agent import procs
from eaglewatch.pipeline.agent.rundir import not_regular

STACKS_DIR = "stacks"
HOOK_DIR = "hook"
STACKS_DIR_ENV = "EAGLEWATCH_STACKS_DIR"
STACKS_SIGNAL_ENV = "EAGLEWATCH_STACKS_SIGNAL"
STACKS_OFF_ENV = "EAGLEWATCH_STACKS"  # "0" in a launch's environment: no hook in the job's processes
STACKS_SIGNAL = int(signal.SIGRTMIN) + 6 if hasattr(signal, "SIGRTMIN") else 0
DUMP_LIMIT = 1 << 20  # one process's dump, read back: far above any real stack
CMDLINE_LIMIT = 4096
ANSWER_S = 3.0  # how long the signalled processes get to write their stacks
PY_SPY_S = 10.0
LAST_STACKS = "stacks.json"  # the latest stacks taken, kept in the run directory

HOOK_SOURCE = '''\
"""eaglewatch: lets `eaglewatch stacks` ask this process where it is (faulthandler on a signal, written to the run
directory), then runs the sitecustomize this file stands in front of, if there is one."""


def _eaglewatch_arm():
    import faulthandler
    import os
    import signal

    folder = os.environ.get("EAGLEWATCH_STACKS_DIR")
    number = os.environ.get("EAGLEWATCH_STACKS_SIGNAL")
    if not folder or not number or not number.isdigit():
        return
    signum = int(number)
    kept = []

    def arm():
        try:
            if signal.getsignal(signum) not in (signal.SIG_DFL, None):
                return  # the program handles this signal itself: leave it alone
            flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
            fd = os.open(os.path.join(folder, "%d.txt" % os.getpid()), flags, 0o600)
            out = os.fdopen(fd, "wb", buffering=0)
            faulthandler.register(signum, file=out, all_threads=True, chain=False)
            del kept[:]
            kept.append(out)  # faulthandler holds the descriptor, not the file object
        except Exception:
            pass

    arm()
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=arm)  # a forked child writes its own file


def _eaglewatch_next():
    import importlib.machinery
    import importlib.util
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


try:
    _eaglewatch_arm()
finally:
    _eaglewatch_next()
'''


def arm_environment(run_path: Path, env: dict[str, str]) -> dict[str, str]:
    """The job's environment with the hook in front of its ``PYTHONPATH`` (the hook written into the run
    directory); unchanged when the launch turned it off, or the hook cannot be written."""
    if env.get(STACKS_OFF_ENV) == "0" or not STACKS_SIGNAL:
        return env
    hook = run_path / HOOK_DIR
    try:
        (run_path / STACKS_DIR).mkdir(mode=0o700, exist_ok=True)
        hook.mkdir(mode=0o700, exist_ok=True)
        target = hook / "sitecustomize.py"
        partial = hook / f".sitecustomize.{os.getpid()}.tmp"
        partial.write_text(HOOK_SOURCE)
        os.replace(partial, target)
    except OSError:
        return env
    out = dict(env)
    out[STACKS_DIR_ENV] = str(run_path / STACKS_DIR)
    out[STACKS_SIGNAL_ENV] = str(STACKS_SIGNAL)
    old = env.get("PYTHONPATH")
    out["PYTHONPATH"] = str(hook) + (os.pathsep + old if old else "")
    return out


# --------------------------------------------------------------------------- what /proc says of a process


def _read(path: str, limit: int) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return b""
    try:
        return os.read(fd, limit)
    except OSError:
        return b""
    finally:
        os.close(fd)


def _text(data: bytes) -> str:
    return data.decode("utf-8", "replace").strip()


def _status(pid: int) -> dict[str, str]:
    fields = {}
    for line in _read(f"/proc/{pid}/status", 16384).decode("utf-8", "replace").splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return fields


def catches(status: dict[str, str], signum: int) -> bool:
    """Whether the process has a handler for ``signum`` (``SigCgt``, a hexadecimal mask, bit signum - 1)."""
    try:
        return bool(int(status.get("SigCgt", "0"), 16) >> (signum - 1) & 1)
    except ValueError:
        return False


def _environ_value(pid: int, names: tuple[str, ...]) -> str | None:
    data = _read(f"/proc/{pid}/environ", 1 << 20)
    values = {}
    for item in data.split(b"\0"):
        key, _, value = item.partition(b"=")
        values[key] = value
    for name in names:
        found = values.get(name.encode())
        if found is not None:
            return found.decode("utf-8", "replace")
    return None


def role_of(cmdline: str, comm: str, leader: bool) -> tuple[str, int | None]:
    """(role, rank from the title): vLLM retitles its processes ``VLLM::EngineCore``, ``VLLM::Worker_TP1``, ...
    (``VLLM::Worker_TP1_EP1`` with experts spread); the job's own first process is ``main``."""
    title = cmdline if cmdline.startswith("VLLM::") else comm if comm.startswith("VLLM::") else ""
    if title:
        name = title[len("VLLM::"):].split()[0] if title[len("VLLM::"):].split() else "process"
        if name.startswith("Worker"):
            parts = name.split("_")[1:]
            words = [f"{part[:2]} {part[2:]}" if part[:2] in ("TP", "PP", "DP", "EP") and part[2:].isdigit()
                     else part for part in parts]
            rank = next((int(part[2:]) for part in parts if part[:2] == "TP" and part[2:].isdigit()), None)
            return "worker " + " ".join(words) if words else "worker", rank
        return name, None
    if leader:
        return "main", None
    return (os.path.basename(cmdline.split(" ", 1)[0]) or comm or "process"), None


def describe(pid: int, leader_pid: int | None) -> dict[str, Any]:
    """What a process is, from /proc: its command line, role, rank, state and wait channel."""
    cmdline = _text(_read(f"/proc/{pid}/cmdline", CMDLINE_LIMIT).replace(b"\0", b" "))
    comm = _text(_read(f"/proc/{pid}/comm", 64))
    status = _status(pid)
    role, title_rank = role_of(cmdline, comm, pid == leader_pid)
    rank_text = _environ_value(pid, ("RANK", "LOCAL_RANK"))
    rank = int(rank_text) if rank_text is not None and rank_text.isdigit() else title_rank
    wchan = _text(_read(f"/proc/{pid}/wchan", 128))
    return {
        "pid": pid, "role": role, "rank": rank, "cmdline": cmdline, "comm": comm,
        "state": status.get("State", ""), "wchan": "" if wchan == "0" else wchan,
        "method": "proc", "note": "", "threads": [],
        "_catches": catches(status, STACKS_SIGNAL) if STACKS_SIGNAL else False,
        "_python": "python" in (cmdline.split(" ", 1)[0] + comm).lower() or cmdline.startswith("VLLM::"),
    }


# --------------------------------------------------------------------------- asking for the stacks


def _by_signal(records: list[dict[str, Any]], folder: Path, answer_s: float) -> None:
    """Signal every process that has the hook, then read what each wrote (its file grew, then stood still)."""
    asked: dict[int, tuple[dict[str, Any], Path, int]] = {}
    for record in records:
        path = folder / f"{record['pid']}.txt"
        if not record["_catches"] or not path.exists() or not_regular(path):
            continue
        try:
            before = path.stat().st_size
            os.kill(record["pid"], STACKS_SIGNAL)
        except OSError:
            continue
        asked[record["pid"]] = (record, path, before)
    deadline = time.monotonic() + answer_s
    sizes: dict[int, int] = {}
    settled: set[int] = set()
    while asked and time.monotonic() < deadline and len(settled) < len(asked):
        time.sleep(0.05)
        for pid, (_, path, before) in asked.items():
            size = _size(path)
            if size > before and sizes.get(pid) == size:
                settled.add(pid)  # grew, then did not change for one look: written
            sizes[pid] = size
    for record, path, before in asked.values():
        text = _read_from(path, before)
        threads = parse_dump(text) if text else []
        if threads:
            record["threads"], record["method"] = threads, "faulthandler"
        else:
            record["note"] = f"did not answer the stack signal within {answer_s:g} s"


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _read_from(path: Path, offset: int) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return ""
    try:
        os.lseek(fd, offset, os.SEEK_SET)
        return os.read(fd, DUMP_LIMIT).decode("utf-8", "replace")
    except OSError:
        return ""
    finally:
        os.close(fd)


def _by_py_spy(record: dict[str, Any], py_spy: str, timeout_s: float) -> None:
    try:
        done = subprocess.run([py_spy, "dump", "--pid", str(record["pid"])], capture_output=True, timeout=timeout_s,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        record["note"] = f"py-spy failed: {type(exc).__name__}"
        return
    threads = parse_dump(done.stdout[:DUMP_LIMIT].decode("utf-8", "replace"))
    if threads:
        record["threads"], record["method"], record["note"] = threads, "py-spy", ""
    else:
        said = done.stderr[:300].decode("utf-8", "replace").strip().splitlines()
        record["note"] = "py-spy: " + (said[-1] if said else f"exit code {done.returncode}")


def take(run_id: str, run_path: Path, pgid: int | None, *, answer_s: float = ANSWER_S,
         py_spy: str = "py-spy") -> dict[str, Any]:
    """The stacks of every live process of the run: one record per process (stackgroups.py reads them).
    ``py_spy`` is the program looked up on the PATH ("" never uses it)."""
    pids = procs.run_processes(run_id, pgid)
    records = [describe(pid, pgid) for pid in pids]
    _by_signal(records, run_path / STACKS_DIR, answer_s)
    tool = shutil.which(py_spy) if py_spy else None
    for record in records:
        if record["threads"]:
            continue
        if tool is not None and record["_python"]:
            _by_py_spy(record, tool, PY_SPY_S)
        if not record["threads"] and not record["note"]:
            record["note"] = ("not a Python process" if not record["_python"]
                              else "no stack handler in this process, and py-spy is not on the PATH")
    for record in records:
        for key in ("_catches", "_python"):
            record.pop(key, None)
    methods = sorted({record["method"] for record in records})
    return {"run": run_id, "taken_at": round(time.time(), 3), "processes": records, "methods": methods}
