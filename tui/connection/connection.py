"""The operator side's one interface to a GPU host, local or over SSH: commands, watches, reconnects.

Threads: each live link has a reader thread (session.py); one maintenance thread pings the agent and, when the
link dies, reconnects with backoff and resubscribes every watch from the offsets already delivered. Every wait
honours ``close()``. Callbacks run on the reader thread and must not call blocking methods of the connection.
"""

from __future__ import annotations

import queue
import random
import threading
import time
from typing import Any, Sequence

from eaglewatch import protocol as p
from eaglewatch.tui.connection.errors import AgentError, ConnectionFailed, LinkLost, UnknownHostKeyError
from eaglewatch.tui.connection.links import AgentUploader, LocalLink, open_ssh_link
from eaglewatch.tui.connection.session import AgentSession
from eaglewatch.tui.connection.ssh import SSHOptions, accept_host_key
from eaglewatch.tui.connection.stream import RunWatch, Sink, StreamGap
from eaglewatch.tui.connection.target import Endpoint, is_local, resolve
from eaglewatch.tui.messages import Item, LinkState, Notice, RestartResult, RunSummary, Telemetry

# Link states (Connection.state and LinkState.state).
IDLE, CONNECTED, LOST, RECONNECTING, FAILED, CLOSED = "idle", "connected", "lost", "reconnecting", "failed", "closed"


class Connection:
    def __init__(
        self,
        host: str = "local",
        *,
        run_root: str | None = None,
        ssh_options: SSHOptions | None = None,
        reconnect: bool = True,
        dead_after_s: float = p.DEAD_AFTER_S,
        backoff_initial_s: float = 0.05,
        backoff_max_s: float = 2.0,
        request_timeout_s: float = 120.0,
        idle_exit_s: float | None = None,
        on_host_items: Sink | None = None,
    ) -> None:
        self.host = host
        self.run_root = run_root
        self.ssh_options = ssh_options or SSHOptions()
        self.endpoint: Endpoint | None = None if is_local(host) else resolve(host, self.ssh_options.config_path)
        self.reconnect = reconnect
        self.dead_after_s = dead_after_s
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.request_timeout_s = request_timeout_s
        self.idle_exit_s = idle_exit_s
        self.on_host_items = on_host_items
        self.host_items: queue.Queue[list[Item]] = queue.Queue()  # telemetry, notices, link states
        self.state = IDLE
        self.failure: Exception | None = None
        self.hello: dict[str, Any] = {}
        self.reconnects = 0
        self._uploader = AgentUploader()
        self._session: AgentSession | None = None
        self._watches: dict[str, RunWatch] = {}
        self._telemetry_interval_s = 0.0
        self._cond = threading.Condition()
        self._dispatch = threading.RLock()
        self._closed = threading.Event()
        self._jitter = random.Random()  # its own: reconnect timing must not draw on (or disturb) the global one
        self._thread: threading.Thread | None = None

    # --- life cycle ----------------------------------------------------------------------------------
    def connect(self) -> dict[str, Any]:
        """Open the first link. Raises UnknownHostKeyError, HostKeyChangedError, AuthenticationFailed,
        AgentStartError or ConnectionFailed; later losses are handled by reconnecting."""
        session = self._open_session()
        with self._cond:
            self._session = session
            self.state = CONNECTED
            self.hello = session.hello
        self._thread = threading.Thread(target=self._maintain, name="eaglewatch-maintain", daemon=True)
        self._thread.start()
        return session.hello

    def close(self) -> None:
        self._closed.set()
        with self._cond:
            session, self._session = self._session, None
            self.state = CLOSED
            self._cond.notify_all()
        if session is not None:
            session.close()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._broadcast(LinkState(CLOSED))

    def __enter__(self) -> "Connection":
        if self.state == IDLE:
            self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def accept_host_key(self, error: UnknownHostKeyError) -> str:
        """The operator accepted the key shown in error: record it in known_hosts."""
        # The error names the file for its host (the ssh config may name one); an explicit choice wins.
        return accept_host_key(error, self.ssh_options.known_hosts_write)

    @property
    def agent_pid(self) -> int | None:
        return self.hello.get("pid")

    # --- links ---------------------------------------------------------------------------------------
    def _open_link(self) -> Any:
        if self.endpoint is None:
            return LocalLink(self.run_root, self.idle_exit_s, env=self.ssh_options.agent_env)
        return open_ssh_link(self.endpoint, self.ssh_options, self._uploader, self.run_root, self.idle_exit_s)

    def _open_session(self) -> AgentSession:
        link = self._open_link()
        session = AgentSession(link, self._on_messages, self._on_tick, self._on_dead, self.dead_after_s)
        try:
            session.start()
        except BaseException:
            session.close()
            if self.endpoint is not None:
                # The uploaded agent may have been removed on the host: check again next time.
                self._uploader.forget(self.endpoint)
            raise
        return session

    def _on_dead(self, session: AgentSession, reason: str) -> None:
        with self._cond:
            if session is not self._session:
                return
            self._session = None
            self.state = LOST
            self._cond.notify_all()
        with self._dispatch:
            for watch in self._watches.values():
                watch.on_link_lost()
        self._broadcast(LinkState(LOST, reason))

    def _maintain(self) -> None:
        attempt = 0
        last_ping = time.monotonic()
        while not self._closed.is_set():
            with self._cond:
                if self._session is not None:
                    self._cond.wait(timeout=1.0)
                session = self._session
            if self._closed.is_set():
                return
            if session is not None:
                if time.monotonic() - last_ping >= p.CLIENT_PING_INTERVAL_S:
                    last_ping = time.monotonic()
                    try:
                        session.send_command(p.OP_PING)
                    except LinkLost:
                        pass
                continue
            if not self.reconnect:
                return
            if attempt:
                # The exponent is capped: a host that stays away for hours (or a zero initial delay) must not
                # overflow the float the delay becomes.
                delay = min(self.backoff_max_s, self.backoff_initial_s * 2 ** min(attempt - 1, 32))
                if self._closed.wait(delay * self._jitter.uniform(0.8, 1.2)):
                    return
            attempt += 1
            with self._cond:
                self.state = RECONNECTING
            self._broadcast(LinkState(RECONNECTING, f"attempt {attempt}", attempt))
            try:
                session = self._open_session()
            except ConnectionFailed as exc:
                if exc.fatal:
                    with self._cond:
                        self.state = FAILED
                        self.failure = exc
                    self._broadcast(LinkState(FAILED, str(exc), attempt))
                    return
                continue
            except Exception as exc:  # paramiko and socket errors while the host is coming back
                del exc
                continue
            with self._cond:
                if self._closed.is_set():
                    session.close()
                    return
                self._session = session
                self.hello = session.hello
                self.state = CONNECTED
                self.reconnects += 1
                self._cond.notify_all()
            if not self._resubscribe(session):
                continue
            attempt = 0
            last_ping = time.monotonic()
            self._broadcast(LinkState(CONNECTED, f"reconnected after {self.reconnects} losses"))

    def _resubscribe(self, session: AgentSession) -> bool:
        with self._dispatch:
            watches = list(self._watches.values())
        try:
            for watch in watches:
                log_offset, events_offset = watch.resume_offsets
                session.request(p.OP_WATCH, 30.0, run=watch.run, log_offset=log_offset, events_offset=events_offset)
            if self._telemetry_interval_s > 0:
                session.request(p.OP_TELEMETRY, 30.0, interval_s=self._telemetry_interval_s)
        except (LinkLost, TimeoutError, AgentError):
            return False
        return True

    # --- incoming ------------------------------------------------------------------------------------
    def _on_messages(self, session: AgentSession, messages: list[dict[str, Any]]) -> None:
        host_batch: list[Item] = []
        with self._dispatch:
            for message in messages:
                kind = message.get("type")
                run = message.get("run")
                watch = self._watches.get(run) if isinstance(run, str) else None
                if kind == p.MSG_LOG and watch is not None:
                    try:
                        watch.on_log(int(message["offset"]), p.log_payload(message))
                    except StreamGap as exc:
                        session.die(str(exc))
                        return
                elif kind == p.MSG_EVENT and watch is not None:
                    watch.on_event(int(message["offset"]), int(message["end"]), message.get("event"),
                                   message.get("raw"))
                elif kind == p.MSG_JOB and watch is not None:
                    watch.on_job(str(message.get("state")), message.get("exit"), message.get("summary") or RunSummary())
                elif kind == p.MSG_NOTICE:
                    notice = Notice(message.get("run"), str(message.get("message", "")))
                    if watch is not None:
                        watch.on_item(notice)
                    host_batch.append(notice)
                elif kind == p.MSG_TELEMETRY:
                    host_batch.append(Telemetry(message))
        if host_batch:
            self._deliver_host(host_batch)

    def _on_tick(self, session: AgentSession) -> None:
        with self._dispatch:
            for watch in list(self._watches.values()):
                watch.tick()

    def _deliver_host(self, batch: list[Item]) -> None:
        if self.on_host_items is not None:
            self.on_host_items(batch)
        else:
            self.host_items.put(batch)

    def _broadcast(self, item: LinkState) -> None:
        with self._dispatch:
            for watch in list(self._watches.values()):
                watch.on_item(item)
                watch.deliver()
        self._deliver_host([item])

    # --- commands ------------------------------------------------------------------------------------
    def _live_session(self, timeout_s: float) -> AgentSession:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._session is None:
                if self.state in (FAILED, CLOSED, IDLE):
                    detail = f": {self.failure}" if self.failure else ""
                    raise LinkLost(f"not connected to {self.host} ({self.state}{detail})")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise LinkLost(f"no link to {self.host} within {timeout_s:g} s")
                self._cond.wait(remaining)
            return self._session

    def request(self, op: str, *, retry: bool = False, timeout_s: float | None = None, **args: Any) -> Any:
        """Send one command and wait for its reply. ``retry`` re-sends after a reconnect (idempotent ops only)."""
        timeout = self.request_timeout_s if timeout_s is None else timeout_s
        for attempt in range(3 if retry else 1):
            session = self._live_session(timeout)
            try:
                return session.request(op, timeout, **args)
            except LinkLost:
                if not retry or attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def ping(self) -> dict[str, Any]:
        return self.request(p.OP_PING, retry=True)

    def runs(self) -> list[RunSummary]:
        return self.request(p.OP_RUNS, retry=True)["runs"]

    def status(self, run: str) -> RunSummary:
        return self.request(p.OP_STATUS, retry=True, run=run)

    def launch(
        self,
        argv: Sequence[str],
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        name: str | None = None,
        python: str | None = None,
        installed: bool = False,
        alerts: dict[str, Any] | None = None,
    ) -> RunSummary:
        """``python``: the host's interpreter for an ``eaglewatch …`` job (else the agent finds one);
        ``installed``: run the host's installed eaglewatch instead of the agent's own copy; ``alerts``: where the
        run's supervisor sends its alerts (config.Alerts.record)."""
        args: dict[str, Any] = {"argv": list(argv)}
        if alerts:
            args["alerts"] = dict(alerts)
        if python is not None:
            args["python"] = python
        if installed:
            args["installed"] = True
        if cwd is not None:
            args["cwd"] = cwd
        if env:
            args["env"] = dict(env)
        if name is not None:
            args["name"] = name
        return self.request(p.OP_LAUNCH, **args)

    def stop(self, run: str, grace_s: float = 10.0) -> RunSummary:
        return self.request(p.OP_STOP, retry=True, run=run, grace_s=grace_s)

    def restart(
        self, run: str, argv: Sequence[str] | None = None, grace_s: float = 10.0, gpu_timeout_s: float = 120.0
    ) -> RestartResult:
        args: dict[str, Any] = {"run": run, "grace_s": grace_s, "gpu_timeout_s": gpu_timeout_s}
        if argv:
            args["argv"] = list(argv)
        return self.request(p.OP_RESTART, **args)

    # --- jobs: one data-parallel extraction, one run per rank, under a scheduler (docs/fleet.md) -----------
    # Each reply is a job snapshot: {job, name, scheduler, target, created_at, world_size, output_dir,
    # scheduler_job_id, ranks: [{rank, host, run, run_dir, node, sched_state, sched_reason, pending_s, elapsed_s,
    # exit_code, summary}]}.

    def job_launch(
        self,
        argv: Sequence[str],
        *,
        ranks: int,
        scheduler: str = "slurm",
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        name: str | None = None,
        python: str | None = None,
        installed: bool = False,
        slurm: dict[str, Any] | None = None,
        alerts: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Submit one job of ``ranks`` runs; each rank runs ``argv + ["--rank", R, "--world-size", N]``. ``slurm``:
        partition, account, time, gpus_per_task, cpus_per_task, mem (None: the cluster's default) and extra
        (more sbatch arguments); ``alerts``: where each rank's supervisor sends its alerts. Not retried: a second
        submission would be a second job."""
        extra: dict[str, Any] = {"alerts": dict(alerts)} if alerts else {}
        return self.request(p.OP_JOB_LAUNCH, scheduler=scheduler, ranks=ranks, argv=list(argv), cwd=cwd,
                            env=dict(env or {}), name=name, python=python, installed=installed,
                            slurm=dict(slurm or {}), **extra)

    def jobs(self) -> list[dict[str, Any]]:
        """The agent's jobs, newest first."""
        return list(self.request(p.OP_JOBS, retry=True))

    def job_status(self, job: str) -> dict[str, Any]:
        return self.request(p.OP_JOB_STATUS, retry=True, job=job)

    def job_cancel(self, job: str) -> dict[str, Any]:
        """Cancel every rank of the job (scancel of the whole job); cancelling twice is harmless."""
        return self.request(p.OP_JOB_CANCEL, retry=True, job=job)

    def job_restart_rank(self, job: str, rank: int) -> dict[str, Any]:
        """Submit that one rank again; it resumes from its files. Not retried: it would submit twice."""
        return self.request(p.OP_JOB_RESTART_RANK, job=job, rank=rank)

    def gpu_history(self, run: str, limit: int = 60) -> list[dict[str, Any]]:
        """The run's recorded GPU samples, oldest first (kept on the host by its supervisor)."""
        return list(self.request(p.OP_GPU_HISTORY, run=run, limit=limit).get("samples") or [])

    def stacks(self, run: str, saved: bool = False) -> dict[str, Any]:
        """Where every process of the run is now (its Python stacks, all threads), or with ``saved`` the last
        stacks taken (by its supervisor at a stall). Taking them again is harmless: retried."""
        return self.request(p.OP_STACKS, retry=True, run=run, saved=saved)

    def telemetry(self, interval_s: float) -> dict[str, Any]:
        """Start (interval_s > 0) or stop telemetry; samples arrive as Telemetry items on host_items."""
        self._telemetry_interval_s = interval_s
        return self.request(p.OP_TELEMETRY, retry=True, interval_s=interval_s)

    def watch(
        self, run: str, *, log_offset: int = 0, events_offset: int = 0, callback: Sink | None = None
    ) -> RunWatch:
        """Stream a run's log (from log_offset) and events (from events_offset), across reconnects."""
        run_id = self.status(run)["run"]
        watch = RunWatch(run_id, log_offset, events_offset, callback)
        with self._dispatch:
            self._watches[run_id] = watch
        try:
            self.request(p.OP_WATCH, retry=True, run=run_id, log_offset=log_offset, events_offset=events_offset)
        except BaseException:
            with self._dispatch:
                self._watches.pop(run_id, None)
            raise
        return watch

    def unwatch(self, watch: RunWatch) -> None:
        watch.cancelled.set()
        with self._dispatch:
            self._watches.pop(watch.run, None)
        try:
            self.request(p.OP_UNWATCH, timeout_s=5.0, run=watch.run)
        except (LinkLost, AgentError, TimeoutError):
            pass


__all__ = ["Connection", "CONNECTED", "LOST", "RECONNECTING", "FAILED", "CLOSED", "IDLE"]


def open_connection(host: str, **kwargs: Any) -> Connection:
    """A connected Connection (see Connection for the keyword arguments)."""
    connection = Connection(host, **kwargs)
    connection.connect()
    return connection
