"""The runs of one host, live and finished, newest first, as k9s lists pods. Enter attaches.

Columns: RUN (its name, else its id), PHASE, PROGRESS (samples done/total), AGE (since it started: ``5m``, ``2h``,
``3d``), RESULT and COMMAND, their widths from the screen's: the command takes what is left, and a cell too long for
its column ends in an ellipsis. The selected run is shown in full under the table (id, start, how it ended, the
whole command over two lines). ``/`` filters the rows (any column, any case; Esc clears), ``o`` sorts by the next
column and ``O`` reverses; the sorted column's header carries the arrow. The cells' contents are the ``runs``
command's (``eaglewatch.tui.commands.runs``).

Every cell is host text shown through ``eaglewatch.safetext.safe_text`` and handed to the table as Rich Text, which
the table does not read as markup (a run named ``[@click=app.quit]`` is only that text)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional

from rich.cells import cell_len
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Footer, Static
from textual.worker import get_current_worker

from eaglewatch import protocol as p
from eaglewatch.safetext import safe_text
from eaglewatch.tui.app.screens.listing import LISTING_BINDINGS, ListingScreen
from eaglewatch.tui.app.widgets.listing import FilterBar, SortColumn, SortOrder, matches, sort_mark, sort_rows
from eaglewatch.tui.commands import runs as runs_command
from eaglewatch.tui.messages import RunSummary
from eaglewatch.tui.runend import DIR_GONE_TEXT, run_end
from eaglewatch.tui.runstate.fmt import fmt_argv, fmt_started

if TYPE_CHECKING:
    from eaglewatch.tui.app.app import DashboardApp

REFRESH_S = 2.0
COLUMNS = ("RUN", "PHASE", "PROGRESS", "AGE", "RESULT", "COMMAND")
RUN, PHASE, PROGRESS, AGE, RESULT, COMMAND = range(len(COLUMNS))
CELL_PADDING = 2  # the table's one column of padding on each side of a cell
SCROLLBAR = 1  # the table's vertical scrollbar (DEFAULT_CSS), kept free so that no column goes under it
# Columns whose contents are short words and numbers: as wide as their widest cell, up to these.
FIXED_MAX = {PHASE: 10, PROGRESS: 13, AGE: 5}
COMMAND_MIN = 12
RUN_MIN, RESULT_MIN = 12, 11  # a name of a dozen characters; "exit code 1"

PHASE_STYLES = {
    runs_command.DONE: "green",
    runs_command.FAILED: "bold red",
    runs_command.STOPPED: "magenta",
    runs_command.LOST: "magenta",
    p.JOB_STARTING: "yellow",
}
LIVE_STYLE = "cyan"

HELP_ROWS = [
    ("↑/↓", "choose a run"),
    ("Enter", "attach to it"),
    ("/", "filter: keep the runs with this text in any column (any case); Enter keeps it, Esc clears it"),
    ("o", "sort by the next column (RUN, PHASE, PROGRESS, AGE, RESULT, COMMAND); the arrow marks it"),
    ("O", "reverse the sort"),
    ("Esc", "clear the filter; on a run, back to this list"),
    ("?", "this help"),
    ("q", "quit"),
]


def result_of(summary: RunSummary) -> str:
    """How an exited run ended (a lost one says so in its phase column already), or that a running one's
    directory is gone; safe for the terminal."""
    state = summary.get("state")
    if state == p.JOB_RUNNING and summary.get("run_dir_gone"):
        return DIR_GONE_TEXT
    if state == p.JOB_LOST and summary.get("run_dir_gone"):
        return "run directory deleted"
    end = run_end(state, summary.get("exit")) if state == p.JOB_EXITED else None
    return safe_text(end.text) if end is not None else ""


@dataclass(frozen=True)
class RunRow:
    """One run as the list shows it: its cells in full (safe for the terminal) and what it sorts by."""

    run: str
    summary: RunSummary
    cells: tuple[str, ...]  # by COLUMNS
    age_s: Optional[float]
    fraction: Optional[float]


def run_row(summary: RunSummary, now: float) -> RunRow:
    result = result_of(summary)
    if summary.get("restart_of"):
        result = f"{result} (restart)" if result else "(restart)"
    cells = (safe_text(summary.get("name")) or safe_text(summary.get("run")), runs_command.phase_of(summary),
             runs_command.progress_text(summary), runs_command.age_text(summary, now), result,
             safe_text(fmt_argv(summary.get("argv"))))
    return RunRow(str(summary.get("run")), summary, cells, runs_command.age_of(summary, now),
                  runs_command.progress_fraction(summary))


def _text_key(index: int) -> Callable[[RunRow], Optional[str]]:
    return lambda row: row.cells[index].casefold() or None


SORT_COLUMNS: tuple[SortColumn[RunRow], ...] = (
    SortColumn("RUN", _text_key(RUN)),
    SortColumn("PHASE", lambda row: runs_command.phase_rank(row.cells[PHASE])),
    SortColumn("PROGRESS", lambda row: row.fraction, descending=True),
    SortColumn("AGE", lambda row: row.age_s),  # the youngest first
    SortColumn("RESULT", _text_key(RESULT)),
    SortColumn("COMMAND", _text_key(COMMAND)),
)
DEFAULT_SORT = SortOrder(AGE, False)


def column_widths(width: int, rows: list[RunRow], order: SortOrder) -> tuple[int, ...]:
    """Each column's width for a screen ``width`` wide: the short ones as wide as their cells, RUN and RESULT up to
    a share of the rest, the command what is left; together exactly the screen's width."""
    labels = [label + (sort_mark(order) if index == order.column else "") for index, label in enumerate(COLUMNS)]

    def want(index: int) -> int:
        return max([cell_len(labels[index])] + [cell_len(row.cells[index]) for row in rows])

    widths = [0] * len(COLUMNS)
    for index, most in FIXED_MAX.items():
        widths[index] = min(want(index), max(most, cell_len(labels[index])))
    flex = width - CELL_PADDING * len(COLUMNS) - SCROLLBAR - sum(widths)
    run_w = min(want(RUN), max(RUN_MIN, int(flex * 0.25)))
    result_w = min(want(RESULT), max(RESULT_MIN, int(flex * 0.22)))
    command = flex - run_w - result_w
    # Room the command does not need goes back to the name and the result.
    spare = command - max(want(COMMAND), COMMAND_MIN)
    if spare > 0:
        more = min(spare, want(RUN) - run_w)
        run_w, spare = run_w + more, spare - more
        result_w += min(spare, want(RESULT) - result_w)
    widths[RUN], widths[RESULT] = run_w, result_w
    widths[COMMAND] = max(cell_len(labels[COMMAND]), flex - run_w - result_w)
    return tuple(widths)


def _cell(row: RunRow, index: int) -> Text:
    text = row.cells[index]
    style = ""
    if index == PHASE:
        style = PHASE_STYLES.get(text, LIVE_STYLE if text in runs_command.PHASE_ORDER else "")
    elif index == RESULT and row.cells[PHASE] in (runs_command.FAILED, runs_command.LOST):
        style = "red"
    elif index in (AGE, PROGRESS):
        style = "dim" if text in ("?", "—") else ""
    return Text(text, style=style, no_wrap=True, overflow="ellipsis",
                justify="right" if index in (PROGRESS, AGE) else "left")


def _lines(text: str, width: int, count: int) -> list[str]:
    """``text`` cut into at most ``count`` lines of ``width`` cells, at a space where there is one, the last
    ending in an ellipsis when more is left."""
    lines: list[str] = []
    rest = text
    while rest and len(lines) < count:
        line = ""
        while rest and cell_len(line + rest[0]) <= width:
            line, rest = line + rest[0], rest[1:]
        if not line:  # a character wider than the line
            line, rest = rest[0], rest[1:]
        elif rest and not rest.startswith(" ") and " " in line.strip():
            cut = line.rstrip().rindex(" ") + 1  # the word that does not fit goes to the next line
            line, rest = line[:cut], line[cut:] + rest
        lines.append(line.rstrip())
        rest = rest.lstrip(" ")
    if rest and lines:
        last = lines[-1]
        while last and cell_len(last) > width - 1:
            last = last[:-1]
        lines[-1] = last + "…"
    return lines


def detail_text(row: Optional[RunRow], width: int) -> Text:
    """The selected run in full, under the table: its id, name, start and end, then its whole command on two
    lines."""
    if row is None:
        return Text("no run to show", "dim")
    summary = row.summary
    first = Text(no_wrap=True, overflow="ellipsis")
    first.append(safe_text(summary.get("run")), "bold")
    if summary.get("name"):
        first.append(f" · {safe_text(summary.get('name'))}")
    first.append(f" · started {fmt_started(summary.get('started_at'), '%Y-%m-%d %H:%M')}", "dim")
    first.append(" · ")
    first.append(row.cells[PHASE], PHASE_STYLES.get(row.cells[PHASE], LIVE_STYLE))
    end = runs_command.result_of(summary)
    if end and end != row.cells[PHASE]:
        first.append(f" · {end}", "red" if row.cells[PHASE] in (runs_command.FAILED, runs_command.LOST) else "")
    if summary.get("restart_of") and not end.endswith("(restart)"):
        first.append(" (restart)")
    first.truncate(width, overflow="ellipsis")
    command = Text("\n".join(_lines(f"$ {row.cells[COMMAND]}", width, 2)), "dim")
    return Text("\n").join([first, command])


class RunsScreen(ListingScreen):
    ENTER_ACTION = "attach"
    DEFAULT_CSS = """
    RunsScreen #runs { scrollbar-size-vertical: 1; }
    RunsScreen #runs-detail { height: 4; padding: 0 1; border-top: solid $primary-darken-2; }
    """
    BINDINGS = [
        # Before the table's own Enter (which would hide it from the footer); not while the filter line is typed in.
        Binding("enter", "attach", "attach", priority=True),
        *LISTING_BINDINGS,
        Binding("question_mark", "help", "help"),
        Binding("q", "quit_app", "quit"),
    ]

    def __init__(self, wall: Callable[[], float] = time.time) -> None:
        """``wall``: the clock the ages are counted on."""
        super().__init__()
        self.wall = wall
        self.runs: list[RunSummary] = []  # as the host listed them, newest first
        self.shown: list[RunRow] = []  # as the table shows them: filtered, sorted
        self.order = DEFAULT_SORT
        self._drawn: object = None

    @property
    def dash(self) -> "DashboardApp":
        return self.app  # type: ignore[return-value]

    def compose(self) -> ComposeResult:
        yield Static(id="runs-title")
        yield DataTable(id="runs", cursor_type="row", zebra_stripes=True)
        yield FilterBar(id="runs-filter")
        yield Static(id="runs-detail")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(DataTable).focus()
        self.redraw()
        self._poll()

    @work(thread=True, exclusive=True, group="runs", exit_on_error=False)
    def _poll(self) -> None:
        worker = get_current_worker()
        while not worker.is_cancelled:
            try:
                runs = self.dash.live_connection().runs()
            except Exception as exc:
                self.app.call_from_thread(self.app.notify, f"cannot list runs: {exc}", severity="error")
                runs = None
            if runs is not None and not worker.is_cancelled:
                self.app.call_from_thread(self.show_runs, runs)
            deadline = time.monotonic() + REFRESH_S
            while time.monotonic() < deadline and not worker.is_cancelled:
                time.sleep(0.05)

    def show_runs(self, runs: list[RunSummary]) -> None:
        self.runs = list(runs)
        self.redraw()

    # ------------------------------------------------------------------ drawing

    @property
    def query_text(self) -> str:
        return self.query_one(FilterBar).value

    def rows(self) -> list[RunRow]:
        """The runs as the table shows them: those the filter keeps, in the chosen order."""
        now = self.wall()
        query = self.query_text
        rows = [row for row in (run_row(summary, now) for summary in self.runs)
                if matches((*row.cells, row.run), query)]
        return sort_rows(rows, SORT_COLUMNS[self.order.column], self.order.reverse)

    def _title(self) -> Text:
        title = Text(no_wrap=True, overflow="ellipsis")
        title.append(f" runs on {safe_text(getattr(self.app, 'host', ''))}")
        total = len(self.runs)
        title.append(f" · {total} run{'s' if total != 1 else ''}", "dim")
        label = COLUMNS[self.order.column]
        title.append(f" · sorted by {label}{sort_mark(self.order)}", "dim")
        return title

    def redraw(self) -> None:
        """The table from the runs, the filter and the order, rebuilt only when what it shows changed; the
        selection stays on its run."""
        table = self.query_one(DataTable)
        selected = self.selected()
        rows = self.rows()
        width = self.size.width or self.app.size.width or 80
        widths = column_widths(width, rows, self.order)
        drawn = (widths, self.order, tuple((row.run, row.cells) for row in rows))
        self.shown = rows
        title = self._title()
        title.truncate(max(1, width), overflow="ellipsis")
        self.query_one("#runs-title", Static).update(title)
        self.query_one(FilterBar).count(len(rows), len(self.runs), "runs")
        if drawn == self._drawn:
            return
        self._drawn = drawn
        cursor = table.cursor_row
        # Widths set here, from the screen: the table's own content-based widths would let a long command push
        # the columns off the screen (and were seen stuck at the headers' widths when rows came right after it
        # was first laid out).
        table.clear(columns=True)
        for index, (label, column_width) in enumerate(zip(COLUMNS, widths)):
            mark = sort_mark(self.order) if index == self.order.column else ""
            table.add_column(label + mark, width=column_width, key=label)
        for index, row in enumerate(rows):
            table.add_row(*(_cell(row, column) for column in range(len(COLUMNS))), key=f"{index}:{row.run}")
        if rows:
            at = next((i for i, row in enumerate(rows) if selected is not None and row.run == selected.run), None)
            table.move_cursor(row=at if at is not None else min(max(cursor, 0), len(rows) - 1))
        self._show_detail()

    def _show_detail(self) -> None:
        detail = self.query_one("#runs-detail", Static)
        width = max(20, (detail.content_size.width or (self.size.width or 80) - 2))
        detail.update(detail_text(self.selected(), width))

    def on_resize(self) -> None:
        self._drawn = None
        self.redraw()

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._show_detail()

    def selected(self) -> Optional[RunRow]:
        cursor = self.query_one(DataTable).cursor_row
        return self.shown[cursor] if 0 <= cursor < len(self.shown) else None

    # ------------------------------------------------------------------ keys

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.action_attach()

    def action_attach(self) -> None:
        row = self.selected()
        if row is not None:
            self.dash.open_run(row.summary, False)

    def listing_changed(self) -> None:
        self.redraw()

    def next_order(self) -> SortOrder:
        return self.order.next(SORT_COLUMNS)

    def action_help(self) -> None:
        from eaglewatch.tui.app.screens.dialogs import HelpScreen

        self.app.push_screen(HelpScreen(HELP_ROWS, self.dash.read_only))

    def action_quit_app(self) -> None:
        self.app.exit(("quit", None))
