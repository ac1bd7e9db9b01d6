"""How a run ended, in words and as a shell status: the one place that wording lives.

The dashboard's header, alerts and goodbye line, the runs list, and the ``attach``, ``stop``, ``restart`` and
``runs`` commands all say it through :func:`run_end`, so a run reads the same wherever it is looked at.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from eaglewatch import protocol as p
from eaglewatch.tui.messages import ExitInfo

LOST_TEXT = "lost, with no exit status and no process left"
# The run directory was deleted under a run: while its processes live it is running, and says so; once they are gone
# nothing recorded how it ended.
DIR_GONE_TEXT = "run directory gone"
LOST_DIR_GONE_TEXT = "lost: its run directory was deleted, so no exit status was kept, and no process is left"
# The phase word of a run the operator stopped (its exit.json says ``stopped``): the run screen's header reads
# STOPPED where a crash reads FAILED.
STOPPED_PHASE = "stopped"
STOPPED_TEXT = "stopped by the operator"


@dataclass(frozen=True)
class RunEnd:
    text: str  # "exit code 1", "killed by SIGTERM", "stopped by the operator (SIGTERM)", "did not start: ...", ...
    # The shell's convention: the job's code, or 128 + the signal; None when nobody knows. A run the operator
    # stopped keeps it (143 after SIGTERM): a command that followed the run did not see it complete.
    code: Optional[int]
    failed: bool  # worth an alert: a non-zero code, a signal, a command that did not start, a lost run
    # The operator asked for the end (``eaglewatch stop``, s, restart, a job's cancel): exit.json's ``stopped``,
    # which the supervisor writes when the stop left its request (stop.json) before signalling. Not a failure.
    stopped: bool = False

    @property
    def status(self) -> int:
        """What a command that followed the run exits with: ``code``, or 1 when it is not known."""
        return 1 if self.code is None else self.code


def _int(value: object) -> Optional[int]:
    if not isinstance(value, (int, float, str)):
        return None
    try:
        return int(value)
    except (ValueError, OverflowError):
        return None


def run_end(state: Optional[str], exit_info: Optional[ExitInfo], dir_gone: bool = False) -> Optional[RunEnd]:
    """How the run ended, from the agent's job state and ``exit.json``; None while it has not ended. ``dir_gone``:
    the agent found the run's directory deleted (summary field ``run_dir_gone``). Whatever the host sent, the
    answer is one of these (an ``exit`` that is not an object counts as none)."""
    if not isinstance(exit_info, dict):
        exit_info = None
    if exit_info:
        signal = _int(exit_info.get("signal"))
        # Only the operator's request makes a signal a stop: a kill by hand, the OOM killer or a time limit is not.
        stopped = exit_info.get("stopped") is True
        if signal:
            name = exit_info.get("signal_name") or signal
            if stopped:
                return RunEnd(f"{STOPPED_TEXT} ({name})", 128 + signal, False, stopped=True)
            return RunEnd(f"killed by {name}", 128 + signal, True)
        if exit_info.get("error"):
            return RunEnd(f"did not start: {exit_info.get('error')}", _int(exit_info.get("code")) or 127, True)
        code = _int(exit_info.get("code"))
        # The supervisor found the run's disk full when it came to record the exit (supervise._write_exit).
        full = ", disk full" if exit_info.get("disk_full") is True else ""
        if stopped:
            # A job that handles SIGTERM itself ends with a code of its own: still the operator's stop.
            how = f" (exit code {code}{full})" if code is not None else ""
            return RunEnd(f"{STOPPED_TEXT}{how}", code, bool(full), stopped=True)
        if code is not None:
            return RunEnd(f"exit code {code}{full}", code, code != 0 or bool(full))
        return RunEnd("ended", None, False)  # an exit.json without a status: nothing to say it failed
    if state == p.JOB_LOST:
        return RunEnd(LOST_DIR_GONE_TEXT if dir_gone else LOST_TEXT, None, True)
    if state == p.JOB_EXITED:
        return RunEnd("ended", None, False)
    return None
