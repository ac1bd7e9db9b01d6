"""The job records on the operator's machine: one JSON file per job, in the shape of the job snapshot
(docs/fleet.md), under ``$EAGLEWATCH_JOBS_DIR`` or ``~/.config/eaglewatch/jobs`` (beside the config file).

An ssh job lives only here: which run on which host is which rank. A Slurm job lives in its target's agent; its
record here says where to ask (its ``target``), so that ``eaglewatch job status JOB`` needs no more than the id.
Every write goes to a temporary file in the same folder, then is renamed over the record, under a lock: a reader
never sees half a record, and two writers (the dashboard's restart, a ``job restart`` in another terminal) take
turns. Files only: nothing here connects anywhere.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Iterator, Optional

from eaglewatch.errors import UserError
from eaglewatch.safetext import safe_text

JOBS_DIR_ENV = "EAGLEWATCH_JOBS_DIR"
DEFAULT_JOBS_DIR = "~/.config/eaglewatch/jobs"
SCHEDULERS = ("ssh", "slurm")

_SLUG_DROP = re.compile(r"[^A-Za-z0-9._-]+")
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,120}$")
_in_process = threading.Lock()  # fcntl's lock is per process; threads of this one take turns here first

Record = dict[str, Any]


def jobs_dir() -> Path:
    return Path(os.path.expanduser(os.environ.get(JOBS_DIR_ENV) or DEFAULT_JOBS_DIR))


def new_job_id(name: Optional[str] = None, now: Optional[float] = None) -> str:
    """``YYYYMMDD-HHMMSS-<6 hex>[-slug]``, as run ids are: sortable by time, a safe file name whatever the name."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now if now is not None else time.time()))
    slug = _SLUG_DROP.sub("-", name or "").strip("-.")[:40].strip("-.")
    job = f"{stamp}-{secrets.token_hex(3)}"
    return f"{job}-{slug}" if slug else job


def record_path(job: str, folder: Optional[Path] = None) -> Path:
    """The record's file. A job id from a scheduler that is not a safe file name is hashed into one."""
    folder = folder or jobs_dir()
    if _SAFE_NAME.match(job) and not job.startswith("."):
        return folder / f"{job}.json"
    slug = _SLUG_DROP.sub("-", job).strip("-.")[:40] or "job"
    return folder / f"{slug}-{hashlib.sha256(job.encode()).hexdigest()[:12]}.json"


def check(record: Any, where: str) -> Record:
    """A record as read back: what the commands rely on is there, or a UserError naming the file."""
    problem = None
    if not isinstance(record, dict):
        problem = "is not a JSON object"
    elif not isinstance(record.get("job"), str) or not record["job"]:
        problem = "has no job id"
    elif record.get("scheduler") not in SCHEDULERS:
        problem = f"names no known scheduler ({', '.join(SCHEDULERS)})"
    elif not isinstance(record.get("ranks"), list) or not all(
            isinstance(entry, dict) and isinstance(entry.get("rank"), int) for entry in record["ranks"]):
        problem = "has no list of ranks"
    if problem:
        raise UserError(safe_text(f"the job record {where} {problem}"))
    return record


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    folder.mkdir(parents=True, exist_ok=True)
    with _in_process:
        try:
            import fcntl
        except ImportError:  # no flock here: threads still take turns
            yield
            return
        with open(folder / ".lock", "a+") as fh:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _write(path: Path, record: Record) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(record, fh, ensure_ascii=True, indent=1)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _read(path: Path) -> Record:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(safe_text(f"cannot read the job record {path}: {exc}")) from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise UserError(safe_text(f"the job record {path} is not JSON: {exc}")) from None
    return check(data, str(path))


class JobStore:
    """The records in one folder (``jobs_dir()`` unless told otherwise)."""

    def __init__(self, folder: Optional[Path] = None) -> None:
        self.folder = folder or jobs_dir()

    def save(self, record: Record) -> Path:
        check(record, "to write")
        path = record_path(record["job"], self.folder)
        with _locked(self.folder):
            _write(path, record)
        return path

    def load(self, job: str) -> Record:
        """The record of exactly this job id."""
        path = record_path(job, self.folder)
        if not path.exists():
            raise UserError(safe_text(f"no job {job} in {self.folder}"))
        return _read(path)

    def all(self) -> tuple[list[Record], list[str]]:
        """Every readable record, newest first, and a sentence for each file that could not be read."""
        records, problems = [], []
        if not self.folder.is_dir():
            return [], []
        for path in sorted(self.folder.glob("*.json")):
            try:
                records.append(_read(path))
            except UserError as exc:
                problems.append(str(exc))
        records.sort(key=lambda r: (float(r.get("created_at") or 0), r["job"]), reverse=True)
        return records, problems

    def find(self, job: str) -> Record:
        """A job by its id, a unique prefix of one, or its name (the newest of that name)."""
        if not job:
            raise UserError("JOB is empty: give a job id, a unique prefix of one, or a job's name")
        path = record_path(job, self.folder)
        if path.exists():
            return _read(path)
        records, _ = self.all()
        exact = [r for r in records if r["job"] == job]
        if exact:
            return exact[0]
        prefixed = [r for r in records if r["job"].startswith(job)]
        if len(prefixed) == 1:
            return prefixed[0]
        if len(prefixed) > 1:
            ids = ", ".join(r["job"] for r in prefixed[:5])
            raise UserError(safe_text(f"{job!r} is the start of {len(prefixed)} jobs ({ids}); give more of it"))
        named = [r for r in records if r.get("name") == job]
        if named:
            return named[0]
        raise UserError(safe_text(f"no job {job!r} in {self.folder} (eaglewatch job list shows them)"))

    def update(self, job: str, **fields: Any) -> Record:
        """Set top-level fields of a record, read afresh under the lock (another writer's change stays)."""
        with _locked(self.folder):
            record = _read(record_path(job, self.folder))
            record.update(fields)
            _write(record_path(job, self.folder), record)
        return record

    def update_rank(self, job: str, rank: int, **fields: Any) -> Record:
        """Set fields of one rank's entry, read afresh under the lock."""
        with _locked(self.folder):
            path = record_path(job, self.folder)
            record = _read(path)
            for entry in record["ranks"]:
                if entry.get("rank") == rank:
                    entry.update(fields)
                    break
            else:
                raise UserError(safe_text(f"job {job} has no rank {rank}"))
            _write(path, record)
        return record
