"""Launch, stop, restart and list runs: the host-side operations, free of any protocol.

The agent's server calls these; so can a test or an operator logged in on the host.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from eaglewatch import __version__
from eaglewatch.pipeline.agent import procs
from eaglewatch.pipeline.agent.rundir import (
    JOB_EXITED,
    JOB_LOST,
    JOB_RUNNING,
    JOB_STARTING,
    RunDir,
    new_run_id,
    run_dirs,
    summary,
    write_json_atomic,
)

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


def _supervisor_argv(run_dir: Path) -> list[str]:
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
) -> RunDir:
    """Create the run directory, start the supervisor detached, and wait until the job's pid is recorded."""
    argv, cwd, env, name = validate_launch(list(argv), cwd, dict(env or {}), name)
    root.mkdir(parents=True, exist_ok=True)
    for _ in range(5):
        run = RunDir(root / new_run_id(name))
        try:
            run.path.mkdir()
            break
        except FileExistsError:
            continue
    else:  # pragma: no cover - five random collisions in one second
        raise JobError("could not create a fresh run directory")
    write_json_atomic(
        run.cmd_path,
        {
            "run": run.run_id,
            "name": name,
            "argv": argv,
            "env": env,
            "cwd": cwd,
            "started_at": time.time(),
            "eaglewatch_version": __version__,
            "restart_of": restart_of,
            "host": socket.gethostname(),
        },
    )
    run.log_path.touch()
    run.events_path.touch()
    job_env = dict(os.environ if base_env is None else base_env)
    job_env.update(env)
    # Python jobs whose stdout is a file buffer it in 8 KiB blocks; the log is only live when they do not.
    job_env.setdefault("PYTHONUNBUFFERED", "1")
    with open(run.path / "supervisor.err", "ab") as err:
        proc = subprocess.Popen(
            _supervisor_argv(run.path),
            cwd=str(run.path),
            env=job_env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            close_fds=True,
            start_new_session=True,
        )
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


def run_state(run: RunDir, table: list[procs.ProcInfo] | None = None) -> str:
    if run.exit_path.exists():
        return JOB_EXITED
    pgid = run.pgid()
    if pgid is not None and procs.group_alive(run.run_id, pgid, table):
        return JOB_RUNNING
    if supervisor_alive(run):
        # Either the job is starting, or it just ended and the supervisor is writing exit.json.
        return JOB_RUNNING if pgid is not None else JOB_STARTING
    if run.exit_path.exists():
        return JOB_EXITED
    if pgid is None and run.supervisor_pid() is None:
        started = run.cmd().get("started_at") or 0
        if time.time() - started < 30:
            return JOB_STARTING
    return JOB_LOST


def run_summary(run: RunDir, table: list[procs.ProcInfo] | None = None) -> dict[str, Any]:
    return summary(run, run_state(run, table))


def list_runs(root: Path) -> list[dict[str, Any]]:
    table = procs.snapshot()
    summaries = [run_summary(run, table) for run in run_dirs(root)]
    return sorted(summaries, key=lambda entry: entry.get("started_at") or 0, reverse=True)


def job_pids(root: Path) -> list[int]:
    """Pids of every running run under root (for telemetry: which GPU processes are ours)."""
    table = procs.snapshot()
    pids: list[int] = []
    for run in run_dirs(root):
        if not run.exit_path.exists() and run.pgid() is not None:
            pids.extend(procs.run_processes(run.run_id, run.pgid(), table))
    return pids


def stop(run: RunDir, grace_s: float = 10.0, notice: Notice | None = None) -> dict[str, Any]:
    """SIGTERM the run's process group, SIGKILL it after grace_s, and return once none of its processes is left."""
    say = notice or (lambda message: None)
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
    if targets.count:
        say(f"sending SIGTERM to process group {targets.pgid} ({targets.count} processes)")
        targets.send(signal.SIGTERM)
        last_signal = signal.SIGTERM
        if not procs.wait_until(lambda: not targets.remaining(), grace_s, 0.02):
            say(f"still running after {grace_s:g} s: sending SIGKILL")
            targets.send(signal.SIGKILL)
            last_signal = signal.SIGKILL
            if not procs.wait_until(lambda: not targets.remaining(), 10.0, 0.02):
                raise JobError(f"processes of run {run.run_id} survived SIGKILL: {targets.remaining()}")
    # The supervisor records the real status; if it is gone too, record what is known.
    recorded = procs.wait_until(lambda: run.exit_path.exists(), 3.0)
    if not recorded and not supervisor_alive(run) and not run.exit_path.exists():
        record: dict[str, Any] = {"code": None, "signal": None, "signal_name": None}
        if last_signal is not None:
            record.update(signal=int(last_signal), signal_name=signal.Signals(last_signal).name)
        record.update(ended_at=time.time(), recorded_by="agent", note="the supervisor was gone; status inferred")
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
    if not cmd.get("argv"):
        raise JobError(f"run {run.run_id} has no readable cmd.json")
    pids = procs.run_processes(run.run_id, run.pgid())
    old = stop(run, grace_s, notice)
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
        list(argv) if argv else cmd["argv"],
        cwd=cmd.get("cwd"),
        env=cmd.get("env") or {},
        name=cmd.get("name"),
        restart_of=run.run_id,
    )
    say(f"restarted as {new.run_id}")
    return old, new


def iter_running(root: Path) -> Iterable[RunDir]:
    table = procs.snapshot()
    for run in run_dirs(root):
        if run_state(run, table) in (JOB_RUNNING, JOB_STARTING):
            yield run
