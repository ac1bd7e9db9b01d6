"""Wait until a job's processes are gone and the GPU memory they held is released (used before a restart)."""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable

from .host import pid_state, visible_pids
from .nvml import NvmlSource

ProgressCallback = Callable[[dict[str, Any]], Any]


def wait_for_gpu_release(
    pids: Iterable[int],
    timeout_s: float,
    poll_s: float = 0.5,
    progress_cb: ProgressCallback | None = None,
    *,
    nvml: NvmlSource | None = None,
) -> bool:
    """Block until none of ``pids`` is alive and NVML lists none of them on any GPU; False on timeout.

    A zombie counts as gone: it has exited and its GPU context was torn down with it. Without NVML (no GPU, no
    driver) only the processes are waited for. ``progress_cb`` is called after every poll with::

        {"elapsed_s", "alive": [pids still running], "zombies": [pids exited but not reaped],
         "gpu": [{"index", "pid", "used_mem"}] (memory NVML still shows for them), "held_bytes",
         "released": bool, "nvml": reason or None, "pid_namespace_mismatch": bool}

    Container PID namespaces: NVML reports host pids, which never equal ours there. When, at the first poll, NVML
    lists processes of which none exists here and none is ours, those entries are taken to be the job's (it is the
    best guess from inside a container) and are waited for too. ``nvml`` passes an already started source (the
    sampler's), otherwise one is opened and closed here.
    """
    targets = {int(pid) for pid in pids}
    if timeout_s < 0:
        raise ValueError("timeout_s must not be negative")
    poll_s = max(poll_s, 0.01)
    own_source = nvml is None
    source = nvml if nvml is not None else NvmlSource()
    started = time.monotonic()
    deadline = started + timeout_s
    foreign: set[tuple[int, int]] | None = None
    try:
        while True:
            states = {pid: pid_state(pid) for pid in targets}
            alive = sorted(pid for pid, state in states.items() if state == "running")
            zombies = sorted(pid for pid, state in states.items() if state == "zombie")
            held: list[dict[str, Any]] = []
            mismatch = False
            readings = source.read_processes() if source.available else []
            entries = [(gpu["index"], proc) for gpu in readings for proc in (gpu.get("processes") or [])]
            if foreign is None and readings:
                listed = {proc["pid"] for _, proc in entries}
                seen_here = visible_pids(listed)
                if listed and not seen_here and not (listed & targets):
                    foreign = {(index, proc["pid"]) for index, proc in entries}
                else:
                    foreign = set()
            for index, proc in entries:
                if proc["pid"] in targets or (index, proc["pid"]) in (foreign or ()):
                    held.append({"index": index, "pid": proc["pid"], "used_mem": proc.get("used_mem")})
                    mismatch = mismatch or proc["pid"] not in targets
            released = not alive and not held
            if progress_cb is not None:
                progress_cb(
                    {
                        "elapsed_s": round(time.monotonic() - started, 3),
                        "alive": alive,
                        "zombies": zombies,
                        "gpu": held,
                        "held_bytes": sum(entry["used_mem"] or 0 for entry in held),
                        "released": released,
                        "nvml": source.reason,
                        "pid_namespace_mismatch": mismatch,
                    }
                )
            if released:
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            time.sleep(min(poll_s, remaining))
    finally:
        if own_source:
            source.close()
