"""The agent's server: commands in on stdin, JSON lines out on stdout, one line per message.

Threads: the main thread reads commands; a streamer thread follows the watched runs' files (woken by inotify) and
sends heartbeats; stop and restart run in their own threads so that streaming and heartbeats never wait for them;
an optional telemetry thread samples the GPUs. The agent opens no port: its only channel is its stdin and stdout.
"""

from __future__ import annotations

import getpass
import importlib.util
import json
import math
import os
import shutil
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Callable

from eaglewatch import __version__
from eaglewatch import protocol as p
from eaglewatch.pipeline.agent import jobs, slurm
from eaglewatch.pipeline.agent.rundir import (
    AmbiguousRun,
    NotRegularFile,
    RunDir,
    RunNotFound,
    not_regular,
    open_run_file,
    read_run_file,
)
from eaglewatch.pipeline.agent.watch import DirWatcher

LOG_CHUNK = 64 * 1024
EVENTS_CHUNK = 256 * 1024
EVENTS_READ_LIMIT = 4 << 20  # per telemetry sample, when looking for a run's output folder
OUTPUT_DIR_FIELD = b'"output_dir"'
FULL_CHECK_INTERVAL_S = 5.0


class Output:
    """Serialises writers; remembers a broken pipe (the client or sshd went away)."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self._lock = threading.Lock()
        self.broken = threading.Event()

    def send(self, message: dict[str, Any]) -> None:
        data = p.encode(message)
        with self._lock:
            if self.broken.is_set():
                return
            try:
                # The stream is unbuffered: a write into a nearly full pipe can be cut short (a signal, such as a
                # job's SIGCHLD, after part of it went through); the rest must follow, or the line is torn.
                view = memoryview(data)
                while view:
                    view = view[self._stream.write(view):]
                self._stream.flush()
            except (OSError, ValueError):
                self.broken.set()


@dataclass
class Watch:
    run: RunDir
    log_offset: int
    events_offset: int
    sent_state: tuple | None = None
    log_fd: int | None = None
    events_fd: int | None = None
    extra: dict = field(default_factory=dict)

    def close(self) -> None:
        for fd in (self.log_fd, self.events_fd):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.log_fd = self.events_fd = None


def not_regular_message(run_id: str, name: str, kind: str) -> str:
    return f"run {run_id}'s {name} is not a regular file ({kind}); not reading it"


class Streamer(threading.Thread):
    def __init__(self, out: Output, heartbeat_s: float = p.HEARTBEAT_INTERVAL_S) -> None:
        super().__init__(name="eaglewatch-streamer", daemon=True)
        self.out = out
        self.heartbeat_s = heartbeat_s
        self.watcher = DirWatcher()
        self._watches: dict[str, Watch] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def add(self, run: RunDir, log_offset: int, events_offset: int) -> None:
        with self._lock:
            old = self._watches.pop(run.run_id, None)
            if old is not None:
                old.close()
            self._watches[run.run_id] = Watch(run, max(0, int(log_offset)), max(0, int(events_offset)))
            self.watcher.add(str(run.path))
        self.watcher.wake()

    def remove(self, run_id: str) -> None:
        with self._lock:
            watch = self._watches.pop(run_id, None)
            if watch is not None:
                self.watcher.remove(str(watch.run.path))
                watch.close()

    def stop(self) -> None:
        self._stop.set()
        self.watcher.wake()

    def run(self) -> None:
        next_beat = time.monotonic()
        next_check = time.monotonic()
        while not self._stop.is_set() and not self.out.broken.is_set():
            now = time.monotonic()
            full_check = now >= next_check
            if full_check:
                # A full check reads /proc to notice a run that vanished without an exit; rare, so cheap.
                next_check = now + FULL_CHECK_INTERVAL_S
            with self._lock:
                watches = list(self._watches.values())
            for watch in watches:
                try:
                    self._pump(watch, full_check)
                except OSError as exc:
                    self.out.send({"type": p.MSG_NOTICE, "run": watch.run.run_id, "message": f"read error: {exc}"})
            now = time.monotonic()
            if now >= next_beat:
                self.out.send(p.heartbeat_message())
                next_beat = now + self.heartbeat_s
                jobs.reap()
            self.watcher.wait(max(0.0, min(next_beat, next_check) - time.monotonic()))
        self.watcher.close()

    def _pump(self, watch: Watch, full_check: bool) -> None:
        self._pump_files(watch)
        run = watch.run
        if watch.sent_state is None or full_check or run.exit_path.exists() != (watch.sent_state[0] == p.JOB_EXITED) \
                or (watch.sent_state[1] is None and run.pid() is not None):
            summary = jobs.run_summary(run)
            key = (summary["state"], summary["pid"], bool(summary.get("run_dir_gone")))
            if key != watch.sent_state:
                if summary["state"] == p.JOB_EXITED:
                    # The job's last bytes were written before exit.json: send them before the exit.
                    self._pump_files(watch)
                    summary = jobs.run_summary(run)
                watch.sent_state = key
                self.out.send(
                    {
                        "type": p.MSG_JOB,
                        "run": run.run_id,
                        "state": summary["state"],
                        "pid": summary["pid"],
                        "pgid": summary["pgid"],
                        "exit": summary["exit"],
                        "summary": summary,
                    }
                )

    def _open(self, watch: Watch, path: Path) -> int | None:
        """The run file opened for streaming, or None for now: not there yet, or not a regular file (a FIFO would
        block this thread, and with it every watch and the heartbeats, forever). That is said once, not per pump."""
        try:
            fd = open_run_file(path)
        except NotRegularFile as exc:
            if watch.extra.get(path.name) != exc.kind:
                watch.extra[path.name] = exc.kind
                self.out.send({"type": p.MSG_NOTICE, "run": watch.run.run_id,
                               "message": not_regular_message(watch.run.run_id, path.name, exc.kind)})
            return None
        except OSError:
            return None
        watch.extra.pop(path.name, None)
        return fd

    def _pump_files(self, watch: Watch) -> None:
        run_id = watch.run.run_id
        if watch.log_fd is None:
            watch.log_fd = self._open(watch, watch.run.log_path)
        if watch.log_fd is not None:
            size = os.fstat(watch.log_fd).st_size
            while watch.log_offset < size and not self.out.broken.is_set():
                data = os.pread(watch.log_fd, min(LOG_CHUNK, size - watch.log_offset), watch.log_offset)
                if not data:
                    break
                self.out.send(p.log_message(run_id, watch.log_offset, data))
                watch.log_offset += len(data)
        if watch.events_fd is None:
            watch.events_fd = self._open(watch, watch.run.events_path)
        if watch.events_fd is not None:
            size = os.fstat(watch.events_fd).st_size
            while watch.events_offset < size and not self.out.broken.is_set():
                data = os.pread(watch.events_fd, min(EVENTS_CHUNK, size - watch.events_offset), watch.events_offset)
                end = data.rfind(b"\n") + 1
                if end == 0:
                    break  # a torn last line: wait for the pipeline to finish writing it
                start = watch.events_offset
                for line in data[:end].splitlines(keepends=True):
                    if line.strip():
                        self.out.send(p.event_message(run_id, start, start + len(line), line.rstrip(b"\r\n")))
                    start += len(line)
                watch.events_offset += end


class OutputDirs:
    """Where each run writes, as the run itself said: the last ``info`` event with ``output_dir`` in its
    events.jsonl. The file is read on from where the last call stopped, complete lines only."""

    def __init__(self) -> None:
        self._offsets: dict[str, int] = {}
        self._found: dict[str, str] = {}

    def of(self, run: RunDir) -> str | None:
        offset = self._offsets.get(run.run_id, 0)
        try:
            data = read_run_file(run.events_path, EVENTS_READ_LIMIT, offset)
        except OSError:  # not there, or not a regular file
            data = b""
        end = data.rfind(b"\n") + 1
        for line in data[:end].splitlines():
            # Most lines are sample and progress events; only parse the few that can hold the field.
            if OUTPUT_DIR_FIELD in line:
                value = _output_dir_of(line)
                if value:
                    self._found[run.run_id] = value
        self._offsets[run.run_id] = offset + end
        return self._found.get(run.run_id)


def _output_dir_of(line: bytes) -> str | None:
    try:
        event = json.loads(line)
    except ValueError:
        return None
    if not isinstance(event, dict) or event.get("kind") != p.EVENT_INFO:
        return None
    value = event.get("output_dir")
    return value if isinstance(value, str) and value else None


class RunRanks:
    """pid -> TP rank label ("Worker_TP3") for the running runs, read incrementally from their logs' prefixes,
    so that per-process GPU memory can be shown per rank. Called by the sampler once per sample."""

    def __init__(self, root: Path) -> None:
        from eaglewatch.pipeline.telemetry.ranks import RankMap

        self.root = root
        self.ranks = RankMap()
        self.offsets: dict[str, int] = {}
        self.output_dirs = OutputDirs()

    def running(self) -> list[RunDir]:
        return [run for run in jobs.run_dirs(self.root) if not run.exit_path.exists()]

    def output_dir(self) -> str | None:
        """The folder whose disk the sampler watches: the newest running run's output folder, as its events say
        (``info`` with ``output_dir``), or its run directory until it has said so. None when nothing runs."""
        newest = max(self.running(), key=lambda r: r.run_id, default=None)
        if newest is None:
            return None
        return self.output_dirs.of(newest) or str(newest.path)

    def __call__(self) -> dict[int, str]:
        for run in self.running():
            offset = self.offsets.get(run.run_id, 0)
            try:
                data = read_run_file(run.log_path, 4 << 20, offset)
            except OSError:  # not there, or not a regular file
                continue
            self.offsets[run.run_id] = offset + len(data)
            self.ranks.feed_log(data)
        return self.ranks.as_dict()


class TelemetryLoop(threading.Thread):
    """Samples through eaglewatch.pipeline.telemetry when it is importable; otherwise never starts."""

    def __init__(self, out: Output, root: Path, interval_s: float) -> None:
        super().__init__(name="eaglewatch-telemetry", daemon=True)
        from eaglewatch.pipeline.telemetry import TelemetrySampler

        self.out = out
        self.interval_s = interval_s
        self.ranks = RunRanks(root)
        self.sampler = TelemetrySampler(interval_s, output_dir=self.ranks.output_dir(),
                                        job_pids_fn=lambda: jobs.job_pids(root), rank_map_fn=self.ranks)
        self._stop = threading.Event()

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        try:
            while not self._stop.is_set() and not self.out.broken.is_set():
                try:
                    # The job says where it writes once it runs, and a newer run may start: look again each time.
                    self.sampler.set_output_dir(self.ranks.output_dir())
                    message = json.loads(json.dumps(self.sampler.sample(), default=str))
                except Exception as exc:
                    self.out.send({"type": p.MSG_NOTICE, "run": None, "message": f"telemetry stopped: {exc}"})
                    return
                message["type"] = p.MSG_TELEMETRY
                self.out.send(message)
                self._stop.wait(self.interval_s)
        finally:
            try:
                self.sampler.close()
            except Exception:
                pass


def _features() -> list[str]:
    features = ["launch", "watch", "stop", "restart", "stacks", "alerts"]
    try:
        if importlib.util.find_spec("eaglewatch.pipeline.telemetry") is not None:
            features.append("telemetry")
    except (ImportError, ValueError):
        pass
    if importlib.util.find_spec("psutil") is not None:
        features.append("psutil")
    if shutil.which("sbatch") is not None:
        features.append("slurm")  # the job ops can submit here
    return features


def _seconds(args: dict[str, Any], key: str, default: float) -> float:
    """A duration argument: a finite number, 0 or more (NaN or infinity would make a wait never end)."""
    value = args.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise jobs.BadRequest(f"{key} must be a finite number of seconds, 0 or more, not {value!r}")
    return float(value)


class Server:
    def __init__(self, root: Path, stdin: BinaryIO, stdout: BinaryIO, idle_exit_s: float = p.AGENT_IDLE_EXIT_S):
        self.root = root
        self.stdin = stdin
        self.out = Output(stdout)
        self.streamer = Streamer(self.out)
        self.telemetry: TelemetryLoop | None = None
        self.idle_exit_s = idle_exit_s
        self._last_input = time.monotonic()

    def hello(self) -> dict[str, Any]:
        return {
            "type": p.MSG_HELLO,
            "agent_version": __version__,
            "protocols": sorted(p.SUPPORTED_VERSIONS),
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "user": getpass.getuser(),
            "run_root": str(self.root),
            "python": sys.version.split()[0],
            "inotify": self.streamer.watcher.uses_inotify,
            "features": _features(),
        }

    def serve(self) -> int:
        self.out.send(self.hello())
        self.streamer.start()
        if self.idle_exit_s > 0:
            threading.Thread(target=self._idle_watchdog, name="eaglewatch-idle", daemon=True).start()
        try:
            while not self.out.broken.is_set():
                line = self.stdin.readline()
                if not line:
                    break
                self._last_input = time.monotonic()
                if line.strip():
                    self.handle_line(line)
        finally:
            self.streamer.stop()
            if self.telemetry is not None:
                self.telemetry.stop()
        return 0

    def _idle_watchdog(self) -> None:
        while True:
            time.sleep(1.0)
            if time.monotonic() - self._last_input > self.idle_exit_s:
                # The link is hung (nothing, not even a ping, for a long time): leave rather than linger.
                os._exit(0)

    def handle_line(self, line: bytes) -> None:
        try:
            raw = json.loads(line)
        except (ValueError, UnicodeDecodeError):
            self.out.send(p.reply_error(None, p.ERR_BAD_REQUEST, "a command must be one JSON object on one line"))
            return
        request_id = raw.get("id") if isinstance(raw, dict) else None
        try:
            message = p.decode(line)
        except p.ProtocolVersionError as exc:
            self.out.send(p.reply_error(request_id, p.ERR_VERSION, f"agent {__version__}: {exc}"))
            return
        except p.ProtocolError as exc:
            self.out.send(p.reply_error(request_id, p.ERR_BAD_REQUEST, str(exc)))
            return
        if message.get("type") != p.MSG_COMMAND:
            self.out.send(p.reply_error(request_id, p.ERR_BAD_REQUEST, f"expected a {p.MSG_COMMAND!r} message"))
            return
        op = message.get("op")
        args = message.get("args") or {}
        handler: Callable[[dict[str, Any]], Any] | None = getattr(self, f"op_{op}", None) if op in p.OPS else None
        if handler is None or not isinstance(args, dict):
            self.out.send(p.reply_error(request_id, p.ERR_BAD_REQUEST, f"unknown command {op!r}"))
            return
        if op in (p.OP_STOP, p.OP_RESTART, p.OP_STACKS) or op in p.JOB_OPS:
            # These wait (on processes, on Slurm's commands): streaming and the next commands must not.
            threading.Thread(target=self._run, args=(handler, request_id, args), daemon=True).start()
        else:
            self._run(handler, request_id, args)

    def _run(self, handler: Callable[[dict[str, Any]], Any], request_id: Any, args: dict[str, Any]) -> None:
        try:
            result = handler(args)
        except RunNotFound as exc:
            reply = p.reply_error(request_id, p.ERR_NOT_FOUND, str(exc))
        except AmbiguousRun as exc:
            reply = p.reply_error(request_id, p.ERR_AMBIGUOUS, str(exc))
        except jobs.JobError as exc:
            reply = p.reply_error(request_id, exc.code, str(exc))
        except (KeyError, TypeError, ValueError) as exc:
            reply = p.reply_error(request_id, p.ERR_BAD_REQUEST, f"bad arguments: {exc!r}")
        except Exception as exc:  # the agent must answer every command, whatever went wrong
            reply = p.reply_error(request_id, p.ERR_FAILED, f"{type(exc).__name__}: {exc}")
        else:
            reply = p.reply_ok(request_id, result)
        self.out.send(reply)

    # --- commands ------------------------------------------------------------------------------------
    def _notice(self, run_id: str | None) -> Callable[[str], None]:
        return lambda message: self.out.send({"type": p.MSG_NOTICE, "run": run_id, "message": message})

    def op_ping(self, args: dict[str, Any]) -> Any:
        return {"t": round(time.time(), 3)}

    def op_runs(self, args: dict[str, Any]) -> Any:
        return {"runs": jobs.list_runs(self.root)}

    def op_status(self, args: dict[str, Any]) -> Any:
        return jobs.run_summary(jobs.find(self.root, args["run"]))

    def op_launch(self, args: dict[str, Any]) -> Any:
        run = jobs.launch(
            self.root, args["argv"], cwd=args.get("cwd"), env=args.get("env"), name=args.get("name"),
            python=args.get("python"), installed=args.get("installed") is True, alerts=args.get("alerts"),
        )
        return jobs.run_summary(run)

    def op_watch(self, args: dict[str, Any]) -> Any:
        run = jobs.find(self.root, args["run"])
        self.streamer.add(run, int(args.get("log_offset") or 0), int(args.get("events_offset") or 0))
        return jobs.run_summary(run)

    def op_unwatch(self, args: dict[str, Any]) -> Any:
        self.streamer.remove(str(args["run"]))
        return {}

    def op_stop(self, args: dict[str, Any]) -> Any:
        run = jobs.find(self.root, args["run"])
        return jobs.stop(run, _seconds(args, "grace_s", 10.0), self._notice(run.run_id))

    def op_restart(self, args: dict[str, Any]) -> Any:
        run = jobs.find(self.root, args["run"])
        argv = args.get("argv")
        old, new = jobs.restart(
            self.root,
            run,
            argv=argv,
            grace_s=_seconds(args, "grace_s", 10.0),
            gpu_timeout_s=_seconds(args, "gpu_timeout_s", 120.0),
            notice=self._notice(run.run_id),
        )
        return {"old": old, "new": jobs.run_summary(new)}

    def op_stacks(self, args: dict[str, Any]) -> Any:
        """Where every process of the run is (stacks.py); ``saved: true`` gives the last stacks taken instead
        (at a stall, by the run's supervisor), or none."""
        run = jobs.find(self.root, args["run"])
        if args.get("saved") is True:
            return jobs.saved_stacks(run)
        return jobs.take_stacks(run)

    def op_gpu_history(self, args: dict[str, Any]) -> Any:
        """The last samples the run's supervisor recorded (none without NVML or the telemetry package)."""
        run = jobs.find(self.root, args["run"])
        limit = max(0, min(int(args.get("limit") or 60), 1000))
        try:
            from eaglewatch.pipeline.telemetry.history import HISTORY_FILE, OLDER_FILE, read_recent
        except Exception:
            return {"samples": []}
        if any(not_regular(run.path / name) for name in (HISTORY_FILE, OLDER_FILE)):
            return {"samples": []}  # read_recent opens them plainly: a FIFO would block every command after this
        return {"samples": read_recent(run.path, limit)}

    # --- data-parallel jobs (docs/slurm.md) ----------------------------------------------------------------
    def op_job_launch(self, args: dict[str, Any]) -> Any:
        return slurm.launch(self.root, args)

    def op_jobs(self, args: dict[str, Any]) -> Any:
        return slurm.list_jobs(self.root)

    def op_job_status(self, args: dict[str, Any]) -> Any:
        return slurm.status(self.root, args.get("job"))

    def op_job_cancel(self, args: dict[str, Any]) -> Any:
        return slurm.cancel(self.root, args.get("job"), self._notice(None))

    def op_job_restart_rank(self, args: dict[str, Any]) -> Any:
        return slurm.restart_rank(self.root, args.get("job"), args.get("rank"), self._notice(None))

    def op_telemetry(self, args: dict[str, Any]) -> Any:
        interval = float(args.get("interval_s") or 0)
        if self.telemetry is not None:
            self.telemetry.stop()
            self.telemetry = None
        if interval <= 0:
            return {"available": True, "running": False}
        try:
            self.telemetry = TelemetryLoop(self.out, self.root, interval)
        except Exception as exc:  # not installed here, or no usable GPU library: no telemetry, said once
            return {"available": False, "running": False, "reason": f"{type(exc).__name__}: {exc}"}
        self.telemetry.start()
        return {"available": True, "running": True}
