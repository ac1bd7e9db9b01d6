"""Log decoder: a job's raw byte stream -> lanes, progress bars, tracebacks with their root cause, hints.

Pure standard library: it imports neither Textual nor paramiko nor torch, so the operator side and
``eaglewatch decode`` run anywhere. The pieces, one job each:

* ``lines``: bytes -> text segments (``\\n``/``\\r``, UTF-8, ANSI escapes), across any chunking;
* ``lanes``: process prefixes (``(Worker_TP0 pid=1)``, ``(VllmWorker rank=3 pid=2)``, ``[rank1]:``, ...);
* ``header``: logger headers -> level, time, source;
* ``bars``: tqdm bars -> :class:`BarUpdate`;
* ``traceback``: per-lane assembly of Python's reports (chains, groups, faulthandler's fatal error, parts of
  tracebacks), begun by the rows of ``START_RULES``; ``nativereports``: its readers of C++ aborts, Rust panics,
  fatal-signal banners and preflight lines; ``stackdump``: stack dumps of live processes (py-spy, faulthandler);
  ``gate``: the cheap line tests, made from the rows' triggers; ``stamps``: loggers' timestamps as sort keys;
* ``deaths``: "killed by signal", "died unexpectedly", the OOM killer; ``lineshapes``: the catalogue of one-line
  failure shapes (NCCL watchdog timeouts, native CUDA checks, scheduler kills, usage errors: one row each);
* ``rootcause``: grouping across ranks and ranking, root cause first; ``hints``: the hint table;
* ``decoder``: :class:`Decoder` ties them together; ``state``: :class:`DecodeState`, what a dashboard reads;
* ``report``: JSON and text output; ``live``/``cli``: ``eaglewatch decode``.
"""

from eaglewatch.decode.decoder import Decoder, decode_bytes
from eaglewatch.decode.events import (
    BarUpdate,
    ExceptionRecord,
    Frame,
    LineEvent,
    ProcessDeath,
    ProvisionalFailure,
    TracebackEvent,
)
from eaglewatch.decode.rootcause import FailureGroup
from eaglewatch.decode.state import BarState, DecodeState, LaneState

__all__ = [
    "BarState",
    "BarUpdate",
    "DecodeState",
    "Decoder",
    "ExceptionRecord",
    "FailureGroup",
    "Frame",
    "LaneState",
    "LineEvent",
    "ProcessDeath",
    "ProvisionalFailure",
    "TracebackEvent",
    "decode_bytes",
]
