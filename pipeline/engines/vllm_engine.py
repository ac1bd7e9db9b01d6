"""The vLLM engine: native hidden-state extraction (``extract_hidden_states``), tensor parallel.

Prompts go in as token ids with ``max_tokens=1``; eaglewatch's KV connector (loaded through
``kv_connector_module_path``) writes each request's file. Nothing inside vLLM is patched.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any, Sequence

from eaglewatch.pipeline.engines.options import EngineOptions
from eaglewatch.pipeline.prepared_data import Sample

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
    gpu_memory_utilization: float,
    kv_cache_memory_bytes: int | None,
    enforce_eager: bool,
    trust_remote_code: bool,
    max_num_seqs: int | None = None,
    fsync: bool = True,
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
            "kv_connector_extra_config": {"fsync": fsync},
        },
    )
    if kv_cache_memory_bytes:
        kwargs["kv_cache_memory_bytes"] = kv_cache_memory_bytes
    else:
        kwargs["gpu_memory_utilization"] = gpu_memory_utilization
    if max_num_seqs:
        kwargs["max_num_seqs"] = max_num_seqs
    return kwargs


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

    def load(self) -> None:
        if not self.options.engine_core_process:
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
        self.llm = LLM(seed=o.seed, **extraction_llm_kwargs(
            self.model_path, self.layer_ids, tp_size=o.tp_size, dtype=self.dtype, max_seq_len=o.max_seq_len,
            gpu_memory_utilization=o.gpu_memory_utilization, kv_cache_memory_bytes=kv_cache_bytes,
            enforce_eager=bool(eager), trust_remote_code=o.trust_remote_code, fsync=o.fsync))

    def submit(self, samples: Sequence[Sample], paths: Sequence[Path]) -> None:
        from vllm import SamplingParams

        prompts = [{"prompt_token_ids": s.input_ids} for s in samples]
        params = [
            SamplingParams(
                max_tokens=1,
                detokenize=False,
                extra_args={"kv_transfer_params": {"eaglewatch_path": str(p), "eaglewatch_loss_mask": s.loss_mask}},
            )
            for s, p in zip(samples, paths)
        ]
        self.llm.generate(prompts, params, use_tqdm=False)

    def flush(self) -> None:
        """Hand the connector the last batch's writes.

        A request's hidden states are read out in the engine step after the one that finished it. After the last
        batch no step would come, so run one for a 1-token request that writes nothing.
        """
        from vllm import SamplingParams

        self.llm.generate([{"prompt_token_ids": [0]}], SamplingParams(max_tokens=1, detokenize=False),
                          use_tqdm=False)

    def wait_written(self, paths: Sequence[Path], timeout_s: float) -> None:
        """The connector writes in background threads; a file appears under its final name once complete."""
        deadline = time.monotonic() + timeout_s
        pending = [Path(p) for p in paths]
        delay = 0.001
        while pending:
            still = []
            for path in pending:
                failed = Path(f"{path}.failed")
                if failed.exists():
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
