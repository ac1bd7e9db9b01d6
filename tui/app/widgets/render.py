"""RunView -> Rich Text for each panel. Pure functions of the view and the width: no IO, no state.

Every string of the view that came from the host (names, arguments, log lines, tracebacks, telemetry notes) is
shown through ``eaglewatch.safetext.safe_text`` (``_s`` here), so that none of it can drive the terminal."""

from __future__ import annotations

import zlib
from typing import Optional

from rich.text import Text

from eaglewatch.safetext import safe_text
from eaglewatch.tui.runstate import CheckView, FailureView, GpuView, LogLine, RunView
from eaglewatch.tui.runstate.jobkind import ENGINE_FREE_TOOLS, engine_free_tool
from eaglewatch.tui.runstate.fmt import bar, fmt_bytes, fmt_count, fmt_duration, fmt_gb, fmt_rate, sparkline

PHASE_STYLES = {
    "validating": "bold cyan",
    "loading": "bold yellow",
    "extracting": "bold green",
    "done": "bold green",
    "failed": "bold white on red",
    "stalled": "bold black on yellow",
    "stopped": "bold black on yellow",
    "lost": "bold white on red",
}
LEVEL_STYLES = {"WARNING": "yellow", "ERROR": "bold red", "CRITICAL": "bold white on red", "DEBUG": "dim"}
_LANE_COLOURS = ("cyan", "magenta", "green", "yellow", "blue", "bright_cyan", "bright_magenta", "bright_green",
                 "bright_blue", "bright_yellow")


def _s(value: object, keep: str = "") -> str:
    return safe_text(value, keep)


def lane_style(lane: str) -> str:
    if lane == "main":
        return "bright_white"
    if lane == "eaglewatch":
        return "bold bright_white"
    return _LANE_COLOURS[zlib.crc32(lane.encode()) % len(_LANE_COLOURS)]


def _clip(text: str, width: int) -> str:
    if width <= 1:
        return text[:max(width, 0)]
    return text if len(text) <= width else text[: width - 1] + "…"


def flow(items: list[Text], width: int, gap: str = "  ") -> Text:
    """Items side by side while they fit ``width``, the next one on a new line when it does not, so that a narrow
    panel shows every figure instead of cutting the last ones. An item wider than a line is cut with an ellipsis."""
    out = Text(no_wrap=True, overflow="ellipsis")
    used = 0
    for item in items:
        if not item.plain:
            continue
        need = len(item.plain) + (len(gap) if used else 0)
        if used and used + need > width:
            out.append("\n")
            used = 0
        elif used:
            out.append(gap)
        if len(item.plain) > width:
            item = item.copy()
            item.truncate(width, overflow="ellipsis")
        out.append_text(item)
        used += len(item.plain) + (len(gap) if used else 0)
    return out


def _figure(label: str, value: str, style: str = "", tail: str = "", tail_style: str = "dim") -> Text:
    text = Text(no_wrap=True)
    if label:
        text.append(label + " ", "dim")
    text.append(value, style)
    if tail:
        text.append(tail, tail_style)
    return text


READ_ONLY_BADGE = " READ-ONLY "


def header_text(view: RunView, width: int, read_only: bool = False) -> Text:
    first = Text(no_wrap=True, overflow="ellipsis")
    first.append(f" {_s(view.host)} ", "bold reverse")
    first.append(" ")
    if read_only:
        first.append(READ_ONLY_BADGE, "bold black on yellow")
        first.append(" ")
    first.append(f" {_s(view.phase).upper()} ", PHASE_STYLES.get(view.phase, "bold"))
    for mark in view.marks:
        if mark != view.phase:
            first.append(" ")
            first.append(f"⚑ {_s(mark)}", "bold red" if mark == "failed" else "bold yellow")
    if view.exit_text:
        first.append("  ")
        ok = view.exit_code == 0 or view.phase == "stopped"  # the operator's stop is no failure
        first.append(_s(view.exit_text), "bold green" if view.exit_code == 0 else "bold yellow" if ok else "bold red")
    if view.uptime_s is not None:
        first.append(f"  up {fmt_duration(view.uptime_s)}")
    if view.link and view.link != "connected":
        first.append(f"  link {_s(view.link)}", "bold yellow")
    first.append("  ")
    first.append(_s(view.run) or "(no run)", "bold")
    if view.name:
        first.append(f" ({_s(view.name)})", "dim")
    if view.phase_detail and view.phase not in ("failed", "stalled"):
        first.append(f"  {_s(view.phase_detail)}", "dim")
    first.truncate(width, overflow="ellipsis")
    second = Text(_clip("$ " + _s(view.command), width) if view.command else "", "dim", no_wrap=True)
    return Text("\n", no_wrap=True).join([first, second])


def load_text(view: RunView, width: int) -> Text:
    text = Text(no_wrap=True, overflow="ellipsis")
    if not view.load:
        waiting = view.phase in ("starting", "validating", "loading")
        text.append("waiting for the loader…" if waiting else "no loading bars", "dim")
        _append_load_step(text, view, width)
        return text
    lane_w = min(16, max(len(_s(b.lane)) for b in view.load))
    for i, item in enumerate(view.load):
        if i:
            text.append("\n")
        count = f"{fmt_count(item.n)}/{fmt_count(item.total)}" if item.total is not None else fmt_count(item.n)
        state = "done" if item.done else f"eta {fmt_duration(item.eta_s)}" if item.eta_s is not None else ""
        tail = f" {count:>7} {fmt_rate(item.per_second, item.unit):>11} {state:>8}"
        if width < lane_w + len(tail) + 8:
            tail = f" {count:>7} {state:>8}"
        bar_w = max(4, min(30, width - lane_w - len(tail) - 2))
        fraction = item.n / item.total if item.total else None
        text.append(_clip(_s(item.lane), lane_w).ljust(lane_w), lane_style(item.lane))
        text.append(" ")
        text.append(bar(fraction, bar_w), "green" if item.done else "yellow")
        text.append(tail)
        if width >= lane_w + bar_w + len(tail) + 12:
            text.append(f"  {_s(item.desc)}", "dim")
    _append_load_step(text, view, width)
    return text


def tool_text(view: RunView, width: int) -> Text:
    """A run of an eaglewatch command that loads no model (prepare, verify, ...): what it does, and where its
    report is, instead of loading, extraction and GPU panels that would stay empty."""
    tool = engine_free_tool(view.argv) or ""
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(f"eaglewatch {tool}", "bold")
    text.append("\n".join(["", *wrap_words(ENGINE_FREE_TOOLS.get(tool, ""), width, 2)]), "dim")
    text.append("\n")
    text.append("no model load, no GPU: its report is in the log" if view.job_state != "exited"
                else "ended: its report is in the log", "dim")
    return text


CHECK_MARKS = {"pass": ("✓", "green"), "warn": ("!", "bold yellow"), "fail": ("✗", "bold red"),
               "running": ("▸", "bold cyan")}
_CHECK_ORDER = {"fail": 0, "running": 1, "warn": 2, "pass": 3}


def shows_preflight(view: RunView) -> bool:
    """The loading panel shows the preflight's checklist until the run has loading bars or reached loading."""
    return bool(view.checks) and not view.load and "loading" not in view.phases_seen


def preflight_text(view: RunView, width: int) -> Text:
    """A summary line, then one row per check: failed, running and warned first (a short panel still shows
    them), each with its reason; the running miniature with its stage and how long it has been at it."""
    checks = view.checks
    text = Text(no_wrap=True, overflow="ellipsis")
    counts = {status: sum(c.status == status for c in checks) for status in CHECK_MARKS}
    parts = [f"{counts['pass']} passed"]
    if counts["warn"]:
        parts.append(f"{counts['warn']} warning" + ("s" if counts["warn"] > 1 else ""))
    if counts["fail"]:
        parts.append(f"{counts['fail']} failed")
    text.append("checks ", "dim")
    text.append(" · ".join(parts), "bold red" if counts["fail"] else "bold")
    name_w = min(14, max(len(_s(c.name)) for c in checks))
    for check in sorted(checks, key=lambda c: _CHECK_ORDER.get(c.status, 1)):
        text.append("\n")
        mark, style = CHECK_MARKS.get(check.status, ("?", "bold"))
        text.append(f"{mark} ", style)
        text.append(_clip(_s(check.name), name_w).ljust(name_w), "bold" if check.status != "pass" else "")
        text.append(" ")
        text.append_text(_check_detail(check, max(1, width - name_w - 3), indent=name_w + 3))
    return text


def _check_detail(check: CheckView, width: int, indent: int = 0) -> Text:
    text = Text(no_wrap=True, overflow="ellipsis")
    if check.status == "running":
        text.append(_s(check.stage or "running"), "bold cyan")
        text.append(f" {fmt_duration(check.elapsed_s)}", "bold")
        if check.stage_elapsed_s is not None and check.elapsed_s is not None \
                and check.elapsed_s - check.stage_elapsed_s >= 1:
            text.append(f" (this stage {fmt_duration(check.stage_elapsed_s)})", "dim")
        return text
    took = f" ({fmt_duration(check.elapsed_s)})" if check.elapsed_s is not None else ""
    style = {"fail": "red", "warn": "yellow"}.get(check.status, "dim")
    if check.status in ("fail", "warn"):
        # What failed or warned is the point of the panel: its reason wraps (to a few lines) instead of being cut.
        lines = wrap_words(_s(check.reason) + took, width, REASON_LINES)
        text.append(("\n" + " " * indent).join(lines), style)
        return text
    text.append(_clip(_s(check.reason) + took, width), style)
    return text


REASON_LINES = 3  # a failed or warned check's reason, at most


def wrap_words(value: str, width: int, most: int) -> list[str]:
    """``value`` in lines of at most ``width`` characters, broken at spaces where it can be; at most ``most``
    lines, the last cut with an ellipsis when there is more."""
    width = max(1, width)
    lines: list[str] = []
    rest = value
    while rest and len(lines) < most:
        if len(rest) <= width:
            lines.append(rest)
            rest = ""
            break
        cut = rest.rfind(" ", 0, width + 1)
        cut = cut if cut > 0 else width
        lines.append(rest[:cut].rstrip())
        rest = rest[cut:].lstrip()
    if rest and lines:
        lines[-1] = _clip(lines[-1] + " " + rest, width)
    return lines or [""]


def _append_load_step(text: Text, view: RunView, width: int) -> None:
    """The engine's latest INFO line and its age: after the shard bars, vLLM can profile and warm up for minutes
    with nothing else to show that it is alive."""
    if not view.load_step:
        return
    age = f"{fmt_duration(view.load_step_age_s)} ago " if view.load_step_age_s is not None else ""
    text.append("\n")
    text.append(age, "yellow" if (view.load_step_age_s or 0) >= 60 else "dim")
    text.append(_clip(_s(view.load_step), max(1, width - len(age))), "dim italic")


def extraction_text(view: RunView, width: int) -> Text:
    ex = view.extraction
    text = Text(no_wrap=True, overflow="ellipsis")
    fraction = ex.done / ex.total if ex.done is not None and ex.total else None
    count = f"{fmt_count(ex.done)}/{fmt_count(ex.total)}" if ex.total else fmt_count(ex.done)
    if view.job_kind:
        text.append(f"{view.job_kind}\n", "dim")
    text.append("samples ", "dim")
    text.append(count, "bold")
    text.append(" ")
    percent = f" {100 * fraction:3.0f}%" if fraction is not None else ""
    text.append(bar(fraction, max(4, min(30, width - len("samples ") - len(count) - 1 - len(percent)))), "green")
    text.append(percent)
    figures: list[Text] = []
    if ex.tokens_per_s is None and ex.samples_per_s is not None:
        figures.append(_figure("samples/s", f"{ex.samples_per_s:,.1f}"))
    else:
        figures.append(_figure("tokens/s", f"{ex.tokens_per_s:,.0f}" if ex.tokens_per_s is not None else "?"))
    if ex.failed_samples is not None:
        # A job that skips failed samples and goes on (speculators'): how many it lost says more than bytes.
        figures.append(_figure("failed", f"{ex.failed_samples:,}", "bold red" if ex.failed_samples else ""))
    else:
        figures.append(_figure("written", fmt_bytes(ex.bytes)))
    figures.append(_figure("eta", "done" if view.phase == "done" else fmt_duration(ex.eta_s)))
    if ex.pace is not None:
        figures.append(_figure("pace", f"{ex.pace}-bound", "bold yellow" if ex.pace == "disk" else ""))
    if ex.disk_free is not None:
        disk = _figure("disk free", fmt_gb(ex.disk_free), "bold red" if "low disk" in view.marks else "",
                       f" of {fmt_gb(ex.disk_total)}" if ex.disk_total else "")
        figures.append(disk)
        if ex.bytes_to_go is not None:
            # What the job still needs says more than the growth rate: a fast writer may stop well before full.
            short = ex.disk_free - ex.bytes_to_go < 0
            figures.append(_figure("needs", f"{fmt_gb(ex.bytes_to_go)} more", "bold red" if short else ""))
        elif ex.disk_full_in_s:
            figures.append(_figure("full in", fmt_duration(ex.disk_full_in_s), "yellow"))
    else:
        figures.append(_figure("disk free", "n/a", "dim"))
    text.append("\n")
    text.append_text(flow(figures, width))
    return text


def _gpu_lines(gpu: GpuView, width: int, wide: bool) -> Text:
    text = Text(no_wrap=True, overflow="ellipsis")
    if gpu.error:
        text.append(f"GPU{gpu.index} ", "bold")
        text.append(_s(gpu.error), "bold red")
        return text
    used, total = gpu.mem_used, gpu.mem_total
    fraction = used / total if used is not None and total else None
    figures = f" {fmt_gb(used).replace(' GiB', '')}/{fmt_gb(total)}"
    util = f" {gpu.util:3.0f}%" if gpu.util is not None else "   ?%"
    temp = f" {gpu.temp_c:.0f}°C" if gpu.temp_c is not None else " ?°C"
    power = f" {gpu.power_w:.0f}W" if gpu.power_w is not None else " ?W"
    spark_w = 12 if wide else 8
    fixed = 5 + len(figures) + len(util) + len(temp) + len(power) + spark_w + 2
    bar_w = max(4, min(24, width - fixed))
    text.append(f"GPU{gpu.index} ", "bold")
    colour = "red" if fraction is not None and fraction > 0.95 else "cyan"
    text.append(bar(fraction, bar_w), colour)
    text.append(figures)
    text.append(util, "bold")
    text.append(temp)
    text.append(power)
    text.append(" ")
    text.append(sparkline(gpu.util_history, spark_w, 100.0), "green")
    job = [proc for proc in gpu.processes if proc.in_job or proc.rank]
    others = [proc for proc in gpu.processes if not (proc.in_job or proc.rank)]
    if not wide:
        return text
    if gpu.throttle:
        text.append(f"\n     throttle: {_s(gpu.throttle)}", "yellow")
    if job or others:
        parts = [f"{_s(proc.rank or proc.pid)} {fmt_gb(proc.used_mem)}" for proc in job]
        if others:
            other_mem = sum(proc.used_mem or 0 for proc in others)
            parts.append(f"{len(others)} other {fmt_gb(other_mem)}")
        text.append("\n     " + _clip(" · ".join(parts), max(10, width - 5)), "dim")
    return text


def gpu_text(view: RunView, width: int, wide: bool = False) -> Text:
    if not view.gpus:
        text = Text(no_wrap=True, overflow="ellipsis")
        note = "no GPU telemetry" if view.gpu_note is None else _s(view.gpu_note)
        text.append("\n".join(wrap_words(note, width, 3)), "dim")
        host = view.host_info
        if host.cpu_percent is not None or host.ram_total:
            text.append("\n")
            text.append(host_line(view))
        return text
    text = Text(no_wrap=True, overflow="ellipsis")
    for i, gpu in enumerate(view.gpus):
        if i:
            text.append("\n")
        text.append_text(_gpu_lines(gpu, width, wide))
    return text


def host_line(view: RunView) -> str:
    host = view.host_info
    parts = []
    if host.cpu_percent is not None:
        parts.append(f"cpu {host.cpu_percent:.0f}%" + (f" of {host.cpu_count}" if host.cpu_count else ""))
    if host.ram_total:
        parts.append(f"ram {fmt_gb(host.ram_used)}/{fmt_gb(host.ram_total)}")
    if host.load1 is not None:
        parts.append(f"load {host.load1:.2f}")
    return "host " + "  ".join(parts) if parts else ""


PROVISIONAL_MARK = "… still printing"  # the report is not complete yet: a chained part or more may follow


def sureness(failure: FailureView) -> str:
    """How sure the decoder is, when it is not certain: "likely: from a fragment (no Traceback header)"."""
    if failure.confidence == "certain":
        return ""
    return f"{failure.confidence}: {failure.basis}" if failure.basis else failure.confidence


def failure_label(failure: FailureView, width: int, compact: bool = False) -> Text:
    """A failure's row: its summary, lanes, and what the decoder adds. ``compact``: one line, cut to ``width``
    (a narrow screen keeps room for the log; the full label is one key away, f)."""
    text = Text(no_wrap=compact, overflow="ellipsis")
    tag = "" if failure.tier == "original" else f"[{failure.tier}] "
    text.append(f"{failure.position}. ", "bold")
    if tag:
        text.append(tag, "dim")
    text.append(_s(failure.summary), "bold red" if failure.position == 1 else "red")
    if compact:
        text.append(f" · {_s(failure.lanes)}", "cyan")
        if failure.provisional:
            text.append(f" · {PROVISIONAL_MARK}", "italic yellow")
        text.truncate(max(1, width), overflow="ellipsis")
        return text
    text.append(f"\n   {_s(failure.lanes)}", "cyan")
    if failure.count > 1:
        text.append(f" · printed {failure.count}×", "dim")
    if failure.provisional:
        text.append(f" · {PROVISIONAL_MARK}", "italic yellow")
    sure = sureness(failure)
    if sure:
        text.append(f" · {_s(sure)}", "yellow")
    if failure.quoted_in:
        text.append(f" · quoted by {_s(failure.quoted_in)}", "dim")
    if failure.hint_title:
        text.append("\n   hint: ", "yellow")
        text.append(_s(failure.hint_title), "yellow")
    return text


def traceback_text(failure: FailureView) -> Text:
    text = Text()
    text.append(_s(failure.summary) + "\n", "bold red")
    text.append(f"lanes: {_s(failure.lanes)}   ({_s(failure.tier)})\n", "cyan")
    if failure.provisional:
        text.append(f"{PROVISIONAL_MARK}: the exception line is in; what follows it is added here as it comes\n",
                    "italic yellow")
    sure = sureness(failure)
    if sure:
        text.append(f"decoded as {_s(sure)}\n", "yellow")
    if failure.quoted_in:
        text.append(f"quoted in the message of {_s(failure.quoted_in)}\n", "dim")
    if failure.context:
        text.append(f"logged as: {_s(failure.context)}\n", "dim")
    if failure.location:
        text.append(f"at {_s(failure.location)}\n")
        if failure.source_line:
            text.append(f"    {_s(failure.source_line)}\n", "bold")
    if failure.hint_title:
        text.append(f"\nhint: {_s(failure.hint_title)}\n", "bold yellow")
        text.append(_s(failure.hint_text, "\n\t") + "\n", "yellow")
    text.append("\n")
    text.append(_s(failure.traceback, "\n\t"))
    return text


def log_line_text(line: LogLine, lane_w: int = 12, search: Optional[str] = None) -> Text:
    text = Text(no_wrap=True)
    text.append(_clip(_s(line.lane), lane_w).ljust(lane_w), lane_style(line.lane))
    text.append(" ")
    style = LEVEL_STYLES.get(line.level or "", "")
    if line.level and line.level != "INFO":
        text.append(_s(line.level[0]) + " ", style)
    body = Text(_s(line.text, "\t"), style=style)
    if search:
        body.highlight_words([search], "bold black on yellow", case_sensitive=False)
    text.append_text(body)
    return text
