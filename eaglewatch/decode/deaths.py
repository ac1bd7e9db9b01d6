"""Lines that say a process died: killed by a signal, by the OOM killer, or "died unexpectedly".

Such a line is often all that is left of a worker that was killed (SIGKILL leaves no traceback), so it
becomes a failure of its own. Lines at INFO or DEBUG are never read as deaths: a clean shutdown logs
"force killing remaining process ..." at those levels and that is not a failure.
"""

from __future__ import annotations

import re
import signal as _signal
from typing import Optional

from eaglewatch.decode.events import ProcessDeath
from eaglewatch.decode.gate import holds_any

_SIGNAL_WORDS = {
    "Segmentation fault": "SIGSEGV",
    "Aborted": "SIGABRT",
    "Bus error": "SIGBUS",
    "Illegal instruction": "SIGILL",
    "Floating point exception": "SIGFPE",
    "Killed": "SIGKILL",
}

_SUBJECT = re.compile(
    r"(?:\bproc(?:ess)?|\b[Ww]orker|\bPID|\bpid)\s+(?P<subject>[A-Za-z_][\w.\-]*(?: rank=\d+)?|\d+)"
    r"(?:\s+\(?pid[=: ]\s*\d+\)?)?\s+(?:has\s+)?(?:died|exited|was killed|terminated)"
)
_SIGNUM = re.compile(
    r"(?:exit ?code|exitcode|return ?code|returncode)[ =:]+\s*-(?P<num>\d+)"
    r"|(?:killed|terminated|died|exited) (?:by|with|from|due to) signal:? ?(?P<num2>\d+|SIG[A-Z]+)"
    r"|\bSignal (?P<num3>\d+) \((?P<name3>SIG[A-Z]+)\) received"
    r"|<Signals\.(?P<name4>SIG[A-Z]+): \d+>"
)
_CORE_DUMPED = re.compile(
    r"(?P<word>Segmentation fault|Aborted|Bus error|Illegal instruction|Floating point exception)\s+\(core dumped\)"
)
_KILLED = re.compile(r"(?:^|\bline \d+:\s+(?P<pid>\d+)\s+)Killed\b")
# A shell's report of a crashed child: "Segmentation fault", "./run.sh: line 12: 81234 Bus error  torchrun ...".
_SIGNAL_WORD = re.compile(
    r"(?:^|\bline \d+:\s+\d+\s+|^\d+\s+)(?P<word>Segmentation fault|Bus error|Illegal instruction"
    r"|Floating point exception)(?:\s+\(core dumped\))?(?:\s{2,}\S.*)?\s*$"
)
_OOM_KILLER = re.compile(r"Out of memory: Kill(?:ed)? process (?P<pid>\d+)")
# Killed for memory by something outside the process: the kernel's OOM killer, a cgroup limit, a scheduler,
# Ray's memory monitor ("1 Workers (tasks / actors) killed due to memory pressure (OOM)").
_OOM_NOTICE = re.compile(
    r"Out of memory: Kill|Memory cgroup out of memory|killed due to memory pressure|memory pressure \(OOM\)"
    r"|Workers \(tasks / actors\) killed|oom[-_]kill(?:er|ed)?\b|\bOOMKilled\b|killed by the OOM killer"
    r"|killed due to the node running low on memory|Detected \d+ oom[-_]kill event",
    re.I,
)
_DIED = re.compile(r"\bdied\b|\bwas killed\b")
# torch.multiprocessing.spawn's join on a child that a signal ended, as its ProcessExitedException's message (the
# signal's name, not a number); a child that exited with a code is "... terminated with exit code 17", no death.
SPAWN_SIGNALLED = re.compile(r"\s*process (?P<index>\d+) terminated with signal (?P<name>SIG[A-Z0-9+]+)\b")

_SKIP_LEVELS = frozenset({"INFO", "DEBUG"})


# The words every death notice above holds one of (each pattern's own words): the cheap test before them.
DEATH_WORDS = ("died", "ignal", "Killed", "killed", "core dumped", "xit code", "xitcode", "eturncode", "eturn code",
               "fault", "Bus error", "Illegal instruction", "oom", "OOM", "out of memory")
maybe_death = holds_any(DEATH_WORDS)
maybe_death.__doc__ = "Cheap test: could this line be a death notice?"


def signal_name(value: str) -> Optional[str]:
    if value.startswith("SIG"):
        return value
    try:
        return _signal.Signals(int(value)).name
    except (ValueError, KeyError):
        return f"signal {value}"


def parse_death(
    msg: str,
    lane: str,
    line_no: int,
    level: Optional[str] = None,
    time: Optional[str] = None,
    source: Optional[str] = None,
    pid: Optional[int] = None,
) -> Optional[ProcessDeath]:
    """A :class:`ProcessDeath` when the line says a process died, else None."""
    if level in _SKIP_LEVELS:
        return None
    text = msg.strip()
    sig: Optional[str] = None
    found = _SIGNUM.search(text)
    if found:
        value = found.group("num") or found.group("num2") or found.group("name3") or found.group("name4")
        sig = signal_name(value)
    else:
        dumped = _CORE_DUMPED.search(text) or _SIGNAL_WORD.search(text)
        if dumped:
            sig = _SIGNAL_WORDS[dumped.group("word")]
        elif _OOM_KILLER.search(text) or _KILLED.search(text):
            sig = "SIGKILL"
    oom = _OOM_NOTICE.search(text) is not None
    if oom and sig is None:
        sig = "SIGKILL"
    subject_match = _SUBJECT.search(text)
    if sig is None and not subject_match and not _DIED.search(text):
        return None
    if sig is None and not (subject_match or "died unexpectedly" in text or "was killed" in text):
        return None
    if sig is None and not subject_match and re.match(r"[\w.]*(?:Error|Exception)(?:_[A-Z][A-Za-z0-9]*)?\b", text):
        return None  # an exception's message that mentions a death is the exception's
    subject = subject_match.group("subject") if subject_match else None
    if subject is not None and subject.isdigit():
        subject = f"pid={subject}"
    return ProcessDeath(
        lane=lane, subject=subject, signal=sig, text=text, line_no=line_no, level=level, time=time,
        source=source, pid=pid, oom=oom,
    )
