"""The engine options, defined once: each field carries its flag, help text and default.

``extract`` and ``preflight`` add them to their parsers (``add_engine_arguments``), the extraction config
inherits them, and ``make_engine`` and the engines take an ``EngineOptions``. Stdlib only, so that building a
parser never imports an engine.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields

from eaglewatch.pipeline import flags
from eaglewatch.pipeline.flags import ArgumentAdder, flag

ENGINES = ("vllm", "hf")


@dataclass(frozen=True, kw_only=True)
class EngineOptions:
    """How the engine runs; ``dtype`` None means the model's own."""

    engine: str = flag("vllm", "extraction engine (default vllm)", choices=ENGINES)
    tp_size: int = flag(1, "tensor parallel size (vllm engine)", type=int)
    dtype: str | None = flag(None, "float32, bfloat16 or float16 (default: the model's)")
    max_seq_len: int = flag(2048, "longest sample in tokens (default 2048); see --long-samples", type=int)
    gpu_memory_utilization: float = flag(0.9, "share of each GPU's memory vLLM may take (default 0.9)",
                                         type=float)
    kv_cache_memory_bytes: int | None = flag(
        None, "KV cache size per device; overrides --gpu-memory-utilization (default on CPU: 512 MiB)", type=int)
    enforce_eager: bool | None = flag(None, "disable CUDA graphs / compilation (default: on for CPU, off for GPU)",
                                      action=argparse.BooleanOptionalAction)
    trust_remote_code: bool = flag(False, "let transformers and vLLM run the model folder's own code",
                                   action="store_true")
    seed: int = flag(0, "engine random seed (default 0)", type=int)
    fsync: bool = flag(True, "fsync each file before its rename (default). --no-fsync leaves the write-back to the "
                             "kernel: faster when the disk is the bottleneck, still atomic for a killed process, "
                             "but not safe against a power loss", action=argparse.BooleanOptionalAction)
    engine_core_process: bool = flag(False, "run vLLM's engine core in its own process (faster scheduling, but "
                                            "files are no longer bit-identical across runs)", action="store_true")
    write_timeout: float = flag(600.0, "seconds to wait for a batch's files (default 600)", type=float)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "EngineOptions":
        return flags.from_args(cls, args)

    def engine_options(self) -> "EngineOptions":
        """Only the engine options (of a config that extends them)."""
        if type(self) is EngineOptions:
            return self
        return EngineOptions(**{f.name: getattr(self, f.name) for f in fields(EngineOptions)})


def add_engine_arguments(parser: ArgumentAdder) -> None:
    flags.add_flags(parser, EngineOptions)
