"""The fleet view: every rank of one data-parallel job, one row each, with the job's totals and ETA on top.

Enter opens the selected rank's run screen, on the rank's host, showing the RunModel this screen streams into (one
watch per run); ``r`` runs a failed rank again, ``c`` cancels the whole job after a confirm. ``/`` filters the ranks
(any column, any case; Esc clears), ``o`` sorts by the next column shown and ``O`` reverses (the arrow on the header
marks it); the selection stays on its rank. The job's snapshot is
polled and the ranks' runs streamed by ``eaglewatch.tui.commands.job_follow`` in two thread workers; the table is
redrawn from the FleetModel at a fixed rate, and only when it moved.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Footer
from textual.worker import get_current_worker

from eaglewatch.safetext import safe_text
from eaglewatch.tui.app.screens.dialogs import ConfirmScreen, HelpScreen
from eaglewatch.tui.app.screens.listing import LISTING_BINDINGS, ListingScreen
from eaglewatch.tui.app.widgets.fleet import (
    DEFAULT_SORT,
    SORT_COLUMNS,
    FleetHeader,
    RankDetail,
    columns_for,
    header_label,
    next_sort,
    row_cells,
    row_matches,
)
from eaglewatch.tui.app.widgets.listing import FilterBar, SortOrder, sort_rows
from eaglewatch.tui.commands.job_follow import FleetFollower
from eaglewatch.tui.commands.job_ops import SSH, JobOps
from eaglewatch.tui.messages import RunSummary
from eaglewatch.tui.runstate import RunModel, Thresholds
from eaglewatch.tui.runstate.fleet import CANCELLED, FAILED, FleetModel, FleetView, RankRow

if TYPE_CHECKING:
    from eaglewatch.tui.app.app import DashboardApp

REFRESH_HZ = 4
RESTARTABLE = (FAILED, CANCELLED)

HELP_ROWS = [
    ("↑/↓", "choose a rank"),
    ("Enter", "open the rank's run screen (Esc comes back here)"),
    ("r", "run the selected rank again, when it failed or was cancelled; it resumes from its files"),
    ("c", "cancel the whole job (confirm)"),
    ("/", "filter: keep the ranks with this text in any column (any case); Enter keeps it, Esc clears it"),
    ("o", "sort by the next column shown (rank, host/node, state, phase, samples, tokens/s, GPU mem, root cause); "
          "the arrow marks it"),
    ("O", "reverse the sort"),
    ("Esc", "clear the filter; on a rank's run screen, back to this view"),
    ("?", "this help"),
    ("q", "quit the dashboard; the job keeps running"),
]


class FleetScreen(ListingScreen):
    ENTER_ACTION = "open_rank"
    DEFAULT_CSS = """
    FleetScreen #fleet-ranks { height: 1fr; scrollbar-size-vertical: 1; }
    """
    BINDINGS = [
        # Before the table's own Enter (which would hide it from the footer); not while the filter line is typed in.
        Binding("enter", "open_rank", "open", priority=True),
        Binding("r", "restart_rank", "restart"),
        Binding("c", "cancel_job", "cancel"),
        *LISTING_BINDINGS,
        Binding("question_mark", "help", "help"),
        Binding("q", "quit_app", "quit"),
    ]

    def __init__(self, fleet: FleetModel, ops: Optional[JobOps] = None, thresholds: Optional[Thresholds] = None,
                 telemetry: bool = True) -> None:
        """``ops``: the live job (else ``fleet`` is shown as it is: replays, snapshots)."""
        super().__init__()
        self.fleet = fleet
        self.ops = ops
        self.follower = FleetFollower(ops, fleet, thresholds or Thresholds(), telemetry, on_error=self._poll_failed) \
            if ops is not None else None
        if ops is not None and fleet.snapshot().job == "":
            fleet.set_snapshot(ops.record)  # what the record knows, until the first poll answers
        self.view: Optional[FleetView] = None
        self.redraws = 0
        self._seen: object = None
        self._alert_seq = 0
        self._ranks: list[int] = []
        self._columns: tuple[tuple[str, int], ...] = ()
        self.order = DEFAULT_SORT
        self._drawn_order = DEFAULT_SORT
        self.shown: tuple[RankRow, ...] = ()  # as the table shows them: filtered, sorted
        self._cells: dict[int, dict[str, object]] = {}

    @property
    def dash(self) -> "DashboardApp":
        return self.app  # type: ignore[return-value]

    @property
    def job(self) -> str:
        return self.ops.job if self.ops is not None else self.fleet.snapshot().job

    def compose(self) -> ComposeResult:
        yield FleetHeader(id="fleet-header")
        yield DataTable(id="fleet-ranks", cursor_type="row", zebra_stripes=True)
        yield FilterBar(id="fleet-filter")
        yield RankDetail(id="fleet-detail")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(DataTable).focus()
        self.set_interval(1 / REFRESH_HZ, self.refresh_view)
        self.refresh_view()
        if self.follower is not None:
            self._poll()
            self._stream()

    def on_resize(self) -> None:
        self._seen = None  # the last column takes the new width
        self.refresh_view()

    # ------------------------------------------------------------------ IO (thread workers)

    @work(thread=True, exclusive=True, group="fleet-poll", exit_on_error=False)
    def _poll(self) -> None:
        worker = get_current_worker()
        if self.follower is not None:
            self.follower.poll_forever(lambda: worker.is_cancelled)

    @work(thread=True, exclusive=True, group="fleet-stream", exit_on_error=False)
    def _stream(self) -> None:
        worker = get_current_worker()
        if self.follower is None:
            return
        try:
            self.follower.stream_forever(lambda: worker.is_cancelled)
        except Exception as exc:
            if not worker.is_cancelled:
                self.app.call_from_thread(self.app.notify, f"lost the ranks' streams: {exc}", severity="error",
                                          timeout=10)

    def _poll_failed(self, message: str) -> None:  # on the poll worker's thread
        self.app.call_from_thread(self.app.notify, message, severity="error", timeout=10)

    def on_unmount(self) -> None:
        if self.follower is not None:
            self.follower.stop()

    # ------------------------------------------------------------------ drawing (UI thread, ≤ REFRESH_HZ)

    def refresh_view(self) -> None:
        key = self.fleet.version_key()
        if key != self._seen:
            self._seen = key
            view = self.fleet.snapshot()
            self.view = view
            self.redraws += 1
            self.query_one(FleetHeader).show(view)
            self._show_rows(view.rows)
            self.query_one(RankDetail).show(self.selected())
            self.sub_title = safe_text(f"job {view.job}")
        for alert in self.fleet.alerts_since(self._alert_seq):
            self._alert_seq = alert.seq
            self.app.notify(alert.message, title=alert.kind, severity=alert.severity, timeout=8)
            self.app.bell()

    def _show_rows(self, all_rows: tuple[RankRow, ...]) -> None:
        table = self.query_one(DataTable)
        query = self.query_one(FilterBar).value
        selected = self.selected()
        rows = tuple(sort_rows((row for row in all_rows if row_matches(row, query)), SORT_COLUMNS[self.order.column],
                               self.order.reverse))
        self.shown = rows
        self.query_one(FilterBar).count(len(rows), len(all_rows), "ranks")
        ranks = [row.rank for row in rows]
        columns = columns_for(self.size.width)
        if ranks != self._ranks or columns != self._columns or self.order != self._drawn_order:
            # Widths set here, from the screen: the table's own content-based widths would let long root causes
            # push the columns off the screen.
            cursor = table.cursor_row
            table.clear(columns=True)
            for label, width in columns:
                table.add_column(header_label(label, self.order), width=width, key=label)
            for row in rows:
                cells = row_cells(row)
                table.add_row(*(cells[label] for label, _ in columns), key=f"rank{row.rank}")
                self._cells[row.rank] = dict(cells)
            self._ranks, self._columns, self._drawn_order = ranks, columns, self.order
            if rows:
                # The selection stays on its rank when the order or the filter changes.
                at = ranks.index(selected.rank) if selected is not None and selected.rank in ranks else None
                table.move_cursor(row=at if at is not None else min(max(cursor, 0), len(rows) - 1))
            return
        for row in rows:
            cells = row_cells(row)
            old = self._cells.get(row.rank, {})
            for label, _ in columns:
                if old.get(label) != cells[label]:
                    table.update_cell(f"rank{row.rank}", label, cells[label])
            self._cells[row.rank] = dict(cells)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self.query_one(RankDetail).show(self.selected())

    def selected(self) -> Optional[RankRow]:
        cursor = self.query_one(DataTable).cursor_row
        return self.shown[cursor] if 0 <= cursor < len(self.shown) else None

    # ------------------------------------------------------------------ filter and sort

    def listing_changed(self) -> None:
        self._seen = None
        self.refresh_view()
        self.query_one(RankDetail).show(self.selected())

    def next_order(self) -> SortOrder:
        return next_sort(self.order, columns_for(self.size.width))

    # ------------------------------------------------------------------ keys

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.action_open_rank()

    def action_open_rank(self) -> None:
        row = self.selected()
        if row is None:
            return
        model = self.fleet.rank_model(row.rank)
        if model is None or self.ops is None:
            why = f"{row.state} ({row.reason})" if row.reason else row.state
            self.app.notify(f"rank {row.rank} has no run to show yet: {why}", severity="warning")
            return
        self._open(row.rank, model)

    @work(thread=True, group="fleet-command", exit_on_error=False)
    def _open(self, rank: int, model: RunModel) -> None:
        ops = self.ops
        if ops is None:
            return
        try:
            entry = ops.entry(rank)
            connection = ops.connection_for(entry)
        except Exception as exc:
            self.app.call_from_thread(self.app.notify, f"cannot open rank {rank}: {exc}", severity="error",
                                      timeout=10)
            return
        self.app.call_from_thread(self.dash.open_rank, ops.host_of(entry), connection, model, ops.scheduler != SSH)

    def on_screen_resume(self) -> None:
        self.dash.back_on_fleet()

    def _refuse(self, what: str) -> bool:
        if self.dash.read_only:
            self.app.notify(f"read-only: {what} refused", severity="warning")
            self.app.bell()
            return True
        if self.ops is None:
            self.app.notify(f"no live job to {what}", severity="warning")
            return True
        return False

    def action_restart_rank(self) -> None:
        row = self.selected()
        if row is None or self._refuse("restart"):
            return
        if row.outcome not in RESTARTABLE:
            self.app.notify(f"rank {row.rank} is {row.outcome}: r runs again a rank that failed or was cancelled "
                            "(Enter opens a live one, whose own r restarts it)", severity="warning")
            return
        self._restart(row.rank)

    @work(thread=True, group="fleet-command", exit_on_error=False)
    def _restart(self, rank: int) -> None:
        ops = self.ops
        if ops is None:
            return
        how = "restarting its run" if ops.scheduler == SSH else "resubmitting it"
        self.app.call_from_thread(self.app.notify, f"rank {rank}: {how}…")
        try:
            started = ops.restart_rank(rank)
        except Exception as exc:
            self.app.call_from_thread(self.app.notify, f"restart of rank {rank} failed: {exc}", severity="error",
                                      timeout=10)
            return
        what = f"runs again as {started.get('run')}" if ops.scheduler == SSH else "resubmitted"
        self.app.call_from_thread(self.app.notify, f"rank {rank} {what}")
        if self.follower is not None:
            self.follower.poll_now()

    def action_cancel_job(self) -> None:
        if self._refuse("cancel"):
            return
        how = ("every run of it gets SIGTERM, then SIGKILL after 10 s" if self.ops is not None
               and self.ops.scheduler == SSH else "scancel of the whole job")
        question = f"Cancel job {self.job}? {how.capitalize()}."

        def answered(yes: Optional[bool]) -> None:
            if yes:
                self._cancel()

        self.app.push_screen(ConfirmScreen(question, "Cancel job", cancel_label="Keep the job"), answered)

    @work(thread=True, group="fleet-command", exit_on_error=False)
    def _cancel(self) -> None:
        ops = self.ops
        if ops is None:
            return
        self.app.call_from_thread(self.app.notify, f"cancelling job {ops.job}…")
        for row in self.fleet.snapshot().rows:
            if row.run:
                # Their ends are the cancel's, and may stream in before the scheduler's word on them does.
                self.fleet.ended_by_operator(row.run)
        try:
            ops.cancel()
        except Exception as exc:
            self.app.call_from_thread(self.app.notify, f"cancel failed: {exc}", severity="error", timeout=10)
        else:
            self.app.call_from_thread(self.app.notify, f"cancelled job {ops.job}")
        if self.follower is not None:
            self.follower.poll_now()

    def action_help(self) -> None:
        self.app.push_screen(HelpScreen(HELP_ROWS, self.dash.read_only))

    def action_quit_app(self) -> None:
        self.app.exit(self.goodbye())

    def goodbye(self) -> tuple[str, str, str, str]:
        """What the app exits with from here: ("job", job id, the job's state, its ranks' outcomes in words)."""
        view = self.fleet.snapshot()
        return ("job", self.job, view.state, ", ".join(f"{n} {outcome}" for outcome, n in view.counts))

    # ------------------------------------------------------------------ a rank restarted from its run screen

    def adopt_restart(self, summary: RunSummary) -> Optional[RunModel]:
        """A run screen restarted one of this job's runs: the rank's new run, streamed from here like the others,
        and recorded as the rank's. None when the run is none of this job's."""
        if self.ops is None or self.follower is None:
            return None
        rank = self.ops.rank_of_run(summary.get("restart_of"))
        if rank is None:
            return None
        model = self.follower.model_for(rank, dict(summary))
        self._adopt(rank, summary)
        return model

    @work(thread=True, group="fleet-command", exit_on_error=False)
    def _adopt(self, rank: int, summary: RunSummary) -> None:
        if self.ops is None:
            return
        try:
            self.ops.adopt(rank, summary)
        except Exception as exc:
            self.app.call_from_thread(self.app.notify, f"could not record rank {rank}'s new run: {exc}",
                                      severity="error", timeout=10)
        if self.follower is not None:
            self.follower.poll_now()
