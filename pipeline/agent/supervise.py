"""The supervisor: a tiny process that starts the job, waits for it and writes exit.json.

The agent spawns it in a new session (``setsid``), so it outlives the agent, the SSH session and sshd itself. The
job runs in its own process group inside that session, so that stop can signal the job's whole group without
hitting the supervisor, which then records how the job ended (a code, or the signal that killed it).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from eaglewatch.pipeline.agent.procs import RUN_ID_ENV
from eaglewatch.pipeline.agent.rundir import (
    PGID_FILE,
    PID_FILE,
    SUPERVISOR_PID_FILE,
    RunDir,
    write_json_atomic,
    write_text_atomic,
)

EVENTS_FILE_ENV = "EAGLEWATCH_EVENTS_FILE"
RUN_DIR_ENV = "EAGLEWATCH_RUN_DIR"


def job_environment(run: RunDir, base: dict[str, str]) -> dict[str, str]:
    env = dict(base)
    env[RUN_ID_ENV] = run.run_id
    env[RUN_DIR_ENV] = str(run.path)
    env[EVENTS_FILE_ENV] = str(run.events_path)
    return env


def _exit_record(status: int) -> dict:
    record: dict = {"code": None, "signal": None, "signal_name": None}
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        record["signal"] = number
        try:
            record["signal_name"] = signal.Signals(number).name
        except ValueError:
            pass
    else:
        record["code"] = os.waitstatus_to_exitcode(status)
    return record


def _ignore(signum: int, frame: object) -> None:
    # A Python-level handler (not SIG_IGN) so that the job, after exec, gets the default disposition back.
    pass


def supervise(run_dir: Path) -> int:
    run = RunDir(run_dir)
    write_text_atomic(run.path / SUPERVISOR_PID_FILE, f"{os.getpid()}\n")
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, _ignore)
    cmd = run.cmd()
    log_fd = os.open(run.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    extra: dict = {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}
    try:
        child = subprocess.Popen(
            cmd["argv"],
            cwd=cmd.get("cwd") or None,
            env=job_environment(run, dict(os.environ)),
            stdin=subprocess.DEVNULL,
            stdout=log_fd,
            stderr=log_fd,
            close_fds=True,
            **extra,
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        message = f"eaglewatch: cannot start {cmd.get('argv')!r}: {exc}\n"
        os.write(log_fd, message.encode("utf-8", "replace"))
        code = 127 if isinstance(exc, FileNotFoundError) else 126
        write_json_atomic(
            run.exit_path,
            {"code": code, "signal": None, "signal_name": None, "ended_at": time.time(),
             "error": str(exc), "recorded_by": "supervisor"},
        )
        return 0
    finally:
        os.close(log_fd)
    write_text_atomic(run.path / PID_FILE, f"{child.pid}\n")
    write_text_atomic(run.path / PGID_FILE, f"{child.pid}\n")
    _, status = os.waitpid(child.pid, 0)
    record = _exit_record(status)
    record["ended_at"] = time.time()
    record["recorded_by"] = "supervisor"
    write_json_atomic(run.exit_path, record)
    return 0
