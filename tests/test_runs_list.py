"""The runs list: its columns (phase, progress, age, result, the command in what is left) at 80 and 120 columns,
filtering with ``/`` and sorting with ``o``/``O``, on a fixed list of runs and a fixed clock; and the same cells in
``eaglewatch runs``."""

from __future__ import annotations

import asyncio
import time

import pytest

pytest.importorskip("textual")

from app_support import screen_text, wait_until

from eaglewatch.tui.app.app import DashboardApp
from eaglewatch.tui.app.screens.runs import COLUMNS, RunsScreen, column_widths, run_row
from eaglewatch.tui.app.widgets.listing import SortOrder
from eaglewatch.tui.commands import runs as runs_command

NOW = 1_796_140_800.0  # 2026-12-01 16:00 UTC
MIN, HOUR, DAY = 60, 3600, 86400
KIMI_ARGV = ["eaglewatch", "extract", "--model-path", "/shared/kimi-k2.5", "--prepared-data", "data/prepared.jsonl",
             "--output-dir", "data/hidden_states", "--batch-size", "64", "--tp-size", "8"]


def summary(run, state, age_s, argv, name=None, exit=None, restart_of=None, phase=None, progress=None, **more):
    fields = {"run": run, "name": name, "state": state, "argv": argv, "started_at": NOW - age_s,
              "restart_of": restart_of, "exit": exit, **more}
    if phase is not None:
        fields["phase"] = phase
    if progress is not None:
        fields["progress"] = progress
    return fields


def fixed_runs() -> list[dict]:
    """Seven runs, newest first, as the agent lists them; ``phase`` and ``progress`` where a run reported them."""
    return [
        summary("20261201-155950-0a1b2c-warmup", "starting", 10, ["eaglewatch", "prepare", "--data", "sharegpt"],
                name="warmup"),
        summary("20261201-155500-5b1d0e-kimi-extract", "running", 5 * MIN, KIMI_ARGV, name="kimi-extract",
                phase="extracting", progress={"done": 1234, "total": 5000}),
        summary("20261201-152000-7c2d1f-missing", "exited", 40 * MIN, ["eaglewatch-missing", "extract"],
                name="missing", exit={"error": "[Errno 2] No such file or directory: 'eaglewatch-missing'",
                                      "code": 127}),
        summary("20261201-140000-9d3e2a-llama-70b-rank1", "exited", 2 * HOUR,
                ["eaglewatch", "extract", "--model-path", "/shared/llama-70b", "--rank", "1", "--world-size", "2"],
                name="llama-70b-rank1", exit={"code": 1}, phase="failed", progress={"done": 16, "total": 64}),
        summary("20261201-130000-1e4f3b-qwen3", "exited", 3 * HOUR,
                ["eaglewatch", "extract", "--model-path", "/shared/qwen3-235b", "--tp-size", "8"], name="qwen3",
                exit={"signal": 15, "signal_name": "SIGTERM"}, restart_of="20261201-120000-2f5a4c-qwen3",
                progress={"done": 900, "total": None}),
        summary("20261128-160000-3a6b5d", "exited", 3 * DAY, ["eaglewatch", "verify", "--output-dir", "out"],
                exit={"code": 0}, progress={"done": 1000, "total": 1000}),
        summary("20261126-160000-4b7c6e-old", "lost", 5 * DAY, ["sleep", "infinity"], name="old"),
    ]


class FakeConnection:
    """What the runs list asks of a connection: the host's runs."""

    state = "connected"

    def __init__(self, runs):
        self._runs = runs

    def runs(self):
        return [dict(summary) for summary in self._runs]


class RunsApp(DashboardApp):
    """The dashboard on a fixed list of runs, its ages counted at NOW; Enter records the run it would open."""

    def __init__(self, runs=None):
        super().__init__("gpu-box", connection=FakeConnection(fixed_runs() if runs is None else runs))
        self.opened: list[str] = []

    def _start(self):  # the connection is there: straight to the list, on the fixed clock
        self.push_screen(RunsScreen(wall=lambda: NOW))

    def open_run(self, summary, replace):
        self.opened.append(summary["run"])


@pytest.fixture
def utc(monkeypatch):
    """Start times in the detail line in UTC, whatever this machine's zone."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


async def painted_list(pilot, app) -> RunsScreen:
    screen = await wait_until(pilot, lambda: isinstance(app.screen, RunsScreen) and app.screen, 30,
                              what="the runs list")
    await wait_until(pilot, lambda: len(screen.shown) == len(fixed_runs()) and "kimi-extract" in screen_text(app),
                     30, what="every run painted")
    return screen


def lines(app) -> list[str]:
    return screen_text(app).splitlines()


def names(screen: RunsScreen) -> list[str]:
    return [row.cells[0] for row in screen.shown]


# ---------------------------------------------------------------------------------------------- cells, no screen

def test_the_cells_say_phase_progress_age_and_result():
    rows = {row.cells[0]: row.cells for row in (run_row(s, NOW) for s in fixed_runs())}
    assert rows["warmup"][1:5] == ("starting", "—", "10s", "")
    assert rows["kimi-extract"][1:5] == ("extracting", "1234/5000", "5m", "")
    assert rows["missing"][1:5] == ("failed", "—", "40m",
                                    "did not start: [Errno 2] No such file or directory: 'eaglewatch-missing'")
    assert rows["llama-70b-rank1"][1:5] == ("failed", "16/64", "2h", "exit code 1")
    assert rows["qwen3"][1:5] == ("failed", "900/?", "3h", "killed by SIGTERM (restart)")
    assert rows["20261128-160000-3a6b5d"][1:5] == ("done", "1000/1000", "3d", "exit code 0")  # no name: its id
    assert rows["old"][1:5] == ("lost", "—", "5d", "")
    assert rows["kimi-extract"][5] == " ".join(KIMI_ARGV)


def test_a_live_run_says_its_state_until_the_agent_reports_a_phase_and_an_end_beats_any_phase():
    running = summary("r", "running", 0, ["x"])
    assert runs_command.phase_of(running) == "running"
    assert runs_command.phase_of({**running, "phase": "loading"}) == "loading"
    assert runs_command.phase_of({**running, "phase": "\x1b[2J"}) == "running"  # not a phase: not shown
    ended = summary("r", "exited", 0, ["x"], exit={"code": 0}, phase="extracting")
    assert runs_command.phase_of(ended) == "done"
    stopped = summary("r", "exited", 0, ["x"], exit={"signal": 15, "signal_name": "SIGTERM", "stopped": True})
    assert runs_command.phase_of(stopped) == "stopped"  # the operator's stop is no failure
    assert runs_command.phase_of(summary("r", "exited", 0, ["x"], exit={"signal": 9, "signal_name": "SIGKILL"})) \
        == "failed"
    assert runs_command.progress_text({**running, "progress": {"done": True, "total": "x"}}) == "—"


@pytest.mark.parametrize("width", [80, 100, 120, 200])
def test_the_columns_fill_the_screen_and_the_command_takes_what_is_left(width):
    rows = [run_row(s, NOW) for s in fixed_runs()]
    widths = column_widths(width, rows, SortOrder(3, False))
    # Every column, its padding and the scrollbar: exactly the screen.
    assert sum(widths) + 2 * len(COLUMNS) + 1 == width
    assert all(w >= len(label) for w, label in zip(widths, COLUMNS))
    assert widths[5] == max(widths)  # the command has the most room
    if width >= 120:
        assert widths[5] > 40


# ---------------------------------------------------------------------------------------------- on the screen

@pytest.mark.parametrize("size", [(80, 24), (120, 36)], ids=["80x24", "120x36"])
def test_every_column_fits_and_the_footer_is_whole(size, utc):
    app = RunsApp()

    async def scenario():
        async with app.run_test(size=size) as pilot:
            await painted_list(pilot, app)
            painted = lines(app)
            header = next(line for line in painted if "RUN" in line and "COMMAND" in line)
            for label in COLUMNS:
                assert label in header
            assert "AGE↑" in header  # the sort, on its column
            assert all(len(line.rstrip()) <= size[0] for line in painted)
            kimi = next(line for line in painted if "kimi-extract" in line and "extracting" in line)
            assert "1234/5000" in kimi and " 5m " in kimi
            text = "\n".join(painted)
            # A result too long for its column ends in an ellipsis, inside it.
            missing = next(line for line in painted if line.lstrip().startswith("missing"))
            assert "did not" in missing and "…" in missing and "eaglewatch-missing'" not in missing
            assert "runs on gpu-box · 7 runs · sorted by AGE↑" in text
            footer = painted[-1]
            for key in ("attach", "filter", "sort", "help", "quit"):
                assert key in footer, footer
            if size[0] >= 120:
                # The command column, not cut at twenty characters.
                assert "eaglewatch extract --model-path /shared/kimi" in kimi
            # The selected run in full under the table: the first row, newest.
            assert "20261201-155950-0a1b2c-warmup · warmup · started 2026-12-01 15:59" in text
            assert "$ eaglewatch prepare --data sharegpt" in text
            await pilot.press("down")
            await wait_until(pilot, lambda: "$ eaglewatch extract --model-path /shared/kimi-k2.5" in screen_text(app),
                             30, what="the selected run's whole command")
            await pilot.press("q")

    asyncio.run(scenario())


def test_slash_filters_any_column_enter_keeps_it_and_escape_clears_it(utc):
    app = RunsApp()

    async def scenario():
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await painted_list(pilot, app)
            await pilot.press("slash", *"FAILED")  # any case; the phase column
            await wait_until(pilot, lambda: names(screen) == ["missing", "llama-70b-rank1", "qwen3"], 30,
                             what="the failed runs only")
            await wait_until(pilot, lambda: "3 of 7 runs" in screen_text(app), 30, what="the count on the filter line")
            assert "kimi-extract" not in screen_text(app)
            await pilot.press("enter")  # keeps the filter, back on the table
            await wait_until(pilot, lambda: screen.focused is screen.query_one("#runs"), 30, what="the table focused")
            assert names(screen) == ["missing", "llama-70b-rank1", "qwen3"]
            await pilot.press("down", "enter")
            await wait_until(pilot, lambda: app.opened, 30, what="a run opened")
            assert app.opened == ["20261201-140000-9d3e2a-llama-70b-rank1"]  # the filtered list's second row
            await pilot.press("escape")
            await wait_until(pilot, lambda: len(screen.shown) == 7 and "3 of 7" not in screen_text(app), 30,
                             what="every run back")
            # The command and the run id are searched too.
            await pilot.press("slash", *"qwen3-235b")
            await wait_until(pilot, lambda: names(screen) == ["qwen3"], 30, what="the run with that command")
            await pilot.press("escape")
            await wait_until(pilot, lambda: len(screen.shown) == 7, 30, what="cleared")
            await pilot.press("slash", *"3a6b5d", "enter")
            await wait_until(pilot, lambda: names(screen) == ["20261128-160000-3a6b5d"], 30, what="by id")
            await pilot.press("q")  # on the table: quits, not typed
            await wait_until(pilot, lambda: app.return_value is not None, 30, what="the exit")

    asyncio.run(scenario())
    assert app.return_value == ("quit", None)


def test_o_cycles_the_sort_column_and_capital_o_reverses_it(utc):
    app = RunsApp()

    async def scenario():
        async with app.run_test(size=(120, 36)) as pilot:
            screen = await painted_list(pilot, app)
            newest_first = names(screen)
            assert newest_first == [s["name"] or s["run"] for s in fixed_runs()]
            await pilot.press("O")
            await wait_until(pilot, lambda: names(screen) == newest_first[::-1] and "AGE↓" in screen_text(app), 30,
                             what="oldest first")
            await pilot.press("o")  # RESULT, its own direction: A to Z, runs without one last
            await wait_until(pilot, lambda: "RESULT↑" in screen_text(app), 30, what="sorted by result")
            assert names(screen)[:4] == ["missing", "20261128-160000-3a6b5d", "llama-70b-rank1", "qwen3"]
            assert "sorted by RESULT↑" in screen_text(app)
            await pilot.press("o", "o")  # COMMAND, then RUN
            await wait_until(pilot, lambda: "RUN↑" in screen_text(app), 30, what="sorted by run")
            assert names(screen) == sorted(names(screen), key=str.casefold)
            await pilot.press("o", "o")  # PHASE, then PROGRESS: the furthest along first
            await wait_until(pilot, lambda: "PROGRESS↓" in screen_text(app), 30, what="sorted by progress")
            assert names(screen)[:3] == ["20261128-160000-3a6b5d", "llama-70b-rank1", "kimi-extract"]
            await pilot.press("o")
            await wait_until(pilot, lambda: "AGE↑" in screen_text(app), 30, what="back to age")
            assert names(screen) == newest_first
            await pilot.press("q")

    asyncio.run(scenario())


def test_the_list_follows_the_host_and_keeps_the_selection_on_its_run(utc):
    runs = fixed_runs()
    app = RunsApp(runs)

    async def scenario():
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await painted_list(pilot, app)
            await pilot.press("down", "down")
            await wait_until(pilot, lambda: screen.selected() and screen.selected().cells[0] == "missing", 30,
                             what="the third run selected")
            # A new run starts: it comes first, and the selection stays on the run it was on.
            newer = summary("20261201-160000-5c8d7f-new", "running", 0, ["true"], name="new")
            screen.show_runs([newer, *runs])
            await wait_until(pilot, lambda: "new " in screen_text(app), 30, what="the new run")
            assert names(screen)[0] == "new" and screen.selected().cells[0] == "missing"
            await pilot.press("q")

    asyncio.run(scenario())


def test_help_lists_the_keys_the_footer_leaves_out(utc):
    app = RunsApp()

    async def scenario():
        async with app.run_test(size=(80, 24)) as pilot:
            await painted_list(pilot, app)
            await pilot.press("question_mark")
            await wait_until(pilot, lambda: "reverse the sort" in screen_text(app), 30, what="the help")
            text = screen_text(app)
            assert "clear the filter" in text and "sort by the next column" in text
            await pilot.press("escape")

    asyncio.run(scenario())


# ---------------------------------------------------------------------------------------------- the command

def test_the_runs_command_prints_the_same_cells_in_columns_that_line_up():
    printed = runs_command.table(fixed_runs(), NOW)
    assert printed[0].split() == ["RUN", "NAME", "PHASE", "PROGRESS", "AGE", "RESULT", "COMMAND"]
    command_at = printed[0].index("COMMAND")
    result_at = printed[0].index("RESULT")
    for line, run in zip(printed[1:], fixed_runs()):
        assert line.startswith(run["run"])
        shown, command = line[command_at:], " ".join(run["argv"])
        # In its column; whole, or cut with an ellipsis at COMMAND_MAX into a pipe.
        assert shown == command or (len(shown) == runs_command.COMMAND_MAX and shown.endswith("…")
                                    and command.startswith(shown[:-1]))
    kimi = printed[2]
    assert "extracting" in kimi and "1234/5000" in kimi and " 5m " in kimi
    missing = printed[3]
    # A long result is cut with an ellipsis and the command still starts in its column.
    assert missing[result_at:command_at].rstrip().endswith("…")
    assert "killed by SIGTERM (restart)" in printed[5]


def test_on_a_terminal_the_runs_command_fits_the_command_to_its_width():
    wide = runs_command.table(fixed_runs(), NOW)
    used = wide[0].index("COMMAND")
    narrow = runs_command.table(fixed_runs(), NOW, used + runs_command.COMMAND_MIN)
    assert max(len(line) for line in narrow) == used + runs_command.COMMAND_MIN
    kimi = narrow[2]
    assert kimi.endswith("…") and kimi[used:-1] in " ".join(KIMI_ARGV)
    # Never less than COMMAND_MIN of it, however narrow the terminal.
    assert runs_command.table(fixed_runs(), NOW, 20)[2] == kimi
