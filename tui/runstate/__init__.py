"""What the dashboard shows about one run, as plain data: no Textual, no IO.

:class:`RunModel` folds everything that arrives for a run (log bytes through the decoder, pipeline events,
telemetry samples, job states, link states) into its own state, and :meth:`RunModel.snapshot` returns a
:class:`RunView` of plain dataclasses that widgets render. One thread feeds, another reads; a lock keeps them
apart. Memory is bounded: the decoder keeps state, not history; the log keeps a tail; GPU history is short.
"""

from eaglewatch.tui.runstate.model import RunModel, Thresholds
from eaglewatch.tui.runstate.view import (
    Alert,
    CheckView,
    Extraction,
    FailureView,
    GpuProcess,
    GpuView,
    HostView,
    LoadBar,
    LogLine,
    RunView,
)

__all__ = [
    "Alert",
    "CheckView",
    "Extraction",
    "FailureView",
    "GpuProcess",
    "GpuView",
    "HostView",
    "LoadBar",
    "LogLine",
    "RunModel",
    "RunView",
    "Thresholds",
]
