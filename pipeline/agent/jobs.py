"""Launch, stop, restart and list runs: the host-side operations, free of any protocol.

The agent's server calls these; so can a test or an operator logged in on the host.
"""

from __future__ import annotations

import getpass
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from eaglewatch import __version__
from eaglewatch.pipeline.agent import jobpython, procs, runwatch, stacks
from eaglewatch.pipeline.agent.rundir import (
    JOB_EXITED,
    JOB_LOST,
    JOB_RUNNING,
    JOB_STARTING,
    RunDir,
    RunNotFound,
    find_run,
    is_run_id,
    new_run_id,
    read_run_record,
    run_dirs,
    summary,
    write_json_atomic,
)
from eaglewatch.pipeline.agent.supervise import STOP_FILE, stop_fields

Notice = Callable[[str], None]

# Children the agent spawned (supervisors), reaped now and then so that they do not linger as zombies while the
# agent runs. They are in their own session; the agent exiting does not touch them.
_spawned: list[subprocess.Popen] = []


class JobError(Exception):
    code = "failed"


class BadRequest(JobError):
    code = "bad_request"


class Refused(JobError):
    code = "refused"


def reap() -> None:
    for proc in list(_spawned):
        if proc.poll() is not None:
            _spawned.remove(proc)


def _check_text(value: Any, what: str, allow_empty: bool = False) -> str:
    if not isinstance(value, str) or (not value and not allow_empty):
        raise BadRequest(f"{what} must be a non-empty string")
    if "\0" in value:
        raise BadRequest(f"{what} must not hold a NUL byte")
    return value


def validate_launch(argv: Any, cwd: Any, env: Any, name: Any) -> tuple[list[str], str, dict[str, str], str | None]:
    if not isinstance(argv, list) or not argv:
        raise BadRequest("argv must be a non-empty list of strings")
    argv = [_check_text(arg, "every argument", allow_empty=True) for arg in argv]
    if not argv[0]:
        raise BadRequest("the command (argv[0]) must not be empty")
    cwd = os.path.expanduser(_check_text(cwd, "cwd")) if cwd else os.getcwd()
    if not os.path.isdir(cwd):
        raise BadRequest(f"working directory {cwd!r} does not exist on the host")
    env = env or {}
    if not isinstance(env, dict):
        raise BadRequest("env must map names to values")
    for key, value in env.items():
        _check_text(key, "an environment variable name")
        if "=" in key:
            raise BadRequest(f"environment variable name {key!r} must not hold '='")
        _check_text(value, f"the value of {key}", allow_empty=True)
    if name is not None:
        name = _check_text(name, "the run name")
    return argv, os.path.abspath(cwd), dict(env), name


def supervisor_argv(run_dir: Path) -> list[str]:
    """How to start the supervisor of ``run_dir`` with this agent's own code (an installation, or the zipapp)."""
    import eaglewatch

    import_root = os.path.dirname(os.path.dirname(os.path.abspath(eaglewatch.__file__)))
    if os.path.isfile(import_root):
        # Running from the uploaded zipapp: the supervisor imports from the same archive.
        code = (
            "import sys;sys.path.insert(0,sys.argv[1]);"
            "from eaglewatch.pipeline.agent.cli import main;sys.exit(main(sys.argv[2:]))"
        )
        return [sys.executable, "-c", code, import_root, "supervise", str(run_dir)]
    return [sys.executable, "-m", "eaglewatch.pipeline.agent", "supervise", str(run_dir)]


def write_command_record(
    run: RunDir,
    requested_argv: Sequence[str],
    job: jobpython.JobCommand | None,
    *,
    cwd: str,
    env: Mapping[str, str],
    name: str | None,
    python: str | None,
    installed: bool,
    restart_of: str | None,
    host: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Write a run's ``cmd.json`` (docs/agent.md), after its empty ``log`` and ``events.jsonl``, so that a run
    listed is a run whose files can be opened. ``job`` is the command worked out by ``jobpython`` (None when it
    could not be: the run is recorded as asked, and ends before it starts); ``host`` is where it runs (this host
    unless said); ``extra`` adds fields (a Slurm rank's ``slurm`` block). Returns the record."""
    record: dict[str, Any] = {
        "run": run.run_id,
        "name": name,
        "argv": list(job.argv) if job is not None else list(requested_argv),
        "requested_argv": list(requested_argv),
        "python": python,
        "installed": bool(installed),
        "job": dict(job.record) if job is not None else {},
        "env": dict(env),
        "cwd": cwd,
        "started_at": time.time(),
        "eaglewatch_version": __version__,
        "restart_of": restart_of,
        "host": host or socket.gethostname(),
    }
    record.update(extra or {})
    run.log_path.touch()
    run.events_path.touch()
    write_json_atomic(run.cmd_path, record)
    return record


def supervisor_env(job: jobpython.JobCommand, base_env: Mapping[str, str]) -> dict[str, str]:
    """The supervisor's environment, which the job inherits: ``base_env`` with what the job's command needs."""
    env = dict(base_env)
    env.update(job.env)
    # Python jobs whose stdout is a file buffer it in 8 KiB blocks; the log is only live when they do not.
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def start_supervisor(run: RunDir, env: Mapping[str, str], *, detached: bool) -> subprocess.Popen:
    """Start the run's supervisor, stdin /dev/null, its own stderr in ``supervisor.err``. ``detached``: in a
    session of its own, to outlive the agent and its SSH session; otherwise in the caller's (a Slurm task's
    launcher keeps the task's processes one tree, which Slurm tracks and ends)."""
    with open(run.path / "supervisor.err", "ab") as err:
        return subprocess.Popen(
            supervisor_argv(run.path),
            cwd=str(run.path),
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            close_fds=True,
            start_new_session=detached,
        )


def _fresh_run_dir(root: Path, name: str | None) -> RunDir:
    root.mkdir(parents=True, exist_ok=True)
    for _ in range(5):
        run = RunDir(root / new_run_id(name))
        try:
            run.path.mkdir()
            return run
        except FileExistsError:
            continue
    raise JobError("could not create a fresh run directory")  # pragma: no cover - five random collisions in 1 s


def launch(
    root: Path,
    argv: Sequence[str],
    *,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
    name: str | None = None,
    restart_of: str | None = None,
    base_env: Mapping[str, str] | None = None,
    wait_s: float = 10.0,
    python: str | None = None,
    installed: bool = False,
    alerts: Mapping[str, Any] | None = None,
) -> RunDir:
    """Create the run directory, start the supervisor detached, and wait until the job's pid is recorded.
    ``alerts`` (the operator's alert settings: runwatch.py) are kept in the run directory for its supervisor.

    A bare ``eaglewatch …`` command runs this agent's own eaglewatch under the Python that has vLLM (``python``,
    else one found on the host), checked before anything starts; ``installed`` runs the host's own eaglewatch
    (see ``jobpython``)."""
    argv, cwd, env, name = validate_launch(list(argv), cwd, dict(env or {}), name)
    if python is not None:
        python = _check_text(python, "the job's Python")
    try:
        job = jobpython.job_command(argv, env, python=python, installed=bool(installed))
    except jobpython.JobPythonError as exc:
        raise BadRequest(str(exc)) from None
    run = _fresh_run_dir(root, name)
    write_command_record(run, argv, job, cwd=cwd, env=env, name=name, python=python, installed=bool(installed),
                         restart_of=restart_of)
    if alerts:
        if not isinstance(alerts, Mapping):
            raise BadRequest("alerts must be an object")
        runwatch.write_settings(run, dict(alerts))
    proc = start_supervisor(run, supervisor_env(job, os.environ if base_env is None else base_env), detached=True)
    _spawned.append(proc)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if run.pid() is not None or run.exit_path.exists():
            break
        if proc.poll() is not None and not run.exit_path.exists():
            break
        time.sleep(0.005)
    return run


def supervisor_alive(run: RunDir) -> bool:
    pid = run.supervisor_pid()
    if pid is None or not procs.pid_alive(pid):
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return str(run.path).encode() in fh.read().split(b"\0")
    except OSError:
        return not os.path.isdir("/proc/self")


def dir_gone(run: RunDir) -> bool:
    """The run directory was deleted (by hand, or a clean-up) while the run may still be going."""
    return not os.path.isdir(run.path)


def _marked(run_id: str, table: list[procs.ProcInfo] | None) -> list[procs.MarkedProcess]:
    return [found for found in procs.marked_processes(table) if found.run_id == run_id]


# --- runs on another node ------------------------------------------------------------------------------------
# A Slurm rank runs on a compute node, where its launcher (slurm_task) started its supervisor; the login host, where
# the agent runs, sees the run directory on the shared file system but none of the node's processes. The launcher
# is the task's main process: while it lives, it refreshes task.alive in the run directory, and that file's age
# says whether the task is alive. A shared file system's client caches a file's attributes for up to 60 s (NFS
# acregmax), so a task is taken for gone only after LOST_AFTER_BEATS beats without news (2 minutes by default).
TASK_ALIVE_ENV = "EAGLEWATCH_TASK_ALIVE_S"
TASK_ALIVE_S = 10.0
LOST_AFTER_BEATS = 12


def task_alive_every_s(environ: Mapping[str, str] | None = None) -> float:
    """Seconds between the launcher's beats: ``EAGLEWATCH_TASK_ALIVE_S``, else 10."""
    text = (os.environ if environ is None else environ).get(TASK_ALIVE_ENV, "")
    try:
        value = float(text)
    except ValueError:
        return TASK_ALIVE_S
    return value if 0 < value < float("inf") else TASK_ALIVE_S


def mark_task_alive(run: RunDir, node: str, every_s: float) -> None:
    """The launcher's first beat: who beats, and how long a silence means its task is gone."""
    write_json_atomic(run.task_alive_path, {"node": node, "pid": os.getpid(), "every_s": every_s,
                                            "lost_after_s": every_s * LOST_AFTER_BEATS, "since": time.time()})


def beat_task_alive(run: RunDir) -> None:
    """One more beat: the file's modification time is now."""
    try:
        os.utime(run.task_alive_path)
    except OSError:  # the run directory was deleted: nobody is left to tell
        pass


def remote_node(cmd: Mapping[str, Any]) -> str | None:
    """The node of a run that a Slurm task started on a host other than this one (its cmd.json's ``host`` and
    ``slurm``), else None: this host's process table tells that run's state."""
    host = cmd.get("host")
    if isinstance(cmd.get("slurm"), dict) and isinstance(host, str) and host and host != socket.gethostname():
        return host
    return None


def _task_alive(run: RunDir, cmd: Mapping[str, Any]) -> bool:
    """Whether the run's Slurm task was heard from lately (a run with no beat yet: whether it started lately)."""
    default = TASK_ALIVE_S * LOST_AFTER_BEATS
    try:
        last = run.task_alive_path.stat().st_mtime
    except OSError:
        started = cmd.get("started_at")
        last = float(started) if isinstance(started, (int, float)) and not isinstance(started, bool) else 0.0
        return time.time() - last <= default
    try:
        lost_after = float(json.loads(read_run_record(run.task_alive_path).decode("utf-8"))["lost_after_s"])
    except (OSError, ValueError, TypeError, KeyError):
        lost_after = default
    if not 0 < lost_after < float("inf"):
        lost_after = default
    return time.time() - last <= lost_after


def _remote_state(run: RunDir, cmd: Mapping[str, Any]) -> str:
    """A run on another node, from its run directory alone (exit.json was looked for already)."""
    if _task_alive(run, cmd):
        return JOB_RUNNING if run.pid() is not None else JOB_STARTING
    # The beats stopped: the task ended, normally right after the supervisor wrote exit.json.
    return JOB_EXITED if run.exit_path.exists() else JOB_LOST


def _refuse_remote(run: RunDir, cmd: Mapping[str, Any], node: str, action: str) -> None:
    """Refuse to stop or restart a run on another node: ``action`` is ``cancel`` or ``restart``."""
    slurm = cmd.get("slurm") or {}
    job, rank = slurm.get("job"), slurm.get("rank")
    how = (f"eaglewatch job cancel {job} ends the job; eaglewatch job restart {job} {rank} runs the rank again"
           if action == "cancel" else f"eaglewatch job restart {job} {rank} submits the rank again")
    raise Refused(f"run {run.run_id} is rank {rank} of Slurm job {job} (task {slurm.get('array_job_id')}_"
                  f"{slurm.get('array_task_id')}) on node {node}: this host cannot signal it, and only Slurm may "
                  f"start it again; {how}")


# --- state ----------------------------------------------------------------------------------------------------
def run_state(run: RunDir, table: list[procs.ProcInfo] | None = None) -> str:
    """starting, running, exited or lost (docs/agent.md, "States"). A run on this host is told by its processes;
    a run a Slurm task started on another node by its run directory (``task.alive``)."""
    if dir_gone(run):
        # Nothing is left to read; the processes tell the truth: they carry the run's marker while they live.
        return JOB_RUNNING if _marked(run.run_id, table) else JOB_LOST
    if run.exit_path.exists():
        return JOB_EXITED
    cmd = run.cmd()
    if remote_node(cmd) is not None:
        return _remote_state(run, cmd)
    pgid = run.pgid()
    if pgid is not None and procs.group_alive(run.run_id, pgid, table):
        return JOB_RUNNING
    if supervisor_alive(run):
        # Either the job is starting, or it just ended and the supervisor is writing exit.json.
        return JOB_RUNNING if pgid is not None else JOB_STARTING
    if run.exit_path.exists():
        return JOB_EXITED
    if pgid is None and run.supervisor_pid() is None:
        started = cmd.get("started_at") or 0
        if time.time() - started < 30:
            return JOB_STARTING
    return JOB_LOST


def _started_from_id(run_id: str) -> float | None:
    try:
        return time.mktime(time.strptime(run_id[:15], "%Y%m%d-%H%M%S"))
    except ValueError:
        return None


def _cmdline(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            words = fh.read().split(b"\0")
    except OSError:
        return None
    return [os.fsdecode(word) for word in words[:-1]] or None


def gone_summary(run_id: str, path: Path, marked: list[procs.MarkedProcess]) -> dict[str, Any]:
    """A run whose directory is gone: what its live processes still say (the group leader's pid and command line),
    ``run_dir_gone`` set, and ``running`` while any of them lives, ``lost`` once none does."""
    leader = next((found for found in marked if found.pid == found.pgrp), None)
    if leader is None and marked:
        leader = min(marked, key=lambda found: found.pid)
    return {
        "run": run_id,
        "name": None,
        "state": JOB_RUNNING if marked else JOB_LOST,
        "argv": _cmdline(leader.pid) if leader is not None else None,
        "cwd": None,
        "env": {},
        "started_at": _started_from_id(run_id),
        "restart_of": None,
        "pid": leader.pid if leader is not None else None,
        "pgid": leader.pgrp if leader is not None else None,
        "exit": None,
        "log_size": 0,
        "events_size": 0,
        "run_dir": str(path),
        "run_dir_gone": True,
    }


def run_summary(run: RunDir, table: list[procs.ProcInfo] | None = None) -> dict[str, Any]:
    if dir_gone(run):
        return gone_summary(run.run_id, run.path, _marked(run.run_id, table))
    return summary(run, run_state(run, table))


def _same_folder(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    return os.path.abspath(a) == os.path.abspath(b) or os.path.realpath(a) == os.path.realpath(b)


def vanished_runs(root: Path, table: list[procs.ProcInfo] | None = None,
                  known: set[str] | None = None) -> dict[str, list[procs.MarkedProcess]]:
    """Runs of this run root whose directory is gone while some of their processes still live, by run id."""
    found: dict[str, list[procs.MarkedProcess]] = {}
    for marked in procs.marked_processes(table):
        if known is not None and marked.run_id in known:
            continue
        if not is_run_id(marked.run_id) or not marked.run_dir or os.path.isdir(marked.run_dir):
            continue
        if os.path.basename(marked.run_dir) == marked.run_id and _same_folder(os.path.dirname(marked.run_dir), root):
            found.setdefault(marked.run_id, []).append(marked)
    return found


def list_runs(root: Path) -> list[dict[str, Any]]:
    table = procs.snapshot()
    runs = run_dirs(root)
    summaries = [run_summary(run, table) for run in runs]
    for run_id, marked in vanished_runs(root, table, {run.run_id for run in runs}).items():
        summaries.append(gone_summary(run_id, root / run_id, marked))
    return sorted(summaries, key=_started_key, reverse=True)


def _started_key(entry: dict[str, Any]) -> float:
    """A summary's start time for sorting, whatever a hand-edited cmd.json holds there."""
    value = entry.get("started_at")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def find(root: Path, ref: str) -> RunDir:
    """A run by id, name or unique id prefix (rundir.find_run), or by exact id a run whose directory is gone but
    whose processes still live."""
    try:
        return find_run(root, ref)
    except RunNotFound:
        if isinstance(ref, str) and is_run_id(ref) and ref in vanished_runs(root):
            return RunDir(root / ref)
        raise


def job_pids(root: Path) -> list[int]:
    """Pids of every running run under root (for telemetry: which GPU processes are ours)."""
    table = procs.snapshot()
    pids: list[int] = []
    for run in run_dirs(root):
        # The pids of a run on another node are that node's: none of this host's processes.
        if not run.exit_path.exists() and run.pgid() is not None and remote_node(run.cmd()) is None:
            pids.extend(procs.run_processes(run.run_id, run.pgid(), table))
    return pids


def _user() -> str | None:
    try:
        return getpass.getuser()
    except Exception:  # no login name and no passwd entry (a container's bare uid)
        return None


def request_stop(run: RunDir, via: str) -> bool:
    """Write ``stop.json`` in the run directory: the operator asked for this run to stop (``via``: the agent op,
    ``stop``, ``restart``, ``job_cancel``, ``job_restart_rank``). Written before the first signal, beside the
    final name then renamed in (never a half-written request, and a link planted at the name is replaced, not
    followed), so that the supervisor, when the job ends, records the end as the operator's stop
    (``supervise.stop_fields``). False when it cannot be written (the run directory is gone)."""
    request = {"by": "operator", "via": via, "user": _user(), "host": socket.gethostname(), "at": time.time()}
    try:
        write_json_atomic(run.path / STOP_FILE, request)
    except OSError:
        return False
    return True


def stop(run: RunDir, grace_s: float = 10.0, notice: Notice | None = None, via: str = "stop") -> dict[str, Any]:
    """SIGTERM the run's process group, SIGKILL it after grace_s, and return once none of its processes is left.

    The stop is the operator's: ``stop.json`` (``request_stop``) is written before the first signal, so the run's
    end is recorded with ``stopped: true``. A run that had ended already (only leftovers to clear) gets none."""
    say = notice or (lambda message: None)
    cmd = {} if dir_gone(run) else run.cmd()
    node = remote_node(cmd)
    if node is not None:
        # Nothing here is the run's: its pids are the node's, and an end recorded here would contradict what the
        # node's supervisor records.
        if run.exit_path.exists():
            return run_summary(run)
        _refuse_remote(run, cmd, node, "cancel")
    procs.wait_until(lambda: run.pid() is not None or run.exit_path.exists() or not supervisor_alive(run), 5.0)
    targets = procs.RunTargets(run.run_id, run.pgid())
    if run.exit_path.exists() and not targets.count:
        return run_summary(run)
    if not targets.count and targets.pgid is not None:
        strangers = procs.group_members(targets.pgid)
        if strangers:
            raise Refused(
                f"process group {targets.pgid} recorded for run {run.run_id} now holds processes that are not the "
                f"run's (pids {strangers[:5]}); nothing was signalled"
            )
    last_signal = None
    requested = False
    if targets.count:
        if not run.exit_path.exists():
            requested = request_stop(run, via)
        say(f"sending SIGTERM to process group {targets.pgid} ({targets.count} processes)")
        targets.send(signal.SIGTERM)
        last_signal = signal.SIGTERM
        if not procs.wait_until(lambda: not targets.remaining(), grace_s, 0.02):
            say(f"still running after {grace_s:g} s: sending SIGKILL")
            targets.send(signal.SIGKILL)
            last_signal = signal.SIGKILL
            if not procs.wait_until(lambda: not targets.remaining(), 10.0, 0.02):
                raise JobError(f"processes of run {run.run_id} survived SIGKILL: {targets.remaining()}")
    if dir_gone(run):
        return run_summary(run)  # nowhere to record anything
    # The supervisor records the real status; if it is gone too, record what is known.
    recorded = procs.wait_until(lambda: run.exit_path.exists(), 3.0)
    if not recorded and not supervisor_alive(run) and not run.exit_path.exists():
        record: dict[str, Any] = {"code": None, "signal": None, "signal_name": None}
        if last_signal is not None:
            record.update(signal=int(last_signal), signal_name=signal.Signals(last_signal).name)
        record.update(ended_at=time.time(), recorded_by="agent", note="the supervisor was gone; status inferred")
        if requested:
            record.update(stop_fields(run))
        write_json_atomic(run.exit_path, record)
    return run_summary(run)


def _gpu_release_hook() -> Callable[..., bool] | None:
    try:
        from eaglewatch.pipeline.telemetry import wait_for_gpu_release
    except Exception:
        return None
    return wait_for_gpu_release


def _gpu_progress(say: Notice) -> Callable[[dict[str, Any]], None]:
    last = [0.0]

    def progress(info: dict[str, Any]) -> None:
        if info.get("released") or time.monotonic() - last[0] < 2.0:
            return
        last[0] = time.monotonic()
        say(
            f"waiting for GPU memory: {len(info.get('alive') or [])} processes alive, "
            f"{info.get('held_bytes') or 0} bytes still held"
        )

    return progress


def restart(
    root: Path,
    run: RunDir,
    *,
    argv: Sequence[str] | None = None,
    grace_s: float = 10.0,
    gpu_timeout_s: float = 120.0,
    notice: Notice | None = None,
) -> tuple[dict[str, Any], RunDir]:
    """Stop run, wait until its processes are gone and their GPU memory is free, then launch the same command
    (or argv) as a new run whose cmd.json names the old one in ``restart_of``."""
    say = notice or (lambda message: None)
    cmd = run.cmd()
    node = remote_node(cmd)
    if node is not None:
        # A new run here would run on this host, outside the job; the job resubmits the rank to Slurm.
        _refuse_remote(run, cmd, node, "restart")
    if not cmd.get("argv"):
        raise JobError(f"run {run.run_id} has no readable cmd.json")
    pids = procs.run_processes(run.run_id, run.pgid())
    alerts = runwatch.read_record(run)  # the new run alerts where the old one did
    old = stop(run, grace_s, notice, via="restart")
    wait_for_gpu_release = _gpu_release_hook()
    if wait_for_gpu_release is None:
        say("GPU memory release not checked: eaglewatch.pipeline.telemetry is not available here")
    elif pids:
        say(f"waiting up to {gpu_timeout_s:g} s for the GPU memory of {len(pids)} processes to be freed")
        if not wait_for_gpu_release(pids, gpu_timeout_s, progress_cb=_gpu_progress(say)):
            raise JobError(
                f"GPU memory held by run {run.run_id} was not freed within {gpu_timeout_s:g} s; "
                "the new run was not started"
            )
    new = launch(
        root,
        # What the operator asked for, worked out again: the new run gets this agent's eaglewatch.
        list(argv) if argv else (cmd.get("requested_argv") or cmd["argv"]),
        cwd=cmd.get("cwd"),
        env=cmd.get("env") or {},
        name=cmd.get("name"),
        restart_of=run.run_id,
        python=cmd.get("python") if isinstance(cmd.get("python"), str) else None,
        installed=cmd.get("installed") is True,
        alerts=alerts,
    )
    say(f"restarted as {new.run_id}")
    return old, new


def take_stacks(run: RunDir) -> dict[str, Any]:
    """The stacks of every process of a running run (stacks.py), kept as the run's latest in stacks.json."""
    cmd = run.cmd() if not dir_gone(run) else {}
    node = remote_node(cmd)
    if node is not None and not _task_alive_here(node):
        raise Refused(f"run {run.run_id} runs on node {node}: its stacks can be taken on that node only "
                      f"(eaglewatch stacks {node} {run.run_id})")
    state = run_state(run)
    if state not in (JOB_RUNNING, JOB_STARTING):
        raise Refused(f"run {run.run_id} is {state}: no process of it is left to ask")
    taken = stacks.take(run.run_id, run.path, run.pgid())
    try:
        write_json_atomic(run.path / stacks.LAST_STACKS, taken)
    except OSError:
        pass
    return taken


def _task_alive_here(node: str) -> bool:
    return node in (socket.gethostname(), socket.gethostname().split(".")[0])


def iter_running(root: Path) -> Iterable[RunDir]:
    table = procs.snapshot()
    for run in run_dirs(root):
        if run_state(run, table) in (JOB_RUNNING, JOB_STARTING):
            yield run


def saved_stacks(run: RunDir) -> dict[str, Any]:
    """The last stacks taken of the run (stacks.json), or an empty record when none were."""
    path = run.path / stacks.LAST_STACKS
    try:
        record = json.loads(read_run_record(path, stacks.DUMP_LIMIT * 8).decode("utf-8")) if path.exists() else None
    except (OSError, ValueError):
        record = None
    if not isinstance(record, dict) or not isinstance(record.get("processes"), list):
        return {"run": run.run_id, "taken_at": None, "processes": [], "methods": []}
    return record
