"""A vLLM KV connector that writes each request's extracted hidden states as one finished sample file.

vLLM's ``extract_hidden_states`` speculative method stores the aux layers' hidden states of every prompt token
in the KV cache of a cache-only layer (heads = layers, head size = hidden). A KV connector reads them out when
the request finishes. vLLM's stock example connector pins host memory and uses CUDA events, which CPU-only torch
refuses, and it writes its own file layout. This one:

* works on CUDA (gather and async device-to-host copy on a side stream, then a writer thread) and on CPU (a plain
  copy), with either layout of the cache-only layer's buffer (see ``_block_axis``);
* writes the final ``hs_{id}.safetensors`` directly (``hidden_states [seq, n_layers, hidden]``, ``token_ids``,
  ``loss_mask``), atomically: temporary name, fsync, rename. A file under its final name is always complete;
* on a write error, leaves ``<final>.failed`` holding the message, so the driver can report it;
* lets every tensor-parallel rank report the request as sent (only rank 0 writes), so vLLM's default
  "wait for all workers" bookkeeping frees the blocks on any vLLM version; only requests whose blocks it holds are
  reported, never one the scheduler freed at once (the driver's 1-token flush request between two samples'
  steps, in the stream).

The driver passes, per request, ``SamplingParams(extra_args={"kv_transfer_params": {"eaglewatch_path": str,
"eaglewatch_loss_mask": list[int]}})``. Loaded by vLLM through ``kv_connector_module_path``; nothing in vLLM is
patched.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from eaglewatch.pipeline.output import (
    FP8_ERROR_KEY,
    FP8_SCALES_KEY,
    STORAGE_DTYPE,
    STORAGE_FP8,
    fp8_error_stats,
    fp8_error_text,
    quantize_fp8,
    write_sample_file,
)
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    SupportsHMA,
)

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.request import Request

# For demos and tests of the failure path: "worker_assert:N" makes the writing worker fail a bare `assert` (an
# AssertionError with an empty message, like vLLM's block_hashes assertion) after it has written N samples;
# "worker_hang:N" makes it wait for ever there instead (a hang: no output, no exit, what the stall alert and
# `eaglewatch stacks` are for).
FAULT_ENV = "EAGLEWATCH_INJECT_FAULT"
PATH_KEY = "eaglewatch_path"
LOSS_MASK_KEY = "eaglewatch_loss_mask"
# A request that writes nothing and only makes the engine take one more step (``VLLMEngine.flush``); its output
# carries the key back, so that the driver can tell it from a sample's.
FLUSH_KEY = "eaglewatch_flush"
# What a sample request's output carries back (the stock connector's name for it).
WRITTEN_PATH_KEY = "hidden_states_path"


@dataclass
class _PendingWrite:
    req_id: str
    path: str
    token_ids: list[int]
    loss_mask: list[int] | None
    block_ids: list[int]


@dataclass
class _WriteMetadata(KVConnectorMetadata):
    writes: list[_PendingWrite] = field(default_factory=list)


def _parse_fault(spec: str) -> tuple[str, int | None]:
    kind, _, count = spec.partition(":")
    if kind not in ("worker_assert", "worker_hang"):
        return "", None
    return kind, int(count or 0)


def _to_host(tensor: torch.Tensor) -> torch.Tensor:
    """A pinned host copy of a GPU tensor, started on the current stream (the caller records the event to wait
    on). FP8 is copied as bytes: pinned buffers of every dtype are not a given."""
    if tensor.dtype == torch.float8_e4m3fn:
        return _to_host(tensor.view(torch.uint8)).view(torch.float8_e4m3fn)
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    host.copy_(tensor, non_blocking=True)
    return host


def _held_by_injected_fault() -> None:
    """The injected hang (``worker_hang:N``): the worker waits here for ever, as one stuck in a collective does."""
    threading.Event().wait()


def _block_axis() -> int:
    """Axis of the in-block offset in the cache-only layer's buffer.

    vLLM up to 0.26 lays it out ``[blocks, block_size, layers, hidden]`` (its backend declares that shape through
    ``get_kv_cache_shape``); later versions ``[blocks, layers, block_size, hidden]``. The sizes alone cannot tell
    the two apart when the layer count equals the block size, so ask the installed backend.
    """
    try:
        from vllm.model_executor.models.extract_hidden_states import CacheOnlyAttentionBackend
    except ImportError:
        return 2
    shape_fn = getattr(CacheOnlyAttentionBackend, "get_kv_cache_shape", None)
    if shape_fn is None:
        return 2
    # Distinct sizes (blocks, block_size, heads, head_size) show where the block offset lands.
    shape = tuple(shape_fn(2, 3, 5, 7))
    return shape.index(3) if len(shape) == 4 and 3 in shape else 2


def _hidden_state_group(kv_cache_config: Any) -> int:
    """Index of the KV cache group that holds the extracted hidden states."""
    if kv_cache_config is None:
        return 0
    try:
        from vllm.v1.kv_cache_interface import HiddenStateCacheSpec
    except ImportError:  # older vLLM: a single group
        return 0
    groups = kv_cache_config.kv_cache_groups
    for gid, group in enumerate(groups):
        if isinstance(group.kv_cache_spec, HiddenStateCacheSpec):
            return gid
    return 0


class EaglewatchHiddenStatesConnector(KVConnectorBase_V1, SupportsHMA):
    def __init__(self, vllm_config: "VllmConfig", role: KVConnectorRole, kv_cache_config: Any = None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self._group_id = _hidden_state_group(kv_cache_config)
        # Scheduler side: writes waiting to be handed to the workers with the next step's metadata.
        self._pending: dict[str, _PendingWrite] = {}
        # Worker side.
        self._kv_cache: torch.Tensor | None = None
        self._block_size = vllm_config.cache_config.block_size
        self._is_writer = True
        self._block_axis = 2
        self._copy_stream: Any = None
        self._copy_events: dict[str, Any] = {}
        # Requests whose blocks the scheduler keeps for a write (every rank learns them from the metadata), and
        # those of them finished, waiting for their copy to end.
        self._held: set[str] = set()
        self._finished: set[str] = set()
        self._writes_submitted = 0
        self._fault, self._fault_after = _parse_fault(os.environ.get(FAULT_ENV, ""))
        self._fsync = bool(self._kv_transfer_config.get_from_extra_config("fsync", True))
        # FP8 rounding: on a GPU, on the copy stream before the copy to the host (half the bytes cross PCIe, and no
        # CPU rounds: at hidden 7168 the host's rounding was slower than the engine); on a CPU, in the writer
        # threads on the host copy. The same arithmetic either way (output.quantize_fp8).
        self._storage = str(self._kv_transfer_config.get_from_extra_config("storage", STORAGE_DTYPE))
        threads = int(self._kv_transfer_config.get_from_extra_config("num_writer_threads", 4))
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="eaglewatch-write")

    # ---------------------------------------------------------------- worker side
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        from vllm.config import get_layers_from_vllm_config
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank
        from vllm.model_executor.models.extract_hidden_states import CacheOnlyAttentionLayer

        self._is_writer = get_tensor_model_parallel_rank() == 0
        layers = get_layers_from_vllm_config(self._vllm_config, CacheOnlyAttentionLayer, list(kv_caches))
        if len(layers) != 1:
            raise RuntimeError(
                f"expected exactly one hidden-states cache layer, found {len(layers)}: is the speculative "
                "method 'extract_hidden_states'?"
            )
        self._kv_cache = kv_caches[next(iter(layers))]
        if self._kv_cache.dim() != 4:
            raise RuntimeError(f"unexpected hidden-states cache shape {tuple(self._kv_cache.shape)}: expected 4 "
                               "dimensions [blocks, block_size, layers, hidden] or "
                               "[blocks, layers, block_size, hidden]")
        # The block size must be the buffer's own (cache_config's may be rounded up for hybrid models).
        self._block_axis = _block_axis()
        self._block_size = int(self._kv_cache.shape[self._block_axis])

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        return None  # store only

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any) -> None:
        return None  # the cache-only layer already holds the states; they are read out in get_finished

    def wait_for_save(self) -> None:
        return None

    def _gather(self, write: _PendingWrite) -> torch.Tensor:
        """``[seq, layers, hidden]`` rows of this request, on the cache's device (and current stream)."""
        assert self._kv_cache is not None
        blocks = torch.tensor(write.block_ids, dtype=torch.long)
        offsets = torch.arange(self._block_size, dtype=torch.long)
        slots = (blocks[:, None] * self._block_size + offsets[None, :]).flatten()[: len(write.token_ids)]
        slots = slots.to(self._kv_cache.device, non_blocking=True)
        if self._block_axis == 1:
            return self._kv_cache[slots // self._block_size, slots % self._block_size]
        return self._kv_cache[slots // self._block_size, :, slots % self._block_size]

    def _submit(self, write: _PendingWrite) -> None:
        if self._fault_after is not None and self._fault == "worker_hang":
            if self._writes_submitted >= self._fault_after:
                _held_by_injected_fault()
        elif self._fault_after is not None:
            assert self._writes_submitted < self._fault_after
        self._writes_submitted += 1
        assert self._kv_cache is not None
        if self._kv_cache.is_cuda:
            # Gather and copy on a side stream into pinned memory so the forward pass is not blocked. The gathered
            # rows are allocated on the side stream too: made on the forward's stream, their memory could be
            # handed to the next forward pass while the copy still reads it.
            if self._copy_stream is None:
                self._copy_stream = torch.cuda.Stream(device=self._kv_cache.device)
            ready = torch.cuda.Event()
            ready.record()
            self._copy_stream.wait_event(ready)
            stats = None
            with torch.cuda.stream(self._copy_stream):
                states = self._gather(write)
                if self._storage == STORAGE_FP8:
                    fp8, scales = quantize_fp8(states)
                    stats = tuple(_to_host(t) for t in fp8_error_stats(states, fp8, scales))
                    tensors = {"hidden_states": _to_host(fp8), FP8_SCALES_KEY: _to_host(scales)}
                else:
                    tensors = {"hidden_states": _to_host(states)}
            done = torch.cuda.Event()
            done.record(self._copy_stream)
            self._copy_events[write.req_id] = done
            storage = STORAGE_DTYPE if stats is not None else self._storage  # rounded already
        else:
            tensors, done, stats, storage = {"hidden_states": self._gather(write).clone()}, None, None, self._storage
        tensors["token_ids"] = torch.tensor(write.token_ids, dtype=torch.int64)
        if write.loss_mask is not None:
            tensors["loss_mask"] = torch.tensor(write.loss_mask, dtype=torch.int8)
        self._executor.submit(self._write, write.path, tensors, done, self._fsync, storage, stats)

    @staticmethod
    def _write(path: str, tensors: dict[str, torch.Tensor], done: Any, fsync: bool = True,
               storage: str = STORAGE_DTYPE, fp8_stats: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        try:
            if done is not None:
                done.synchronize()
            metadata = None
            if fp8_stats is not None:  # rounded on the GPU: its error record, measured there, in words here
                metadata = {FP8_ERROR_KEY: fp8_error_text(*fp8_stats, len(tensors["token_ids"]))}
            write_sample_file(path, {k: v.contiguous() for k, v in tensors.items()}, fsync=fsync, storage=storage,
                              metadata=metadata)
        except BaseException as exc:  # the driver is waiting on this file: tell it why it will not come
            # The partial file is gone already (write_sample_file removes it), which gives a full disk room for
            # the message; should even that fail, the empty marker still tells the driver to stop waiting.
            try:
                with open(path + ".failed", "w") as f:
                    f.write(f"{type(exc).__name__}: {exc}\n")
            except OSError:
                pass
            raise

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        if self.has_connector_metadata():
            metadata = self._get_connector_metadata()
            if isinstance(metadata, _WriteMetadata):
                for write in metadata.writes:
                    self._held.add(write.req_id)
                    if self._is_writer:
                        self._submit(write)
        # Only requests whose blocks are held may be reported: the others (the 1-token flush request, anything not
        # ours) were freed by the scheduler when they finished, and reporting one would trip its bookkeeping.
        # A request's write and its "finished" come with the same step (both are made by one schedule() call).
        self._finished.update(r for r in finished_req_ids if r in self._held)
        sent: set[str] = set()
        for req_id in list(self._finished):
            event = self._copy_events.get(req_id)
            if event is not None and not event.query():
                continue  # the device-to-host copy is still running; its blocks must stay allocated
            self._copy_events.pop(req_id, None)
            self._finished.discard(req_id)
            self._held.discard(req_id)
            sent.add(req_id)
        return (sent or None), None

    def shutdown(self) -> None:
        self._executor.shutdown(wait=True)

    # ------------------------------------------------------------- scheduler side
    def get_num_new_matched_tokens(self, request: "Request", num_computed_tokens: int) -> tuple[int | None, bool]:
        return 0, False

    def update_state_after_alloc(self, request: "Request", blocks: Any, num_external_tokens: int) -> None:
        return None

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KVConnectorMetadata:
        metadata = _WriteMetadata(writes=list(self._pending.values()))
        self._pending.clear()
        return metadata

    def request_finished(self, request: "Request", block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        params = request.kv_transfer_params or {}
        path = params.get(PATH_KEY)
        if path is None or request.prompt_token_ids is None:
            # Not a sample (or aborted before it ran): nothing to write.
            return False, ({FLUSH_KEY: True} if params.get(FLUSH_KEY) else None)
        self._pending[request.request_id] = _PendingWrite(
            req_id=request.request_id,
            path=str(path),
            token_ids=list(request.prompt_token_ids),
            loss_mask=params.get(LOSS_MASK_KEY),
            block_ids=list(block_ids),
        )
        # True: keep the blocks until get_finished reports the copy done.
        return True, {WRITTEN_PATH_KEY: path}

    def request_finished_all_groups(
        self, request: "Request", block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        if not 0 <= self._group_id < len(block_ids):
            return False, None
        return self.request_finished(request, block_ids[self._group_id])

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: "VllmConfig") -> str | None:
        # One token's layers stay together in memory. "NHD" is the name every vLLM version accepts: up to 0.26 it
        # is one of the two layouts there are, later versions read it as an alias of "LBNHC".
        return "NHD"
