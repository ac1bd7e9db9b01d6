"""The job record: one JSON file per data-parallel job under the run root, ``jobs/<job id>.json``.

The record is what the agent knows about a job that Slurm and the run directories do not say: which run id each
rank was given, which array task runs it, the request it was submitted with (to resubmit a rank the same way), and
the last finished state Slurm reported for each rank (Slurm forgets a finished job after ``MinJobAge``). Beside it,
the job's folder ``jobs/<job id>/`` holds the batch scripts and Slurm's batch output files.

Every change is a read-modify-write under an exclusive ``flock`` on the folder's lock file, written atomically
(temporary name, then rename): two agents of one operator (or a test beside the dashboard) may touch one job.

A record is read like a run's files (``rundir.read_run_record``): a FIFO, a device, a huge file, text that is not
UTF-8 or JSON that is not a record of the shape written here is a job whose record cannot be read, said in one
line (``UnreadableJob``), never a hung agent or a traceback.
"""

from __future__ import annotations

import fcntl
import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from eaglewatch.pipeline.agent.jobs import JobError
from eaglewatch.pipeline.agent.rundir import NotRegularFile, is_run_id, read_run_record, write_json_atomic

JOBS_DIR = "jobs"
LOCK_FILE = ".lock"


class JobNotFound(JobError):
    code = "not_found"


class AmbiguousJob(JobError):
    code = "ambiguous"


class UnreadableJob(JobError):
    """A job record that is there but cannot be read: not a regular file, too big, not UTF-8 JSON, or not of the
    shape the agent writes."""


def jobs_dir(root: Path) -> Path:
    return root / JOBS_DIR


def record_path(root: Path, job_id: str) -> Path:
    return jobs_dir(root) / f"{job_id}.json"


def job_folder(root: Path, job_id: str) -> Path:
    return jobs_dir(root) / job_id


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _optional(value: Any, kind: type | tuple[type, ...]) -> bool:
    return value is None or (isinstance(value, kind) and not isinstance(value, bool))


def _rank_problem(rank: Any) -> str | None:
    if not isinstance(rank, dict):
        return f"a rank is a JSON {_json_type(rank)}, not an object"
    number = rank.get("rank")
    if not _is_int(number):
        return f"a rank's number is {_shown(number)}, not a whole number"
    attempts = rank.get("attempts", [])
    if not isinstance(attempts, list):
        return f"rank {number}: its attempts are a JSON {_json_type(attempts)}, not a list"
    for attempt in [rank, *attempts]:
        if not isinstance(attempt, dict):
            return f"rank {number}: an earlier attempt is a JSON {_json_type(attempt)}, not an object"
        for key in ("run", "scheduler_job_id", "output"):
            if not _optional(attempt.get(key), str):
                return f"rank {number}: its {key} is {_shown(attempt.get(key))}, not a string"
        if not _optional(attempt.get("final"), dict):
            return f"rank {number}: its final state is a JSON {_json_type(attempt.get('final'))}, not an object"
        if not _optional(attempt.get("submitted_at"), (int, float)):
            return f"rank {number}: its submitted_at is {_shown(attempt.get('submitted_at'))}, not a time"
    return None


def record_problem(record: Any, job_id: str) -> str | None:
    """Why ``record`` is not a job record of job ``job_id`` as the agent writes one; None when it is. Only what the
    agent indexes or iterates is checked: a field of an unexpected type there would otherwise end a command in a
    traceback."""
    if not isinstance(record, dict):
        return f"it holds a JSON {_json_type(record)}, not an object"
    if record.get("job") != job_id:
        return f"it names job {_shown(record.get('job'))}, not {job_id}"
    world_size = record.get("world_size")
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        return f"its world_size is {_shown(world_size)}, not a whole number of ranks"
    request = record.get("request")
    if not isinstance(request, dict):
        return f"its request is a JSON {_json_type(request)}, not an object"
    argv = request.get("argv")
    if not isinstance(argv, list) or not all(isinstance(word, str) for word in argv):
        return "its request's argv is not a list of strings"
    if not isinstance(request.get("cwd"), str):
        return f"its request's cwd is {_shown(request.get('cwd'))}, not a string"
    if not _optional(request.get("env"), dict) or not all(
            isinstance(key, str) and isinstance(value, str) for key, value in (request.get("env") or {}).items()):
        return "its request's env is not an object of strings"
    for key in ("name", "python"):
        if not _optional(request.get(key), str):
            return f"its request's {key} is {_shown(request.get(key))}, not a string"
    if not _optional(record.get("name"), str):
        return f"its name is {_shown(record.get('name'))}, not a string"
    ranks = record.get("ranks")
    if not isinstance(ranks, list):
        return f"its ranks are a JSON {_json_type(ranks)}, not a list"
    for rank in ranks:
        problem = _rank_problem(rank)
        if problem is not None:
            return problem
    if sorted(rank["rank"] for rank in ranks) != list(range(world_size)):
        return f"its ranks are not each rank of 0 to {world_size - 1} once"
    return None


def _shown(value: Any) -> str:
    """A value from the record in a message: its repr, cut short (the record may hold anything, of any size)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _json_type(value: Any) -> str:
    names = ((bool, "boolean"), (dict, "object"), (list, "list"), (str, "string"), (int, "number"),
             (float, "number"))
    return "null" if value is None else next((name for kind, name in names if isinstance(value, kind)), "value")


def load_record(root: Path, job_id: str) -> dict[str, Any]:
    """Job ``job_id``'s record. JobNotFound when there is none, UnreadableJob when there is one that cannot be read
    (its message says why, in one line)."""
    path = record_path(root, job_id)
    try:
        data = read_run_record(path)
    except FileNotFoundError:
        raise JobNotFound(f"no job {job_id!r} under {jobs_dir(root)}") from None
    except NotRegularFile as exc:
        raise UnreadableJob(f"job record {path} cannot be read: it is {exc.kind}, not a regular file") from None
    except OSError as exc:
        raise UnreadableJob(f"job record {path} cannot be read: {exc.strerror or exc}") from None
    try:
        record = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise UnreadableJob(f"job record {path} cannot be read: it is not UTF-8 text") from None
    except (ValueError, RecursionError):
        raise UnreadableJob(f"job record {path} cannot be read: it is not JSON") from None
    problem = record_problem(record, job_id)
    if problem is not None:
        raise UnreadableJob(f"job record {path} cannot be read: {problem}")
    return record


def read_record(root: Path, job_id: str) -> dict[str, Any] | None:
    """``load_record``, or None when there is no record or it cannot be read."""
    try:
        return load_record(root, job_id)
    except JobError:
        return None


def write_record(root: Path, record: dict[str, Any]) -> None:
    write_json_atomic(record_path(root, record["job"]), record)


@contextmanager
def locked(root: Path, job_id: str) -> Iterator[None]:
    """Hold the job's lock: a read-modify-write of its record happens inside."""
    folder = job_folder(root, job_id)
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def job_ids(root: Path) -> list[str]:
    """Every job under the run root, newest first (job ids sort by creation time, like run ids)."""
    try:
        names = os.listdir(jobs_dir(root))
    except OSError:
        return []
    ids = [name[:-5] for name in names if name.endswith(".json") and is_run_id(name[:-5])]
    return sorted(ids, reverse=True)


def find_job(root: Path, ref: Any) -> dict[str, Any]:
    """A job's record by id, then by name (the newest of that name), then by unique id prefix. A record that cannot
    be read is said (UnreadableJob) when the id or prefix names it alone; a name is only looked for in the records
    that can be read."""
    if not isinstance(ref, str) or not ref:
        raise JobNotFound("no job given")
    if is_run_id(ref):
        try:
            return load_record(root, ref)
        except JobNotFound:
            pass
    records: dict[str, dict[str, Any]] = {}
    unreadable: dict[str, str] = {}
    for job_id in job_ids(root):
        try:
            records[job_id] = load_record(root, job_id)
        except UnreadableJob as exc:
            unreadable[job_id] = str(exc)
        except JobNotFound:
            continue  # removed meanwhile
    named = [record for record in records.values() if record.get("name") == ref]
    if named:
        return named[0]
    by_prefix = [job_id for job_id in [*records, *unreadable] if job_id.startswith(ref)]
    if len(by_prefix) == 1:
        if by_prefix[0] in unreadable:
            raise UnreadableJob(unreadable[by_prefix[0]])
        return records[by_prefix[0]]
    if by_prefix:
        raise AmbiguousJob(f"{ref!r} matches {len(by_prefix)} jobs "
                           f"({', '.join(sorted(by_prefix, reverse=True)[:5])}); give more of the id")
    more = f" ({len(unreadable)} job records cannot be read: {next(iter(unreadable.values()))})" if unreadable else ""
    raise JobNotFound(f"no job {ref!r} under {jobs_dir(root)}{more}")
