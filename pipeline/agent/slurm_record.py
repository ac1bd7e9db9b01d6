"""The job record: one JSON file per data-parallel job under the run root, ``jobs/<job id>.json``.

The record is what the agent knows about a job that Slurm and the run directories do not say: which run id each
rank was given, which array task runs it, the request it was submitted with (to resubmit a rank the same way), and
the last finished state Slurm reported for each rank (Slurm forgets a finished job after ``MinJobAge``). Beside it,
the job's folder ``jobs/<job id>/`` holds the batch scripts and Slurm's batch output files.

Every change is a read-modify-write under an exclusive ``flock`` on the folder's lock file, written atomically
(temporary name, then rename): two agents of one operator (or a test beside the dashboard) may touch one job.
"""

from __future__ import annotations

import fcntl
import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from eaglewatch.pipeline.agent.jobs import JobError
from eaglewatch.pipeline.agent.rundir import is_run_id, write_json_atomic

JOBS_DIR = "jobs"
LOCK_FILE = ".lock"


class JobNotFound(JobError):
    code = "not_found"


class AmbiguousJob(JobError):
    code = "ambiguous"


def jobs_dir(root: Path) -> Path:
    return root / JOBS_DIR


def record_path(root: Path, job_id: str) -> Path:
    return jobs_dir(root) / f"{job_id}.json"


def job_folder(root: Path, job_id: str) -> Path:
    return jobs_dir(root) / job_id


def read_record(root: Path, job_id: str) -> dict[str, Any] | None:
    try:
        with open(record_path(root, job_id), encoding="utf-8") as fh:
            record = json.load(fh)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("job") == job_id else None


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
    """A job's record by id, then by name (the newest of that name), then by unique id prefix."""
    if not isinstance(ref, str) or not ref:
        raise JobNotFound("no job given")
    if is_run_id(ref):
        record = read_record(root, ref)
        if record is not None:
            return record
    records = [record for record in (read_record(root, job_id) for job_id in job_ids(root)) if record is not None]
    named = [record for record in records if record.get("name") == ref]
    if named:
        return named[0]
    by_prefix = [record for record in records if record["job"].startswith(ref)]
    if len(by_prefix) == 1:
        return by_prefix[0]
    if by_prefix:
        raise AmbiguousJob(f"{ref!r} matches {len(by_prefix)} jobs "
                           f"({', '.join(r['job'] for r in by_prefix[:5])}); give more of the id")
    raise JobNotFound(f"no job {ref!r} under {jobs_dir(root)}")
