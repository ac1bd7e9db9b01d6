"""The sbatch command and the batch script of a job's ranks: text and argv lists, no IO.

A job is one Slurm *array*: task i is rank i. Array tasks are scheduled, cancelled and resubmitted one by one
(``scancel 123_4``, ``sbatch --array=4``), which is what data-parallel ranks need: they share nothing while they
run, so one rank may start while others wait for a node, and one cancelled or failed rank is resubmitted alone. One
job of N tasks (``srun`` steps) would be scheduled all at once, and one lost rank could only be redone with the
whole allocation.

sbatch gets its options as argv words (no shell sees them); the script is a POSIX shell script in which every word
that came from the request is quoted with ``shlex.quote``: the operator's command, paths, names, environment.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from eaglewatch.pipeline.agent.jobs import BadRequest
from eaglewatch.pipeline.agent.rundir import is_run_id

SBATCH = "sbatch"
# sbatch options an extra word may not give, and why: (long form, short form or "", why refused). Two kinds: what
# the job's layout sets (one array task per rank, its output files, its name, which eaglewatch reads back), and
# what changes sbatch's own behaviour or output, so that eaglewatch could not tell what it submitted: --wait blocks
# until the job ends (the submission times out while the job runs), --test-only and --help submit nothing, --quiet
# hides the job id that --parsable prints. A row is matched by its long form's unambiguous prefixes too ("--arr").
REFUSED_OPTIONS: tuple[tuple[str, str, str], ...] = (
    ("--array", "-a", "eaglewatch submits one array task per rank"),
    ("--wrap", "", "the batch script is eaglewatch's"),
    ("--output", "-o", "eaglewatch keeps each task's output in the job's folder"),
    ("--error", "-e", "eaglewatch keeps each task's output in the job's folder"),
    ("--parsable", "", "eaglewatch passes it once and reads the job id it prints"),
    ("--job-name", "-J", "eaglewatch names the job, and finds it by that name"),
    ("--chdir", "-D", "the ranks run in --cwd"),
    ("--ntasks", "-n", "each rank is one task"),
    ("--nodes", "-N", "each rank is one task on one node"),
    ("--requeue", "", "a requeued task would find its run directory taken; use eaglewatch job restart JOB RANK"),
    ("--hold", "-H", "every rank (and every resubmitted one) would stay held until scontrol release"),
    ("--wait", "-W", "sbatch would block until the job ends, so the submission would time out while the job runs"),
    ("--test-only", "", "sbatch would only estimate a start time and submit nothing"),
    ("--quiet", "-Q", "sbatch would not print the job id eaglewatch reads"),
    ("--help", "-h", "sbatch would print its help and submit nothing"),
    ("--usage", "", "sbatch would print its usage and submit nothing"),
    ("--version", "-V", "sbatch would print its version and submit nothing"),
)
# sbatch's short options that take no value: in a bundle ("-vW") the letters after one of these are options too;
# after any other letter they are its value ("-pWide" is --partition=Wide).
_SHORT_FLAGS = "hHOQsvVW"
# sbatch reads "%A", "%a", "%j" ... in file names; "%%" is a literal "%".
_PERCENT = re.compile("%")

# The launcher runs from the agent's own copy of eaglewatch (a zipapp file or a package folder), put first on the
# path, so that a task runs the same code as the agent that submitted it.
LAUNCHER_BOOT = (
    "import sys;sys.path.insert(0,sys.argv[1]);"
    "from eaglewatch.pipeline.agent.slurm_task import main;sys.exit(main(sys.argv[2:]))"
)


@dataclass(frozen=True)
class SbatchOptions:
    """The resource request of every rank (each array task asks for the same)."""

    partition: str | None = None
    account: str | None = None
    time: str | None = None
    gpus_per_task: int | None = None
    cpus_per_task: int | None = None
    mem: str | None = None
    extra: tuple[str, ...] = ()

    @classmethod
    def from_request(cls, raw: Any) -> "SbatchOptions":
        """The ``slurm`` argument of ``job_launch``, checked; raises BadRequest."""
        raw = raw or {}
        if not isinstance(raw, dict):
            raise BadRequest("slurm must be an object of sbatch options")
        unknown = set(raw) - {"partition", "account", "time", "gpus_per_task", "cpus_per_task", "mem", "extra"}
        if unknown:
            raise BadRequest(f"unknown slurm options: {', '.join(sorted(unknown))}")
        extra = raw.get("extra") or []
        if not isinstance(extra, list):
            raise BadRequest("slurm.extra must be a list of sbatch options")
        return cls(
            partition=_text(raw.get("partition"), "slurm.partition"),
            account=_text(raw.get("account"), "slurm.account"),
            time=_text(raw.get("time"), "slurm.time"),
            gpus_per_task=_count(raw.get("gpus_per_task"), "slurm.gpus_per_task", minimum=0),
            cpus_per_task=_count(raw.get("cpus_per_task"), "slurm.cpus_per_task", minimum=1),
            mem=_text(raw.get("mem"), "slurm.mem"),
            extra=tuple(_extra_word(word) for word in extra),
        )

    def to_record(self) -> dict[str, Any]:
        return {"partition": self.partition, "account": self.account, "time": self.time,
                "gpus_per_task": self.gpus_per_task, "cpus_per_task": self.cpus_per_task, "mem": self.mem,
                "extra": list(self.extra)}

    def argv(self) -> list[str]:
        words = []
        for flag, value in (("--partition", self.partition), ("--account", self.account), ("--time", self.time),
                            ("--gpus-per-task", self.gpus_per_task), ("--cpus-per-task", self.cpus_per_task),
                            ("--mem", self.mem)):
            if value is not None:
                words.append(f"{flag}={value}")
        return words + list(self.extra)


def _text(value: Any, what: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value or any(c in value for c in "\0\n\r"):
        raise BadRequest(f"{what} must be a non-empty one-line string")
    return value


def _count(value: Any, what: str, minimum: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise BadRequest(f"{what} must be a whole number, {minimum} or more")
    return value


def refused_option(word: str) -> tuple[str, str] | None:
    """The refused option this sbatch word gives (its long form, why), or None."""
    if word.startswith("--"):
        name = word.split("=", 1)[0]
        # sbatch takes any unambiguous prefix of a long option ("--arr=4").
        return next(((long, why) for long, _, why in REFUSED_OPTIONS if long.startswith(name)), None)
    for letter in word[1:]:
        row = next(((long, why) for long, short, why in REFUSED_OPTIONS if short == "-" + letter), None)
        if row is not None or letter not in _SHORT_FLAGS:
            return row  # a refused letter, or one whose value is the rest of the word ("-o.", "-pgpu")
    return None


def _extra_word(word: Any) -> str:
    if not isinstance(word, str) or not word.startswith("-") or word in ("-", "--") \
            or any(c in word for c in "\0\n\r"):
        # A word that is not an option would be read by sbatch as the script's file name.
        raise BadRequest(f"every slurm.extra word must be one sbatch option (starting with '-'), not {word!r}")
    refused = refused_option(word)
    if refused is not None:
        long, why = refused
        given = word.split("=", 1)[0] if word.startswith("--") else word[:40]
        named = long if given == long else f"{given} ({long})"
        raise BadRequest(f"sbatch option {named} is refused: {why}")
    return word


def array_spec(tasks: Sequence[int]) -> str:
    """``--array`` for these task ids: "0-7" when they are consecutive, else "1,4"."""
    ordered = sorted(set(tasks))
    if not ordered:
        raise ValueError("a job needs at least one task")
    if ordered == list(range(ordered[0], ordered[-1] + 1)) and len(ordered) > 1:
        return f"{ordered[0]}-{ordered[-1]}"
    return ",".join(map(str, ordered))


def output_pattern(folder: str) -> str:
    """Slurm's batch output file of each task, in the job's folder: ``slurm-<array job>_<task>.out``."""
    return _PERCENT.sub("%%", folder.rstrip("/")) + "/slurm-%A_%a.out"


def output_file(folder: str, array_job_id: str, task: int) -> str:
    """The file ``output_pattern`` names for one task, as it lands on disk."""
    return f"{folder.rstrip('/')}/slurm-{array_job_id}_{task}.out"


def job_name(job_id: str) -> str:
    """The Slurm job name of every submission of a job: how squeue finds one whose sbatch did not answer."""
    return f"eaglewatch-{job_id}"


def sbatch_argv(*, job_id: str, tasks: Sequence[int], folder: str, cwd: str, options: SbatchOptions,
                script: str) -> list[str]:
    """sbatch's argv: one array task per rank in ``tasks``, each one task on one node, never requeued by Slurm on
    its own (a requeued task would find its run directory taken: the operator restarts a rank instead)."""
    return [
        SBATCH, "--parsable", f"--job-name={job_name(job_id)}", f"--array={array_spec(tasks)}", "--ntasks=1",
        "--nodes=1", f"--output={output_pattern(folder)}", f"--chdir={cwd}", "--no-requeue",
        f"--comment=eaglewatch job {job_id}", *options.argv(), script,
    ]


@dataclass(frozen=True)
class RankCommand:
    """What every rank of a job runs: the operator's argv (the rank's ``--rank R --world-size N`` is added by the
    launcher), where, with which environment overrides and which Python for an ``eaglewatch …`` command."""

    argv: tuple[str, ...]
    cwd: str
    env: Mapping[str, str]
    name: str | None
    python: str | None
    installed: bool


def batch_script(*, job_id: str, run_root: str, world_size: int, runs: Mapping[int, str], command: RankCommand,
                 launcher_python: str, import_root: str, restart_of: Mapping[int, str] | None = None) -> str:
    """The batch script: the array task's id picks the rank and its run id, then the launcher (``slurm_task``)
    starts the rank under eaglewatch's supervisor in that run directory and exits with the rank's status."""
    if not is_run_id(job_id):
        raise ValueError(f"not a job id: {job_id!r}")
    q = shlex.quote
    lines = [
        "#!/bin/sh",
        f"# eaglewatch job {job_id}: {world_size} ranks, one array task each; the rank is SLURM_ARRAY_TASK_ID.",
        "# Each rank runs under eaglewatch's supervisor in its own run directory (docs/slurm.md).",
        "rank=${SLURM_ARRAY_TASK_ID:-}",
        'case "$rank" in',
    ]
    for rank in sorted(runs):
        if not is_run_id(runs[rank]):
            raise ValueError(f"not a run id: {runs[rank]!r}")
        restart = f" restart_of={q(restart_of[rank])}" if restart_of and rank in restart_of else " restart_of="
        lines.append(f"  {int(rank)}) run={q(runs[rank])}{restart} ;;")
    lines += [
        f"  *) echo \"eaglewatch: array task '$rank' is not a rank of job {job_id}\" >&2; exit 2 ;;",
        "esac",
    ]
    words = [launcher_python, "-c", LAUNCHER_BOOT, import_root, "--run-root", run_root, "--job", job_id,
             "--world-size", str(world_size), "--cwd", command.cwd]
    if command.name is not None:
        words += ["--name", command.name]
    if command.python is not None:
        words += ["--python", command.python]
    if command.installed:
        words.append("--installed")
    for key in sorted(command.env):
        words += ["--env", f"{key}={command.env[key]}"]
    quoted = " ".join(q(word) for word in words)
    argv = " ".join(q(word) for word in command.argv)
    lines.append(f'exec {quoted} --run "$run" --rank "$rank" --restart-of "$restart_of" -- {argv}')
    return "\n".join(lines) + "\n"
