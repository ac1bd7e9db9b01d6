"""A decoded state as a JSON document (schema in docs/decode.md) or as text for a terminal."""

from __future__ import annotations

import textwrap
from typing import Any, Optional

from eaglewatch.decode.events import Frame
from eaglewatch.decode.lanes import compress_names
from eaglewatch.decode.rootcause import TIER_NAMES, TIER_ORIGINAL, FailureGroup
from eaglewatch.decode.state import BarState, DecodeState, LaneState

SCHEMA = "eaglewatch.decode/1"


def _num(value: Optional[float]) -> Optional[float | int]:
    if value is None:
        return None
    if float(value).is_integer():
        return int(value)
    return round(value, 3)


def frame_dict(frame: Optional[Frame]) -> Optional[dict[str, Any]]:
    if frame is None:
        return None
    return {"file": frame.file, "line": frame.line, "function": frame.function, "source": frame.source,
            "kind": frame.kind}


def _user_frame(group: FailureGroup) -> Optional[Frame]:
    """The innermost frame of the operator's own code, when the failure passed through it."""
    for exc in reversed(group.first.exceptions):
        for frame in reversed(exc.frames):
            if frame.is_user:
                return frame
    return None


def group_dict(group: FailureGroup, position: int) -> dict[str, Any]:
    first = group.first
    return {
        "position": position,
        "exc_type": group.exc_type,
        "message": group.message,
        "summary": group.summary,
        "lanes": list(group.lanes),
        "lanes_label": group.lanes_label(),
        "count": group.count,
        "processes": group.spread,
        "tier": TIER_NAMES[group.tier],
        "kind": first.kind,
        "confidence": group.confidence,
        "basis": group.basis,
        "provisional": group.provisional,
        "quoted_in": group.quoted_in,
        "frame": frame_dict(group.innermost),
        "user_frame": frame_dict(_user_frame(group)),
        "hint": group.hint.as_dict() if group.hint else None,
        "traceback": first.text,
        "chain": [{"exc_type": exc.exc_type, "message": exc.message, "link": exc.link} for exc in first.exceptions],
        "sub_exceptions": [
            {"exc_type": sub.exc_type, "message": sub.message, "frame": frame_dict(sub.innermost)}
            for exc in first.exceptions
            for sub in exc.sub_exceptions
        ],
        "level": first.level,
        "time": first.time,
        "context": first.context,
        "signal": first.signal,
        "complete": first.complete,
        "line": first.line_no + 1,
    }


def lane_dict(lane: LaneState) -> dict[str, Any]:
    return {
        "name": lane.name,
        "kind": lane.kind,
        "pid": lane.pid,
        "ranks": {axis: num for axis, num in lane.ranks},
        "lines": lane.lines,
        "warnings": lane.warnings,
        "errors": lane.errors,
        "levels": dict(lane.levels),
        "last_time": lane.last_time,
    }


def bar_dict(bar: BarState) -> dict[str, Any]:
    last = bar.last
    return {
        "lane": bar.lane,
        "desc": bar.desc,
        "n": _num(last.n),
        "total": _num(last.total),
        "percent": last.percent,
        "unit": last.unit,
        "rate": _num(last.rate),
        "rate_unit": last.rate_unit,
        "per_second": _num(last.per_second),
        "elapsed_s": _num(last.elapsed_s),
        "remaining_s": _num(last.remaining_s),
        "eta_s": _num(last.eta_s),
        "postfix": last.postfix,
        "done": last.done,
        "updates": bar.updates,
    }


def to_dict(state: DecodeState, source: Optional[str] = None) -> dict[str, Any]:
    """The whole state as one JSON-ready document."""
    failures = state.failures_ranked()
    warnings = state.warnings_ranked()
    with state.lock:
        return {
            "schema": SCHEMA,
            "file": source,
            "lines": state.lines,
            "bytes": state.bytes,
            "facts": dict(state.facts),
            "lanes": [lane_dict(lane) for lane in state.lanes_list()],
            "progress": [bar_dict(bar) for bar in state.bars_list()],
            "failures": [group_dict(group, i + 1) for i, group in enumerate(failures)],
            "warnings": [group_dict(group, i + 1) for i, group in enumerate(warnings)],
            "dropped_failures": state.dropped_failures,
        }


# ---------------------------------------------------------------------------------------------- text


def _fmt_count(value: Optional[float]) -> str:
    if value is None:
        return "?"
    if float(value).is_integer():
        return str(int(value))
    return f"{value:.4g}"


def fmt_seconds(value: Optional[float]) -> str:
    if value is None:
        return "?"
    value = int(round(value))
    hours, rest = divmod(value, 3600)
    minutes, seconds = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{seconds:02d}s"
    return f"{seconds}s"


def bar_line(bar: BarState) -> str:
    last = bar.last
    count = f"{_fmt_count(last.n)}/{_fmt_count(last.total)}" if last.total is not None else _fmt_count(last.n)
    pct = f"{last.percent:3d}%" if last.percent is not None else "    "
    rate = f"{last.rate:g} {last.rate_unit}" if last.rate is not None and last.rate_unit else "?"
    if last.done:
        eta = "done"
    elif last.eta_s is not None:
        eta = f"eta {fmt_seconds(last.eta_s)}"
    else:
        eta = ""
    return f"{bar.lane:<14} {bar.desc or '(no description)':<40} {count:>11} {pct} {rate:>14}  {eta}"


def _frame_lines(frame: Frame, indent: str) -> list[str]:
    where = f"{frame.file}:{frame.line}" if frame.line is not None else frame.file
    lines = [f"{indent}at {where} in {frame.function}" if frame.function else f"{indent}at {where}"]
    if frame.source:
        lines.append(f"{indent}    {frame.source}")
    return lines


def group_lines(
    group: FailureGroup, position: int, show_traceback: bool, width: int = 100, hint_shown: bool = False
) -> list[str]:
    first = group.first
    tag = "" if group.tier == TIER_ORIGINAL else f"[{TIER_NAMES[group.tier]}] "
    if group.provisional:
        tag = "[provisional] " + tag
    lines = [f"{position:>2}. {tag}{group.summary}"]
    pad = "    "
    times = f", printed {group.count} times" if group.count > group.spread else ""
    lines.append(f"{pad}lanes: {group.lanes_label()}{times}")
    basis = f" ({group.basis})" if group.basis else ""
    lines.append(f"{pad}confidence: {group.confidence}{basis}")
    if first.context:
        lines.append(f"{pad}logged as: {first.context}")
    inner = group.innermost
    if inner is not None:
        lines.extend(_frame_lines(inner, pad))
        user = _user_frame(group)
        if user is not None and user != inner:
            lines.append(f"{pad}from your code: {user.file}:{user.line} in {user.function}")
    for exc in first.exceptions:
        for sub in exc.sub_exceptions:
            lines.append(f"{pad}- {sub.exc_type}: {sub.message.splitlines()[0] if sub.message else ''}".rstrip())
    if group.hint is not None and hint_shown:
        lines.append(f"{pad}hint: {group.hint.title} (as above)")
    elif group.hint is not None:
        hint = group.hint
        lines.append(f"{pad}hint: {hint.title}")
        for text_line in textwrap.wrap(hint.text, width=width - 10):
            lines.append(f"{pad}      {text_line}")
        if hint.figures:
            figures = ", ".join(f"{key}={value}" for key, value in hint.figures.items())
            lines.append(f"{pad}      ({figures})")
    if show_traceback and first.text:
        text_lines = first.text.splitlines()
        if len(text_lines) > 40:
            text_lines = text_lines[:5] + [f"... {len(text_lines) - 35} lines ..."] + text_lines[-30:]
        lines.append(f"{pad}traceback:")
        lines.extend(f"{pad}  | {line}" for line in text_lines)
    return lines


def render_text(state: DecodeState, source: Optional[str] = None, all_tracebacks: bool = False) -> str:
    failures = state.failures_ranked()
    warnings = state.warnings_ranked()
    lanes = state.lanes_list()
    bars = state.bars_list()
    facts = dict(state.facts)
    out: list[str] = []
    head = [f"{state.lines} lines", f"{len(lanes)} lanes"]
    if "vllm_version" in facts:
        head.append(f"vLLM {facts['vllm_version']}")
    if "tensor_parallel_size" in facts:
        head.append(f"TP={facts['tensor_parallel_size']}")
    if "exit_status" in facts:
        head.append(f"exit status {facts['exit_status']}")
    out.append(f"{source or 'log'}: " + ", ".join(head))
    if failures:
        root = failures[0]
        notes = [] if root.confidence == "certain" else [f"{root.confidence}: {root.basis}"]
        if root.provisional:
            notes.append("provisional")
        note = f"  ({'; '.join(notes)})" if notes else ""
        out.append(f"Root cause: {root.summary}  [{compress_names(root.lanes)}]{note}")
    else:
        out.append("No failures.")
    out.append("")
    out.append("Lanes")
    out.append(f"  {'LANE':<20} {'KIND':<7} {'PID':>8} {'LINES':>7} {'WARN':>5} {'ERR':>5}  LAST TIME")
    for lane in lanes:
        pid = str(lane.pid) if lane.pid is not None else "-"
        out.append(
            f"  {lane.name:<20} {lane.kind:<7} {pid:>8} {lane.lines:>7} {lane.warnings:>5} {lane.errors:>5}"
            f"  {lane.last_time or ''}".rstrip()
        )
    if bars:
        out.append("")
        out.append("Progress (last state of each bar)")
        for bar in bars:
            out.append("  " + bar_line(bar))
    if failures:
        out.append("")
        out.append("Failures (root cause first)")
        shown: set[str] = set()
        for i, group in enumerate(failures):
            hint_id = group.hint.id if group.hint else ""
            lines = group_lines(group, i + 1, all_tracebacks or i == 0, hint_shown=hint_id in shown)
            out.extend("  " + line for line in lines)
            shown.add(hint_id)
    if warnings:
        out.append("")
        out.append("Warnings (tracebacks the process survived)")
        for i, group in enumerate(warnings):
            out.extend("  " + line for line in group_lines(group, i + 1, all_tracebacks))
    if state.dropped_failures:
        out.append("")
        out.append(f"({state.dropped_failures} further distinct failures not kept)")
    return "\n".join(out) + "\n"
