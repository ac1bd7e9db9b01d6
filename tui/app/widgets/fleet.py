"""The fleet view's parts: the job's header (totals, ETA) and the cells of each rank's row, drawn from a FleetView.

Pure functions of the view, plus one Static that shows the header; nothing here reads files, sockets or the
clock. Every string that came from a host or a scheduler (names, hosts, nodes, states, reasons, root causes) goes
through ``eaglewatch.safetext.safe_text`` and into Rich Text, never into markup."""

from __future__ import annotations

from typing import Optional

from rich.text import Text
from textual.widgets import Static

from eaglewatch.safetext import safe_text
from eaglewatch.tui.app.widgets.listing import SortColumn, SortOrder, matches, sort_mark
from eaglewatch.tui.runstate.fleet import CANCELLED, DONE, FAILED, OUTCOMES, PENDING, RUNNING, FleetView, RankRow
from eaglewatch.tui.runstate.fmt import fmt_count, fmt_duration, fmt_gib_used, fmt_rate

COLUMNS = ("rank", "host/node", "state", "phase", "samples", "tokens/s", "GPU mem", "root cause")
# Widths of every column but the last, which takes what is left of the screen. Below WIDE_MIN columns the GPU
# memory goes (the run screen has it): the root cause needs the room more.
# Each is at least its label and the sort's arrow ("samples↓").
WIDTHS = {"rank": 5, "host/node": 14, "state": 10, "phase": 10, "samples": 9, "tokens/s": 9, "GPU mem": 13}
NARROW_WIDTHS = {"rank": 5, "host/node": 11, "state": 9, "phase": 10, "samples": 8, "tokens/s": 9}
WIDE_MIN = 120
CELL_PADDING = 2  # the table's one column of padding on each side of a cell
SCROLLBAR = 1  # the table's vertical scrollbar (FleetScreen's CSS)
LAST_MIN = 12

OUTCOME_STYLES = {
    DONE: "green",
    FAILED: "bold red",
    CANCELLED: "magenta",
    PENDING: "yellow",
    RUNNING: "",
}
JOB_STATE_STYLES = {
    DONE: "bold green",
    FAILED: "bold white on red",
    CANCELLED: "bold magenta",
    PENDING: "bold black on yellow",
    RUNNING: "bold cyan",
}


def samples_text(done: Optional[int], total: Optional[int]) -> str:
    if done is None and total is None:
        return "—"
    return f"{fmt_count(done) if done is not None else '?'}/{fmt_count(total) if total is not None else '?'}"


def rate_text(tokens_per_s: Optional[float]) -> str:
    if tokens_per_s is None:
        return "—"
    return f"{tokens_per_s / 1000:.1f}k" if tokens_per_s >= 1000 else f"{tokens_per_s:.0f}"


def gpu_text(used: Optional[int], total: Optional[int]) -> str:
    """Used over total GPU memory of the rank's node, in GiB as every size in the lists: ``29/140 GiB``."""
    return fmt_gib_used(used, total)


def phase_style(row: RankRow) -> str:
    if row.stalled:
        return "bold black on yellow"
    return OUTCOME_STYLES.get(row.outcome, "")


def columns_for(width: int) -> tuple[tuple[str, int], ...]:
    """The columns that fit ``width`` and their widths, the root cause last with what is left."""
    widths = WIDTHS if width >= WIDE_MIN else NARROW_WIDTHS
    used = sum(widths.values()) + CELL_PADDING * (len(widths) + 1) + SCROLLBAR  # the last column's padding too
    return (*widths.items(), ("root cause", max(LAST_MIN, width - used)))


def _fraction(row: RankRow) -> Optional[float]:
    return row.done / row.total if row.done is not None and row.total else None


def _phase_key(row: RankRow) -> tuple[int, str]:
    """Phases in the order of what became of the rank (pending, running, done, failed, cancelled), then by name."""
    return (OUTCOMES.index(row.outcome) if row.outcome in OUTCOMES else len(OUTCOMES), row.phase)


# The sort of each column (``o`` cycles through those shown, ``O`` reverses); the rank, ascending, first.
SORT_COLUMNS: tuple[SortColumn[RankRow], ...] = (
    SortColumn("rank", lambda row: row.rank),
    SortColumn("host/node", lambda row: row.where.casefold() if row.where != "—" else None),
    SortColumn("state", lambda row: row.state.casefold() if row.state != "—" else None),
    SortColumn("phase", _phase_key),
    SortColumn("samples", _fraction, descending=True),
    SortColumn("tokens/s", lambda row: row.tokens_per_s, descending=True),
    SortColumn("GPU mem", lambda row: row.gpu_used, descending=True),
    SortColumn("root cause", lambda row: why_text(row).casefold() or None),
)
SORT_LABELS = tuple(column.label for column in SORT_COLUMNS)
DEFAULT_SORT = SortOrder(0, False)


def next_sort(order: SortOrder, shown: tuple[tuple[str, int], ...]) -> SortOrder:
    """The next column of those ``shown`` (columns_for), in its own starting direction."""
    labels = [label for label, _ in shown]
    current = SORT_LABELS[order.column]
    at = labels.index(current) if current in labels else -1
    index = SORT_LABELS.index(labels[(at + 1) % len(labels)])
    return SortOrder(index, SORT_COLUMNS[index].descending)


def header_label(label: str, order: SortOrder) -> str:
    """A column's header, with the sort's arrow on the sorted one."""
    return label + sort_mark(order) if SORT_LABELS[order.column] == label else label


def row_matches(row: RankRow, query: str) -> bool:
    """Whether the filter keeps a rank: ``query`` in any of its cells (as painted, whole), or its run id."""
    return matches([*(cell.plain for cell in row_cells(row).values()), safe_text(row.run)], query)


def why_text(row: RankRow) -> str:
    """The last column: the rank's root cause, or why it waits (Slurm's reason), safe for the terminal."""
    if row.root_cause:
        return safe_text(row.root_cause)
    if row.outcome == PENDING and (row.reason or row.pending_s is not None):
        waited = f" {fmt_duration(row.pending_s)}" if row.pending_s is not None else ""
        reason = f": {safe_text(row.reason)}" if row.reason else ""
        return f"pending{waited}{reason}"
    return ""


def row_cells(row: RankRow) -> dict[str, Text]:
    """The table's cells for one rank, by column, each host string made safe, styled by what became of it."""
    style = OUTCOME_STYLES.get(row.outcome, "")
    return {
        "rank": Text(str(row.rank), style="bold"),
        "host/node": Text(safe_text(row.where), no_wrap=True, overflow="ellipsis"),
        "state": Text(safe_text(row.state), style=style, no_wrap=True, overflow="ellipsis"),
        "phase": Text(safe_text(row.phase), style=phase_style(row), no_wrap=True, overflow="ellipsis"),
        "samples": Text(samples_text(row.done, row.total), no_wrap=True),
        "tokens/s": Text(rate_text(row.tokens_per_s), no_wrap=True),
        "GPU mem": Text(gpu_text(row.gpu_used, row.gpu_total), no_wrap=True),
        "root cause": Text(why_text(row), style="red" if row.outcome == FAILED else "dim", no_wrap=True,
                           overflow="ellipsis"),
    }


def detail_text(row: Optional[RankRow], width: int) -> Text:
    """The selected rank in full, under the table: where, state, run, GPU memory; then its root cause, wrapped."""
    if row is None:
        return Text("")
    first = Text(no_wrap=True, overflow="ellipsis")
    first.append(f"rank {row.rank}", "bold")
    first.append(f" · {safe_text(row.where)} · ")
    first.append(safe_text(row.state), OUTCOME_STYLES.get(row.outcome, "") or "bold")
    if row.end_text:
        first.append(f" · {safe_text(row.end_text)}")
    first.append(f" · GPU {gpu_text(row.gpu_used, row.gpu_total)}", "dim")
    if row.run:
        first.append(f" · run {safe_text(row.run)}", "dim")
    if row.restart_of:
        first.append(f" (restart of {safe_text(row.restart_of)})", "dim")
    first.truncate(width, overflow="ellipsis")
    why = why_text(row)
    second = Text(why, "red" if row.outcome == FAILED else "dim", overflow="ellipsis")
    second.truncate(2 * width, overflow="ellipsis")
    return Text("\n").join([first, second]) if why else first


def header_text(view: FleetView, width: int) -> Text:
    """Three lines: the job and its state; samples, rate and ETA over all ranks; how many ranks are where."""
    first = Text(no_wrap=True, overflow="ellipsis")
    first.append(f" job {safe_text(view.job)} ", "bold reverse")
    first.append(" ")
    first.append(f" {view.state.upper()} ", JOB_STATE_STYLES.get(view.state, "bold"))
    if view.name:
        first.append(f"  {safe_text(view.name)}", "bold")
    sched = safe_text(view.scheduler)
    if view.scheduler_job_id:
        sched += f" job {safe_text(view.scheduler_job_id)}"
    first.append(f"  {sched} · {view.world_size} ranks on {safe_text(view.target)}", "dim")
    first.truncate(width, overflow="ellipsis")

    second = Text(no_wrap=True, overflow="ellipsis")
    second.append("samples ", "dim")
    second.append(samples_text(view.done, view.total), "bold")
    if view.total and view.done is not None:
        second.append(f" ({100 * view.done / view.total:.0f}%)")
    second.append("   ")
    second.append(fmt_rate(view.tokens_per_s, "tokens") if view.tokens_per_s is not None else "— tokens/s", "bold")
    second.append("   ETA ", "dim")
    if view.eta_s is not None and view.state != DONE:
        second.append(fmt_duration(view.eta_s), "bold")
        second.append(f" ({safe_text(view.eta_note)}, by tokens)", "dim")
    elif view.state == DONE:
        second.append("done", "bold green")
    else:
        second.append("?", "bold")
        second.append(f" ({safe_text(view.eta_note)})", "dim")
    second.truncate(width, overflow="ellipsis")

    third = Text(no_wrap=True, overflow="ellipsis")
    for index, (outcome, count) in enumerate(view.counts):
        if index:
            third.append(" · ", "dim")
        third.append(f"{count} {outcome}", OUTCOME_STYLES.get(outcome, "") or "bold")
    if view.scheduler_error:
        third.append(f"   scheduler: {safe_text(view.scheduler_error)}", "bold red")
    if view.output_dir:
        third.append(f"   output {safe_text(view.output_dir)}", "dim")
    third.truncate(width, overflow="ellipsis")
    return Text("\n", no_wrap=True).join([first, second, third])


class RankDetail(Static):
    """The selected rank in full (detail_text)."""

    DEFAULT_CSS = "RankDetail { height: 3; border-top: solid $primary-darken-2; }"

    def show(self, row: Optional[RankRow]) -> None:
        self.update(detail_text(row, max(20, self.content_size.width or self.size.width or 80)))


class FleetHeader(Static):
    """The job's header; redrawn on a new view or a new size, and only when it looks different."""

    DEFAULT_CSS = "FleetHeader { height: 3; background: $boost; }"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.view: Optional[FleetView] = None
        self._drawn: object = None

    def show(self, view: FleetView) -> None:
        self.view = view
        self._put(header_text(view, max(20, self.content_size.width or self.size.width or 80)))

    def on_resize(self) -> None:
        if self.view is not None:
            self._put(header_text(self.view, max(20, self.content_size.width)))

    def _put(self, drawn: Text) -> None:
        if drawn == self._drawn:
            return
        self._drawn = drawn
        self.update(drawn)
