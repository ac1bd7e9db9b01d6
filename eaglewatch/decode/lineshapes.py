"""The catalogue of one-line failure shapes: fatal lines that are not Python exceptions, one row each.

A row says how a shape is found and read: its ``triggers`` (cheap substrings, one of which the line must hold),
its ``pattern``, how the match becomes a failure (``read``), the decoder's ``basis`` for it, the lines that must
come before it (``after``: a prefix, such as argparse's ``usage:``), and the public threads its example comes
from. Rows are tried in order; the first that reads the line wins.

Everything else is made from the rows: the gate that the decoder asks of every line (:func:`may_be_shape`, made
from all triggers by ``gate.py``, so a row's trigger cannot be forgotten in a filter), the markers it keeps per lane
(:data:`MARKERS`), the example files' golden tests (``tests/test_decode_shapes.py``, examples in
``tests/fixtures/shapes/<name>.log``) and the shapes table of ``docs/decode.md``.

Adding a shape is adding a row here and its example file; nothing else names it. Python tracebacks are not rows:
they span lines and chain, and ``traceback.py`` reads them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional

from eaglewatch.decode.deaths import signal_name
from eaglewatch.decode.events import (
    KIND_NATIVE,
    KIND_TRACEBACK,
    KIND_WATCHDOG,
    LIKELY,
    ExceptionRecord,
    Frame,
    TracebackEvent,
)
from eaglewatch.decode.exclass import class_from_message
from eaglewatch.decode.frames import frame_kind
from eaglewatch.decode.gate import holds_any, make_gate
from eaglewatch.decode.nativereports import BASIS_RPC
from eaglewatch.decode.stackdump import BASIS_STACK_DUMP

WATCHDOG_TYPE = "NCCL watchdog timeout"
NATIVE_CUDA_TYPE = "CUDA Error"
TORCH_CUDA_ERROR = "torch.AcceleratorError"
RAY_NODE_DIED = "Ray node died"
USAGE_ERROR = "Usage error"
CHECK_FAILED = "Check failed"
RAY_MEMORY_KILL = "Killed by Ray's memory monitor"
TORCH_CHECK_TYPE = "RuntimeError"  # the class a failed TORCH_CHECK raises (c10::Error, as Python sees it)
CTYPES_MISSING_TYPE = "AttributeError"  # the class ctypes raises for a function a library does not export
PEFT_MERGE_TYPE = "ValueError"  # the class peft raises when it refuses to merge adapters into the base model
ROPE_SCALING_TYPE = "ValueError"  # the class transformers' config raises for a rope_scaling it cannot read
# The class vLLM's Qwen2 model raises (0.7.3's, among others) when sliding window is on for some layers only,
# whatever the two layer counts; other versions and models assert the same words (an AssertionError), which fails
# only when the counts differ. So wrappers are not told this class (exclass.py): its words are not one class's.
SLIDING_WINDOW_TYPE = "ValueError"
MISSING_FILE_TYPE = "OSError"  # the class transformers raises (as EnvironmentError) for a file a repo lacks
# What a death by each signal is called (a shell's words), by its Linux number: a launcher that reports a child's
# signal by number ran it on Linux, whatever machine reads the log.
_LINUX_SIGNALS = {4: "SIGILL", 6: "SIGABRT", 7: "SIGBUS", 8: "SIGFPE", 9: "SIGKILL", 11: "SIGSEGV", 15: "SIGTERM"}
_SIGNAL_DEATH = {"SIGSEGV": "Segmentation fault", "SIGBUS": "Bus error", "SIGILL": "Illegal instruction",
                 "SIGFPE": "Floating point exception", "SIGABRT": "Aborted", "SIGKILL": "Killed",
                 "SIGTERM": "Terminated"}


class Reading(NamedTuple):
    """What a row read from a line: the failure's type and message, where native code said it failed, the
    signal that ended the process when the line says so, and the rank the report names (``None``: its lane's)."""

    exc_type: str
    message: str
    frame: Optional[Frame] = None
    signal: Optional[str] = None
    rank: Optional[str] = None
    time: Optional[str] = None  # the line's own timestamp, where no logger header gave one


@dataclass(frozen=True)
class Shape:
    name: str  # also the example file's name: tests/fixtures/shapes/<name>.log
    summary: str  # one line for the docs' table
    triggers: tuple[str, ...]  # the line holds at least one (case as written)
    pattern: re.Pattern[str]
    read: Callable[[re.Match[str], str], Optional[Reading]]
    basis: str  # the decoder's word for how it knows
    examples: tuple[str, ...]  # the public threads the example lines come from
    kind: str = KIND_NATIVE
    anchored: bool = False  # the pattern matches at the line's start (else anywhere in its first ``window``)
    window: int = 4000
    every: bool = False  # one failure per match: a line can carry several ranks' reports run together
    after: Optional[str] = None  # only after a line of this lane that starts with this
    after_within: int = 40  # ... at most this many of its lines before
    quiet_too: bool = True  # also a failure on a line logged at INFO or DEBUG (a collector's level, say)

    def matches(self, msg: str) -> list[re.Match[str]]:
        if self.every:
            return list(self.pattern.finditer(msg))
        found = self.pattern.match(msg) if self.anchored else self.pattern.search(msg, 0, self.window)
        return [found] if found is not None else []


def _frame(file: str, line: str, function: Optional[str] = None) -> Frame:
    return Frame(file, int(line), function, None, frame_kind(file))


# ---------------------------------------------------------------------------------------------------- readers


def _watchdog(found: re.Match[str], msg: str) -> Reading:
    return Reading(WATCHDOG_TYPE, found.group(0).strip(), rank=found.group("rank"))


def _watchdog_failure(found: re.Match[str], msg: str) -> Reading:
    return Reading(WATCHDOG_TYPE, msg[found.start():].strip(), rank=found.group("rank"))


def _cuda_check(found: re.Match[str], msg: str) -> Reading:
    file = found.group("f1") or found.group("f2") or found.group("f3") or found.group("f4")
    line = found.group("l1") or found.group("l2") or found.group("l3") or found.group("l4")
    # "CUDA Error: out of memory at x.cpp:56" reads as type and message; the other forms are kept whole.
    text = msg[found.start("m1"):].strip() if found.group("m1") else msg[found.start():].strip()
    return Reading(NATIVE_CUDA_TYPE, text, _frame(file, line))


def _torch_cuda_hint(found: re.Match[str], msg: str) -> Reading:
    return Reading(TORCH_CUDA_ERROR, f"CUDA error: {found.group('code')} (the exception's first line is not in the "
                                     "log; this is PyTorch's line that closes its message)")


def _cann(found: re.Match[str], msg: str) -> Reading:
    return Reading(f"{found.group('mod')} ERROR", found.group("msg").strip(), _frame(found.group("src"),
                                                                                      found.group("line")))


def _device_assert(found: re.Match[str], msg: str) -> Reading:
    return Reading(NATIVE_CUDA_TYPE, f"Assertion `{found.group('check')}` failed. (device-side, in "
                                     f"{found.group('kernel')})",
                   _frame(found.group("file"), found.group("line"), found.group("kernel")))


def _message_as(exc_type: str) -> Callable[[re.Match[str], str], Reading]:
    def read(found: re.Match[str], msg: str) -> Reading:
        return Reading(exc_type, found.group("msg").strip())
    return read


# Quotes a reporter puts around a line, by family (a typographic pair may come reversed: ”...“).
_DOUBLE_QUOTES = "\"\u201c\u201d\u201e\u00ab\u00bb"
_SINGLE_QUOTES = "'\u2018\u2019\u201a\u2039\u203a"
_QUOTES = _DOUBLE_QUOTES + _SINGLE_QUOTES + "`"
# Where a quote of each family closes: the quote, then punctuation at most, then a space or the line's end.
_QUOTE_ENDS = {family: re.compile(f"[{re.escape(family)}]" + r"[.,;:!?)\]]*(?:\s|$)")
               for family in (_DOUBLE_QUOTES, _SINGLE_QUOTES, "`")}


def _nccl_warn_quoted(found: re.Match[str], msg: str) -> Optional[Reading]:
    text = found.group("msg")
    quote = found.group("q")
    if quote:
        family = next(family for family in _QUOTE_ENDS if quote in family)
        end = _QUOTE_ENDS[family].search(text)
        if end is not None:
            text = text[:end.start()]
    elif not found.group("src"):
        return None  # "NCCL WARN" in words, neither quoted nor after NCCL's file:line
    text = text.strip()
    if not text:
        return None
    frame = _frame(found.group("src"), found.group("line")) if found.group("src") else None
    return Reading("NCCL WARN", text, frame)


def _ucx(found: re.Match[str], msg: str) -> Reading:
    return Reading("UCX ERROR", found.group("msg").strip(), _frame(found.group("src"), found.group("line")))


def _ray_core(found: re.Match[str], msg: str) -> Optional[Reading]:
    status = _RAY_STATUS.search(found.group("msg"))
    frame = _frame(found.group("src"), found.group("line"))
    if status is not None:
        return Reading(status.group("status"), status.group("msg").strip(), frame)
    if found.group("lvl") == "F":
        return Reading("Ray fatal error", found.group("msg").strip(), frame)
    return None


def _check_failed(found: re.Match[str], msg: str) -> Reading:
    stamp = found.group("ts") or f"{found.group('gd')} {found.group('gt')}"
    return Reading(CHECK_FAILED, found.group("msg").strip(), _frame(found.group("src"), found.group("line")),
                   time=stamp)


def _ort_cuda(found: re.Match[str], msg: str) -> Reading:
    return Reading(NATIVE_CUDA_TYPE, f"CUDA failure {found.group('code')}: {found.group('msg').strip()}",
                   _frame(found.group("file"), found.group("line")))


def _node_dead(found: re.Match[str], msg: str) -> Reading:
    return Reading(RAY_NODE_DIED, msg[found.start():].strip())


def _watchdog_died(found: re.Match[str], msg: str) -> Reading:
    quoted = found.group("msg").strip()
    return Reading(class_from_message(quoted) or "c10::DistBackendError", quoted)


def _memory_monitor(found: re.Match[str], msg: str) -> Reading:
    return Reading(RAY_MEMORY_KILL, msg[found.start():found.end()].strip(), signal="SIGKILL")


def _usage(found: re.Match[str], msg: str) -> Reading:
    return Reading(USAGE_ERROR, f"{found.group('prog').strip()}: {found.group('msg').strip()}")


def _library(found: re.Match[str], msg: str) -> Reading:
    return Reading(f"{found.group('lib')} error", found.group("msg").strip())


def _signalled(found: re.Match[str], msg: str) -> Reading:
    number = int(found.group("num"))
    name = _LINUX_SIGNALS.get(number) or signal_name(str(number)) or f"signal {number}"
    return Reading(_SIGNAL_DEATH.get(name, f"Killed by {name}"), found.group("notice"), signal=name,
                   rank=found.group("rank"))


def _whole_match_as(exc_type: str) -> Callable[[re.Match[str], str], Reading]:
    def read(found: re.Match[str], msg: str) -> Reading:
        return Reading(exc_type, found.group(0).strip())
    return read


def _field_repr(found: re.Match[str], msg: str) -> Reading:
    # The innermost class is what failed; the wrapper (httpcore's ConnectError) only carries it.
    return Reading(found.group("inner") or found.group("outer"), found.group("msg"))


# A class name as an exception's repr starts: an exception-like ending, so that "exception=Foo(...)" with any
# other object is not read.
_EXC_CLASS = r"(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Timeout|Exit|Interrupt)"
_RAY_STATUS = re.compile(r"\b(?P<status>IOError|Invalid|NotFound|TimedOut|OutOfMemory|ObjectStoreFull|OutOfDisk"
                         r"|RpcError|NotImplemented|UnknownError): (?P<msg>\S.*)")

# ---------------------------------------------------------------------------------------------------- the rows

SHAPES: tuple[Shape, ...] = (
    Shape(
        "nccl-watchdog-timeout", "an NCCL watchdog's collective timeout; several ranks' may run together on a line",
        ("atchdog caught",),
        re.compile(r"(?:\[(?:PG [^\]]*?)?Rank (?P<rank>\d+)\] )?Watchdog caught collective operation timeout: "
                   r"(?P<work>WorkNCCL\((?:[^()]|\([^()]*\))*\)?)(?: ran for \d+ milliseconds before timing out\.?)?"),
        _watchdog, "NCCL watchdog report", ("https://github.com/hiyouga/LlamaFactory/issues/7396",),
        kind=KIND_WATCHDOG, every=True),
    Shape(
        "nccl-watchdog-failure", "PyTorch 2.6 and later: the watchdog's failure at a work sequence id",
        ("detected by watchdog",),
        re.compile(r"(?:\[PG ID \d+ PG GUID [^\]]*?Rank (?P<rank>\d+)\] +)?failure detected by watchdog at work "
                   r"sequence id: (?P<seq>\d+)"),
        _watchdog_failure, "NCCL watchdog report", ("https://github.com/sgl-project/sglang/issues/10216",),
        kind=KIND_WATCHDOG, every=True),
    Shape(
        "cuda-check", "a C++ CUDA check: vLLM's CUDACHECK, an allocator's, the CUDA samples', torch_memory_saver's",
        ("CUDA Error: ", "CUDA error: ", "Cuda error ", "CUDA error at ", "cudaError error: "),
        re.compile(r"CUDA [Ee]rror: (?P<m1>.+?) at (?P<f1>[\w./\-]+\.\w+):(?P<l1>\d+)"
                   r"|Failed: Cuda error (?P<f2>[\w./\-]+\.\w+):(?P<l2>\d+) '(?P<m2>[^']*)'"
                   r"|CUDA error at (?P<f3>[\w./\-]+\.\w+):(?P<l3>\d+) code=(?P<m3>.+)"
                   r"|cudaError error: (?P<m4>\d+ \([^)]*\)) +file=(?P<f4>[\w./\-]+\.\w+) func=\S+ line=(?P<l4>\d+)"),
        _cuda_check, "native error line (no Python exception)",
        ("https://github.com/vllm-project/vllm/pull/12981", "https://github.com/fzyzcjy/torch_memory_saver/issues/99")),
    Shape(
        "torch-cuda-hint", "PyTorch's closing line of a CUDA error whose exception line the paste lost",
        ("Search for `cudaError",),
        re.compile(r"Search for `(?P<code>cudaError\w+)' in https://docs\.nvidia\.com/"),
        _torch_cuda_hint, "PyTorch's CUDA error line, its exception line missing",
        ("https://github.com/noonghunna/club-3090/issues/106",), window=200),
    Shape(
        "cann-error", "Huawei CANN's error line (HCCL, the runtime, the graph engine on Ascend NPUs)",
        ("[ERROR] ",),
        re.compile(r"\[ERROR\] (?P<mod>[A-Z][A-Z_]{1,15})\(\d+,[^)]*\):\S+ \[(?P<src>[\w.]+):(?P<line>\d+)\]"
                   r"(?:\[[^\]]*\])*(?P<msg>.*)"),
        _cann, "CANN error line", ("https://github.com/gpustack/gpustack/issues/2021",), anchored=True),
    Shape(
        "cuda-device-assert", "a CUDA kernel's device-side assertion, one line per failing thread",
        ("Assertion `",),
        re.compile(r"(?P<file>[\w./\-]+\.cuh?):(?P<line>\d+): (?P<kernel>[^:\s][^:]*?): block: \[\d+,\d+,\d+\], "
                   r"thread: \[\d+,\d+,\d+\] Assertion `(?P<check>[^`]*)` failed\."),
        _device_assert, "CUDA device-side assertion", ("https://github.com/sgl-project/sglang/issues/7139",),
        window=2000),
    Shape(
        "nccl-warn", "NCCL's own WARN line, also behind a launcher's bracketed time",
        (" WARN ",),
        re.compile(r"^(?:\[[\d\-:.,T Z]+\] )?\S+:\d+:\d+ \[\d+\] (?:[\w./]+:\d+ )?(?:NCCL )?WARN (?P<msg>\S.*)"),
        _message_as("NCCL WARN"), "NCCL WARN line", ("https://github.com/NVIDIA/nccl-tests/issues/15",),
        anchored=True),
    Shape(
        "nccl-warn-quoted", "NCCL's WARN line quoted without its host:pid:tid [dev] prefix (straight or typographic "
        "quotes, backticks), or from its file:line on", ("NCCL WARN ",),
        re.compile(r"(?:^|(?<=\s))(?P<q>[" + _QUOTES + r"])?"
                   r"(?:(?P<src>[\w./\-]+\.(?:cc|cpp|cu|c|h|hpp)):(?P<line>\d+) )?NCCL WARN (?P<msg>\S.*)"),
        _nccl_warn_quoted, "NCCL WARN line", ("https://github.com/NVIDIA/nccl/issues/1129",),
        window=2000, quiet_too=False),
    Shape(
        "ucx-error", "UCX's error line (NIXL, LMCache, Mooncake transports)",
        ("UCX",),
        re.compile(r"(?P<src>[\w.]+\.c):(?P<line>\d+) +UCX +ERROR +(?P<msg>\S.*)"),
        _ucx, "UCX error line", ("https://github.com/LMCache/LMCache/issues/725",), window=400),
    Shape(
        "glog-check-failed", "a C++ CHECK that failed (glog or Ray's logger, severity F or C): the process aborts",
        ("Check failed: ",),
        re.compile(r"(?:\[(?P<ts>\d{4}-\d\d-\d\d [\d:,.]+) [CF] \d+ \d+\] |\b[CF](?P<gd>\d{4}) (?P<gt>[\d:.]+) +\d+ )"
                   r"(?:\([\w-]+\) )?(?P<src>[\w.]+\.(?:cc|cpp|h|hpp)):(?P<line>\d+)\]?: +Check failed: (?P<msg>\S.*)"),
        _check_failed, "C++ check failure line", ("https://github.com/ray-project/ray/pull/26007",), window=400),
    Shape(
        "ray-core-error", "Ray's C++ core at level E with a Status in it, or at level F",
        (".cc:",),
        re.compile(r"\[\d{4}-\d\d-\d\d [\d:,.]+ (?P<lvl>[EF]) \d+ \d+\] (?P<src>[\w.]+\.cc):(?P<line>\d+): "
                   r"(?P<msg>.*)"),
        _ray_core, "Ray core error line", ("https://github.com/vllm-project/vllm/issues/5495",), anchored=True),
    Shape(
        "onnxruntime-cuda-failure", "onnxruntime's CUDA call check",
        ("CUDA failure ",),
        re.compile(r"CUDA failure (?P<code>\d+): (?P<msg>[^;]*?) ; GPU=[^;]*;(?: hostname=[^;]*;)? "
                   r"file=(?P<file>[^;]+?) ; line=(?P<line>\d+)"),
        _ort_cuda, "onnxruntime CUDA check", ("https://github.com/C0untFloyd/roop-unleashed/issues/465",),
        window=2000),
    Shape(
        "ray-node-dead", "Ray's GCS gives up on a node: every actor on it is gone",
        ("marked dead because",),
        re.compile(r"The node with node id: (?P<node>\w+).*? has been marked dead because (?P<why>[^.]*)"),
        _node_dead, "Ray node marked dead", ("https://github.com/ray-project/ray/issues/45179",), window=600),
    Shape(
        "ray-memory-monitor-kill", "Ray's memory monitor killed a worker: prose, no exception class",
        ("Ray killed this worker",),
        re.compile(r"Memory on the node \(IP: [^,)]*[^)]*\) where the task \([^)]*\) was running was "
                   r"[\d.]+\w*B? ?/ ?[\d.]+\w*B? \([\d.]+\), which exceeds the memory usage threshold of [\d.]+\. "
                   r"Ray killed this worker \(ID: \w+\)"),
        _memory_monitor, "Ray memory monitor's kill notice", ("https://github.com/verl-project/verl/issues/1684",)),
    Shape(
        "watchdog-died", "a process-group watchdog that died of an error, not a timeout",
        ("watchdog thread terminated",),
        re.compile(r"Process group watchdog thread terminated with exception: (?P<msg>\S.*)"),
        _watchdog_died, "process-group watchdog died of an error",
        ("https://github.com/NVIDIA/Megatron-LM/issues/935",)),
    Shape(
        "usage-error", "a command line refused by argparse: its usage, then PROG: error: ...",
        (": error: ",),
        re.compile(r"^(?P<prog>[\w.\- ]{1,60}): error: (?P<msg>\S.*)"),
        _usage, "command-line usage error", ("https://github.com/huggingface/trl/issues/3139",),
        anchored=True, after="usage: "),
    Shape(
        "argparse-error", "argparse's own words for a refused command line, with or without its usage line",
        (": error: ",),
        re.compile(r"^(?P<prog>[\w.\- ]{1,60}): error: (?P<msg>(?:unrecognized arguments: "
                   r"|the following arguments are required: |ambiguous option: |one of the arguments "
                   r"|argument [^:]{1,80}: (?:invalid choice: |invalid \w+ value: |expected (?:one|at most one"
                   r"|at least one|\d+) arguments?|not allowed with argument ))\S.*)"),
        _usage, "argparse error line", ("https://github.com/vllm-project/vllm/issues/8273",), anchored=True),
    Shape(
        "rocm-blas-error", "ROCm's BLAS libraries' error line: no GEMM can run after it",
        ("las error", "LAS error", "laslt error", "LASLt error", "LASLT error"),
        re.compile(r"(?P<lib>roc[Bb][Ll][Aa][Ss](?:[Ll][Tt])?|hip[Bb][Ll][Aa][Ss](?:[Ll][Tt])?) error: (?P<msg>\S.*)"),
        _library, "native library error line (no Python exception)",
        ("https://github.com/pytorch/pytorch/issues/137695",), window=400),
    Shape(
        "tgi-signalled", "text-generation-inference's launcher: a shard (or the weights' download) died of a signal",
        ("signaled",),
        re.compile(r"(?P<notice>(?:Shard|Download) process was signaled to shutdown with signal (?P<num>\d+))"
                   r"(?:[^\n]*? rank=(?P<rank>\d+))?"),
        _signalled, "launcher's notice of a death by signal",
        ("https://github.com/huggingface/text-generation-inference/issues/2293",), window=2000),
    Shape(
        "torch-check-expected", "a TORCH_CHECK with no message of its own, its class (RuntimeError) not printed",
        ("got false",),
        re.compile(r"\bExpected \S.{0,300}? to be true, but got false\b"),
        _whole_match_as(TORCH_CHECK_TYPE), "TORCH_CHECK message without its class (raised as RuntimeError)",
        ("https://github.com/hiyouga/LlamaFactory/issues/2949",), kind=KIND_TRACEBACK, quiet_too=False),
    Shape(
        "ctypes-function-not-found", "ctypes' words for a function a DLL does not export, its class (AttributeError) "
        "not printed", ("not found",),
        re.compile(r"function (?:'[^'\s]{1,300}'|ordinal \d{1,5}) not found(?=\s*$)"),
        _whole_match_as(CTYPES_MISSING_TYPE), "ctypes message without its class (raised as AttributeError)",
        ("https://github.com/bitsandbytes-foundation/bitsandbytes/issues/711",), kind=KIND_TRACEBACK, anchored=True,
        quiet_too=False),
    Shape(
        "peft-merge-refused", "peft refuses to merge adapters into a quantized (or layer-replicated) base model, its "
        "class (ValueError) not printed", ("Cannot merge",),
        re.compile(r"\bCannot merge (?:[\w-]{1,20} ){0,2}layers when (?:the model is (?:loaded in \d{1,2}-bit mode"
                   r"|gptq quantized)|base model layers are replicated)"),
        _whole_match_as(PEFT_MERGE_TYPE), "peft message without its class (raised as ValueError)",
        ("https://github.com/huggingface/peft/issues/1704",), kind=KIND_TRACEBACK, quiet_too=False),
    # Only the wordings transformers has always raised: "`rope_scaling`'s factor field must be a float >= 1, got"
    # and the like are warnings in newer versions, which print them bare too. (This row's and the next one's
    # triggers hold anchors the gate has already, "got " and "not ", so every line's test costs what it did.)
    Shape(
        "transformers-rope-scaling-refused", "an older transformers refuses a rope_scaling it cannot read (Llama "
        "3.1's llama3 form), its class (ValueError) not printed", ("got {", "], got "),
        re.compile(r"`?rope_(?:scaling|parameters)`?(?: must be a dictionary with (?:with )?two fields, `?type`? "
                   r"and `?factor`?|'s type field must be one of \[[^\]]{0,200}\])[^\n]{0,40}?,? ?got "
                   r"(?:\{[^{}]{0,1000}\}|\S+)"),
        _whole_match_as(ROPE_SCALING_TYPE), "transformers message without its class (raised as ValueError)",
        ("https://github.com/ShmuelRonen/ComfyUI_ChatterBox_Voice/issues/1",), kind=KIND_TRACEBACK,
        quiet_too=False),
    Shape(
        "vllm-sliding-window-refused", "vLLM refuses a model whose sliding window covers some layers only "
        "(Qwen2's max_window_layers), its class (ValueError) not printed", ("layers is not supported",),
        re.compile(r"\bSliding window for some but all layers is not supported\.(?: This model uses sliding window "
                   r"but `?max_window_layers`? = \d+ is less than `?\w+`? = \d+\.)?"
                   r"(?: Please open an issue to discuss this feature\.)?"),
        _whole_match_as(SLIDING_WINDOW_TYPE), "vLLM message without its class (raised as ValueError)",
        ("https://github.com/vllm-project/vllm/issues/15705",), kind=KIND_TRACEBACK, quiet_too=False),
    # The message must be the whole line: callers that go on without the file log the same words inside their own
    # sentence ("Failed to load generation config for X: X does not appear to have a file named
    # generation_config.json. ... Proceeding without generation config."), and prose quotes them. ("not " is an
    # anchor the gate has already.)
    Shape(
        "transformers-file-not-in-repo", "transformers finds no such file in a model's folder or Hub repository "
        "(X does not appear to have a file named F), its class (OSError) not printed", (" does not appear to have ",),
        re.compile(r"[^\s'\"`]{1,300} does not appear to have (?:a file named [\w./\-]{1,200}(?:, [\w./\-]{1,200}){0,8}"
                   r"(?:,? or [\w./\-]{1,200})?|files named \([^()]{1,1000}\)\.?)"
                   r"(?: Checkout '[^'\s]{1,600}' for available files\.{0,2})?(?=\s*$)"),
        _whole_match_as(MISSING_FILE_TYPE), "transformers message without its class (raised as OSError)",
        ("https://github.com/AIGeeksGroup/3D-R1/issues/12",), kind=KIND_TRACEBACK, anchored=True, quiet_too=False),
    # A trace record's "<event>.failed exception=<repr>" (httpcore's; its level is DEBUG, so a retried connection
    # is no failure where a level is printed). Only a repr that is an exception class, at most one wrapping
    # another, its arguments an optional errno and one quoted message, and the field after a word of failure.
    Shape(
        "exception-repr-field", "an exception's repr in a logger's exception= field after a failed event "
        "(httpcore's trace records), the innermost class named", ("failed exception=",),
        re.compile(r"\bfailed exception=(?P<outer>" + _EXC_CLASS + r")\((?:(?P<inner>" + _EXC_CLASS + r")\()?"
                   r"(?:-?\d{1,5}, )?(?P<q>['\"])(?P<msg>[^'\"]{1,2000})(?P=q)\)\)?(?=\W|$)"),
        _field_repr, "exception repr in a log record's field", ("https://github.com/vllm-project/vllm/issues/1644",),
        kind=KIND_TRACEBACK, window=2000, quiet_too=False),
)



@dataclass(frozen=True)
class ReportShape:
    """A shape that spans lines and has a reader of its own (``reader``: its module); listed here so that the
    catalogue, its example files and the docs' table are one list."""

    name: str
    summary: str
    reader: str
    basis: str
    examples: tuple[str, ...]


REPORTS: tuple[ReportShape, ...] = (
    ReportShape("stack-dump-faulthandler", "a hung process's stack in faulthandler's form, no exception: where it is "
                "stuck", "stackdump", BASIS_STACK_DUMP, ("https://github.com/vllm-project/vllm/issues/2731",)),
    ReportShape("stack-dump-py-spy", "py-spy dump of a live process: each thread's stack, the one that matters "
                "named", "stackdump", BASIS_STACK_DUMP, ("https://github.com/vllm-project/vllm/issues/50835",)),
    ReportShape("grpc-error-repr", "gRPC's error repr logged without a traceback (`_X of RPC that terminated with:`,"
                " then its status and details): the repr's class, the message from its details", "nativereports",
                BASIS_RPC, ("https://github.com/ray-project/ray/issues/16059",)),
)

# The decoder's whole test of whether a line may be one of the rows, made from every row's triggers (gate.py).
may_be_shape = make_gate(trigger for shape in SHAPES for trigger in shape.triggers)
# Its first stage alone, for the decoder's busiest path (every INFO line): a line that fails it is no row's;
# line_failures checks the rest.
might_be_shape: Callable[[str], bool] = may_be_shape.any_anchor  # type: ignore[attr-defined]
# Line starts a lane's shapes wait for (``after``): the decoder notes where each was last seen.
_SHAPE_TESTS = tuple((shape, holds_any(shape.triggers)) for shape in SHAPES)
MARKERS: tuple[str, ...] = tuple(sorted({shape.after for shape in SHAPES if shape.after}))
MARKER_FIRST = frozenset(marker[0] for marker in MARKERS)  # so that most lines are passed over with one test


_QUIET_LEVELS = frozenset({"INFO", "DEBUG"})


def line_failures(
    msg: str, lane: str, line_no: int, level: Optional[str], time: Optional[str], source: Optional[str],
    pid: Optional[int], lane_rank: Optional[int], seen: Optional[dict[str, int]] = None,
) -> list[TracebackEvent]:
    """The failures one line says, by the first row that reads it. ``seen``: the line numbers where this lane
    last printed each of :data:`MARKERS`."""
    if not may_be_shape(msg):
        return []
    for shape, holds in _SHAPE_TESTS:
        if not holds(msg):
            continue
        if not shape.quiet_too and level in _QUIET_LEVELS:
            continue
        if shape.after is not None:
            at = (seen or {}).get(shape.after)
            if at is None or line_no - at > shape.after_within:
                continue
        out = []
        for found in shape.matches(msg):
            reading = shape.read(found, msg)
            if reading is None:
                continue
            # Ranks aborting together write into one another's lines: a report that names its rank is that rank's.
            origin = (f"rank{reading.rank}" if reading.rank is not None and int(reading.rank) != lane_rank
                      else None)
            frames = (reading.frame,) if reading.frame is not None else ()
            out.append(TracebackEvent(
                lane=lane, kind=shape.kind, exceptions=(ExceptionRecord(reading.exc_type, reading.message, frames),),
                line_no=line_no, level=level, time=reading.time or time, source=source, origin=origin,
                text=msg.strip(), pid=pid, signal=reading.signal,
                confidence=LIKELY, basis=shape.basis,
            ))
        if out:
            return out
    return []


_SEQ = re.compile(r"SeqNum=(?P<seq>\d+)")
_OP = re.compile(r"OpType=(?P<op>\w+)")


def watchdog_key(message: str) -> Optional[tuple[str, str]]:
    """``(OpType, SeqNum)`` of the collective a watchdog report names: the same timeout seen by every rank."""
    flat = message.replace("\n", "")
    op = _OP.search(flat)
    if op is None:
        return None
    seq = _SEQ.search(flat)
    return (op.group("op"), seq.group("seq") if seq else "?")
