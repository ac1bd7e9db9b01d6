"""DashboardApp: connect to a host (locally or over SSH), then show a run, or the host's runs; or show a
data-parallel job's fleet view.

Start-up happens in a thread worker: connecting (an unknown host key brings up a dialog and waits for the
operator), launching when asked to, then opening the run screen or the runs list. The app owns the one
Connection; screens use it from their own thread workers. A job's fleet view instead reaches each of its hosts
through the job's own connections (``JobOps``); opening a rank makes that rank's host the app's host and
connection for the run screen on top.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Optional, Sequence

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.widgets import Footer, Static
from textual.worker import get_current_worker

from eaglewatch.safetext import safe_text
from eaglewatch.tui.app import gcpolicy
from eaglewatch.tui.app.screens.dialogs import HostKeyScreen
from eaglewatch.tui.app.screens.fleet import FleetScreen
from eaglewatch.tui.app.screens.run import RunScreen
from eaglewatch.tui.app.screens.runs import RunsScreen
from eaglewatch.tui.messages import RunSummary
from eaglewatch.tui.runstate import RunModel, Thresholds
from eaglewatch.tui.runstate.fleet import FleetModel, FleetThresholds

if TYPE_CHECKING:
    from textual.notifications import SeverityLevel
    from textual.worker import Worker

    from eaglewatch.tui.commands.job_ops import JobOps
    from eaglewatch.tui.connection import Connection, UnknownHostKeyError


def _css_path() -> str:
    from importlib.resources import files

    return str(files("eaglewatch.assets").joinpath("dashboard.tcss"))


class LaunchRequest:
    def __init__(self, argv: Sequence[str], cwd: Optional[str] = None, env: Optional[dict[str, str]] = None,
                 name: Optional[str] = None, alerts: Optional[dict] = None) -> None:
        self.argv = list(argv)
        self.cwd = cwd
        self.env = dict(env or {})
        self.name = name
        self.alerts = alerts  # where the run's supervisor sends its alerts (config.Config.alerts_for)


class DashboardApp(App):
    CSS_PATH = _css_path()
    TITLE = "eaglewatch"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = [Binding("ctrl+c", "detach", "detach", show=False, priority=True)]

    def __init__(
        self,
        host: str = "local",
        *,
        target: Optional[str] = None,
        run: Optional[str] = None,
        launch: Optional[LaunchRequest] = None,
        connection: "Optional[Connection]" = None,
        connect_kwargs: Optional[dict[str, Any]] = None,
        read_only: bool = False,
        thresholds: Optional[Thresholds] = None,
        model: Optional[RunModel] = None,
        telemetry: bool = True,
        job: "Optional[JobOps]" = None,
        fleet: Optional[FleetModel] = None,
        fleet_thresholds: Optional[FleetThresholds] = None,
    ) -> None:
        """``host``: the name shown and used in the goodbye line (a named host of the config file, say);
        ``target``: what to connect to when that is not ``host`` itself (the named host's target).
        ``connection``: a Connection, connected or not (else one is made from the target and ``connect_kwargs``).
        ``model``: show this already-fed model and connect to nothing (replays, snapshots).
        ``job``: show this job's fleet view (its connections are its own); ``fleet``: show this already-fed
        FleetModel as a fleet view and connect to nothing."""
        super().__init__()
        self.host = host
        self.target = target or host
        self.run_request = run
        self.launch_request = launch
        self.connection = connection
        self.connect_kwargs = dict(connect_kwargs or {})
        self.read_only = read_only
        self._read_only_asked = read_only  # what the operator asked for; a rank's run screen may add to it
        self.thresholds = thresholds or Thresholds()
        self.preloaded = model
        self.telemetry = telemetry
        self.opened_runs: list[str] = []
        self.job_ops = job
        self.preloaded_fleet = fleet
        self.fleet_thresholds = fleet_thresholds or FleetThresholds()
        self.fleet_screen: Optional[FleetScreen] = None
        self._rank_run: Optional[str] = None  # the run of the rank whose run screen is open over the fleet view
        # A job's connections belong to the job (JobOps' pool): the rank's one the app holds is borrowed.
        self._owns_connection = connection is None and job is None

    def compose(self) -> ComposeResult:
        yield Static(f"connecting to {safe_text(self.host)}…", id="status", markup=False)
        yield Footer()

    def on_mount(self) -> None:
        # The collector's long pauses come when the dashboard chooses (gcpolicy): run screens settle as they open.
        self.set_interval(gcpolicy.FREEZE_EVERY_S, gcpolicy.freeze_survivors)
        self.set_interval(gcpolicy.SETTLE_EVERY_S, gcpolicy.settle)
        if self.preloaded is not None:
            self.push_screen(RunScreen(self.preloaded.snapshot().run, self.preloaded, follow=False))
            return
        if self.job_ops is not None or self.preloaded_fleet is not None:
            fleet = self.preloaded_fleet or FleetModel(self.fleet_thresholds)
            self.fleet_screen = FleetScreen(fleet, self.job_ops, self.thresholds, self.telemetry)
            self.push_screen(self.fleet_screen)
            return
        self._start()

    def set_status(self, text: str, problem: str = "") -> None:
        """Plain text (commands and errors hold brackets that are not markup), through safe_text (they quote the
        host)."""
        from rich.text import Text

        text = safe_text(text, keep="\n")
        line = Text.assemble((safe_text(problem), "bold red"), text) if problem else Text(text)
        self.query_one("#status", Static).update(line)

    def notify(self, message: str, *, title: str = "", severity: "SeverityLevel" = "information",
               timeout: Optional[float] = None, markup: bool = False) -> None:
        """Every notification and alert of the dashboard quotes the host (a failure's message, a run's name, an
        error from the link): shown through safe_text, and not read as markup unless a caller asks for it."""
        super().notify(safe_text(message, keep="\n"), title=safe_text(title), severity=severity, timeout=timeout,
                       markup=markup)

    # ------------------------------------------------------------------ start-up (thread worker)

    @work(thread=True, exclusive=True, group="start", exit_on_error=False)
    def _start(self) -> None:
        worker = get_current_worker()
        try:
            connection = self._connect(worker)
            if worker.is_cancelled:
                return
            if self.launch_request is not None:
                request = self.launch_request
                self.call_from_thread(self.set_status, f"launching on {self.host}: {' '.join(request.argv)}")
                summary = connection.launch(request.argv, cwd=request.cwd, env=request.env, name=request.name,
                                            alerts=request.alerts)
                self.call_from_thread(self.open_run, summary, False)
            elif self.run_request is not None:
                summary = connection.status(self.run_request)
                self.call_from_thread(self.open_run, summary, False)
            else:
                self.call_from_thread(self.push_screen, RunsScreen())
        except Exception as exc:
            if not worker.is_cancelled:
                self.call_from_thread(self.set_status, f" {exc}\n\nctrl+c quits.", f"cannot open {self.host}:")
                self.call_from_thread(self.notify, str(exc), severity="error", timeout=20)

    def _connect(self, worker: "Worker[None]") -> "Connection":
        from eaglewatch.tui.connection import IDLE, Connection, UnknownHostKeyError

        if self.connection is None:
            self.connection = Connection(self.target, **self.connect_kwargs)
        connection = self.connection
        if connection.state != IDLE:
            return connection
        for _ in range(3):
            try:
                connection.connect()
                return connection
            except UnknownHostKeyError as exc:
                if not self._ask_host_key(exc, worker):
                    raise RuntimeError(f"refused the host key of {exc.host_id} ({exc.fingerprint})") from None
                connection.accept_host_key(exc)
                self.call_from_thread(self.notify, f"recorded {exc.host_id} {exc.fingerprint}")
        raise RuntimeError("could not connect after accepting the host key")

    def _ask_host_key(self, exc: "UnknownHostKeyError", worker: "Worker[None]") -> bool:
        answered = threading.Event()
        answer: list[bool] = []

        def done(value: Optional[bool]) -> None:
            answer.append(bool(value))
            answered.set()

        screen = HostKeyScreen(exc.host_id, exc.key_type, exc.fingerprint, exc.known_hosts_path)
        self.call_from_thread(self.push_screen, screen, done)
        while not answered.wait(0.05):
            if worker.is_cancelled:
                return False
        return answer[0]

    # ------------------------------------------------------------------ screens

    def live_connection(self) -> "Connection":
        """The connection, for the screens' thread workers: every screen that uses it opens after connecting."""
        if self.connection is None:
            raise RuntimeError(f"not connected to {self.host}")
        rank_run = self._rank_run
        if self.fleet_screen is not None and rank_run is not None:
            # A rank's run screen follows nothing itself: it asks for the connection only to stop or restart its
            # run, and the end that follows is the operator's doing, not a failure of the rank.
            self.fleet_screen.fleet.ended_by_operator(rank_run)
        return self.connection

    def open_run(self, summary: RunSummary, replace: bool) -> None:
        """Show one run; ``replace`` swaps the current run screen (after a restart)."""
        run = summary["run"]
        self.opened_runs.append(run)
        # A rank of the job on the fleet view, restarted from its run screen: the fleet streams its new run.
        adopted = self.fleet_screen.adopt_restart(summary) if self.fleet_screen is not None else None
        if adopted is not None:
            self._rank_run = run
            screen = RunScreen(run, adopted, follow=False)
        else:
            screen = RunScreen(run, RunModel(self.host, summary, thresholds=self.thresholds))
        if replace and isinstance(self.screen, RunScreen):
            self.switch_screen(screen)
        else:
            self.push_screen(screen)

    def open_rank(self, host: str, connection: "Connection", model: RunModel, read_only: bool = False) -> None:
        """The fleet view's Enter: the rank's run screen, on the rank's host. It shows the RunModel the fleet
        streams into, so it follows nothing itself; its keys (stop, restart) act through ``connection``, unless
        ``read_only`` (a Slurm rank: its run is on a compute node, which the target's agent cannot signal, and
        only Slurm may start it again) until the fleet view is back (``back_on_fleet``)."""
        self.host = host
        self.connection = connection
        self.read_only = self._read_only_asked or read_only
        run = model.snapshot().run
        if run:
            self.opened_runs.append(run)
        self._rank_run = run
        self.push_screen(RunScreen(run, model, follow=False))

    def back_on_fleet(self) -> None:
        self.read_only = self._read_only_asked
        self._rank_run = None

    def action_detach(self) -> None:
        if isinstance(self.screen, FleetScreen):
            self.exit(self.screen.goodbye())
            return
        run = self.screen.run_id if isinstance(self.screen, RunScreen) else None
        self.exit(("detached", run))

    async def on_unmount(self) -> None:
        self.workers.cancel_all()
        connection = self.connection
        if connection is not None and self._owns_connection:
            threading.Thread(target=connection.close, name="eaglewatch-close", daemon=True).start()
