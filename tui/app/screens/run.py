"""The main screen: one run, live. Header, loading, extraction, GPUs, failures, log; keys to act on the job."""

from __future__ import annotations

import os
import shlex
import subprocess
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, Input
from textual.worker import get_current_worker

from eaglewatch import protocol as p
from eaglewatch.safetext import safe_text
from eaglewatch.tui.app import gcpolicy, saved
from eaglewatch.tui.app.feed import follow_run
from eaglewatch.tui.app.screens.dialogs import (
    ConfirmScreen,
    HelpScreen,
    RestartScreen,
    StacksScreen,
    TracebackScreen,
)
from eaglewatch.tui.app.widgets.panels import (
    ExtractionPanel,
    FailurePanel,
    GpuPanel,
    LoadPanel,
    LogPanel,
    RunHeader,
)
from eaglewatch.tui.runstate import RunModel
from eaglewatch.tui.runstate.jobkind import engine_free_tool

if TYPE_CHECKING:
    from eaglewatch.tui.app.app import DashboardApp

REFRESH_HZ = 15  # redraws per second at most; the feed never posts per line
LIVE_LINES_PER_REDRAW = 200  # of a burst, the log panel shows the newest this many per redraw
# The log's new lines are written at most this often: each write while the log grows asks for a layout pass, whose
# frame repaints most of the screen, and a failure's frame waits behind it (BENCHMARKS.md, "Crash to paint").
LOG_HZ = 5
WIDE_MIN = (120, 36)  # columns, rows: side-by-side failures and per-process GPU rows from here up

HELP_ROWS = [
    ("r", "restart the run (confirm; the arguments can be edited first)"),
    ("s", "stop the run (confirm)"),
    ("l", "full-screen log (again, or Esc, to go back)"),
    ("f", "failures, root cause first; Enter opens the full traceback"),
    ("g", "GPUs: memory, use, temperature, power, processes by rank"),
    ("k", "where every process is: its stacks, grouped by rank"),
    ("/", "search the log, matches marked (Enter keeps, Esc clears)"),
    ("] [", "in the log: next, previous match of the search"),
    ("&", "in the log: only the matching lines (again: all lines)"),
    ("v", "log level filter: all, warnings and up, errors"),
    ("n", "log lane filter: all, then each lane in turn"),
    ("w", "in the log: wrap long lines (again: cut them)"),
    ("End", "in the log: back to the newest line, following new ones"),
    ("p", "open the log, as shown, in a pager ($PAGER, else less)"),
    ("x", "save the log and the tracebacks to files in this folder"),
    ("tab", "move between panels"),
    ("?", "this help"),
    ("q", "detach: quit the dashboard, the job keeps running"),
    ("Q", "stop the job, then quit (confirm)"),
    ("Esc", "back to the runs list (when opened from it)"),
]


class RunScreen(Screen):
    class News(Message):
        """Posted by the feed's thread when a failure, a check or an alert changed: redraw now, not at the next
        poll."""

    BINDINGS = [
        Binding("r", "restart", "restart"),
        Binding("s", "stop", "stop"),
        Binding("l", "toggle_max('log')", "log"),
        Binding("f", "toggle_max('failures')", "failures"),
        Binding("g", "toggle_max('gpus')", "GPUs"),
        Binding("k", "stacks", "stacks", show=False),
        Binding("slash", "search", "search"),
        Binding("question_mark", "help", "help"),
        Binding("q", "detach", "detach"),
        # Listed in the help screen only: the footer keeps to one 80-column row.
        Binding("Q", "stop_quit", "stop+quit", show=False),
        Binding("p", "pager", "pager", show=False),
        Binding("x", "save", "save", show=False),
        Binding("escape", "back", "back", show=False),
        # In read-only mode check_action turns the three above off; these then say why the key did nothing.
        Binding("r", "refused('restart')", "restart", show=False),
        Binding("s", "refused('stop')", "stop", show=False),
        Binding("Q", "refused('stop and quit')", "stop+quit", show=False),
    ]
    # Keys that would change the job: not offered (footer) in read-only mode, and refused if pressed.
    CHANGING_ACTIONS = ("restart", "stop", "stop_quit")

    def __init__(self, run: Optional[str], model: RunModel, follow: bool = True) -> None:
        super().__init__()
        self.run_id = run
        self.model = model
        self.follow = follow
        self._seen_version = -1
        self._log_behind = False  # the view was redrawn without the log's new lines
        self._log_written_at = 0.0  # time.monotonic() of the last write of new log lines
        self._alert_seq = 0
        self.redraws = 0

    @property
    def dash(self) -> "DashboardApp":
        return self.app  # type: ignore[return-value]

    def compose(self) -> ComposeResult:
        yield RunHeader(id="header")
        with Horizontal(id="upper"):
            with Vertical(id="stats"):
                with Horizontal(id="row1"):
                    yield LoadPanel(id="load")
                    yield ExtractionPanel(id="extraction")
                yield GpuPanel(id="gpus")
            yield FailurePanel(id="failures")
        yield LogPanel(id="log")
        yield Input(placeholder="search the log; Enter keeps it, Esc clears", id="search")
        yield Footer()

    def on_mount(self) -> None:
        gcpolicy.settle()  # the new run has nothing to show yet: the full collection's pause costs nothing here
        self.query_one(RunHeader).read_only = self.dash.read_only
        self._layout_for(self.size.width, self.size.height)
        self.set_interval(1 / REFRESH_HZ, self.refresh_view)
        self.refresh_view()
        if self.follow and self.run_id is not None:
            self._follow()

    def on_resize(self, event) -> None:
        self._layout_for(event.size.width, event.size.height)

    def _layout_for(self, width: int, height: int) -> None:
        wide = width >= WIDE_MIN[0] and height >= WIDE_MIN[1]
        if wide != self.has_class("wide"):
            self.set_class(wide, "wide")
            self.query_one(FailurePanel).relabel()

    # ------------------------------------------------------------------ IO (thread worker)

    @work(thread=True, exclusive=True, group="feed", exit_on_error=False)
    def _follow(self) -> None:
        worker = get_current_worker()
        run = self.run_id
        if run is None:
            return
        try:
            follow_run(self.dash.live_connection(), self.model, run, lambda: worker.is_cancelled,
                       telemetry=self.dash.telemetry, on_news=self._news)
        except Exception as exc:
            if not worker.is_cancelled:
                self.app.call_from_thread(self.app.notify, f"lost the run's stream: {exc}", severity="error",
                                          timeout=10)

    # ------------------------------------------------------------------ drawing (UI thread, ≤ REFRESH_HZ)

    def refresh_view(self, log_too: bool = True) -> None:
        """Redraw what changed. ``log_too=False`` (news: a failure) redraws only the failure panel: the log's new
        lines and the other panels wait for the next poll, since the frame that shows the failure costs what it has
        to paint, and the log and the statistics are most of that."""
        model = self.model
        version = model.version
        if version != self._seen_version:
            view = model.snapshot()
            self.redraws += 1
            if log_too:
                self._seen_version = version
                panels: tuple = (self.query_one(RunHeader), self.query_one(LoadPanel),
                                 self.query_one(ExtractionPanel), self.query_one(GpuPanel),
                                 self.query_one(FailurePanel))
            else:
                panels = (self.query_one(FailurePanel),)
            for panel in panels:
                panel.show(view)
            # A command that loads no model (prepare, verify, ...) gets no extraction or GPU panel.
            self.set_class(engine_free_tool(view.argv) is not None, "engine-free")
            self.query_one(LogPanel).lanes = view.lanes
            self._log_behind = True
            if view.run and view.run != self.run_id:
                self.run_id = view.run
            self.sub_title = safe_text(f"{view.host} · {view.run}")
        if log_too and self._log_behind and time.monotonic() - self._log_written_at >= 1 / LOG_HZ - 0.01:
            self._log_behind = False
            self._log_written_at = time.monotonic()
            log = self.query_one(LogPanel)
            log.add_lines(model.log_since(log.last_seq, limit=LIVE_LINES_PER_REDRAW),
                          cap=LIVE_LINES_PER_REDRAW)
        for alert in model.alerts_since(self._alert_seq):
            self._alert_seq = alert.seq
            self.app.notify(alert.message, title=alert.kind, severity=alert.severity, timeout=8)
            self.app.bell()

    def _news(self) -> None:  # on the feed's thread: post_message is thread-safe
        self.post_message(self.News())

    def on_run_screen_news(self, event: "RunScreen.News") -> None:
        self.refresh_view(log_too=False)

    def on_log_panel_filter_changed(self, event: LogPanel.FilterChanged) -> None:
        log = self.query_one(LogPanel)
        log.redraw(self.model.log_since(0))

    def on_failure_panel_open(self, event: FailurePanel.Open) -> None:
        self.app.push_screen(TracebackScreen(event.failure, self.model.failures))

    # ------------------------------------------------------------------ keys

    def check_action(self, action: str, parameters: tuple[object, ...]) -> Optional[bool]:
        if action in self.CHANGING_ACTIONS and self.dash.read_only:
            return False  # not offered in the footer; the key falls through to action_refused
        return True

    def action_refused(self, what: str) -> None:
        self._refuse_if_read_only(what)

    def _refuse_if_read_only(self, what: str) -> bool:
        if self.dash.read_only:
            self.app.notify(f"read-only: {what} refused", severity="warning")
            self.app.bell()
            return True
        if self.dash.connection is None or self.run_id is None:
            self.app.notify(f"no live run to {what}", severity="warning")
            return True
        return False

    def action_toggle_max(self, which: str) -> None:
        widget = self.query_one(f"#{which}")
        if self.maximized is widget:
            self.minimize()
        else:
            self.maximize(widget, container=False)
            widget.focus()
        if isinstance(widget, GpuPanel) and widget.view is not None:
            widget.show(widget.view)
        self.query_one(FailurePanel).relabel()

    def action_stacks(self) -> None:
        if self.dash.connection is None or self.run_id is None:
            self.app.notify("no live run to take the stacks of", severity="warning")
            return
        if self.model.stacks() is None:
            self.model.want_stacks()
        self.app.push_screen(StacksScreen(self.model.stacks, self.model.want_stacks))

    def action_search(self) -> None:
        box = self.query_one("#search", Input)
        box.add_class("visible")
        box.focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "search":
            shown = safe_text(event.value)
            if shown != event.value:
                # Pasted text can hold escapes: the box shows (and searches for) them visibly, as the log does.
                event.input.value = shown
                return
            self.query_one(LogPanel).set_search(shown)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "search":
            event.input.remove_class("visible")
            self.query_one(LogPanel).focus()

    def action_back(self) -> None:
        box = self.query_one("#search", Input)
        if box.has_class("visible") or box.value:
            box.value = ""
            box.remove_class("visible")
            self.query_one(LogPanel).set_search(None)
            return
        if self.maximized is not None:
            self.minimize()
            return
        if len(self.app.screen_stack) > 2 and self.dash.connection is not None:
            self.app.pop_screen()

    def action_help(self) -> None:
        self.app.push_screen(HelpScreen(HELP_ROWS, self.dash.read_only))

    def action_detach(self) -> None:
        view = self.model.snapshot()
        if view.job_state in (p.JOB_EXITED, p.JOB_LOST):
            # Nothing keeps running: say how it ended instead.
            self.app.exit(("left", self.run_id, view.exit_text))
        else:
            self.app.exit(("detached", self.run_id))

    def action_stop(self) -> None:
        if self._refuse_if_read_only("stop"):
            return

        def answered(yes: Optional[bool]) -> None:
            if yes:
                self._stop_job(quit_after=False)

        self.app.push_screen(ConfirmScreen(f"Stop run {self.run_id}? Its whole process group gets SIGTERM, then "
                                           "SIGKILL after 10 s.", "Stop"), answered)

    def action_stop_quit(self) -> None:
        if self._refuse_if_read_only("stop and quit"):
            return

        def answered(yes: Optional[bool]) -> None:
            if yes:
                self._stop_job(quit_after=True)

        self.app.push_screen(ConfirmScreen(f"Stop run {self.run_id}, then quit?", "Stop and quit"), answered)

    def action_restart(self) -> None:
        if self._refuse_if_read_only("restart"):
            return
        argv = list(self.model.snapshot().argv)

        def answered(new_argv: Optional[list[str]]) -> None:
            if new_argv:
                self._restart_job(None if new_argv == argv else new_argv)

        self.app.push_screen(RestartScreen(self.run_id or "", argv), answered)

    # ------------------------------------------------------------------ the log out of the dashboard

    @work(thread=True, group="save", exclusive=True, exit_on_error=False)
    def action_save(self) -> None:
        """The log as the dashboard holds it and every failure's traceback, in files in the current folder."""
        try:
            paths = saved.save_run(Path.cwd(), self.run_id, self.model.log_since(0), self.model.failures())
        except OSError as exc:
            self.app.call_from_thread(self.app.notify, f"could not save: {safe_text(exc)}", severity="error",
                                      timeout=10)
            return
        names = ", ".join(safe_text(path) for path in paths)
        self.app.call_from_thread(self.app.notify, f"saved {names}", timeout=10)

    @work(thread=True, group="save", exclusive=True, exit_on_error=False)
    def action_pager(self) -> None:
        """The log, as shown, in the operator's pager: the dashboard steps aside until the pager quits."""
        fd, name = tempfile.mkstemp(prefix=f"{saved.file_stem(self.run_id)}.", suffix=".log.txt")
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(saved.log_text(self.model.log_since(0)))
        self.app.call_from_thread(self._page, name)

    def _page(self, name: str) -> None:
        pager = shlex.split(os.environ.get("PAGER") or "less -S +G")
        try:
            with self.app.suspend():
                subprocess.call([*pager, name])
        except Exception as exc:  # no terminal to hand over (a test, a web view) or no such pager
            self.app.notify(f"no pager ({safe_text(exc) or type(exc).__name__}); the log is in {safe_text(name)}",
                            severity="warning", timeout=10)
            return
        Path(name).unlink(missing_ok=True)

    @work(thread=True, group="command", exit_on_error=False)
    def _stop_job(self, quit_after: bool) -> None:
        run = self.run_id
        if run is None:
            return
        self.app.call_from_thread(self.app.notify, f"stopping {run}…")
        try:
            summary = self.dash.live_connection().stop(run)
        except Exception as exc:
            self.app.call_from_thread(self.app.notify, f"stop failed: {exc}", severity="error", timeout=10)
            return
        self.model.set_summary(summary)
        self.app.call_from_thread(self.app.notify, f"stopped {run}")
        if quit_after:
            self.app.call_from_thread(self.app.exit, ("stopped", run))

    @work(thread=True, group="command", exit_on_error=False)
    def _restart_job(self, argv: Optional[list[str]]) -> None:
        run = self.run_id
        if run is None:
            return
        self.app.call_from_thread(self.app.notify, f"restarting {run}: stopping, then waiting for GPU memory…")
        try:
            result = self.dash.live_connection().restart(run, argv)
        except Exception as exc:
            self.app.call_from_thread(self.app.notify, f"restart failed: {exc}", severity="error", timeout=10)
            return
        new = result["new"]
        self.app.call_from_thread(self.dash.open_run, new, True)
