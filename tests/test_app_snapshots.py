"""Snapshots of the run screen, its full-screen views and its help at 80x24 and 120x36, from real logs and real H200 telemetry, with fixed clocks.

Update after an intended change of the look: pytest tests/test_app_snapshots.py --snapshot-update
"""

from __future__ import annotations

import pytest

pytest.importorskip("textual")
pytest.importorskip("pytest_textual_snapshot")

from app_support import crashed_model, extracting_model, wait_until

from eaglewatch.tui.app.app import DashboardApp
from eaglewatch.tui.app.screens.run import RunScreen

SIZES = pytest.mark.parametrize("size", [(80, 24), (120, 36)], ids=["80x24", "120x36"])


def quiet(model):
    """The app, with the run's alerts marked as seen so that no notification covers the panels."""
    app = DashboardApp("gpu-box", model=model)

    async def settle(pilot):
        # The run screen's first redraw paints the model and sends one notification per alert of the model (it is
        # fixed: no later alert), which the app takes in as messages; clearing before they are all in would leave
        # toasts on the picture.
        await wait_until(pilot, lambda: isinstance(app.screen, RunScreen) and app.screen.redraws > 0
                         and len(app._notifications) >= len(model.alerts_since(0)), 30,
                         what="the run screen's first redraw and its alerts")
        app.clear_notifications()
        await wait_until(pilot, lambda: not app.screen.query("Toast"), 30, what="the toasts gone")

    return app, settle


@SIZES
def test_crashed_run(snap_compare, size):
    app, settle = quiet(crashed_model())
    assert snap_compare(app, terminal_size=size, run_before=settle)


@SIZES
def test_run_mid_extraction(snap_compare, size):
    app, settle = quiet(extracting_model())
    assert snap_compare(app, terminal_size=size, run_before=settle)


@SIZES
@pytest.mark.parametrize("key", ["f", "g", "l", "question_mark"], ids=["failures", "gpus", "log", "help"])
def test_full_screen_views(snap_compare, key, size):
    app, settle = quiet(crashed_model())
    assert snap_compare(app, terminal_size=size, run_before=settle, press=[key])


@SIZES
def test_read_only(snap_compare, size):
    model = extracting_model()
    app = DashboardApp("gpu-box", model=model, read_only=True)

    async def settle_this(pilot):
        await wait_until(pilot, lambda: isinstance(app.screen, RunScreen) and app.screen.redraws > 0, 30,
                         what="the run screen")
        app.clear_notifications()
        await wait_until(pilot, lambda: not app.screen.query("Toast"), 30, what="the toasts gone")

    assert snap_compare(app, terminal_size=size, run_before=settle_this)


def provisional_model():
    """The real crash log up to the worker's exception line: its failure shown before the rest of the report."""
    import json

    from app_support import H200X2_STREAM, WORKER_ASSERT_LOG

    from eaglewatch.tui.runstate import RunModel

    model = RunModel("gpu-box", {"run": "20251130-041140-3f9a2c-extract", "name": "extract",
                                 "argv": ["eaglewatch", "extract", "--model-path", "models/llama", "--tp-size", "2",
                                          "--output-dir", "out"],
                                 "started_at": 1_000.0, "state": "running"},
                     clock=lambda: 0.0, wall=lambda: 1_072.0)
    for line in WORKER_ASSERT_LOG.read_bytes().splitlines(keepends=True):
        model.feed_log(line)
        if model.snapshot().failures:
            break
    for line in H200X2_STREAM.read_text().splitlines()[:30]:
        model.feed_telemetry(json.loads(line))
    assert model.snapshot().failures[0].provisional
    return model


@SIZES
def test_provisional_failure(snap_compare, size):
    app, settle = quiet(provisional_model())
    assert snap_compare(app, terminal_size=size, run_before=settle)


@SIZES
def test_preflight_miniature_running(snap_compare, size):
    from test_app_preflight import miniature_running_model

    app, settle = quiet(miniature_running_model())
    assert snap_compare(app, terminal_size=size, run_before=settle)


@SIZES
def test_preflight_miniature_failed(snap_compare, size):
    from test_app_preflight import miniature_failed_model

    app, settle = quiet(miniature_failed_model())
    assert snap_compare(app, terminal_size=size, run_before=settle)


def dialog(name: str, model):
    from eaglewatch.tui.app.screens.dialogs import ConfirmScreen, HostKeyScreen, RestartScreen, TracebackScreen

    run = "20251130-041140-3f9a2c-extract"
    return {
        "stop": lambda: ConfirmScreen(f"Stop run {run}? Its whole process group gets SIGTERM, then SIGKILL after 10 s.",
                                      "Stop"),
        "restart": lambda: RestartScreen(run, list(model.snapshot().argv)),
        "traceback": lambda: TracebackScreen(model.snapshot().failures[0]),
        "host key": lambda: HostKeyScreen("gpu-box:22", "ssh-ed25519",
                                          "SHA256:m1Tn6ePqk4CxYLHn6wtm3AmkFYqG9Tbcs1pVW5J7Hg8", "~/.ssh/known_hosts"),
    }[name]()


@SIZES
@pytest.mark.parametrize("name", ["stop", "restart", "traceback", "host key"])
def test_dialogs(snap_compare, name, size):
    model = crashed_model()
    app, settle = quiet(model)

    async def open_dialog(pilot):
        await settle(pilot)
        screen = app.screen
        app.push_screen(dialog(name, model))
        await wait_until(pilot, lambda: app.screen is not screen, 30, what=f"the {name} dialog")

    assert snap_compare(app, terminal_size=size, run_before=open_dialog)
