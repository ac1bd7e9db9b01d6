"""Failures as the dashboard shows them: the decoder's groups and the preflight's failed checks, as FailureViews,
each with the keys its alert is remembered by.

A root cause's alert must ring once however it is refined: the decoder shows it when its exception line arrives
(provisional) and again, complete, when the chained part or the lane's silence ends the report, and the complete
one may name another root exception (so another text and another group key). What stays is *who printed it and
where it began*: the process and the first line. Two different failures in two lanes differ in that (each rings
once when it becomes the root cause), even with the same text; the same failure printed by two ranks at once
shares its group key, which is remembered too.
"""

from __future__ import annotations

from typing import Any, Optional

from eaglewatch.decode import FailureGroup
from eaglewatch.decode.events import KIND_CHECK
from eaglewatch.tui.runstate.view import FailureView

_TIERS = {0: "original", 1: "secondary", 2: "re-raised", 3: "final report"}
_CHECK_COPY = "PreflightCheckFailed"  # the decoder's name for a "[FAIL] name  reason" row of the printed table

AlertKeys = frozenset[tuple[object, ...]]


def _process(group: FailureGroup) -> str:
    return group.process_keys[0] if group.process_keys else f"name:{group.first.lane}"


def group_ident(group: FailureGroup) -> str:
    ident = f"{_process(group)}@{group.first.line_no}"
    return f"quoted:{ident}" if group.quoted_in is not None else ident


def alert_keys(group: FailureGroup) -> AlertKeys:
    """Where it began (its first copy's line, and the earliest line of any copy: a lone exception line may come
    before its traceback), in which process, and what the decoder groups it by."""
    process = _process(group)
    return frozenset({("at", process, group.first.line_no), ("at", process, group.line_no), ("group", group.key)})


def failure_view(group: FailureGroup, position: int) -> FailureView:
    first = group.first
    inner = group.innermost
    hint = group.hint
    return FailureView(
        position=position,
        summary=group.summary,
        lanes=group.lanes_label(),
        tier=_TIERS.get(group.tier, str(group.tier)),
        count=group.count,
        location=inner.location() if inner is not None else None,
        source_line=inner.source if inner is not None else None,
        context=first.context,
        hint_title=hint.title if hint is not None else None,
        hint_text=hint.text if hint is not None else None,
        traceback=first.text or group.summary,
        provisional=group.provisional,
        confidence=group.confidence,
        basis=group.basis,
        quoted_in=group.quoted_in,
        ident=group_ident(group),
    )


def check_copy(group: FailureGroup, names: set[str]) -> Optional[str]:
    """The failed check a decoder group is the printed table's copy of (``[FAIL] miniature  ...``), if any: the
    check's own event says more (the miniature's decoded root cause), so it is shown instead."""
    if group.first.kind != KIND_CHECK or group.exc_type != _CHECK_COPY:
        return None
    name = group.message.split(":", 1)[0].strip()
    return name if name in names else None


def check_keys(name: str) -> AlertKeys:
    return frozenset({("check", name)})


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def check_failure_view(name: str, event: dict[str, Any], position: int) -> FailureView:
    """A failed preflight check; a failed miniature leads with the root cause decoded from its own log."""
    reason = _text(event.get("reason"))
    fix = _text(event.get("fix"))
    given = event.get("details")
    details: dict[str, Any] = given if isinstance(given, dict) else {}
    cause = details.get("root_cause")
    root: Optional[dict[str, Any]] = cause if isinstance(cause, dict) else None
    summary = _text(root.get("summary")) if root else ""
    lines = [f"preflight check {name} failed", f"reason: {reason}"]
    if root:
        lines.append(f"root cause: {summary}" + (f" ({_text(root.get('exc_type'))})" if root.get("exc_type") else ""))
    if fix:
        lines.append(f"fix: {fix}")
    hint = _text(root.get("hint")) if root and root.get("hint") else None
    return FailureView(
        position=position,
        summary=summary or f"{name}: {reason}",
        lanes=f"preflight · {name}",
        tier="original",
        count=1,
        location=None,
        source_line=None,
        context=f"the preflight's {name} check",
        hint_title=hint,
        hint_text=fix if hint else None,
        traceback="\n".join(lines),
        basis="preflight check event",
        ident=f"check:{name}",
    )
