"""The agent's telemetry cost: its own CPU time for sampling every GPU plus the host at 1 Hz, as % of one core.

    python bench/bench_telemetry.py [--duration 60] [--gpu-repeat 8] [--job-pid-file F] [--output-dir D]
                                    [--query-costs 2000] [--json-out FILE]

Agent-style: every tick it samples (NVML + psutil), encodes the protocol line and writes it to /dev/null, and
polls an idle log file for new bytes, as the agent does while streaming a quiet job. The first sample (NVML
initialisation, imports) is left out of the measured window. ``--gpu-repeat K`` queries every GPU K times per
sample, to stand in for a host with K times as many GPUs (8 × 1 on a one-GPU machine). ``--query-costs N`` then
times each NVML query and the host sample alone, N calls each, outside the measured window.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import tempfile
import threading
import time
from typing import Any, Callable

from eaglewatch import protocol
from eaglewatch.pipeline.telemetry import HostSampler, NvmlSource, TelemetrySampler
from eaglewatch.pipeline.telemetry.__main__ import FileFollower


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def per_call_us(fn: Callable[[], Any], n: int) -> float | None:
    try:
        fn()
    except Exception:
        return None
    started = time.perf_counter()
    for _ in range(n):
        fn()
    return round((time.perf_counter() - started) / n * 1e6, 2)


def query_costs(source: NvmlSource, host: HostSampler, roots: list[int], n: int) -> dict[str, Any]:
    out: dict[str, Any] = {"host_sample_us": per_call_us(lambda: host.sample(roots), max(1, n // 20))}
    if not source.available:
        return out
    nv, h = source._nv, source.devices[0].handle
    calls: dict[str, Callable[[], Any]] = {
        "memory_v2": lambda: nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2),
        "memory_v1": lambda: nv.nvmlDeviceGetMemoryInfo(h),
        "utilization": lambda: nv.nvmlDeviceGetUtilizationRates(h),
        "mem_plus_util": lambda: (nv.nvmlDeviceGetMemoryInfo(h), nv.nvmlDeviceGetUtilizationRates(h)),
        "temperature": lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
        "power_usage": lambda: nv.nvmlDeviceGetPowerUsage(h),
        "power_limit": lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h),
        "sm_clock": lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
        "clock_event_reasons": lambda: nv.nvmlDeviceGetCurrentClocksEventReasons(h),
        "compute_processes": lambda: nv.nvmlDeviceGetComputeRunningProcesses(h),
    }
    out["nvml_query_us"] = {name: per_call_us(fn, n) for name, fn in calls.items()}
    devices, source.devices = source.devices, source.devices[:1]
    try:
        out["nvml_read_one_gpu_us"] = per_call_us(source.read, max(1, n // 10))
    finally:
        source.devices = devices
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--gpu-repeat", type=int, default=1)
    parser.add_argument("--job-pid-file", default=None)
    parser.add_argument("--output-dir", default=None)
    parser.add_argument("--query-costs", type=int, default=0)
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args()

    def job_pids() -> list[int]:
        if not args.job_pid_file:
            return [os.getpid()]
        try:
            with open(args.job_pid_file) as fh:
                return [int(tok) for tok in fh.read().split()]
        except (OSError, ValueError):
            return []

    idle_log = tempfile.NamedTemporaryFile(prefix="idle-log-", delete=False)
    idle_log.write(b"(EngineCore pid=1) INFO started\n")
    idle_log.close()
    follower = FileFollower(idle_log.name)
    sampler = TelemetrySampler(interval_s=args.interval, output_dir=args.output_dir, job_pids_fn=job_pids)
    sink = open(os.devnull, "wb")
    sink.write(sampler.sample_line())  # first sample: NVML init, imports; not measured
    follower.read_new()
    if sampler.nvml.available and args.gpu_repeat > 1:
        sampler.nvml.devices = sampler.nvml.devices * args.gpu_repeat

    walls: list[float] = []
    cpus: list[float] = []
    sizes: list[int] = []
    gpu_counts: list[int] = []

    def tick(line: bytes) -> None:
        sink.write(line)
        follower.read_new()

    stop = threading.Event()
    timer = threading.Timer(args.duration, stop.set)
    timer.daemon = True
    cpu0, wall0 = cpu_seconds(), time.monotonic()
    timer.start()
    next_at = time.monotonic()
    while not stop.is_set():
        c, w = time.process_time(), time.perf_counter()
        message = sampler.sample()
        line = protocol.encode(message)
        tick(line)
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
        sizes.append(len(line))
        gpu_counts.append(len(message["gpus"]))
        next_at += args.interval
        stop.wait(max(0.0, next_at - time.monotonic()))
    cpu1, wall1 = cpu_seconds(), time.monotonic()
    cpu_total, wall_total = cpu1 - cpu0, wall1 - wall0

    result: dict[str, Any] = {
        "machine": platform.node(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "nvml": sampler.nvml_reason,
        "driver": sampler.nvml.driver,
        "gpus_sampled": max(gpu_counts) if gpu_counts else 0,
        "physical_gpus": len(sampler.nvml.devices) // max(1, args.gpu_repeat) if sampler.nvml.available else 0,
        "gpu_repeat": args.gpu_repeat,
        "samples": len(walls),
        "wall_s": round(wall_total, 2),
        "cpu_s": round(cpu_total, 4),
        "cpu_pct_of_one_core": round(cpu_total / wall_total * 100, 3),
        "per_sample_cpu_ms_mean": round(statistics.mean(cpus) * 1e3, 3),
        "per_sample_wall_ms_mean": round(statistics.mean(walls) * 1e3, 3),
        "per_sample_wall_ms_max": round(max(walls) * 1e3, 3),
        "message_bytes_mean": round(statistics.mean(sizes)),
        "job_procs_last": len(message["host"].get("procs") or []),
    }
    if args.query_costs:
        if sampler.nvml.available and args.gpu_repeat > 1:
            sampler.nvml.devices = sampler.nvml.devices[: result["physical_gpus"]]
        roots = job_pids()
        result["costs"] = query_costs(sampler.nvml, HostSampler(args.output_dir), roots, args.query_costs)
    sampler.close()
    os.unlink(idle_log.name)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json_out:
        with open(args.json_out, "w") as fh:
            fh.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
