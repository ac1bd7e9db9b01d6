"""Data-parallel jobs on Slurm: submit, list, cancel and resubmit ranks, from the login host (docs/slurm.md).

A job is one Slurm array with one task per rank (``slurm_script``). Each task runs the rank launcher
(``slurm_task``), which gives the rank an ordinary run directory under the run root and runs it under eaglewatch's
supervisor, so a rank is watched, listed and decoded like any run. The run root must be on a file system the login
host and the compute nodes share. The agent keeps a job record (``slurm_record``) and asks Slurm for the tasks'
states (``squeue --json``, else ``scontrol show job --oneliner``); nothing else is kept in memory.

Every Slurm command is an argv list run without a shell, with a timeout: a controller that does not answer is an
error reply, not a hung agent.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable

from eaglewatch.pipeline.agent import jobpython, jobs, runwatch
from eaglewatch.pipeline.agent.rundir import RunDir, is_run_id, new_run_id, read_run_file, write_text_atomic
from eaglewatch.pipeline.agent.slurm_record import (
    find_job,
    job_folder,
    job_ids,
    locked,
    read_record,
    write_record,
)
from eaglewatch.pipeline.agent.slurm_script import (
    RankCommand,
    SbatchOptions,
    batch_script,
    job_name,
    output_file,
    sbatch_argv,
)
from eaglewatch.pipeline.agent.slurm_snapshot import SCHEDULER, RankFacts, rank_entry, snapshot
from eaglewatch.pipeline.agent.slurm_state import (
    SlurmParseError,
    SlurmTask,
    TaskKey,
    parse_job_ref,
    parse_scontrol,
    parse_squeue_json,
    stepd_end,
)
from eaglewatch.pipeline.agent.slurm_task import rank_argv

SLURM_TIMEOUT_S = 30.0
# Read when sbatch runs (not bound as a default), so that a test can make a hanging sbatch time out sooner.
SBATCH_TIMEOUT_S = SLURM_TIMEOUT_S
MAX_RANKS = 100_000
CANCEL_WAIT_S = 30.0
# Before a rank is resubmitted its old task must be gone (KillWait, 30 s by default, plus the supervisor's own end).
RESTART_WAIT_S = 90.0
POLL_S = 0.25
BATCH_OUTPUT_TAIL = 64 * 1024
Notice = Callable[[str], None]


class SlurmError(jobs.JobError):
    """A Slurm command is missing, failed or did not answer."""


class SlurmTimeout(SlurmError):
    """A Slurm command did not answer in time: what it was asked to do may have been done."""


def _run(argv: list[str], timeout_s: float = SLURM_TIMEOUT_S) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise SlurmError(f"{argv[0]} is not installed on this host (not on PATH): Slurm jobs are submitted from a "
                         "host with the Slurm client commands, such as the cluster's login node") from None
    except subprocess.TimeoutExpired:
        raise SlurmTimeout(f"{argv[0]} did not answer within {timeout_s:g} s: is slurmctld reachable?") from None
    except OSError as exc:
        raise SlurmError(f"cannot run {argv[0]}: {exc.strerror or exc}") from None


def _stderr_line(proc: subprocess.CompletedProcess) -> str:
    lines = (proc.stderr or proc.stdout or "").strip().splitlines()
    return lines[-1].strip() if lines else f"exit status {proc.returncode}"


# --- reading Slurm ------------------------------------------------------------------------------------------
def query(keys: set[TaskKey]) -> tuple[dict[TaskKey, SlurmTask], str | None]:
    """Slurm's view of these array tasks, and why it could not be asked (None when it was). Tasks the controller
    no longer holds are absent."""
    if not keys:
        return {}, None
    arrays = sorted({array for array, _ in keys})
    try:
        # Slurm 22.05 ignores the job filter with --json (every job comes back); later versions honour it.
        proc = _run(["squeue", "--json", "--states=all", "--jobs=" + ",".join(map(str, arrays))])
    except SlurmError as exc:
        return {}, str(exc)
    if proc.returncode == 0:
        try:
            found = parse_squeue_json(proc.stdout)
        except SlurmParseError:
            pass
        else:
            return {key: task for key, task in found.items() if key in keys}, None
    # No JSON (a build without the openapi plugin), or a filter on a forgotten id refused: ask per array job.
    return query_scontrol(keys)


def query_scontrol(keys: set[TaskKey]) -> tuple[dict[TaskKey, SlurmTask], str | None]:
    """``query`` through ``scontrol show job --oneliner``, one call per array job."""
    found: dict[TaskKey, SlurmTask] = {}
    arrays = sorted({array for array, _ in keys})
    errors = []
    for array in arrays:
        try:
            shown = _run(["scontrol", "show", "job", "--oneliner", str(array)])
        except SlurmError as exc:
            return {}, str(exc)
        if shown.returncode == 0:
            found.update(parse_scontrol(shown.stdout))
        elif "Invalid job id" not in (shown.stderr or ""):  # forgotten after MinJobAge: not an error
            errors.append(_stderr_line(shown))
    error = "; ".join(errors[:3]) if errors else None
    return {key: task for key, task in found.items() if key in keys}, error


def _current_keys(record: dict[str, Any], ranks: Iterable[int] | None = None, *,
                  unfinished_only: bool = False) -> dict[int, TaskKey]:
    """The array task of each rank's current attempt (of ``ranks``, else all); with ``unfinished_only``, only of
    ranks whose end the record does not hold yet: Slurm need not be asked about those."""
    wanted = set(ranks) if ranks is not None else None
    keys = {}
    for rank in record.get("ranks") or []:
        if wanted is not None and rank["rank"] not in wanted:
            continue
        if unfinished_only and isinstance(rank.get("final"), dict):
            continue
        try:
            keys[rank["rank"]] = parse_job_ref(str(rank.get("scheduler_job_id")))
        except ValueError:
            continue
    return keys


# --- building snapshots ---------------------------------------------------------------------------------------
def _read_tail(path: Any) -> bytes:
    """The last ``BATCH_OUTPUT_TAIL`` bytes of a rank's batch output file; nothing when there is none, or it is
    not a regular file (the record names the path: a FIFO or a device there is not read)."""
    if not isinstance(path, str) or not path or "\0" in path:
        return b""
    try:
        size = os.stat(path).st_size
        return read_run_file(path, BATCH_OUTPUT_TAIL, max(0, size - BATCH_OUTPUT_TAIL))
    except OSError:
        return b""


def _facts(root: Path, rank: dict[str, Any], this_host: str, need_stepd: bool) -> RankFacts:
    run_id = rank.get("run")
    summary = host = None
    if isinstance(run_id, str) and is_run_id(run_id):
        run = RunDir(root / run_id)
        if run.cmd_path.exists():
            summary = jobs.run_summary(run)
            host = run.cmd().get("host")
    stepd = stepd_end(_read_tail(rank.get("output"))) if need_stepd else None
    return RankFacts(summary=summary, host=host if isinstance(host, str) else None, stepd=stepd,
                     this_host=this_host)


def _snapshots(root: Path, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Snapshots of these jobs, from one question to Slurm for all their unfinished tasks. Finished states Slurm
    reports are kept in the records, for when it has forgotten them."""
    wanted = {record["job"]: _current_keys(record, unfinished_only=True) for record in records}
    tasks, error = query({key for keys in wanted.values() for key in keys.values()})
    this_host = socket.gethostname()
    now = time.time()
    out = []
    for record in records:
        keys = wanted[record["job"]]
        entries = []
        finished: dict[int, dict[str, Any]] = {}
        for rank in record.get("ranks") or []:
            task = tasks.get(keys[rank["rank"]]) if rank["rank"] in keys else None
            facts = _facts(root, rank, this_host, need_stepd=task is None and not rank.get("final"))
            entries.append(rank_entry(rank, task, facts, now))
            if task is not None and task.finished:
                finished[rank["rank"]] = task.to_record()
        if finished:
            _keep_finished(root, record["job"], finished, _refs(record))
        out.append(snapshot(record, entries, error))
    return out


def _refs(record: dict[str, Any]) -> dict[int, str | None]:
    return {rank["rank"]: rank.get("scheduler_job_id") for rank in record.get("ranks") or []}


def _keep_finished(root: Path, job_id: str, finished: dict[int, dict[str, Any]], refs: dict[int, str | None]) -> None:
    """Store finished states in the record, unless the rank was resubmitted meanwhile (its task changed)."""
    with locked(root, job_id):
        record = read_record(root, job_id)
        if record is None:
            return
        changed = False
        for rank in record.get("ranks") or []:
            number = rank["rank"]
            if number in finished and rank.get("scheduler_job_id") == refs.get(number) \
                    and rank.get("final") != finished[number]:
                rank["final"] = finished[number]
                changed = True
        if changed:
            write_record(root, record)


# --- operations -------------------------------------------------------------------------------------------------
def _output_dir(argv: list[str], cwd: str) -> str | None:
    """The folder every rank writes to, from the command's ``--output-dir`` (None for a command without one)."""
    value = None
    for i, word in enumerate(argv):
        if word == "--output-dir" and i + 1 < len(argv):
            value = argv[i + 1]
        elif word.startswith("--output-dir="):
            value = word.split("=", 1)[1]
    return os.path.normpath(os.path.join(cwd, os.path.expanduser(value))) if value else None


def _rank_count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_RANKS:
        raise jobs.BadRequest(f"ranks must be a whole number from 1 to {MAX_RANKS}, not {value!r}")
    return value


def _command(record: dict[str, Any]) -> RankCommand:
    request = record["request"]
    return RankCommand(argv=tuple(request["argv"]), cwd=request["cwd"], env=dict(request.get("env") or {}),
                       name=request.get("name"), python=request.get("python"),
                       installed=request.get("installed") is True)


def _known_arrays(record: dict[str, Any]) -> set[str]:
    """Every array job id the record holds, earlier attempts included."""
    refs = [attempt.get("scheduler_job_id") for rank in record.get("ranks") or []
            for attempt in [rank, *rank.get("attempts", [])]]
    return {str(ref).split("_", 1)[0] for ref in refs if ref}


def _array_id(stdout: str) -> str | None:
    """The array job id in sbatch's --parsable answer ("4711" or "4711;cluster"), None if it is not one."""
    lines = stdout.strip().splitlines()
    word = lines[-1].split(";", 1)[0].strip() if lines else ""
    return word if word.isdigit() else None


def _find_submitted(job_id: str, known: set[str]) -> tuple[str | None, str | None]:
    """The array job id of a submission of this job that the record does not hold yet, asked of squeue by the
    name eaglewatch gave the job (sacct needs slurmdbd, which many clusters lack). (id, None) when found,
    (None, None) when Slurm holds none, (None, why) when squeue could not be asked."""
    try:
        # Plain text, not --json: Slurm 22.05 ignores the filters with --json.
        proc = _run(["squeue", "--noheader", "--all", "--states=all", f"--name={job_name(job_id)}", "--format=%F"])
    except SlurmError as exc:
        return None, str(exc)
    if proc.returncode != 0:
        return None, _stderr_line(proc)
    found = {line.strip() for line in proc.stdout.splitlines() if line.strip().isdigit()} - known
    return (max(found, key=int) if found else None), None


def _submit(root: Path, record: dict[str, Any], runs: dict[int, str], restart_of: dict[int, str] | None = None
            ) -> tuple[str, str | None]:
    """Write the batch script for these ranks and sbatch it; return Slurm's array job id, and a note when sbatch's
    own answer did not confirm the submission but squeue did. Raises SlurmError when it was not submitted, or
    when that cannot be told (``SlurmTimeout``)."""
    job_id = record["job"]
    folder = job_folder(root, job_id)
    folder.mkdir(parents=True, exist_ok=True)
    if record.get("_alerts"):
        # Before any rank can start: each rank's task copies them into its run directory (slurm_task.py).
        runwatch.write_settings(folder, record.pop("_alerts"))
    script = folder / f"submit-{time.strftime('%Y%m%d-%H%M%S')}-{'-'.join(map(str, sorted(runs)))[:40]}.sh"
    write_text_atomic(script, batch_script(
        job_id=job_id, run_root=str(root), world_size=record["world_size"], runs=runs, command=_command(record),
        launcher_python=sys.executable, import_root=jobpython.import_root(), restart_of=restart_of,
    ))
    options = SbatchOptions.from_request(record["request"].get("slurm"))
    argv = sbatch_argv(job_id=job_id, tasks=list(runs), folder=str(folder), cwd=record["request"]["cwd"],
                       options=options, script=str(script))
    try:
        proc = _run(argv, SBATCH_TIMEOUT_S)
    except SlurmTimeout as exc:
        what = str(exc)
    else:
        array_id = _array_id(proc.stdout)
        if proc.returncode == 0 and array_id is not None:
            return array_id, None
        what = (f"sbatch exited with status {proc.returncode}: {_stderr_line(proc)}" if proc.returncode != 0 else
                f"sbatch's answer is not a job id: {(proc.stdout.strip().splitlines() or ['(nothing)'])[0][:200]}")
    # A timed-out, failed or garbled sbatch may still have queued the job (a slow controller, a site's wrapper):
    # Slurm is asked before anything is said, so that a queued job is neither lost nor submitted twice.
    name = job_name(job_id)
    found, error = _find_submitted(job_id, _known_arrays(record))
    if found is not None:
        return found, f"{what}; squeue shows it queued as Slurm job {found} ({name}): submitted, record kept"
    if error is not None:
        raise SlurmTimeout(f"{what}; whether it was submitted cannot be told, as squeue failed too ({error}): "
                           f"look with squeue --states=all --name={name} before submitting it again")
    raise SlurmError(f"{what}; Slurm holds no job named {name}: not submitted")


def _rank_run_id(record: dict[str, Any], rank: int) -> str:
    # The slug of a run id is cut at 40 characters: the rank goes after a shortened name, so that it stays.
    return new_run_id(f"{(record.get('name') or 'job')[:28]}-rank{rank}")


def launch(root: Path, args: dict[str, Any]) -> dict[str, Any]:
    """``job_launch``: check the request, submit one array task per rank, return the job's snapshot."""
    scheduler = args.get("scheduler", SCHEDULER)
    if scheduler != SCHEDULER:
        raise jobs.BadRequest(f"the agent submits jobs to Slurm only (scheduler 'slurm'), not {scheduler!r}")
    world_size = _rank_count(args.get("ranks"))
    argv, cwd, env, name = jobs.validate_launch(args.get("argv"), args.get("cwd"), args.get("env"), args.get("name"))
    python = args.get("python")
    if python is not None and (not isinstance(python, str) or not python or "\0" in python):
        raise jobs.BadRequest("python must be a non-empty string")
    installed = args.get("installed") is True
    options = SbatchOptions.from_request(args.get("slurm"))
    if shutil.which("sbatch") is None:
        raise SlurmError("sbatch is not installed on this host (not on PATH): Slurm jobs are submitted from a host "
                         "with the Slurm client commands, such as the cluster's login node")
    try:
        # Here, before anything is queued, so that a command no node could run is refused at once; each rank
        # works its command out again on its node.
        jobpython.job_command(rank_argv(argv, 0, world_size), env, python=python, installed=installed)
    except jobpython.JobPythonError as exc:
        raise jobs.BadRequest(str(exc)) from None
    root.mkdir(parents=True, exist_ok=True)
    job_id = new_run_id(name)
    record: dict[str, Any] = {
        "job": job_id, "name": name, "scheduler": SCHEDULER, "target": socket.gethostname(),
        "created_at": time.time(), "world_size": world_size, "output_dir": _output_dir(argv, cwd),
        "scheduler_job_id": None, "run_root": str(root),
        "request": {"argv": argv, "cwd": cwd, "env": env, "name": name, "python": python, "installed": installed,
                    "slurm": options.to_record()},
        "ranks": [],
    }
    alerts = args.get("alerts")
    if alerts is not None and not isinstance(alerts, dict):
        raise jobs.BadRequest("alerts must be an object")
    if alerts:
        record["_alerts"] = dict(alerts)  # kept in the job's folder, never in its record (a webhook URL is a secret)
    runs = {rank: _rank_run_id(record, rank) for rank in range(world_size)}
    with locked(root, job_id):
        try:
            array_id, note = _submit(root, record, runs)
        except SlurmTimeout:
            raise  # it may have been queued: its batch script stays, for whoever looks
        except BaseException:
            shutil.rmtree(job_folder(root, job_id), ignore_errors=True)
            raise
        folder = str(job_folder(root, job_id))
        record["scheduler_job_id"] = array_id
        record["ranks"] = [
            {"rank": rank, "run": runs[rank], "scheduler_job_id": f"{array_id}_{rank}",
             "output": output_file(folder, array_id, rank), "submitted_at": record["created_at"], "final": None,
             "attempts": []}
            for rank in range(world_size)
        ]
        write_record(root, record)
    out = _snapshots(root, [record])[0]
    if note is not None:
        out["submit_note"] = note  # the operator side says it: the submission was not plain
    return out


def list_jobs(root: Path) -> list[dict[str, Any]]:
    """``jobs``: every job under the run root, newest first."""
    records = [record for record in (read_record(root, job_id) for job_id in job_ids(root)) if record]
    return _snapshots(root, records)


def status(root: Path, ref: Any) -> dict[str, Any]:
    return _snapshots(root, [find_job(root, ref)])[0]


def _active_ranks(record: dict[str, Any], ranks: Iterable[int] | None = None) -> dict[int, SlurmTask]:
    keys = _current_keys(record, ranks)
    tasks, error = query(set(keys.values()))
    if error:
        raise SlurmError(error)
    return {rank: tasks[key] for rank, key in keys.items() if key in tasks and tasks[key].active}


def _wait_ended(record: dict[str, Any], ranks: list[int] | None, timeout_s: float) -> dict[int, SlurmTask]:
    """Wait until Slurm holds none of these ranks' tasks as pending, running or completing; the tasks still
    active when the time ran out."""
    deadline = time.monotonic() + timeout_s
    while True:
        active = _active_ranks(record, ranks)
        if not active or time.monotonic() > deadline:
            return active
        time.sleep(POLL_S)


def _scancel(refs: list[str]) -> None:
    proc = _run(["scancel", *refs])
    if proc.returncode != 0 and "already completing or completed" not in (proc.stderr or ""):
        raise SlurmError(f"scancel {' '.join(refs)} failed: {_stderr_line(proc)}")


def _request_stop(root: Path, record: dict[str, Any], ranks: Iterable[int], via: str) -> None:
    """``stop.json`` in the current run directory of each of these ranks, before scancel: the rank's supervisor on
    the node (the run root is shared) then records its end as the operator's stop. A rank whose task has not made
    its run directory yet (pending) gets none: nothing of it runs, and its launcher must find no directory there."""
    wanted = set(ranks)
    for entry in record.get("ranks") or []:
        run_id = entry.get("run")
        if entry.get("rank") not in wanted or not isinstance(run_id, str) or not is_run_id(run_id):
            continue
        run = RunDir(root / run_id)
        if run.path.is_dir() and not run.exit_path.exists():
            jobs.request_stop(run, via)


def cancel(root: Path, ref: Any, notice: Notice | None = None) -> dict[str, Any]:
    """``job_cancel``: scancel every rank's current task, wait until Slurm has ended them, return the snapshot."""
    say = notice or (lambda message: None)
    record = find_job(root, ref)
    active = _active_ranks(record)
    if active:
        # Each resubmitted rank is an array of its own; the first array's other tasks have ended already.
        arrays = sorted({str(task.array_job_id) for task in active.values()}, key=int)
        _request_stop(root, record, active, "job_cancel")
        say(f"scancel {' '.join(arrays)} ({len(active)} ranks pending or running)")
        _scancel(arrays)
        left = _wait_ended(record, None, CANCEL_WAIT_S)
        if left:
            say(f"{len(left)} ranks still ending after {CANCEL_WAIT_S:g} s (Slurm's KillWait)")
    return status(root, record["job"])


def restart_rank(root: Path, ref: Any, rank: Any, notice: Notice | None = None) -> dict[str, Any]:
    """``job_restart_rank``: end the rank's task if it still runs, then submit that rank again as a new run
    (``restart_of`` names the last one) in the same output folder, where the command resumes."""
    say = notice or (lambda message: None)
    record = find_job(root, ref)
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < int(record.get("world_size") or 0):
        raise jobs.BadRequest(f"rank must be a rank of job {record['job']} (0 to {record.get('world_size', 0) - 1}), "
                              f"not {rank!r}")
    active = _active_ranks(record, [rank])
    if active:
        task = active[rank]
        _request_stop(root, record, [rank], "job_restart_rank")
        say(f"scancel {task.array_job_id}_{task.task_id}: rank {rank} is {task.state.lower()}")
        _scancel([f"{task.array_job_id}_{task.task_id}"])
        if _wait_ended(record, [rank], RESTART_WAIT_S):
            raise SlurmError(f"rank {rank}'s task did not end within {RESTART_WAIT_S:g} s; it was not resubmitted")
    job_id = record["job"]
    with locked(root, job_id):
        record = read_record(root, job_id) or record
        entry = next(item for item in record["ranks"] if item["rank"] == rank)
        old_run = entry.get("run") if isinstance(entry.get("run"), str) else None
        old_exists = bool(old_run) and (root / str(old_run)).is_dir()
        new_run = _rank_run_id(record, rank)
        array_id, note = _submit(root, record, {rank: new_run}, {rank: str(old_run)} if old_exists else None)
        entry["attempts"] = [*entry.get("attempts", []),
                             {key: entry.get(key) for key in ("run", "scheduler_job_id", "output", "submitted_at",
                                                              "final")}]
        entry.update(run=new_run, scheduler_job_id=f"{array_id}_{rank}", submitted_at=time.time(), final=None,
                     output=output_file(str(job_folder(root, job_id)), array_id, rank))
        write_record(root, record)
    if note is not None:
        say(note)
    say(f"rank {rank} resubmitted as Slurm job {array_id}_{rank}, run {new_run}")
    return status(root, job_id)
