"""The rank launcher: what a job's batch script runs on the compute node, as the array task's main process.

It makes the rank's run directory under the (shared) run root, with the run id the agent gave that rank at submit
time, writes ``cmd.json`` as a launch does (``jobs.write_command_record``, plus a ``slurm`` block: job, rank, array
task, node), starts eaglewatch's supervisor in it and waits. The supervisor runs the rank's command and writes
``exit.json``; the launcher then exits with the command's own status (or is ended by the same signal), so that
Slurm's state for the task (COMPLETED, FAILED, ...) is the rank's.

While it waits it refreshes ``task.alive`` in the run directory (``jobs.beat_task_alive``): the login host, which
sees the run directory but not this node's processes, tells from it that the task still lives.

Slurm ends a task (scancel, time limit) by sending SIGTERM to every process of the task, then SIGKILL after
``KillWait``. The launcher, like the supervisor, ignores SIGTERM: the rank's command ends on it, the supervisor
records how, and only then does the launcher exit; were it to end first, Slurm would take the task for finished and
SIGKILL the supervisor before it wrote ``exit.json``.

The rank's command is worked out here, on the node (``jobpython``): which Python has vLLM and how many GPUs it sees
are the node's facts, not the login host's.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Sequence

from eaglewatch.pipeline.agent import jobpython, jobs, runwatch
from eaglewatch.pipeline.agent.rundir import NotRegularFile, RunDir, is_run_id, not_regular, write_json_atomic
from eaglewatch.pipeline.agent.slurm_record import job_folder

RANK_ARG = "--rank"
WORLD_SIZE_ARG = "--world-size"
EXIT_BAD_TASK = 2


def rank_argv(argv: Sequence[str], rank: int, world_size: int) -> list[str]:
    """The rank's command: the job's argv with this rank's share of the data."""
    return [*argv, RANK_ARG, str(rank), WORLD_SIZE_ARG, str(world_size)]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="eaglewatch slurm task", add_help=False)
    parser.add_argument("--run-root", required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--cwd", required=True)
    parser.add_argument("--name", default=None)
    parser.add_argument("--python", default=None)
    parser.add_argument("--installed", action="store_true")
    parser.add_argument("--env", action="append", default=[])
    parser.add_argument("--run", required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--restart-of", default="")
    parser.add_argument("argv", nargs=argparse.REMAINDER)
    return parser


def _ignore(signum: int, frame: object) -> None:
    # A Python-level handler, not SIG_IGN: the supervisor and the command it execs get the default dispositions.
    pass


def _say(message: str) -> None:
    # The batch output file: where an operator looks when a rank never got a run directory.
    print(f"eaglewatch: {message}", file=sys.stderr, flush=True)


def main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(list(argv))
    command = list(args.argv[1:] if args.argv[:1] == ["--"] else args.argv)
    run_path = Path(args.run_root) / args.run
    if not is_run_id(args.run) or not is_run_id(args.job) or not command:
        _say(f"not a rank of an eaglewatch job: run {args.run!r}, job {args.job!r}, command {command!r}")
        return EXIT_BAD_TASK
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, _ignore)
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    try:
        run_path.mkdir(parents=True)
    except FileExistsError:
        _say(f"run directory {run_path} exists already: this task ran before (requeued?); restart the rank instead")
        return EXIT_BAD_TASK
    run = RunDir(run_path)
    every_s = jobs.task_alive_every_s()
    jobs.mark_task_alive(run, node, every_s)
    requested = rank_argv(command, args.rank, args.world_size)
    overrides = dict(item.split("=", 1) for item in args.env if "=" in item)
    slurm = {"job": args.job, "rank": args.rank, "world_size": args.world_size,
             "job_id": os.environ.get("SLURM_JOB_ID"), "array_job_id": os.environ.get("SLURM_ARRAY_JOB_ID"),
             "array_task_id": os.environ.get("SLURM_ARRAY_TASK_ID"), "node": node}

    def record(job: jobpython.JobCommand | None) -> None:
        jobs.write_command_record(run, requested, job, cwd=args.cwd, env=overrides, name=args.name,
                                  python=args.python, installed=bool(args.installed),
                                  restart_of=args.restart_of or None, host=node, extra={"slurm": slurm})

    try:
        jobs.validate_launch(requested, args.cwd, overrides, args.name)
        job = jobpython.job_command(requested, overrides, python=args.python, installed=args.installed)
    except (jobs.JobError, jobpython.JobPythonError) as exc:
        record(None)
        return _refused(run, str(exc))
    record(job)
    alerts = runwatch.read_record(job_folder(Path(args.run_root), args.job))
    if alerts is not None:
        runwatch.write_settings(run, alerts)  # the rank's supervisor alerts where the job asked
    supervisor = jobs.start_supervisor(run, jobs.supervisor_env(job, os.environ), detached=False)
    return _exit_like(run, _wait_beating(supervisor, run, every_s))


def _wait_beating(supervisor: subprocess.Popen, run: RunDir, every_s: float) -> int:
    """Wait for the supervisor, refreshing ``task.alive`` every ``every_s`` meanwhile; its exit status."""
    done = threading.Event()

    def beat() -> None:
        while not done.wait(every_s):
            jobs.beat_task_alive(run)

    beater = threading.Thread(target=beat, name="eaglewatch-task-alive", daemon=True)
    beater.start()
    try:
        return supervisor.wait()
    finally:
        done.set()
        beater.join()


def _open_append(path: Path) -> int:
    """A descriptor that appends to path, created if missing, which must be a regular file (``rundir.open_run_file``
    for writing). Raises NotRegularFile for a FIFO, a device, ...: the stat first keeps a device from being opened at
    all, O_NONBLOCK keeps the open of a FIFO from waiting for a reader (with none it fails at once, ENXIO), and fstat
    checks what was opened."""
    kind = not_regular(path)
    if kind is not None:
        raise NotRegularFile(path, kind)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
    fd = os.open(path, flags, 0o644)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularFile(path, not_regular(path) or "not a regular file")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _append(path: Path, data: bytes) -> str | None:
    """Append data to the regular file path; why it could not be, else None."""
    try:
        fd = _open_append(path)
    except NotRegularFile as exc:
        return f"{path} is {exc.kind}, not a regular file"
    except OSError as exc:
        return f"{path}: {exc.strerror or exc}"
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except OSError as exc:
        return f"{path}: {exc.strerror or exc}"
    finally:
        os.close(fd)
    return None


def _refused(run: RunDir, message: str) -> int:
    """The rank cannot start on this node (no such folder, no Python with vLLM): recorded as a run that could not
    start, the way the supervisor records a missing command. A log that cannot be written (a FIFO put there) is
    said in exit.json's error and the batch output, not waited on."""
    problem = _append(run.log_path, f"eaglewatch: cannot start the rank on this node: {message}\n"
                      .encode("utf-8", "replace"))
    error = message if problem is None else f"{message} (and the run's log cannot be written: {problem})"
    write_json_atomic(run.exit_path, {"code": EXIT_BAD_TASK, "signal": None, "signal_name": None,
                                      "ended_at": time.time(), "error": error, "recorded_by": "slurm_task"})
    _say(f"cannot start the rank: {error}")
    return EXIT_BAD_TASK


def _exit_like(run: RunDir, supervisor_status: int) -> int:
    """Exit as the rank's command did: its code, or the signal that ended it."""
    info = run.exit_info()
    if info is None:
        _say(f"the supervisor of {run.run_id} ended ({supervisor_status}) without recording the rank's exit")
        return supervisor_status if supervisor_status > 0 else 1
    if isinstance(info.get("code"), int):
        return int(info["code"])
    number = info.get("signal")
    if isinstance(number, int) and number > 0:
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            signal.signal(number, signal.SIG_DFL)
        except (OSError, ValueError):
            pass  # SIGKILL and SIGSTOP cannot be caught, so they already have their default action
        os.kill(os.getpid(), number)
        return 128 + number  # a signal that does not end a process (SIGCHLD) leaves the conventional code
    return 1
