"""The stacks of a run's processes, grouped: what ``eaglewatch stacks HOST RUN`` prints.

The host side collects one record per process (a JSON-able dict)::

    {"pid": 123, "role": "worker TP 1", "rank": 1, "cmdline": "python x.py", "state": "S (sleeping)",
     "wchan": "futex_wait_queue", "method": "py-spy", "note": "",
     "threads": [{"name": "MainThread", "current": False,
                  "frames": [{"func": "all_reduce", "file": "/x/distributed_c10d.py", "line": 2050}, ...]}]}

with each thread's frames innermost first, as faulthandler and py-spy print them. This module reads such dumps
(:func:`parse_dump`), groups processes whose main threads stand in the same frames (:func:`group`), marks the frame
where the groups part, and renders them for a terminal (:func:`render`) or one line (:func:`summary`). A hang of
eight ranks where seven wait in ``all_reduce`` and one still loads weights reads as two groups, and the frame where
they part is the news.

Records come from a host: every string of theirs shown here passes through :func:`safe_text`.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable, Optional

from eaglewatch.decode.stackdump import FH_FRAME, FH_HEAD, SPY_FRAME, SPY_HEAD, SPY_PREAMBLE, is_waiting
from eaglewatch.safetext import safe_text

MAIN_THREAD = "MainThread"
KEEP_HEAD = 3  # a long stack keeps its outermost 3 frames ...
KEEP_TAIL = 12  # ... and its innermost 12
PARTS_MARK = "▶"
PARTS_WORDS = "← parts here"
SUMMARY_CHARS = 300

# faulthandler's dump of the calling thread alone (``all_threads=False``).
_FH_STACK = re.compile(r"^Stack \(most recent call first\):\s*$")
# faulthandler's thread id: ``0x%0*lx``, lower-case hex (py-spy prints ``0x7F3A...``, upper-case, or a decimal id).
_FH_TID = re.compile(r"^0x[0-9a-f]+$")
_ROLE_NUMBER = re.compile(r"^(?P<base>.*?)\s*(?P<number>\d+)$")

Record = dict[str, Any]


# --- reading dumps ---------------------------------------------------------------------------------------------


def parse_dump(text: str) -> list[Record]:
    """The threads of a faulthandler or py-spy dump, in the order printed: ``{"name", "current", "frames",
    "id"}``, frames innermost first as ``{"func", "file", "line"}``. Lines of neither shape are skipped."""
    threads: list[Record] = []
    for raw in text.splitlines():
        line = raw.rstrip("\r\n")
        if not line.strip() or SPY_PREAMBLE.match(line):
            continue
        frame = FH_FRAME.match(line) or SPY_FRAME.match(line)
        if frame is not None:
            if not threads:
                threads.append(_thread("thread", "", False))
            threads[-1]["frames"].append({"func": frame.group("func"), "file": frame.group("file"),
                                          "line": int(frame.group("line"))})
            continue
        head = FH_HEAD.match(line)
        if head is not None:
            tid = head.group("tid")
            threads.append(_thread(head.group("name") or tid, tid, head.group("cur") == "Current thread"))
            continue
        spy = SPY_HEAD.match(line)
        if spy is not None:
            tid = spy.group("tid")
            threads.append(_thread(spy.group("name") or tid, tid, "active" in spy.group("state")))
            continue
        if _FH_STACK.match(line):
            threads.append(_thread("thread", "", True))
    return threads


def _thread(name: str, tid: str, current: bool) -> Record:
    return {"name": name, "id": tid, "current": current, "frames": []}


def main_thread(threads: Iterable[Record], method: Optional[str] = None) -> Optional[Record]:
    """The thread named ``MainThread``; else, in a faulthandler dump (``method``, or thread ids in faulthandler's
    form), the last listed (faulthandler lists the newest thread first, the main thread last); else the first."""
    listed = [t for t in threads if isinstance(t, dict)]
    if not listed:
        return None
    named = next((t for t in listed if t.get("name") == MAIN_THREAD), None)
    if named is not None:
        return named
    if method == "faulthandler" or (method is None and all(_FH_TID.match(str(t.get("id") or t.get("name") or ""))
                                                           for t in listed)):
        return listed[-1]
    return listed[0]


def _frames(thread: Optional[Record]) -> list[Record]:
    """A thread's frames, innermost first; what is not a frame left out."""
    if not thread:
        return []
    frames = thread.get("frames")
    if not isinstance(frames, list):
        return []
    return [f for f in frames if isinstance(f, dict)]


def _file(frame: Record) -> str:
    return str(frame.get("file") or "")


def blocking_frame(thread: Optional[Record]) -> Optional[Record]:
    """The frame that says what the thread is stuck in: the innermost that is not a waiting primitive (a poll, a
    lock, a queue); else the innermost; None without frames."""
    frames = _frames(thread)
    if not frames:
        return None
    return next((f for f in frames if not is_waiting(_file(f))), frames[0])


def frame_text(frame: Record) -> str:
    """``all_reduce (distributed_c10d.py:2050)``, safe to show: the file's last part (with its folder for
    ``__init__.py`` and the like)."""
    parts = _file(frame).replace("\\", "/").rstrip("/").split("/")
    name = parts[-1]
    if len(parts) > 1 and name in ("__init__.py", "__main__.py"):
        name = "/".join(parts[-2:])
    line = frame.get("line")
    where = f"{name}:{line}" if line is not None and line != "" else name
    return f"{safe_text(frame.get('func') or '?')} ({safe_text(where)})"


def where(thread: Optional[Record]) -> str:
    """One line: ``all_reduce (distributed_c10d.py:2050)``, or past a wait ``waiting in poll (poll.py:106) under
    dequeue (shm_broadcast.py:794)``; ``no Python frames`` without frames. Safe to show."""
    frames = _frames(thread)
    if not frames:
        return "no Python frames"
    inner = frames[0]
    if not is_waiting(_file(inner)):
        return frame_text(inner)
    cause = next((f for f in frames if not is_waiting(_file(f))), None)
    if cause is None:
        return f"waiting in {frame_text(inner)}"
    return f"waiting in {frame_text(inner)} under {frame_text(cause)}"


def _stuck(text: str) -> str:
    return text if text.startswith(("waiting in ", "no Python")) else f"stuck in {text}"


# --- grouping --------------------------------------------------------------------------------------------------


@dataclass
class StackGroup:
    """Processes whose main threads stand in the same frames (or, without a Python stack, in the same state)."""

    processes: list[Record]  # sorted by rank, then pid
    frames: list[Record]  # the main thread's, outermost first (the blocking frame last); [] without a stack
    label: str  # who: "ranks 0–6", "rank 7", "pid 4242", "pids 11, 12", "ranks 0–1, pid 9"
    where: str  # one line: what the main thread is stuck in (safe to show)
    parts_at: Optional[int] = None  # index into frames of the first frame where this group parts from the others
    role: str = ""  # the role all share, numbers compressed ("worker TP 0–6", "EngineCore"); "" when mixed

    @property
    def has_stack(self) -> bool:
        return bool(self.frames)


def _int(value: Any) -> Optional[int]:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def _order(record: Record) -> tuple[int, int, int]:
    rank, pid = _int(record.get("rank")), _int(record.get("pid"))
    return (0 if rank is not None else 1, rank if rank is not None else 0, pid if pid is not None else -1)


def compress(numbers: Iterable[int]) -> str:
    """``0–6``; ``0, 2, 5``; ``11, 12``; ``0–3, 7``: runs of three or more with an en dash."""
    values = sorted(set(numbers))
    out: list[str] = []
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        if j - i >= 2:
            out.append(f"{values[i]}–{values[j]}")
        else:
            out.extend(str(v) for v in values[i:j + 1])
        i = j + 1
    return ", ".join(out)


def label(processes: list[Record]) -> str:
    """``ranks 0–6``, ``rank 7``, ``pid 4242``, ``pids 11, 12``; ranks where known, pids for the rest."""
    ranks = [r for r in (_int(p.get("rank")) for p in processes) if r is not None]
    rest = [p for p in processes if _int(p.get("rank")) is None]
    pids = [n for n in (_int(p.get("pid")) for p in rest) if n is not None]
    parts = []
    if ranks:
        parts.append(f"rank{'s' if len(set(ranks)) > 1 else ''} {compress(ranks)}")
    if pids:
        parts.append(f"pid{'s' if len(set(pids)) > 1 else ''} {compress(pids)}")
    others = len(rest) - len(pids)
    if others:
        parts.append(f"{others} process{'es' if others > 1 else ''} without a pid")
    return ", ".join(parts) or "no processes"


def shared_role(processes: list[Record]) -> str:
    """The role all share (``EngineCore``); roles that differ only in their number compressed (``worker TP 0–6``);
    "" when they differ otherwise. Safe to show."""
    roles = [str(p.get("role") or "") for p in processes]
    if not roles or not roles[0]:
        return ""
    if all(r == roles[0] for r in roles):
        return safe_text(roles[0])
    numbered = [_ROLE_NUMBER.match(r) for r in roles]
    bases = {m.group("base") for m in numbered if m is not None}
    if len(bases) != 1 or any(m is None for m in numbered):
        return ""
    return safe_text(f"{bases.pop()} {compress(int(m.group('number')) for m in numbered if m is not None)}")


def _key(record: Record) -> tuple[Any, ...]:
    frames = _frames(main_thread(_threads(record), _method(record)))
    if frames:
        return ("stack",) + tuple((_file(f), str(f.get("func") or ""), str(f.get("line"))) for f in frames)
    return ("none", str(record.get("state") or ""), str(record.get("wchan") or ""), _note(record))


def _threads(record: Record) -> list[Record]:
    threads = record.get("threads")
    return [t for t in threads if isinstance(t, dict)] if isinstance(threads, list) else []


def _method(record: Record) -> Optional[str]:
    method = record.get("method")
    return method if isinstance(method, str) and method else None


def _note(record: Record) -> str:
    note = str(record.get("note") or "")
    if not note and _threads(record):
        return "no Python frames"
    return note


def group(processes: list[Record]) -> list[StackGroup]:
    """Processes whose main threads hold the same frames (file, function, line) as one group; processes with no
    Python stack by (state, wchan, note). Groups ordered by their lowest rank, then pid; ``parts_at`` set where
    two or more groups have frames."""
    buckets: dict[tuple[Any, ...], list[Record]] = {}
    for record in processes:
        if isinstance(record, dict):
            buckets.setdefault(_key(record), []).append(record)
    groups: list[StackGroup] = []
    for members in buckets.values():
        members.sort(key=_order)
        first = members[0]
        main = main_thread(_threads(first), _method(first))
        frames = list(reversed(_frames(main)))
        text = where(main) if frames else _no_stack(first)
        groups.append(StackGroup(members, frames, label(members), text, None, shared_role(members)))
    groups.sort(key=lambda g: _order(g.processes[0]))
    _mark_parting(groups)
    return groups


def _no_stack(record: Record) -> str:
    note = _note(record)
    return f"no Python stack ({safe_text(note)})" if note else "no Python stack"


def _frame_key(frame: Record) -> tuple[str, str, str]:
    return (_file(frame), str(frame.get("func") or ""), str(frame.get("line")))


def _mark_parting(groups: list[StackGroup]) -> None:
    """Each group's first frame (outermost first) that the group nearest to it does not share."""
    stacked = [g for g in groups if g.frames]
    if len(stacked) < 2:
        return
    keys = [[_frame_key(f) for f in g.frames] for g in stacked]
    for i, mine in enumerate(keys):
        shared = 0
        for j, theirs in enumerate(keys):
            if i == j:
                continue
            common = 0
            for a, b in zip(mine, theirs):
                if a != b:
                    break
                common += 1
            shared = max(shared, common)
        # A stack that is all the other's outer part parts where it stands: at its innermost frame.
        stacked[i].parts_at = min(shared, len(mine) - 1)


# --- text ------------------------------------------------------------------------------------------------------


def _cut(line: str, width: Optional[int]) -> str:
    if width is None or width <= 0 or len(line) <= width:
        return line
    return line[: max(width - 1, 0)] + "…"


def _stack_lines(frames: list[Record], parts_at: Optional[int], indent: str) -> list[str]:
    """Frames outermost first, one a line; past KEEP_HEAD + KEEP_TAIL frames the middle elided, but never the
    parting frame."""
    shown = set(range(len(frames)))
    if len(frames) > KEEP_HEAD + KEEP_TAIL:
        shown = set(range(KEEP_HEAD)) | set(range(len(frames) - KEEP_TAIL, len(frames)))
        if parts_at is not None and 0 <= parts_at < len(frames):
            shown.add(parts_at)
    lines: list[str] = []
    hidden = 0
    for index, frame in enumerate(frames):
        if index not in shown:
            hidden += 1
            continue
        if hidden:
            lines.append(f"{indent}… {hidden} frame{'s' if hidden > 1 else ''} …")
            hidden = 0
        if index == parts_at:
            lines.append(f"{indent[:-2]}{PARTS_MARK} {frame_text(frame)}   {PARTS_WORDS}")
        else:
            lines.append(f"{indent}{frame_text(frame)}")
    return lines


def _other_threads(g: StackGroup) -> list[tuple[Record, Record]]:
    """(process, thread) for every thread of the group's processes but their main threads."""
    out: list[tuple[Record, Record]] = []
    for record in g.processes:
        threads = _threads(record)
        main = main_thread(threads, _method(record))
        out.extend((record, t) for t in threads if t is not main)
    return out


def _header(g: StackGroup) -> str:
    parts = [g.label]
    if g.role:
        parts.append(g.role)
    if len(g.processes) > 1:
        parts.append(f"{len(g.processes)} processes")
    if g.has_stack:
        parts.append(_stuck(g.where))
    else:
        parts.append(g.where)
        first = g.processes[0]
        state, wchan = safe_text(first.get("state") or ""), safe_text(first.get("wchan") or "")
        if state or wchan:
            parts.append(f"{state} in {wchan}".strip() if wchan else state)
    return " · ".join(parts)


def render(groups: list[StackGroup], all_threads: bool = False, width: Optional[int] = None) -> list[str]:
    """Plain lines for a terminal: each group's header, its main thread's frames outermost first (the parting
    frame marked), and its other threads in one line (``all_threads``: each with its frames). Safe to show."""
    lines: list[str] = []
    for g in groups:
        lines.append(_header(g))
        if any(_int(p.get("rank")) is None for p in g.processes) or not g.has_stack:
            cmdlines = sorted({str(p.get("cmdline") or "") for p in g.processes} - {""})
            for cmdline in cmdlines[:3]:
                lines.append(f"    $ {safe_text(cmdline)}")
            if len(cmdlines) > 3:
                lines.append(f"    … {len(cmdlines) - 3} other command lines")
        if not g.has_stack:
            continue
        lines.extend(_stack_lines(g.frames, g.parts_at, "    "))
        others = _other_threads(g)
        if not others:
            continue
        if all_threads:
            lines.extend(_all_other_threads(g, others))
        else:
            lines.append(_others_line(g, others))
    return [_cut(line, width) for line in lines]


def _others_line(g: StackGroup, others: list[tuple[Record, Record]]) -> str:
    counts = Counter(where(t) for _, t in others)
    n = len(others)
    head = f"  + {n} other thread{'s' if n > 1 else ''}"
    if len(g.processes) > 1:
        head += f" in {len(g.processes)} processes"
    kinds = [f"{c} {w}" if w.startswith(("waiting", "no Python")) else f"{c} in {w}"
             for w, c in sorted(counts.items(), key=lambda item: (-item[1], item[0]))]
    if len(kinds) > 4:
        kinds = kinds[:4] + ["…"]
    return f"{head}: {', '.join(kinds)}"


def _all_other_threads(g: StackGroup, others: list[tuple[Record, Record]]) -> list[str]:
    """Each other thread under its name with its frames; threads of the same frames in several processes once."""
    same: dict[tuple[Any, ...], list[tuple[Record, Record]]] = {}
    for record, thread in others:
        same.setdefault(tuple(_frame_key(f) for f in _frames(thread)), []).append((record, thread))
    lines: list[str] = []
    for members in same.values():
        thread = members[0][1]
        names = {str(t.get("name") or "") for _, t in members}
        parts = [f"  thread {safe_text(names.pop())}" if len(names) == 1 else f"  {len(members)} threads"]
        if len(g.processes) > 1:
            parts.append(label(sorted({id(r): r for r, _ in members}.values(), key=_order)))
        parts.append(_stuck(where(thread)))
        lines.append(" · ".join(parts))
        lines.extend(_stack_lines(list(reversed(_frames(thread))), None, "      "))
    return lines


def summary(groups: list[StackGroup]) -> str:
    """One line for an alert or a status bar: ``ranks 0–6: all_reduce (distributed_c10d.py:2050); rank 7:
    load_weights (loader.py:88)``, cut at about SUMMARY_CHARS characters. Safe to show."""
    text = "; ".join(f"{g.label}: {g.where}" for g in groups)
    return _cut(text, SUMMARY_CHARS)


__all__ = [
    "StackGroup",
    "blocking_frame",
    "compress",
    "frame_text",
    "group",
    "label",
    "main_thread",
    "parse_dump",
    "render",
    "shared_role",
    "summary",
    "where",
]


def report(taken: Optional[dict[str, Any]], all_threads: bool = False, width: Optional[int] = None) -> list[str]:
    """The agent's stacks record as ``eaglewatch stacks`` and the dashboard show it: a head (how many processes,
    by which method, when), then the groups. ``None``: not taken yet."""
    import time

    if taken is None:
        return ["taking the stacks of every process of the run…"]
    processes = [record for record in taken.get("processes") or [] if isinstance(record, dict)]
    at = taken.get("taken_at")
    when = time.strftime("%H:%M:%S", time.localtime(at)) if isinstance(at, (int, float)) else "never"
    run = safe_text(str(taken.get("run") or "the run"))
    if not processes:
        error = taken.get("error")
        why = f": {safe_text(str(error))}" if error else ""
        return [f"{run}: no stacks (taken: {when}){why}"]
    methods = ", ".join(safe_text(str(m)) for m in taken.get("methods") or []) or "?"
    count = f"{len(processes)} process{'es' if len(processes) != 1 else ''}"
    return [f"{run} · {count} · taken {when} by {methods}", ""] + render(group(processes), all_threads, width)
