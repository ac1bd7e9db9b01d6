"""The engine options, defined once: each field carries its flag, help text and default.

``extract`` and ``preflight`` add them to their parsers (``add_engine_arguments``), the extraction config
inherits them, and ``make_engine`` and the engines take an ``EngineOptions``. Stdlib only, so that building a
parser never imports an engine.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, fields

from eaglewatch.errors import UserError
from eaglewatch.pipeline import flags
from eaglewatch.pipeline.flags import ArgumentAdder, flag
from eaglewatch.pipeline.model_info import DTYPE_ALIASES
from eaglewatch.pipeline.output import STORAGE_DTYPE, STORAGES

ENGINES = ("vllm", "hf")
# What the engines compute in (``--dtype``): fp8 and the like are weight formats, not activation dtypes.
COMPUTE_DTYPES = ("float32", "bfloat16", "float16")
SEED_MAX = 2**32 - 1  # numpy's seeds, which vLLM sets from --seed
# The stream's default bound on hidden states waiting for the disk (--max-in-flight-tokens): on a GPU host they wait
# in pinned host memory, which the kernel cannot swap out.
IN_FLIGHT_BYTES = 8 << 30


def at_least(flag_name: str, value: int | None, low: int) -> str | None:
    """The problem with an integer flag below ``low``, or None."""
    if value is None or value >= low:
        return None
    return f"{flag_name} must be at least {low} (got {value})"


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
    exact: bool = flag(False, "fixed batches of --batch-size, one engine call each, engine core in-process: the "
                              "files are bit-identical from run to run and across kill -9 and resume, but the "
                              "engine drains at every batch's end (vllm; slower on uneven lengths)",
                       action="store_true")
    max_in_flight: int = flag(1024, "samples handed to vLLM whose files are not on disk yet, at most (default "
                                    "1024): the stream's window", type=int)
    max_in_flight_tokens: int | None = flag(
        None, "tokens of those samples, at most (default: what 8 GiB of hidden states hold, at least one sample "
              "of --max-seq-len)", type=int)
    fsync: bool = flag(True, "make the files durable against a power loss (default): the output's filesystem is "
                             "synced every --sync-interval seconds, off the engine's path, and the manifest records "
                             "how far each sync reached. --no-fsync leaves the write-back to the kernel: still atomic "
                             "for a killed process, not safe against a power loss",
                       action=argparse.BooleanOptionalAction)
    sync_interval: float = flag(10.0, "seconds between two syncs of the output's filesystem (default 10); 0 syncs "
                                      "each file before its rename instead (every file durable once named; slowest "
                                      "when the disk is the limit)", type=float)
    engine_core_process: bool | None = flag(
        None, "run vLLM's engine core in its own process (default: on GPUs, except with --exact; in-process on CPU, "
              "where the extra process competes for the cores)", action=argparse.BooleanOptionalAction)
    write_timeout: float = flag(600.0, "seconds to wait for a batch's files (default 600)", type=float)
    fast_start: bool = flag(False, "start vLLM for a few short samples (the preflight's miniature): a small "
                                   "profile run and no kernel autotuning", action="store_true")
    # Apart from --dtype, which is what the engine computes in (and what verify's floors are made in): the storage
    # is what the writer does with the computed states on their way to the disk.
    storage: str = flag(STORAGE_DTYPE, "how the files keep the hidden states: dtype = as computed, in --dtype "
                                       "(default); fp8 = float8_e4m3fn with one float32 scale per token, "
                                       "speculators' FP8 layout (half of bf16's bytes; the rounding's error per "
                                       "layer is recorded)", choices=STORAGES)

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise UserError("; ".join(problems))

    def problems(self) -> list[str]:
        """Every option out of its range, one clear phrase each (checked before anything is read or written)."""
        found = [p for p in (at_least("--tp-size", self.tp_size, 1), at_least("--max-seq-len", self.max_seq_len, 1),
                             at_least("--kv-cache-memory-bytes", self.kv_cache_memory_bytes, 1)) if p]
        if self.engine not in ENGINES:
            found.append(f"--engine must be one of {', '.join(ENGINES)} (got {self.engine!r})")
        elif self.engine == "hf" and self.tp_size > 1:
            found.append("the hf engine runs on one device; use --tp-size 1 or --engine vllm")
        if self.dtype is not None and DTYPE_ALIASES.get(self.dtype, self.dtype) not in COMPUTE_DTYPES:
            found.append(f"--dtype must be one of {', '.join(COMPUTE_DTYPES)} (got {self.dtype!r})")
        if not 0 < self.gpu_memory_utilization <= 1:  # also false for NaN
            found.append(f"--gpu-memory-utilization is a share of each GPU's memory: more than 0, at most 1 "
                         f"(got {self.gpu_memory_utilization})")
        if not 0 <= self.seed <= SEED_MAX:
            found.append(f"--seed must be in 0..{SEED_MAX} (got {self.seed})")
        found += [p for p in (at_least("--max-in-flight", self.max_in_flight, 1),
                              at_least("--max-in-flight-tokens", self.max_in_flight_tokens, 1)) if p]
        if not self.sync_interval >= 0 or math.isinf(self.sync_interval):  # also false for NaN
            found.append(f"--sync-interval must be a number of seconds, 0 or more (got {self.sync_interval})")
        if self.exact and self.engine_core_process:
            found.append("--exact runs vLLM's engine core in-process (its batches then do not depend on timing); "
                         "drop --engine-core-process")
        if self.storage not in STORAGES:
            found.append(f"--storage must be one of {', '.join(STORAGES)} (got {self.storage!r})")
        if not self.write_timeout > 0 or math.isnan(self.write_timeout):
            found.append(f"--write-timeout must be a positive number of seconds (got {self.write_timeout})")
        return found

    @property
    def fsync_each_file(self) -> bool:
        """The writers fsync every file before its rename (``--sync-interval 0``)."""
        return self.fsync and self.sync_interval == 0

    @property
    def periodic_sync(self) -> bool:
        """The driver syncs the output's filesystem every ``sync_interval`` seconds (the default)."""
        return self.fsync and self.sync_interval > 0

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
