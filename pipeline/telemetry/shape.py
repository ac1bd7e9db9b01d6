"""Pure functions turning raw NVML readings (see :mod:`.nvml`) into the GPU part of a telemetry message.

No IO here: everything the shaping needs to know about processes (the job's process tree, which pids exist in this
PID namespace, the rank labels) is passed in, so recorded readings reshape exactly as they did live.

A shaped GPU::

    {"index", "name", "uuid", "mem_used", "mem_total", "mem_reserved", "util_gpu", "util_mem", "temp_c",
     "power_w", "power_limit_w", "sm_clock_mhz", "throttle", "error",
     "processes": [{"pid", "used_mem", "rank", "in_job"}]}

Memory is in bytes, power in watts, utilisation in percent. A value NVML could not give is ``None``.
"""

from __future__ import annotations

from typing import Any, Collection, Iterable, Mapping, Sequence

# Clock event (throttle) reasons from nvml.h, in the order they are named. "GPU idle" (0x1) is left out on
# purpose: an idle GPU shows in its utilisation, and naming it a throttle would flag every idle card.
THROTTLE_REASONS: tuple[tuple[int, str], ...] = (
    (0x0000000000000004, "sw_power_cap"),
    (0x0000000000000008, "hw_slowdown"),
    (0x0000000000000020, "sw_thermal"),
    (0x0000000000000040, "hw_thermal"),
    (0x0000000000000080, "hw_power_brake"),
    (0x0000000000000010, "sync_boost"),
    (0x0000000000000002, "app_clocks"),
    (0x0000000000000100, "display_clocks"),
)
_KNOWN_MASK = 0x1 | sum(bit for bit, _ in THROTTLE_REASONS)


def throttle_reason(mask: int | None) -> str | None:
    """Names of the active clock-limiting reasons, comma-joined; None when there is none (or no reading)."""
    if not mask:
        return None
    names = [name for bit, name in THROTTLE_REASONS if mask & bit]
    unknown = mask & ~_KNOWN_MASK
    if unknown:
        names.append(f"other(0x{unknown:x})")
    return ",".join(names) or None


def _get(raw: Mapping[str, Any], field: str, key: str) -> Any:
    value = raw.get(field)
    return value.get(key) if isinstance(value, Mapping) else None


def _watts(milliwatts: Any) -> float | None:
    return None if milliwatts is None else round(milliwatts / 1000.0, 1)


def nvml_pids(raw_gpus: Iterable[Mapping[str, Any]]) -> set[int]:
    return {proc["pid"] for gpu in raw_gpus for proc in (gpu.get("processes") or [])}


def detect_pid_namespace_mismatch(
    reported: Collection[int], visible: Collection[int], job_pids: Collection[int]
) -> tuple[bool, str | None]:
    """Whether the pids NVML reports (host pids) belong to another PID namespace than ours.

    ``reported``: pids NVML lists on any GPU; ``visible``: those of them that exist in this PID namespace
    (``/proc/<pid>``); ``job_pids``: the job's process tree as this namespace sees it.
    """
    reported = set(reported)
    if not reported:
        return False, None
    missing = reported - set(visible)
    if not missing:
        return False, None
    if missing == reported:
        return True, (
            f"none of the {len(reported)} pid(s) NVML reports exist in this PID namespace: the sampler is likely "
            "in a container and NVML gives host pids, so GPU processes are not matched to the job"
        )
    job = set(job_pids)
    if job and not (reported & job):
        return True, (
            f"{len(missing)} of the {len(reported)} pid(s) NVML reports do not exist in this PID namespace and none "
            "is in the job's process tree: NVML likely gives host pids, so GPU processes are not matched to the job"
        )
    return False, None


def shape_processes(
    raw_procs: Iterable[Mapping[str, Any]] | None,
    *,
    job_pids: Collection[int],
    ranks: Mapping[int, str],
    match: bool,
) -> list[dict[str, Any]]:
    rows = []
    for proc in raw_procs or []:
        pid = proc["pid"]
        rows.append(
            {
                "pid": pid,
                "used_mem": proc.get("used_mem"),
                # In another PID namespace a pid names an unrelated process here: label nothing rather than lie.
                "rank": ranks.get(pid) if match else None,
                "in_job": bool(match and pid in job_pids),
            }
        )
    rows.sort(key=lambda row: row["pid"])
    return rows


def shape_gpu(
    raw: Mapping[str, Any],
    *,
    job_pids: Collection[int] = (),
    ranks: Mapping[int, str] | None = None,
    match: bool = True,
) -> dict[str, Any]:
    util = raw.get("utilization")
    errors = raw.get("errors") or {}
    dynamic = [k for k in raw if k not in ("index", "name", "uuid", "errors")]
    failed_all = bool(dynamic) and all(raw.get(k) is None for k in dynamic) and bool(errors)
    return {
        "index": raw.get("index"),
        "name": raw.get("name"),
        "uuid": raw.get("uuid"),
        "mem_used": _get(raw, "memory", "used"),
        "mem_total": _get(raw, "memory", "total"),
        "mem_reserved": _get(raw, "memory", "reserved"),
        "util_gpu": util.get("gpu") if isinstance(util, Mapping) else None,
        "util_mem": util.get("memory") if isinstance(util, Mapping) else None,
        "temp_c": raw.get("temperature_c"),
        "power_w": _watts(raw.get("power_mw")),
        "power_limit_w": _watts(raw.get("power_limit_mw")),
        "sm_clock_mhz": raw.get("sm_clock_mhz"),
        "throttle": throttle_reason(raw.get("clock_event_mask")),
        # Every query failed (a lost GPU, say): keep the first reason so the row can say why it is blank.
        "error": next(iter(errors.values()))["message"] if failed_all else None,
        "processes": shape_processes(raw.get("processes"), job_pids=job_pids, ranks=ranks or {}, match=match),
    }


def shape_gpus(
    raw_gpus: Sequence[Mapping[str, Any]],
    *,
    job_pids: Collection[int] = (),
    ranks: Mapping[int, str] | None = None,
    visible_pids: Collection[int] | None = None,
) -> tuple[list[dict[str, Any]], bool, str | None]:
    """Shape every GPU; returns (gpus, pid_namespace_mismatch, note).

    ``visible_pids`` is the subset of NVML's pids that exist in this namespace; None means "not checked" (all
    taken as visible).
    """
    reported = nvml_pids(raw_gpus)
    visible = reported if visible_pids is None else set(visible_pids)
    mismatch, note = detect_pid_namespace_mismatch(reported, visible, job_pids)
    gpus = [shape_gpu(raw, job_pids=job_pids, ranks=ranks, match=not mismatch) for raw in raw_gpus]
    return gpus, mismatch, note
