"""Known failures: a table of rows, each a pattern with a title and a hint.

A row matches a failure when every condition it sets holds:

* ``types``: a regex that fully matches the short type of one exception of the chain (or a leaf of a group);
* ``match``: a regex searched in the failure's messages, the log message that introduced it and the
  innermost source line of each exception;
* ``frames``: a regex searched in the frames (``file:function: source`` per line);
* ``kinds``: the failure kinds it applies to (traceback, fatal, abort, death);
* ``signals``: a regex that fully matches the signal the process died of;
* ``needs``: flags the caller knows ("silent": no traceback explains this process's end).

``figures`` are regexes with named groups searched in the same text; what they find goes with the hint, so
"GPU out of memory" comes with how much was asked for and how much was free. The first matching row wins,
so more specific rows come first. Adding a hint is adding a row (and its test).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Mapping, Optional

from eaglewatch.decode.events import KIND_ABORT, KIND_DEATH, KIND_FATAL, Failure

_SIZE = r"[\d.]+ ?[KMGTP]i?B"


@dataclass(frozen=True)
class HintRule:
    id: str
    title: str
    text: str
    types: Optional[str] = None
    match: Optional[str] = None
    frames: Optional[str] = None
    kinds: tuple[str, ...] = ()
    signals: Optional[str] = None
    needs: tuple[str, ...] = ()
    figures: tuple[str, ...] = ()
    facts: tuple[str, ...] = ()  # facts about the run (e.g. "vllm_version") to show with the hint


@dataclass(frozen=True)
class Hint:
    id: str
    title: str
    text: str
    figures: Mapping[str, str] = field(default_factory=dict)
    row: int = -1  # index of the matching row in RULES

    def as_dict(self) -> dict[str, object]:
        return {"id": self.id, "title": self.title, "text": self.text, "figures": dict(self.figures)}


_API_TEXT = (
    "The calling code was written for another vLLM version than the one installed. Compare `pip show vllm` "
    "with the version the pipeline pins and install that one, or update the call."
)

RULES: tuple[HintRule, ...] = (
    HintRule(
        "spawn_main_guard",
        "Script starts vLLM without a main guard",
        "vLLM starts its engine with the 'spawn' method, which imports the main script again in the child. "
        'Put the code that creates the LLM under `if __name__ == "__main__":`.',
        match=r"start a new process before the\s+current process has finished its bootstrapping phase"
        r"|freeze_support\(\)",
    ),
    HintRule(
        "vllm_51016_page_size",
        "vLLM #51016: KV cache page size assertion at tensor parallel >= 2",
        "A known vLLM bug (vllm-project/vllm#51016) in vLLM 0.25.1 to 0.26 with tensor_parallel_size >= 2: "
        "page-size unification leaves a padded page smaller than the real one. Use a vLLM release outside "
        "that range, or run with --tensor-parallel-size 1.",
        # vLLM 0.26.0 asserts `self.page_size_padded >= self.unpadded_page_size_bytes`; reports quote it as
        # `page_size_padded >= real_page_size`. Either spelling, in the message or the failing source line.
        match=r"page_size_padded\s*>=\s*(?:self\.)?(?:real_page_size|unpadded_page_size_bytes)",
        facts=("vllm_version", "tensor_parallel_size"),
    ),
    HintRule(
        "block_hashes_assertion",
        "Request reached the KV connector without block hashes",
        "vLLM hashes a prompt per full KV-cache block, so a prompt shorter than one block (block_size tokens, "
        "often 16) has no block hashes, and neither has any request when the connector and the scheduler "
        "disagree about prefix caching. Make every prompt at least one block long, keep prefix caching on, "
        "and use the hidden-states connector that ships with the installed vLLM.",
        types=r"AssertionError",
        match=r"block_hashes",
        facts=("vllm_version",),
    ),
    HintRule(
        "weight_shape_mismatch",
        "Weight shape mismatch while loading the checkpoint",
        "A checkpoint tensor's shape differs from the model parameter it is loaded into: the model config "
        "(hidden size, heads, vocabulary, tensor-parallel split) does not match the weights, or a shard "
        "belongs to another model. Check config.json against the shards.",
        match=r"shape mismatch|size mismatch|Attempted to load weight|\.shape\s*(?:==|!=)"
        r"|shapes? (?:do(?:es)? not|don't) match",
        frames=r"load_weights?|weight_loader|model_loader|load_state_dict",
        figures=(
            r"Attempted to load weight \(torch\.Size\(\[(?P<checkpoint_shape>[\d, ]*)\]\)\) into parameter "
            r"\(torch\.Size\(\[(?P<parameter_shape>[\d, ]*)\]\)\)",
            r"size mismatch for (?P<parameter>[\w.]+)",
        ),
    ),
    HintRule(
        "safetensors_shard",
        "Missing or corrupt safetensors shard",
        "A checkpoint shard is missing, truncated or not a safetensors file (an interrupted download or copy, "
        "a Git LFS pointer). Compare the shard sizes with model.safetensors.index.json and fetch it again.",
        match=r"SafetensorError|safetensors_rust|HeaderTooLarge|MetadataIncompleteBuffer|InvalidHeader"
        r"|incomplete metadata|Error while deserializing header"
        r"|(?:FileNotFoundError|No such file or directory)[^\n]*\.safetensors"
        r"|\.safetensors'? (?:not found|does not exist|is missing)|Cannot find any model weights"
        r"|no (?:safetensors|model weights) (?:files )?found",
        figures=(r"(?P<file>[\w.\-/]*\.safetensors)",),
    ),
    HintRule(
        "pin_memory_without_gpu",
        "Pinned memory requested on a machine without a GPU",
        "Something asked for pinned (page-locked) host memory, which CPU-only torch cannot allocate; vLLM's "
        "stock hidden-states connector does this. On a CPU host use a connector or code path that does not pin "
        "memory (pin_memory=False), or run on a GPU host.",
        match=r"pin_memory=True requires a CUDA|Cannot access accelerator device when none is available"
        r"|pinned memory (?:requires|is not available)",
    ),
    HintRule(
        "cuda_oom",
        "GPU out of memory",
        "The GPU ran out of memory. Lower --gpu-memory-utilization, --max-num-seqs or --max-model-len, or "
        "spread the model over more GPUs; check with nvidia-smi that no other process holds GPU memory.",
        match=r"CUDA out of memory|CUDA [Ee]rror: out of memory|cudaErrorMemoryAllocation|HIP out of memory"
        r"|OutOfMemoryError",
        figures=(
            r"Tried to allocate (?P<requested>" + _SIZE + ")",
            r"total capacity of (?P<total>" + _SIZE + ")",
            r"(?P<total>" + _SIZE + r") total capacity",
            r"of which (?P<free>" + _SIZE + ") is free",
            r"(?P<free>" + _SIZE + r") free;",
            r"this process has (?P<in_use>" + _SIZE + r") memory in use",
            r"(?P<allocated>" + _SIZE + r") is allocated by PyTorch",
            r"(?P<allocated>" + _SIZE + r") already allocated",
            r"GPU (?P<gpu>\d+)",
        ),
    ),
    HintRule(
        "cuda_kernel_error",
        "CUDA kernel error",
        "A GPU kernel failed. CUDA reports such errors late, so the traceback may point at a later call: rerun "
        "with CUDA_LAUNCH_BLOCKING=1 to see the kernel. A device-side assert usually means an index out of "
        "range, such as a token id at or above the vocabulary size; an illegal memory access can also come from "
        "a driver, CUDA and torch that do not match.",
        match=r"CUDA [Ee]rror: (?!out of memory)|device-side assert(?:ion)? triggered|cudaError(?!MemoryAllocation)\w+"
        r"|CUBLAS_STATUS_\w+|CUDNN_STATUS_\w+|Failed: Cuda error ",
        figures=(
            r"Cuda error \S+ '(?P<cuda_error>[^']+)'",
            r"CUDA [Ee]rror: (?P<cuda_error>[^\n.]+?)(?= at \S+:\d|\.|\n|$)",
            r"(?P<status>CUBLAS_STATUS_\w+|CUDNN_STATUS_\w+)",
        ),
    ),
    HintRule(
        "cuda_unavailable",
        "No usable GPU",
        "The process found no GPU it could use: CUDA_VISIBLE_DEVICES names none, the driver is older than the "
        "CUDA build of torch, or the GPUs are busy in exclusive mode. Check nvidia-smi, CUDA_VISIBLE_DEVICES "
        "and `python -c 'import torch; print(torch.cuda.is_available())'`.",
        match=r"No CUDA GPUs are available|CUDA driver version is insufficient|Found no NVIDIA driver"
        r"|no CUDA-capable device is detected|Torch not compiled with CUDA enabled"
        r"|Failed to infer device type|CUDA-capable device\(s\) is/are busy or unavailable",
    ),
    HintRule(
        "model_not_found",
        "Model path or name not found",
        "The model could not be found: the path is wrong or incomplete (no config.json), the Hugging Face "
        "repository name is wrong or gated, or the host is offline (HF_HUB_OFFLINE) without the model cached. "
        "Point at a local folder with config.json, tokenizer and weights.",
        match=r"does not appear to have a file named|Repository Not Found|is not a local folder and is not a valid "
        r"model identifier|Can't load (?:the )?(?:configuration|tokenizer) (?:of|for)|We couldn't connect to "
        r"'https://huggingface.co'|Cannot access gated repo|Invalid repository ID or local directory",
        figures=(r"(?:folder|directory|path|identifier)[: ]+'?(?P<model>[\w./\-]+?)'?(?: |$|,)",),
    ),
    HintRule(
        "startup_memory_check",
        "Not enough free memory for the requested memory utilization",
        "vLLM reserves --gpu-memory-utilization of the device's total memory at start-up (on the CPU backend "
        "the same flag sizes host memory) and fails when less than that is free. Lower the flag below "
        "free/total, or stop what else uses the memory.",
        match=r"memory on (?:node|device) .*on startup is less than desired (?:CPU|GPU) memory utilization",
        figures=(
            r"\((?P<free_gib>[\d.]+)/(?P<total_gib>[\d.]+) GiB\) on startup",
            r"memory utilization \((?P<utilization>[\d.]+), (?P<wanted_gib>[\d.]+) GiB\)",
            r"memory on (?P<device>node \d+|device(?: \d+)?)",
        ),
    ),
    HintRule(
        "kv_cache_too_small",
        "KV cache too small",
        "After loading the weights too little memory is left for the KV cache. Raise "
        "--gpu-memory-utilization, or lower --max-model-len or --max-num-seqs.",
        match=r"No available memory for the cache blocks|larger than the maximum number of tokens that can be "
        r"stored in KV cache|KV cache is needed, which is larger than the available",
        figures=(
            r"max seq len \((?P<max_model_len>\d+)\)",
            r"stored in KV cache \((?P<kv_cache_tokens>\d+)\)",
            r"(?P<needed>[\d.]+ GiB) KV cache is needed",
            r"available KV cache memory \((?P<available>[\d.]+ GiB)\)",
        ),
    ),
    HintRule(
        "cpu_oom",
        "Host (CPU) out of memory",
        "The process could not get host memory. Reduce what is held in RAM (batch size, number of workers, "
        "--swap-space, CPU KV cache size) or use a machine with more memory; check `free -g`.",
        types=r"MemoryError|_ArrayMemoryError",
        figures=(r"allocate (?P<requested>" + _SIZE + ")",),
    ),
    HintRule(
        "cpu_oom",
        "Host (CPU) out of memory",
        "The process could not get host memory. Reduce what is held in RAM (batch size, number of workers, "
        "--swap-space, CPU KV cache size) or use a machine with more memory; check `free -g`.",
        match=r"DefaultCPUAllocator: (?:not enough memory|can't allocate memory)|Cannot allocate memory"
        r"|std::bad_alloc|Unable to allocate [\d.]+ ?[KMGTP]i?B",
        figures=(
            r"you tried to allocate (?P<requested_bytes>\d+) bytes",
            r"Unable to allocate (?P<requested>" + _SIZE + ")",
        ),
    ),
    HintRule(
        "disk_full",
        "Disk full",
        "A write failed because the file system is full (or out of inodes, or over quota). Hidden states are "
        "large: check `df -h` and `df -i` on the output folder, free space or point the output elsewhere.",
        match=r"No space left on device|Errno 28\]|Disk quota exceeded|ENOSPC",
        figures=(r"No space left on device: '(?P<path>[^']+)'",),
    ),
    HintRule(
        "collective_comm",
        "Collective communication error (NCCL / gloo)",
        "A collective operation between ranks failed or timed out. This is often a consequence: look for the "
        "rank that failed first. Otherwise rerun with NCCL_DEBUG=INFO, check NCCL_SOCKET_IFNAME / "
        "GLOO_SOCKET_IFNAME, the size of /dev/shm in containers, and that every rank sees the same GPUs.",
        match=r"\bNCCL\b|\bnccl[A-Z]\w*|ProcessGroupNCCL|\b[Gg]loo\b|DistBackendError|DistNetworkError"
        r"|Watchdog caught collective operation timeout|\bc10d\b",
        figures=(
            r"\[Rank (?P<rank>\d+)\]",
            r"(?P<nccl_error>nccl\w*Error\w*|unhandled (?:system|cuda) error|remote process exited or there was "
            r"a network error)",
            r"Timeout\(ms\)=(?P<timeout_ms>\d+)",
            r"NCCL version (?P<nccl_version>[\d.]+\+?\w*)",
        ),
    ),
    HintRule(
        "vllm_api_mismatch",
        "vLLM API or version mismatch",
        _API_TEXT,
        types=r"TypeError",
        match=r"unexpected keyword argument|got multiple values for (?:keyword )?argument"
        r"|takes \d+ positional arguments? but \d+ (?:were|was) given|missing \d+ required (?:positional|keyword)",
        frames=r"/vllm/",
        facts=("vllm_version",),
        figures=(r"unexpected keyword argument '(?P<argument>\w+)'", r"(?P<callable>[\w.]+)\(\) (?:got|takes|missing)"),
    ),
    HintRule(
        "vllm_api_mismatch",
        "vLLM API or version mismatch",
        _API_TEXT,
        types=r"TypeError",
        match=r"(?:LLM|LLMEngine|AsyncLLM\w*|SamplingParams|EngineArgs|\w+Config|\w*Connector\w*)\.?\w*\(\) got an "
        r"unexpected keyword argument",
        facts=("vllm_version",),
        figures=(r"unexpected keyword argument '(?P<argument>\w+)'", r"(?P<callable>[\w.]+)\(\) got"),
    ),
    HintRule(
        "vllm_api_mismatch",
        "vLLM API or version mismatch",
        _API_TEXT,
        types=r"AttributeError",
        match=r"module 'vllm[\w.]*' has no attribute|'(?:LLM|LLMEngine|AsyncLLM\w*|SamplingParams|EngineArgs|\w+Config"
        r"|\w*Connector\w*|RequestOutput|CompletionOutput)' object has no attribute",
        facts=("vllm_version",),
        figures=(r"has no attribute '(?P<attribute>\w+)'",),
    ),
    HintRule(
        "vllm_api_mismatch",
        "vLLM API or version mismatch",
        _API_TEXT,
        types=r"AttributeError",
        match=r"has no attribute",
        frames=r"/vllm/[^\n]*$",
        facts=("vllm_version",),
        figures=(r"has no attribute '(?P<attribute>\w+)'",),
    ),
    HintRule(
        "vllm_api_mismatch",
        "vLLM API or version mismatch",
        _API_TEXT,
        types=r"ImportError|ModuleNotFoundError",
        match=r"cannot import name '\w+' from '?vllm|No module named '?vllm[\w.]*",
        facts=("vllm_version",),
        figures=(
            r"cannot import name '(?P<name>\w+)' from '(?P<module>[\w.]+)'",
            r"No module named '(?P<module>[\w.]+)'",
        ),
    ),
    HintRule(
        "killed_sigkill",
        "Killed by SIGKILL (probably the out-of-memory killer)",
        "Nothing inside the process can catch SIGKILL: most often the kernel's OOM killer took it because the "
        "host ran out of memory (see `dmesg` or `journalctl -k` for 'Out of memory'), or a scheduler or "
        "operator killed it. Reduce host memory use or raise the job's memory limit.",
        kinds=(KIND_DEATH, KIND_FATAL),
        signals=r"SIGKILL",
    ),
    HintRule(
        "killed_signal",
        "Process crashed in native code",
        "The process died of a signal raised in native code (a CUDA kernel, the driver, a C extension), so "
        "Python printed no traceback. Rerun with PYTHONFAULTHANDLER=1 (and CUDA_LAUNCH_BLOCKING=1 on GPUs) "
        "to see where; check driver, CUDA and torch versions agree.",
        kinds=(KIND_DEATH, KIND_FATAL),
        signals=r"SIGSEGV|SIGBUS|SIGILL|SIGFPE",
    ),
    HintRule(
        "killed_signal",
        "Process killed by a signal",
        "The process was ended by a signal rather than an exception. If nobody stopped it on purpose, look "
        "for the sender: the job scheduler's time or memory limit, the parent shutting down, or an abort.",
        kinds=(KIND_DEATH, KIND_FATAL, KIND_ABORT),
        signals=r".+",
    ),
    HintRule(
        "died_without_traceback",
        "A process died without a traceback",
        "A process ended without printing why: it was killed from outside (the OOM killer, a scheduler, "
        "kill -9) or crashed in native code. Check `dmesg` for the OOM killer and the exit code; rerun with "
        "PYTHONFAULTHANDLER=1 to catch a native crash.",
        needs=("silent",),
    ),
)

@dataclass(frozen=True)
class _Patterns:
    """A rule's regular expressions, compiled once."""

    types: Optional[re.Pattern[str]]
    match: Optional[re.Pattern[str]]
    frames: Optional[re.Pattern[str]]
    signals: Optional[re.Pattern[str]]
    figures: tuple[re.Pattern[str], ...]


_COMPILED: list[tuple[HintRule, _Patterns]] = []


def _compiled() -> list[tuple[HintRule, _Patterns]]:
    if not _COMPILED:
        for rule in RULES:
            _COMPILED.append(
                (
                    rule,
                    _Patterns(
                        types=re.compile(rule.types) if rule.types else None,
                        match=re.compile(rule.match, re.S) if rule.match else None,
                        frames=re.compile(rule.frames, re.M) if rule.frames else None,
                        signals=re.compile(rule.signals) if rule.signals else None,
                        figures=tuple(re.compile(f) for f in rule.figures),
                    ),
                )
            )
    return _COMPILED


def failure_text(failure: Failure) -> str:
    """What ``match`` and ``figures`` search: messages, the introducing log message, innermost sources."""
    parts: list[str] = []
    for exc in failure.exceptions:
        for item in (exc, *exc.sub_exceptions):
            parts.append(f"{item.exc_type}: {item.message}")
            inner = item.innermost
            if inner is not None and inner.source:
                parts.append(inner.source)
    if failure.context:
        parts.append(failure.context)
    return "\n".join(parts)


def frames_text(failure: Failure) -> str:
    lines = []
    for exc in failure.exceptions:
        for item in (exc, *exc.sub_exceptions):
            for frame in item.frames:
                lines.append(f"{frame.file}:{frame.function}: {frame.source or ''}")
    return "\n".join(lines)


def _types(failure: Failure) -> list[str]:
    out = []
    for exc in failure.exceptions:
        for item in (exc, *exc.sub_exceptions):
            out.append(item.short_type)
            if item.exc_type.endswith(")") and "(" in item.exc_type:
                # A wrapper naming what it wraps: RayTaskError(torch.OutOfMemoryError)
                out.append(item.exc_type[item.exc_type.index("(") + 1 : -1].rsplit(".", 1)[-1])
    return out


def classify(
    failure: Failure,
    *,
    flags: frozenset[str] = frozenset(),
    facts: Optional[Mapping[str, object]] = None,
) -> Optional[Hint]:
    """The first row that matches ``failure``, with its figures; None when no row does."""
    text = failure_text(failure)
    frames: Optional[str] = None
    types = _types(failure)
    signal = failure.signal or ""
    for row, (rule, pats) in enumerate(_compiled()):
        if rule.kinds and failure.kind not in rule.kinds:
            continue
        if any(flag not in flags for flag in rule.needs):
            continue
        sig_re = pats.signals
        if sig_re is not None and not sig_re.fullmatch(signal):
            continue
        type_re = pats.types
        if type_re is not None and not any(type_re.fullmatch(t) for t in types):
            continue
        match_re = pats.match
        if match_re is not None and not match_re.search(text):
            continue
        frames_re = pats.frames
        if frames_re is not None:
            if frames is None:
                frames = frames_text(failure)
            if not frames_re.search(frames):
                continue
        figures: dict[str, str] = {}
        for pattern in pats.figures:
            found = pattern.search(text)
            if found:
                for key, value in found.groupdict().items():
                    if value is not None and key not in figures:
                        figures[key] = value.strip()
        if signal and rule.signals:
            figures.setdefault("signal", signal)
        for fact in rule.facts:
            value = (facts or {}).get(fact)
            if value is not None:
                figures.setdefault(fact, str(value))
        return Hint(rule.id, rule.title, rule.text, figures, row)
    return None

