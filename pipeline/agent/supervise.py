"""The supervisor: a tiny process that starts the job, waits for it and writes exit.json.

The agent spawns it in a new session (``setsid``), so it outlives the agent, the SSH session and sshd itself. The
job runs in its own process group inside that session, so that stop can signal the job's whole group without
hitting the supervisor, which then records how the job ended (a code, or the signal that killed it). A stop the
operator asked for leaves ``stop.json`` in the run directory before the first signal; the supervisor then adds
``stopped: true`` to exit.json, so the run reads as stopped, not as crashed.

When the job's main process has ended, the run is over, but some of its processes may not be: a tensor-parallel
worker stuck in a collective whose peer died keeps its GPU memory (seen on two H200s: 137 GB held, at 100 %
utilisation, after the main process had exited). The supervisor gives them a grace period to end by themselves,
then SIGTERM, then SIGKILL, and says so in the log, the events and exit.json (``leftovers``).
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from eaglewatch import protocol
from eaglewatch.pipeline.agent import runwatch, stacks
from eaglewatch.pipeline.agent.alert_send import AlertSender
from eaglewatch.pipeline.agent.procs import RUN_ID_ENV, RunTargets, wait_until
from eaglewatch.pipeline.agent.rundir import (
    STOP_FILE,
    PGID_FILE,
    PID_FILE,
    SUPERVISOR_PID_FILE,
    RunDir,
    read_run_record,
    write_json_atomic,
    write_text_atomic,
)

EVENTS_FILE_ENV = "EAGLEWATCH_EVENTS_FILE"
RUN_DIR_ENV = "EAGLEWATCH_RUN_DIR"
GPU_HISTORY_ENV = "EAGLEWATCH_GPU_HISTORY_S"  # seconds between GPU history lines; 0 turns the recorder off
LEFTOVER_GRACE_ENV = "EAGLEWATCH_LEFTOVER_GRACE_S"
LEFTOVER_GRACE_S = 15.0  # after the main process's exit, before SIGTERM; again before SIGKILL
# Space kept aside in the run directory for exit.json: a job that fills the disk (its own output on the same
# filesystem) must still leave its exit status, or it would read as lost. Freed just before the exit record needs it.
EXIT_RESERVE_FILE = "exit.reserve"
EXIT_RESERVE_BYTES = 16 * 1024
DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_SETTLE_S = 2.0  # helpers that end right after the main process (multiprocessing's resource tracker) are no news
# The operator's stop, written into the run directory before the first signal (jobs.request_stop; for a Slurm rank
# before scancel): the job's end is then recorded as a stop (exit.json's ``stopped``), not as a crash. A signal that
# came without it (kill by hand, the OOM killer, Slurm's time limit) stays a failure.
STOP_LIMIT = 64 * 1024
STOP_FIELDS = ("by", "via", "user", "host", "at")


def job_environment(run: RunDir, base: dict[str, str]) -> dict[str, str]:
    env = dict(base)
    env[RUN_ID_ENV] = run.run_id
    env[RUN_DIR_ENV] = str(run.path)
    env[EVENTS_FILE_ENV] = str(run.events_path)
    return stacks.arm_environment(run.path, env)


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
    _reserve_space(run)
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
    _keep(write_text_atomic, run.path / PID_FILE, f"{child.pid}\n")
    _keep(write_text_atomic, run.path / PGID_FILE, f"{child.pid}\n")
    history = _start_gpu_history(run)
    watcher = _start_watcher(run, child.pid)
    _, status = os.waitpid(child.pid, 0)
    record = _exit_record(status)
    record["ended_at"] = time.time()
    record["recorded_by"] = "supervisor"
    record.update(stop_fields(run))
    record = _write_exit(run, record)
    if watcher is not None:
        watcher.finish(record)
    # Leftovers are ended even when nothing can be recorded (the run directory was deleted): they hold GPUs.
    leftovers = clear_leftovers(run, child.pid, _env_seconds(LEFTOVER_GRACE_ENV, LEFTOVER_GRACE_S))
    if leftovers is not None:
        _keep(write_json_atomic, run.exit_path, {**record, "leftovers": leftovers})
    if history is not None:
        try:
            history.finish()  # a last line: the memory the run held, released (or not)
        except OSError:
            pass
    if watcher is not None:
        watcher.sender.close(ALERT_DRAIN_S)  # the end alert goes out before the supervisor does
    return 0


ALERT_DRAIN_S = 30.0
ALERTS_LOG = "alerts.log"


def _start_watcher(run: RunDir, pgid: int) -> runwatch.RunWatcher | None:
    """The run's alert watcher (runwatch.py), when its launch asked for alerts; else None."""
    try:
        settings = runwatch.read_settings(run)
        if settings is None:
            return None
        for problem in settings.problems:
            _alert_note(run, f"alerts: {problem}")
        if settings.sinks.empty:
            return None
        sender = AlertSender(settings.sinks, note=lambda line: _alert_note(run, line))
        watcher = runwatch.RunWatcher(run, settings, sender, pgid=pgid)
        watcher.start()
        return watcher
    except Exception as exc:  # alerts are news about the job; they never stop it
        _alert_note(run, f"alerts: not started: {type(exc).__name__}: {exc}")
        return None


def _alert_note(run: RunDir, line: str) -> None:
    """One line of what became of an alert, in alerts.log (the URL is never in it: alert_send redacts it)."""
    try:
        fd = os.open(run.path / ALERTS_LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {line}\n".encode("utf-8", "replace"))
        finally:
            os.close(fd)
    except OSError:
        pass


def read_stop_request(run: RunDir) -> dict | None:
    """The operator's stop request (``stop.json``), or None when there is none or it is not a JSON object (read
    bounded, and never from a FIFO or a device: rundir.read_run_record)."""
    try:
        request = json.loads(read_run_record(run.path / STOP_FILE, STOP_LIMIT).decode("utf-8"))
    except (OSError, ValueError):
        return None
    return request if isinstance(request, dict) else None


def stop_fields(run: RunDir) -> dict:
    """What exit.json says about an operator's stop: ``stopped: true`` and ``stop`` (who asked, how, when: the
    request's own fields, strings and numbers only), or nothing when the run was not stopped by request."""
    request = read_stop_request(run)
    if request is None:
        return {}
    kept = {key: request[key] for key in STOP_FIELDS
            if isinstance(request.get(key), (str, int, float)) and not isinstance(request.get(key), bool)}
    return {"stopped": True, "stop": kept}


def _reserve_space(run: RunDir) -> None:
    """Blocks for exit.json, taken while the disk has room (best effort: a full disk now is no reason not to run)."""
    try:
        with open(run.path / EXIT_RESERVE_FILE, "wb") as fh:
            fh.write(b"\0" * EXIT_RESERVE_BYTES)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError:
        pass


def _write_exit(run: RunDir, record: dict) -> dict:
    """exit.json, new beside old then swapped in. When the disk is full, the reserve is given back and the record
    written again, saying that the disk was full: the run ends as "exit code N, disk full", not as lost."""
    try:
        write_json_atomic(run.exit_path, record)
    except OSError as exc:
        if exc.errno not in DISK_FULL_ERRNOS:
            return record
        for leftover in (run.exit_path.with_name(f".{run.exit_path.name}.{os.getpid()}.tmp"),
                         run.path / EXIT_RESERVE_FILE):
            try:
                leftover.unlink()
            except OSError:
                pass
        record = {**record, "disk_full": True}
        _keep(write_json_atomic, run.exit_path, record)
        return record
    try:
        (run.path / EXIT_RESERVE_FILE).unlink()
    except OSError:
        pass
    return record


def _keep(write, path: Path, content) -> bool:
    """Write a record of the run; False when its directory is gone (deleted under the running job)."""
    try:
        write(path, content)
    except OSError:
        return False
    return True


def _env_seconds(name: str, default: float) -> float:
    try:
        return max(0.0, float(os.environ.get(name, default)))
    except ValueError:
        return default


def _start_gpu_history(run: RunDir):
    """The run's GPU history recorder (pipeline/telemetry/history.py), when NVML answers; else None."""
    interval = _env_seconds(GPU_HISTORY_ENV, 5.0)
    if interval <= 0:
        return None
    try:
        from eaglewatch.pipeline.telemetry.history import HistoryRecorder

        recorder = HistoryRecorder(run.path, interval)
        if not recorder.available():
            return None
        recorder.start()
        return recorder
    except Exception:  # no telemetry package or no NVML: the job runs the same without a history
        return None


def _note(run: RunDir, message: str) -> None:
    """A line in the run's log (where the operator looks) and a warning event (which the dashboard alerts on)."""
    line = f"[eaglewatch] {message}\n".encode("utf-8", "replace")
    event = protocol.make_event(protocol.EVENT_WARNING, message=message, code="leftover_processes", by="supervisor")
    for path, data in ((run.log_path, line), (run.events_path, protocol.encode(event))):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
        except OSError:
            pass


def clear_leftovers(run: RunDir, pgid: int, grace_s: float) -> dict | None:
    """End what is left of the run after its main process exited; None when nothing was left."""
    targets = RunTargets(run.run_id, pgid)
    if not targets.count or wait_until(lambda: not targets.remaining(), min(_SETTLE_S, grace_s), 0.1):
        return None
    pids = targets.remaining()
    _note(run, f"{len(pids)} process(es) of the run outlived its main process (pids {' '.join(map(str, pids[:8]))}); "
               f"SIGTERM in {grace_s:g} s unless they end")
    ended_by = None
    # Each look reads /proc: twice a second is plenty while waiting on processes that may never end.
    if not wait_until(lambda: not targets.remaining(), grace_s, 0.5):
        for signum in (signal.SIGTERM, signal.SIGKILL):
            targets.send(signum)
            ended_by = signal.Signals(signum).name
            if wait_until(lambda: not targets.remaining(), grace_s if signum == signal.SIGTERM else 10.0, 0.25):
                break
    left = targets.remaining()
    if left:
        _note(run, f"processes of the run survived SIGKILL: pids {' '.join(map(str, left[:8]))}")
    else:
        _note(run, f"the leftover processes ended {'after ' + ended_by if ended_by else 'by themselves'}")
    return {"pids": pids, "ended_by": ended_by, "alive": left, "cleared_at": time.time()}
