"""GPU and host telemetry on the GPU host: NVML per GPU and per process, psutil for the host.

Public interface (the agent streams what :meth:`TelemetrySampler.sample` returns, one message per sample):

- :class:`TelemetrySampler` – one ``telemetry`` protocol message per sample, holding every GPU and the host;
- :func:`wait_for_gpu_release` – wait until pids are gone and their GPU memory is freed (before a restart);
- :class:`RankMap`, :func:`ranks_from_log`, :func:`ranks_from_events` – which pid is which TP rank.

``pynvml`` and ``psutil`` are optional and imported lazily; see docs/telemetry.md.
"""

from __future__ import annotations

from .host import HostSampler, OutputDiskWatch, pid_state
from .nvml import NvmlSource
from .ranks import RankMap, ranks_from_events, ranks_from_log
from .release import wait_for_gpu_release
from .render import render_lines
from .sampler import TelemetrySampler
from .shape import detect_pid_namespace_mismatch, shape_gpu, shape_gpus, throttle_reason

__all__ = [
    "HostSampler",
    "NvmlSource",
    "OutputDiskWatch",
    "RankMap",
    "TelemetrySampler",
    "detect_pid_namespace_mismatch",
    "pid_state",
    "ranks_from_events",
    "ranks_from_log",
    "render_lines",
    "shape_gpu",
    "shape_gpus",
    "throttle_reason",
    "wait_for_gpu_release",
]
