"""The runs of one host, live and finished, newest first. Enter attaches.

Every cell is host text shown through ``eaglewatch.safetext.safe_text`` and handed to the table as Rich Text, which
the table does not read as markup (a run named ``[@click=app.quit]`` is only that text)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from rich.cells import cell_len
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static
from textual.worker import get_current_worker

from eaglewatch import protocol as p
from eaglewatch.safetext import safe_text
from eaglewatch.tui.messages import RunSummary
from eaglewatch.tui.runend import DIR_GONE_TEXT, run_end
from eaglewatch.tui.runstate.fmt import fmt_argv, fmt_started

if TYPE_CHECKING:
    from eaglewatch.tui.app.app import DashboardApp

REFRESH_S = 2.0
COLUMNS = ("run", "state", "result", "started", "name", "command")


def result_of(summary: RunSummary) -> str:
    """How an exited run ended (a lost one says so in its state column already), or that a running one's
    directory is gone; safe for the terminal."""
    state = summary.get("state")
    if state == p.JOB_RUNNING and summary.get("run_dir_gone"):
        return DIR_GONE_TEXT
    if state == p.JOB_LOST and summary.get("run_dir_gone"):
        return "run directory deleted"
    end = run_end(state, summary.get("exit")) if state == p.JOB_EXITED else None
    return safe_text(end.text) if end is not None else ""


def row_of(summary: RunSummary) -> tuple[str, ...]:
    """The table's cells for one run, each safe for the terminal."""
    result = result_of(summary) + (" (restart)" if summary.get("restart_of") else "")
    return (safe_text(summary.get("run")), safe_text(summary.get("state")), result,
            fmt_started(summary.get("started_at"), "%m-%d %H:%M"), safe_text(summary.get("name")),
            safe_text(fmt_argv(summary.get("argv")))[:80])


class RunsScreen(Screen):
    BINDINGS = [
        Binding("enter", "attach", "attach", show=True, priority=False),
        Binding("question_mark", "help", "help"),
        Binding("q", "quit_app", "quit"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.runs: list[RunSummary] = []

    @property
    def dash(self) -> "DashboardApp":
        return self.app  # type: ignore[return-value]

    def compose(self) -> ComposeResult:
        yield Static(f" runs on {safe_text(self.dash.host)} · Enter attaches · q quits", id="runs-title", markup=False)
        table: DataTable = DataTable(id="runs", cursor_type="row", zebra_stripes=True)
        table.add_columns(*COLUMNS)
        yield table
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(DataTable).focus()
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
        table = self.query_one(DataTable)
        if [(r["run"], r.get("state"), r.get("exit"), r.get("run_dir_gone")) for r in runs] == [
                (r["run"], r.get("state"), r.get("exit"), r.get("run_dir_gone")) for r in self.runs]:
            return
        cursor = table.cursor_row
        selected = self.runs[cursor]["run"] if 0 <= cursor < len(self.runs) else None
        self.runs = runs
        rows = [row_of(summary) for summary in runs]
        # Widths set from the data: the table's own content-based widths were seen stuck at the headers' widths
        # when rows came right after it was first laid out (run ids cut to three characters).
        table.clear(columns=True)
        for index, label in enumerate(COLUMNS):
            table.add_column(label, width=max([len(label)] + [cell_len(row[index]) for row in rows]))
        for index, row in enumerate(rows):
            table.add_row(*(Text(cell, no_wrap=True) for cell in row), key=f"{index}:{row[0]}")
        if selected is not None:
            for i, summary in enumerate(runs):
                if summary["run"] == selected:
                    table.move_cursor(row=i)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.action_attach()

    def action_attach(self) -> None:
        table = self.query_one(DataTable)
        if 0 <= table.cursor_row < len(self.runs):
            self.dash.open_run(self.runs[table.cursor_row], False)

    def action_help(self) -> None:
        from eaglewatch.tui.app.screens.dialogs import HelpScreen

        self.app.push_screen(HelpScreen([("↑/↓", "choose a run"), ("Enter", "attach to it"),
                                         ("Esc", "(on a run) back to this list"), ("q", "quit")],
                                        self.dash.read_only))

    def action_quit_app(self) -> None:
        self.app.exit(("quit", None))
