"""Extraction engines. Each writes ``hs_{id}.safetensors`` files for a batch of samples.

* ``vllm``: vLLM's native ``extract_hidden_states`` speculative method, tensor parallel, with eaglewatch's own
  KV connector writing the files (``vllm_connector.py``).
* ``hf``: transformers with forward hooks on the decoder layers; for small models, the CPU and cross-checks.

Layer id k means the same in both: the residual stream after k decoder layers (0 = the embeddings;
``num_hidden_layers`` = the last layer's output **before** the final norm, unlike HF's
``hidden_states[-1]``, which is after it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, Sequence

if TYPE_CHECKING:
    from pathlib import Path

    from eaglewatch.pipeline.prepared_data import Sample

ENGINES = ("vllm", "hf")


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
