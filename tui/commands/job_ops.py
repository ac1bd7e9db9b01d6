"""What can be done to a job, whichever scheduler runs it: launch it, read its snapshot, restart a rank, cancel it.

- ``ssh``: this machine keeps the job's record (job_record.py). Each rank is a run launched with the agent's
  ``launch`` op on its host; the snapshot is the record with each run's ``status`` from its host's agent; a
  rank restarts with the agent's ``restart`` op on its run (the same command, which resumes from its files);
  cancelling stops every run of the job.
- ``slurm``: the target's agent keeps the job; every action is its job op (``job_launch``, ``job_status``,
  ``job_restart_rank``, ``job_cancel``). The record here only says where the job lives.

Blocking IO throughout: the commands call it directly, the dashboard from its thread workers.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence

from eaglewatch import protocol as p
from eaglewatch.errors import UserError
from eaglewatch.safetext import safe_text
from eaglewatch.tui.commands import _common
from eaglewatch.tui.commands.job_hosts import HostPool
from eaglewatch.tui.commands.job_record import JobStore, Record, new_job_id
from eaglewatch.tui.connection.connection import CONNECTED
from eaglewatch.tui.messages import RunSummary

if TYPE_CHECKING:
    from eaglewatch.tui.connection import Connection

SSH, SLURM = "ssh", "slurm"
STATUS_TIMEOUT_S = 15.0  # one rank's status; a host that does not answer is reported, the others are not held up
STOP_GRACE_S = 10.0
RESTART_GPU_TIMEOUT_S = 120.0


def rank_argv(argv: Sequence[str], rank: int, world_size: int) -> list[str]:
    """What rank ``rank`` runs: the job's command with its share appended (``extract --rank r --world-size n``)."""
    return [*argv, "--rank", str(rank), "--world-size", str(world_size)]


def output_dir_of(argv: Sequence[str], cwd: Optional[str]) -> Optional[str]:
    """The shared output folder, when the command names one (``--output-dir X`` or ``--output-dir=X``)."""
    value = None
    for index, word in enumerate(argv):
        if word == "--output-dir" and index + 1 < len(argv):
            value = argv[index + 1]
        elif word.startswith("--output-dir="):
            value = word.split("=", 1)[1]
    if value and cwd and not value.startswith(("/", "~")):
        return f"{cwd.rstrip('/')}/{value}"
    return value


def _elapsed(summary: RunSummary, now: float) -> Optional[float]:
    started = summary.get("started_at")
    if not isinstance(started, (int, float)):
        return None
    exit_info = summary.get("exit") or {}
    ended = exit_info.get("ended_at") if isinstance(exit_info, dict) else None
    return max(0.0, (ended if isinstance(ended, (int, float)) else now) - started)


def _exit_code(summary: RunSummary) -> Optional[int]:
    exit_info = summary.get("exit")
    code = exit_info.get("code") if isinstance(exit_info, dict) else None
    return code if isinstance(code, int) and not isinstance(code, bool) else None


def _rank_entry(rank: int, host: str, summary: Optional[RunSummary], error: Optional[str] = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"rank": rank, "host": host, "run": None, "run_dir": None, "node": None,
                             "sched_state": None, "sched_reason": None, "pending_s": None, "elapsed_s": None,
                             "exit_code": None, "summary": None}
    if summary:
        entry.update(run=summary.get("run"), run_dir=summary.get("run_dir"), summary=dict(summary))
    if error:
        entry["error"] = error
    return entry


def launch_ssh(pool: HostPool, store: JobStore, hosts: Sequence[str], argv: Sequence[str], *,
               cwd: Optional[str], env: dict[str, str], name: Optional[str], installed: bool,
               say: Callable[[str], None] = lambda line: None) -> Record:
    """One run per host, rank r on ``hosts[r]``, through each host's agent. Every host is connected before any
    run starts, and the record is written before the first launch and after each, so that it always says which
    ranks run. A rank whose launch the agent refused keeps its error in the record (``job restart`` launches it
    once that is fixed); the others run on."""
    pool.connect_all(hosts)
    job = new_job_id(name)
    world = len(hosts)
    record: Record = {
        "job": job, "name": name, "scheduler": SSH, "target": ",".join(hosts), "created_at": time.time(),
        "world_size": world, "output_dir": output_dir_of(argv, cwd), "scheduler_job_id": None,
        "ranks": [_rank_entry(rank, host, None) for rank, host in enumerate(hosts)],
        # Beyond the snapshot's fields: what a rank that never started is launched with, and the cancel.
        "launch": {"argv": list(argv), "cwd": cwd, "env": dict(env), "installed": installed},
        "cancelled_at": None,
    }
    store.save(record)
    for rank, host in enumerate(hosts):
        try:
            summary = launch_rank(pool, record, rank, host)
        except UserError as exc:
            record = store.update_rank(job, rank, error=f"launch failed: {exc}")
            say(f"rank {rank} on {safe_text(host)}: launch failed: {exc}")
            continue
        record = store.update_rank(job, rank, **{k: v for k, v in _rank_entry(rank, host, summary).items()
                                                 if k not in ("rank", "host")})
        say(f"rank {rank} on {safe_text(host)}: {safe_text(summary.get('run'))}")
    return record


def launch_rank(pool: HostPool, record: Record, rank: int, host: str) -> RunSummary:
    launch = record.get("launch") or {}
    argv = launch.get("argv")
    if not isinstance(argv, list) or not argv:
        raise UserError(safe_text(f"the record of job {record['job']} does not say what its ranks run"))
    connection = pool.get(host)
    run_name = f"{record.get('name') or record['job']}-rank{rank}"
    return _common.agent_call(connection.launch, rank_argv(argv, rank, int(record["world_size"])),
                              cwd=launch.get("cwd"), env=launch.get("env") or {}, name=run_name,
                              python=pool.python_of(host), installed=bool(launch.get("installed")),
                              alerts=pool.alerts_of(host))


def launch_slurm(pool: HostPool, store: JobStore, target: str, ranks: int, argv: Sequence[str], *,
                 cwd: Optional[str], env: dict[str, str], name: Optional[str], installed: bool,
                 slurm: dict[str, Any]) -> Record:
    """Submit the job through the target's agent; keep its snapshot here as the record of where it lives."""
    connection = pool.get(target)
    snapshot = _common.agent_call(connection.job_launch, argv, ranks=ranks, cwd=cwd, env=env, name=name,
                                  python=pool.python_of(target), installed=installed, slurm=slurm,
                                  alerts=pool.alerts_of(target))
    record = dict(snapshot)
    record.setdefault("scheduler", SLURM)
    record["target"] = target  # as the operator wrote it: a named host stays its name
    store.save(record)
    return record


class JobOps:
    """One job's actions. ``record``: its record (for a Slurm job not launched from here, the agent's snapshot)."""

    def __init__(self, record: Record, pool: HostPool, store: Optional[JobStore] = None,
                 saved: bool = True) -> None:
        self.record = record
        self.job: str = record["job"]
        self.scheduler: str = record.get("scheduler") or SSH
        self.pool = pool
        self.store = store or JobStore()
        self.saved = saved  # whether this machine holds a record of the job (else the agent alone knows it)
        self._lock = threading.Lock()

    def host_of(self, entry: dict[str, Any]) -> str:
        """Where a rank's run can be read: its host (ssh), or the target whose agent knows the job (Slurm)."""
        if self.scheduler == SSH:
            return str(entry.get("host") or "local")
        return str(self.record.get("target") or "local")

    def connection_for(self, entry: dict[str, Any]) -> "Connection":
        return self.pool.get(self.host_of(entry))

    def _fresh_record(self) -> Record:
        if self.saved:
            record = self.store.load(self.job)
            with self._lock:
                self.record = record
        return self.record

    # ------------------------------------------------------------------ reading

    def snapshot(self) -> dict[str, Any]:
        """The job now, in the snapshot's shape. A rank whose host or run cannot be read keeps what was known of
        it, with ``error`` saying why."""
        if self.scheduler != SSH:
            connection = self.pool.get(str(self.record.get("target") or "local"))
            snapshot = dict(_common.agent_call(connection.job_status, self.job))
            snapshot["target"] = self.record.get("target") or snapshot.get("target")
            return snapshot
        record = self._fresh_record()
        now = time.time()
        ranks = []
        for entry in record["ranks"]:
            entry = dict(entry)
            run = entry.get("run")
            if run:
                try:
                    connection = self.connection_for(entry)
                    if connection.state != CONNECTED:
                        # Reconnecting by itself: asking now would wait for it, and hold up every other rank.
                        raise ConnectionError(f"the link to {self.host_of(entry)} is {connection.state}")
                    summary: RunSummary = connection.request(p.OP_STATUS, retry=True, timeout_s=STATUS_TIMEOUT_S,
                                                             run=run)
                    entry.update(summary=dict(summary), run_dir=summary.get("run_dir") or entry.get("run_dir"))
                    entry.pop("error", None)
                except Exception as exc:  # the link's and the agent's errors alike: this rank is unknown now
                    entry["error"] = f"cannot read its status: {exc}"
            summary = entry.get("summary") or {}
            entry.update(elapsed_s=_elapsed(summary, now), exit_code=_exit_code(summary))
            ranks.append(entry)
        return {**record, "ranks": ranks}

    def entry(self, rank: int) -> dict[str, Any]:
        for entry in self.record.get("ranks") or []:
            if entry.get("rank") == rank:
                return entry
        raise UserError(safe_text(f"job {self.job} has no rank {rank} (it has {self.record.get('world_size')})"))

    # ------------------------------------------------------------------ actions

    def restart_rank(self, rank: int) -> Mapping[str, Any]:
        """Run the rank again: its run restarted (ssh: the agent's restart op, which stops it first if it still
        runs; the command resumes from its files), or resubmitted (Slurm). Returns the new run's summary (ssh)
        or the job's snapshot (Slurm)."""
        if self.scheduler != SSH:
            connection = self.pool.get(str(self.record.get("target") or "local"))
            return _common.agent_call(connection.job_restart_rank, self.job, rank)
        self._fresh_record()
        entry = self.entry(rank)
        host = self.host_of(entry)
        if entry.get("run"):
            connection = self.pool.get(host)
            result = _common.agent_call(connection.restart, entry["run"], None, STOP_GRACE_S, RESTART_GPU_TIMEOUT_S)
            new = result["new"]
        else:
            new = launch_rank(self.pool, self.record, rank, host)
        self.adopt(rank, new)
        return new

    def adopt(self, rank: int, summary: RunSummary) -> None:
        """The rank's run is now this one (a restart from here, or from the run's own screen)."""
        if self.scheduler == SSH and self.saved:
            record = self.store.update_rank(self.job, rank, run=summary.get("run"), run_dir=summary.get("run_dir"),
                                            summary=dict(summary), error=None)
            with self._lock:
                self.record = record

    def rank_of_run(self, run: Optional[str]) -> Optional[int]:
        for entry in self.record.get("ranks") or []:
            if run and entry.get("run") == run:
                return int(entry["rank"])
        return None

    def cancel(self) -> dict[str, Any]:
        """Stop the whole job: every run of it (ssh, at once, each with SIGTERM then SIGKILL after the grace), or
        scancel (Slurm). Returns the job's snapshot afterwards; a run that could not be stopped is named in a
        UserError after the others were."""
        if self.scheduler != SSH:
            connection = self.pool.get(str(self.record.get("target") or "local"))
            return _common.agent_call(connection.job_cancel, self.job)
        # Recorded first: the runs that end now end by the cancel, not by a failure of their own.
        record = self.store.update(self.job, cancelled_at=time.time()) if self.saved else self.record
        with self._lock:
            self.record = record
        problems: list[str] = []

        def stop(entry: dict[str, Any]) -> None:
            try:
                self.connection_for(entry).stop(entry["run"], STOP_GRACE_S)
            except Exception as exc:
                problems.append(f"rank {entry['rank']}: {exc}")

        threads = [threading.Thread(target=stop, args=(entry,), name=f"eaglewatch-cancel-{entry['rank']}",
                                    daemon=True) for entry in record["ranks"] if entry.get("run")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if problems:
            raise _common.user_error("could not stop " + "; ".join(sorted(problems)))
        return self.snapshot()


def open_job(pool: HostPool, store: JobStore, job: str, slurm_target: Optional[str] = None) -> JobOps:
    """A job by id, prefix or name from the records here; with ``slurm_target``, asked of that agent directly
    (a job launched from another machine)."""
    if slurm_target is not None:
        try:
            record = store.find(job)
            if record.get("scheduler") == SLURM:
                return JobOps({**record, "target": slurm_target}, pool, store)
        except UserError:
            pass
        snapshot = _common.agent_call(pool.get(slurm_target).job_status, job)
        return JobOps({**snapshot, "scheduler": snapshot.get("scheduler") or SLURM, "target": slurm_target},
                      pool, store, saved=False)
    return JobOps(store.find(job), pool, store)
