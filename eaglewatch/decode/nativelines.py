"""Fatal lines that are not Python exceptions: NCCL watchdog timeouts and native CUDA checks.

* ``[rank1]:[E321 02:07:08.40 ProcessGroupNCCL.cpp:607] [Rank 1] Watchdog caught collective operation timeout:
  WorkNCCL(SeqNum=1580, OpType=ALLREDUCE, ...) ran for 600060 milliseconds before timing out.`` One line may carry
  several ranks' reports run together; each is a failure of kind ``watchdog``.
* ``CUDA Error: out of memory at /workspace/csrc/cumem_allocator.cpp:56`` (a C++ allocator's check),
  ``Failed: Cuda error /workspace/csrc/custom_all_reduce.cuh:164 'invalid argument'`` (vLLM's CUDACHECK),
  ``CUDA error at file.cu:12 code=2(cudaErrorMemoryAllocation)`` (the CUDA samples' helper), ``cudaError error: 2
  (out of memory)  file=csrc/core.cpp func=resume line=172`` (torch_memory_saver's check): kind ``native``,
  type ``CUDA Error``, the file and line as the frame.
* ``failure detected by watchdog at work sequence id: 40231`` (PyTorch 2.6 and later's watchdog): kind ``watchdog``.
* UCX's ``tcp_ep.c:1260 UCX  ERROR ...``, Ray's C++ ``[... E pid pid] core_worker.cc:228: ... IOError: ...`` (its
  Status is the type), and a process-group watchdog that died of an error rather than a timeout: kind ``native``.
* A CUDA kernel's device-side assertion, one line per failing thread: ``/pytorch/aten/src/ATen/native/cuda/Loss.cu:240:
  nll_loss_forward_reduce_cuda_kernel_2d: block: [0,0,0], thread: [17,0,0] Assertion `t >= 0 && t < n_classes`
  failed.``: kind ``native``, type ``CUDA Error``, grouped by kernel file and line whatever the thread. It comes
  before the ``RuntimeError: CUDA error: device-side assert triggered`` that reports it, and names the check.
* Huawei CANN's own error lines (Ascend NPUs: HCCL, the runtime, the graph engine): ``[ERROR]
  HCCL(36035,mindie_llm_backend_connector):2025-05-13-02:25:58.068.817 [op_base.cc:974][36818][Init]...
  HcclCommInitRootInfo failed.``: kind ``native``, type ``HCCL ERROR`` (the module's name and the level).
* onnxruntime's CUDA check (``CUDA failure 35: CUDA driver version is insufficient ... ; file=... ; line=236``):
  kind ``native``, type ``CUDA Error``.
* Ray's notice that a node was marked dead (``The node with node id: ... has been marked dead because the detector
  has missed too many heartbeats from it``): kind ``native``, type ``Ray node died``.
* ``rocblaslt error: Could not load .../TensileLibrary_lazy_gfx942.dat`` (ROCm's BLAS libraries): kind ``native``,
  type ``rocblaslt error`` as printed.

Whatever level a collector printed in front of them, these are failures: the process does not go on.
"""

from __future__ import annotations

import re
from typing import Optional

from eaglewatch.decode.events import (
    KIND_NATIVE,
    KIND_WATCHDOG,
    LIKELY,
    ExceptionRecord,
    Frame,
    TracebackEvent,
)
from eaglewatch.decode.exclass import class_from_message
from eaglewatch.decode.frames import frame_kind

WATCHDOG_TYPE = "NCCL watchdog timeout"
NATIVE_CUDA_TYPE = "CUDA Error"

_WATCHDOG = re.compile(
    r"(?:\[(?:PG [^\]]*?)?Rank (?P<rank>\d+)\] )?Watchdog caught collective operation timeout: "
    r"(?P<work>WorkNCCL\((?:[^()]|\([^()]*\))*\)?)(?: ran for \d+ milliseconds before timing out\.?)?"
)
# PyTorch 2.6 and later: "[PG ID 2 PG GUID 3 Rank 1]  failure detected by watchdog at work sequence id: 40231 ..."
_WATCHDOG_FAILURE = re.compile(
    r"(?:\[PG ID \d+ PG GUID [^\]]*?Rank (?P<rank>\d+)\] +)?failure detected by watchdog at work sequence id: "
    r"(?P<seq>\d+)"
)
# ROCm's BLAS libraries print their own error lines and then the process cannot run a GEMM:
# "rocblaslt error: Could not load .../TensileLibrary_lazy_gfx942.dat".
_NATIVE_LIBRARY = re.compile(
    r"(?P<lib>roc[Bb][Ll][Aa][Ss](?:[Ll][Tt])?|hip[Bb][Ll][Aa][Ss](?:[Ll][Tt])?) error: (?P<msg>\S.*)")
# UCX (NIXL, LMCache, Mooncake transports): "[1749803291.555759] [host:7053 :0]  tcp_ep.c:1260 UCX  ERROR tcp_ep
# 0x3c502370 (state=CONNECTED): send(110) failed: Input/output error".
_UCX = re.compile(r"(?P<src>[\w.]+\.c):(?P<line>\d+) +UCX +ERROR +(?P<msg>\S.*)")
# Ray's C++ core at level E or F with a Status in it: "[2024-06-13 16:11:51,588 E 13261 13261] core_worker.cc:228:
# Failed to register worker ... to Raylet. IOError: [RayletClient] Unable to register worker with raylet. ..."
_RAY_CPP = re.compile(
    r"\[\d{4}-\d\d-\d\d [\d:,.]+ (?P<lvl>[EF]) \d+ \d+\] (?P<src>[\w.]+\.cc):(?P<line>\d+): (?P<msg>.*)")
_RAY_STATUS = re.compile(r"\b(?P<status>IOError|Invalid|NotFound|TimedOut|OutOfMemory|ObjectStoreFull|OutOfDisk"
                         r"|RpcError|NotImplemented|UnknownError): (?P<msg>\S.*)")

# onnxruntime's CUDA call check: "... onnxruntime::CudaCall CUDA failure 35: CUDA driver version is insufficient
# for CUDA runtime version ; GPU=0 ; hostname=h ; file=.../cuda_execution_provider.cc ; line=236 ; expr=...".
_ORT_CUDA = re.compile(r"CUDA failure (?P<code>\d+): (?P<msg>[^;]*?) ; GPU=[^;]*;(?: hostname=[^;]*;)? "
                       r"file=(?P<file>[^;]+?) ; line=(?P<line>\d+)")
# Ray's GCS gives up on a node (its raylet crashed, was killed or lost the network): every actor on it is gone.
# "The node with node id: 0f21... and address: 10.0.0.51 and node name: 10.0.0.51 has been marked dead because
# the detector has missed too many heartbeats from it."
_RAY_NODE_DEAD = re.compile(r"The node with node id: (?P<node>\w+).*? has been marked dead because (?P<why>[^.]*)")
RAY_NODE_DIED = "Ray node died"
# A process-group watchdog that died of an error (not a timeout), printed without the C++ abort around it:
# "[PG ID 2 PG GUID 3 Rank 2] Process group watchdog thread terminated with exception: CUDA error: ...".
_WATCHDOG_DIED = re.compile(r"Process group watchdog thread terminated with exception: (?P<msg>\S.*)")
# NCCL's own debug output prints its errors at WARN: "host:18553:18611 [0] include/socket.h:360 WARN Call to
# connect failed : Connection timed out" (NCCL 2.2), "host:123:456 [3] NCCL WARN Cuda failure 'out of memory'".
# NCCL's own line, also behind a launcher's bracketed time ("[2025-07-21 19:05:29] node004:27907:27907 [1] ...").
_NCCL_WARN = re.compile(r"^(?:\[[\d\-:.,T Z]+\] )?\S+:\d+:\d+ \[\d+\] (?:[\w./]+:\d+ )?(?:NCCL )?WARN (?P<msg>\S.*)")
_NATIVE = re.compile(
    r"CUDA [Ee]rror: (?P<m1>.+?) at (?P<f1>[\w./\-]+\.\w+):(?P<l1>\d+)"
    r"|Failed: Cuda error (?P<f2>[\w./\-]+\.\w+):(?P<l2>\d+) '(?P<m2>[^']*)'"
    r"|CUDA error at (?P<f3>[\w./\-]+\.\w+):(?P<l3>\d+) code=(?P<m3>.+)"
    # torch_memory_saver's check: "cudaError error: 2 (out of memory)  file=csrc/core.cpp func=resume line=172"
    r"|cudaError error: (?P<m4>\d+ \([^)]*\)) +file=(?P<f4>[\w./\-]+\.\w+) func=\S+ line=(?P<l4>\d+)"
)
# Every failing GPU thread prints one; threads printing at once write into each other's lines, so a line is taken
# only whole.
_DEVICE_ASSERT = re.compile(
    r"(?P<file>[\w./\-]+\.cuh?):(?P<line>\d+): (?P<kernel>[^:\s][^:]*?): block: \[\d+,\d+,\d+\], "
    r"thread: \[\d+,\d+,\d+\] Assertion `(?P<check>[^`]*)` failed\.")
# PyTorch's CUDA check (2.8 and later) ends its message with this line; when a paste lost the exception line
# above it, it still names the error: "Search for `cudaErrorStreamCaptureUnsupported' in https://docs.nvidia.com/...".
_TORCH_CUDA_HINT = re.compile(r"Search for `(?P<code>cudaError\w+)' in https://docs\.nvidia\.com/")
TORCH_CUDA_ERROR = "torch.AcceleratorError"
# CANN: "[ERROR] MODULE(pid,process):date [file.cc:line][tid][tags]...message".
_CANN = re.compile(r"\[ERROR\] (?P<mod>[A-Z][A-Z_]{1,15})\(\d+,[^)]*\):\S+ \[(?P<src>[\w.]+):(?P<line>\d+)\]"
                   r"(?:\[[^\]]*\])*(?P<msg>.*)")
_SEQ = re.compile(r"SeqNum=(?P<seq>\d+)")
_OP = re.compile(r"OpType=(?P<op>\w+)")


def maybe_native(msg: str) -> bool:
    lower = msg.lower()
    return ("uda error" in msg or "UDA Error" in msg or "cudaError error" in msg or "UDA error at" in msg
            or "blaslt error" in lower or "rocblas error" in lower or "UCX" in msg or ".cc:" in msg[:80]
            or " WARN " in msg
            or "watchdog thread terminated" in msg or "Assertion `" in msg or msg[:8] == "[ERROR] "
            or "Search for `cudaError" in msg or "marked dead because" in msg or "CUDA failure " in msg)


def maybe_watchdog(msg: str) -> bool:
    return "atchdog caught" in msg or "detected by watchdog" in msg


def watchdog_key(message: str) -> Optional[tuple[str, str]]:
    """``(OpType, SeqNum)`` of the collective a watchdog report names: the same timeout seen by every rank."""
    flat = message.replace("\n", "")
    op = _OP.search(flat)
    if op is None:
        return None
    seq = _SEQ.search(flat)
    return (op.group("op"), seq.group("seq") if seq else "?")


def watchdog_failures(
    msg: str, lane: str, line_no: int, level: Optional[str], time: Optional[str], source: Optional[str],
    pid: Optional[int], lane_rank: Optional[int],
) -> list[TracebackEvent]:
    out = []
    for found in _WATCHDOG.finditer(msg):
        rank = found.group("rank")
        # Ranks aborting together write into one another's lines: the report names its own rank.
        origin = f"rank{rank}" if rank is not None and int(rank) != lane_rank else None
        text = found.group(0).strip()
        out.append(TracebackEvent(
            lane=lane, kind=KIND_WATCHDOG, exceptions=(ExceptionRecord(WATCHDOG_TYPE, text),), line_no=line_no,
            level=level, time=time, source=source, origin=origin, text=msg.strip(), pid=pid,
            confidence=LIKELY, basis="NCCL watchdog report",
        ))
    if not out:
        for found in _WATCHDOG_FAILURE.finditer(msg):
            rank = found.group("rank")
            origin = f"rank{rank}" if rank is not None and int(rank) != lane_rank else None
            report = ExceptionRecord(WATCHDOG_TYPE, msg[found.start():].strip())
            out.append(TracebackEvent(
                lane=lane, kind=KIND_WATCHDOG, exceptions=(report,),
                line_no=line_no, level=level, time=time, source=source, origin=origin, text=msg.strip(), pid=pid,
                confidence=LIKELY, basis="NCCL watchdog report",
            ))
    return out


def native_failure(
    msg: str, lane: str, line_no: int, level: Optional[str], time: Optional[str], source: Optional[str],
    pid: Optional[int],
) -> Optional[TracebackEvent]:
    found = _NATIVE.search(msg, 0, 4000)  # anywhere: a C++ printf glues its line to whatever came before
    if found is None:
        other = _other_native(msg)
        if other is not None:
            exc, basis = other
            return TracebackEvent(
                lane=lane, kind=KIND_NATIVE, exceptions=(exc,), line_no=line_no, level=level, time=time,
                source=source, text=msg.strip(), pid=pid, confidence=LIKELY, basis=basis)
        library = _NATIVE_LIBRARY.search(msg, 0, 400)
        if library is None:
            return None
        return TracebackEvent(
            lane=lane, kind=KIND_NATIVE, exceptions=(ExceptionRecord(f"{library.group('lib')} error",
                                                                     library.group("msg").strip()),),
            line_no=line_no, level=level, time=time, source=source, text=msg.strip(), pid=pid,
            confidence=LIKELY, basis="native library error line (no Python exception)",
        )
    file = found.group("f1") or found.group("f2") or found.group("f3") or found.group("f4")
    line = found.group("l1") or found.group("l2") or found.group("l3") or found.group("l4")
    frame = Frame(file, int(line), None, None, frame_kind(file))
    # "CUDA Error: out of memory at x.cpp:56" reads as type and message; the other forms are kept whole.
    text = msg[found.start("m1"):].strip() if found.group("m1") else msg[found.start():].strip()
    return TracebackEvent(
        lane=lane, kind=KIND_NATIVE, exceptions=(ExceptionRecord(NATIVE_CUDA_TYPE, text, (frame,)),),
        line_no=line_no, level=level, time=time, source=source, text=msg.strip(), pid=pid,
        confidence=LIKELY, basis="native error line (no Python exception)",
    )


def _other_native(msg: str) -> Optional[tuple[ExceptionRecord, str]]:
    """UCX errors, Ray's C++ core errors with a Status, a process-group watchdog that died of an error, NCCL's
    WARN lines, device-side assertions, CANN's error lines, PyTorch's CUDA-check line without its exception."""
    if "Search for `cudaError" in msg:
        hint = _TORCH_CUDA_HINT.search(msg, 0, 200)
        if hint is not None:
            code = hint.group("code")
            return (ExceptionRecord(TORCH_CUDA_ERROR, f"CUDA error: {code} (the exception's first line is not in the "
                                                      "log; this is PyTorch's line that closes its message)"),
                    "PyTorch's CUDA error line, its exception line missing")
    if msg[:8] == "[ERROR] ":
        cann = _CANN.match(msg)
        if cann is not None:
            frame = Frame(cann.group("src"), int(cann.group("line")), None, None, frame_kind(cann.group("src")))
            return (ExceptionRecord(f"{cann.group('mod')} ERROR", cann.group("msg").strip(), (frame,)),
                    "CANN error line")
    if "Assertion `" in msg:
        check = _DEVICE_ASSERT.search(msg, 0, 2000)
        if check is not None:
            file = check.group("file")
            frame = Frame(file, int(check.group("line")), check.group("kernel"), None, frame_kind(file))
            return (ExceptionRecord(NATIVE_CUDA_TYPE, f"Assertion `{check.group('check')}` failed. (device-side, "
                                                      f"in {check.group('kernel')})", (frame,)),
                    "CUDA device-side assertion")
    if " WARN " in msg:
        nccl = _NCCL_WARN.match(msg)
        if nccl is not None:
            return ExceptionRecord("NCCL WARN", nccl.group("msg").strip()), "NCCL WARN line"
    if "UCX" in msg:
        ucx = _UCX.search(msg, 0, 400)
        if ucx is not None:
            frame = Frame(ucx.group("src"), int(ucx.group("line")), None, None, frame_kind(ucx.group("src")))
            return ExceptionRecord("UCX ERROR", ucx.group("msg").strip(), (frame,)), "UCX error line"
    if ".cc:" in msg[:80]:
        ray = _RAY_CPP.match(msg)
        if ray is not None:
            status = _RAY_STATUS.search(ray.group("msg"))
            frame = Frame(ray.group("src"), int(ray.group("line")), None, None, frame_kind(ray.group("src")))
            if status is not None:
                return (ExceptionRecord(status.group("status"), status.group("msg").strip(), (frame,)),
                        "Ray core error line")
            if ray.group("lvl") == "F":
                return ExceptionRecord("Ray fatal error", ray.group("msg").strip(), (frame,)), "Ray core fatal line"
    if "CUDA failure " in msg:
        ort = _ORT_CUDA.search(msg, 0, 2000)
        if ort is not None:
            file = ort.group("file")
            frame = Frame(file, int(ort.group("line")), None, None, frame_kind(file))
            return (ExceptionRecord(NATIVE_CUDA_TYPE, f"CUDA failure {ort.group('code')}: {ort.group('msg').strip()}",
                                    (frame,)), "onnxruntime CUDA check")
    if "marked dead because" in msg:
        node = _RAY_NODE_DEAD.search(msg, 0, 600)
        if node is not None:
            return ExceptionRecord(RAY_NODE_DIED, msg[node.start():].strip()), "Ray node marked dead"
    if "watchdog thread terminated" in msg:
        died = _WATCHDOG_DIED.search(msg)
        if died is not None:
            quoted = died.group("msg").strip()
            return (ExceptionRecord(class_from_message(quoted) or "c10::DistBackendError", quoted),
                    "process-group watchdog died of an error")
    return None
