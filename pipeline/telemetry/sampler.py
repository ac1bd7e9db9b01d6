"""The telemetry sampler: one protocol message per sample, holding every GPU and the host."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Iterable

from eaglewatch import protocol

from .host import HostSampler, visible_pids
from .nvml import NvmlSource
from .shape import nvml_pids, shape_gpus

RawSink = Callable[[dict[str, Any]], None]


class TelemetrySampler:
    """Samples NVML and the host every ``interval_s`` seconds (1 s by default).

    ``job_pids_fn`` returns the job's root pids (their descendants are found here); ``rank_map_fn`` returns
    pid → rank label (a :class:`~.ranks.RankMap` fits). ``output_dir`` is the folder whose disk and growth are
    watched. ``nvml`` and ``host`` replace the default sources; ``raw_sink`` receives every sample's raw NVML
    readings together with the process context they were shaped with (for recording fixtures).

    When NVML is unavailable (no GPU, no driver, no ``pynvml``) that is decided once, at the first sample, and
    every message carries the one-line reason in ``nvml`` while host samples go on.
    """

    def __init__(
        self,
        interval_s: float = 1.0,
        output_dir: str | None = None,
        job_pids_fn: Callable[[], Iterable[int]] | None = None,
        rank_map_fn: Callable[[], dict[int, str]] | None = None,
        *,
        nvml: NvmlSource | None = None,
        host: HostSampler | None = None,
        raw_sink: RawSink | None = None,
    ) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        self.interval_s = float(interval_s)
        self.output_dir = output_dir
        self.job_pids_fn = job_pids_fn
        self.rank_map_fn = rank_map_fn
        self.nvml = nvml if nvml is not None else NvmlSource()
        self.host = host if host is not None else HostSampler(output_dir)
        self.raw_sink = raw_sink

    def set_output_dir(self, output_dir: str | None) -> None:
        """Watch another folder's disk from the next sample on (a new run, or the job said where it writes)."""
        if output_dir != self.output_dir:
            self.output_dir = output_dir
            self.host.set_output_dir(output_dir)

    @property
    def nvml_reason(self) -> str | None:
        """Why there is no GPU telemetry, or None when there is (after the first sample)."""
        return self.nvml.reason

    def _job_roots(self) -> list[int]:
        if self.job_pids_fn is None:
            return []
        try:
            return [int(pid) for pid in self.job_pids_fn()]
        except Exception:
            # A run folder being rewritten, a pid file half written: sample without a job this time.
            return []

    def _ranks(self) -> dict[int, str]:
        if self.rank_map_fn is None:
            return {}
        try:
            return dict(self.rank_map_fn())
        except Exception:
            return {}

    def sample(self) -> dict[str, Any]:
        """One telemetry message body (``type`` "telemetry"), ready for :func:`protocol.encode`."""
        t = round(time.time(), 3)
        raw_gpus = self.nvml.read()
        host, job_tree = self.host.sample(self._job_roots())
        ranks = self._ranks()
        visible = visible_pids(nvml_pids(raw_gpus))
        gpus, mismatch, note = shape_gpus(raw_gpus, job_pids=job_tree, ranks=ranks, visible_pids=visible)
        if self.raw_sink is not None:
            self.raw_sink(
                {
                    "t": t,
                    "driver": self.nvml.driver,
                    "nvml": self.nvml.reason,
                    "gpus": raw_gpus,
                    "job_pids": sorted(job_tree),
                    "visible_pids": sorted(visible),
                    "ranks": {str(pid): label for pid, label in sorted(ranks.items())},
                }
            )
        return {
            "type": protocol.MSG_TELEMETRY,
            "t": t,
            "interval_s": self.interval_s,
            "driver": self.nvml.driver,
            "nvml": self.nvml.reason,
            "gpus": gpus,
            "host": host,
            "pid_namespace_mismatch": mismatch,
            "pid_namespace_note": note,
        }

    def sample_line(self) -> bytes:
        """One sample as a protocol line (JSON, newline, version stamped)."""
        return protocol.encode(self.sample())

    def run(
        self,
        emit: Callable[[bytes], Any],
        *,
        count: int | None = None,
        stop: threading.Event | None = None,
    ) -> int:
        """Emit a line every interval until ``count`` lines or ``stop`` is set; returns the lines emitted.

        Samples are scheduled on a fixed grid (no drift from the sampling's own time); a sample that overruns
        its slot skips the missed ticks rather than bursting to catch up.
        """
        stop = stop or threading.Event()
        emitted = 0
        next_at = time.monotonic()
        while not stop.is_set() and (count is None or emitted < count):
            emit(self.sample_line())
            emitted += 1
            if count is not None and emitted >= count:
                break
            next_at += self.interval_s
            now = time.monotonic()
            if next_at < now:
                next_at = now + self.interval_s - ((now - next_at) % self.interval_s)
            stop.wait(next_at - now)
        return emitted

    def close(self) -> None:
        self.nvml.close()
