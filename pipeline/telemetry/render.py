"""Plain-text view of a telemetry message, for the command line and logs. Missing values read "n/a"."""

from __future__ import annotations

from typing import Any, Mapping

NA = "n/a"
_GIB = 1024**3
_MIB = 1024**2


def gib(value: float | None) -> str:
    return NA if value is None else f"{value / _GIB:.1f}G"


def mib(value: float | None) -> str:
    return NA if value is None else f"{value / _MIB:.0f}M"


def number(value: Any, unit: str = "", digits: int = 0) -> str:
    if value is None:
        return NA
    return f"{value:.{digits}f}{unit}"


def rate(value: float | None) -> str:
    if value is None:
        return NA
    for unit, size in (("G", _GIB), ("M", _MIB), ("K", 1024)):
        if abs(value) >= size:
            return f"{value / size:.1f}{unit}/s"
    return f"{value:.0f}B/s"


def duration(seconds: float | None) -> str:
    if seconds is None:
        return NA
    if seconds >= 86400:
        return f"{seconds / 86400:.1f}d"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f}h"
    if seconds >= 60:
        return f"{seconds / 60:.0f}m"
    return f"{seconds:.0f}s"


def gpu_line(gpu: Mapping[str, Any]) -> str:
    power = f"{number(gpu.get('power_w'), 'W')}/{number(gpu.get('power_limit_w'), 'W')}"
    text = (
        f"GPU{gpu.get('index')} {gpu.get('name') or NA}  mem {gib(gpu.get('mem_used'))}/{gib(gpu.get('mem_total'))}"
        f"  util {number(gpu.get('util_gpu'), '%')}  memutil {number(gpu.get('util_mem'), '%')}"
        f"  {number(gpu.get('temp_c'), 'C')}  {power}  sm {number(gpu.get('sm_clock_mhz'), 'MHz')}"
    )
    if gpu.get("throttle"):
        text += f"  throttle {gpu['throttle']}"
    if gpu.get("error"):
        text += f"  ({gpu['error']})"
    return text


def process_line(proc: Mapping[str, Any]) -> str:
    owner = proc.get("rank") or ("job" if proc.get("in_job") else "other")
    return f"    pid {proc.get('pid')}  {owner}  {mib(proc.get('used_mem'))}"


def host_line(host: Mapping[str, Any]) -> str:
    load = "/".join(number(host.get(k), digits=2) for k in ("load1", "load5", "load15"))
    text = (
        f"host cpu {number(host.get('cpu_percent'), '%', 1)}  load {load}"
        f"  ram {gib(host.get('ram_used'))}/{gib(host.get('ram_total'))}"
        f"  swap {gib(host.get('swap_used'))}/{gib(host.get('swap_total'))}"
    )
    disk = host.get("disk")
    if disk:
        text += (
            f"  disk free {gib(disk.get('free'))}/{gib(disk.get('total'))}"
            f"  output {gib(disk.get('output_bytes'))} +{rate(disk.get('growth_bytes_per_s'))}"
            f"  full in {duration(disk.get('full_in_s'))}"
        )
    net, io = host.get("net") or {}, host.get("disk_io") or {}
    text += (
        f"  net {rate(net.get('rx_bytes_per_s'))} in {rate(net.get('tx_bytes_per_s'))} out"
        f"  io {rate(io.get('read_bytes_per_s'))} r {rate(io.get('write_bytes_per_s'))} w"
    )
    return text


def render_lines(message: Mapping[str, Any]) -> list[str]:
    """Human-readable lines for one telemetry message."""
    lines = []
    if message.get("nvml"):
        lines.append(f"GPU telemetry unavailable: {message['nvml']}")
    if message.get("pid_namespace_mismatch"):
        lines.append(f"PID namespace mismatch: {message.get('pid_namespace_note') or 'NVML pids are not ours'}")
    for gpu in message.get("gpus") or []:
        lines.append(gpu_line(gpu))
        lines.extend(process_line(proc) for proc in gpu.get("processes") or [])
    host = message.get("host")
    if host:
        lines.append(host_line(host))
        for proc in host.get("procs") or []:
            flag = "  ZOMBIE" if proc.get("zombie") else ""
            lines.append(
                f"    pid {proc.get('pid')} ({proc.get('name') or NA})  ppid {proc.get('ppid')}"
                f"  rss {mib(proc.get('rss'))}  cpu {number(proc.get('cpu_percent'), '%', 1)}"
                f"  {proc.get('state')}{flag}"
            )
        if host.get("psutil"):
            lines.append(f"  ({host['psutil']})")
    return lines
