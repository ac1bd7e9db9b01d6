"""The dashboard over the real test sshd: the unknown-host-key dialog, the runs list, attaching, launching."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

pytest.importorskip("textual")
pytest.importorskip("paramiko")

from agent_support import run_root  # noqa: F401  (fixture)
from app_support import screen_text, wait_until
from sshd import Sshd, sshd_server  # noqa: F401  (fixture)
from test_app_keys import TICKER
from test_app_local import run_screen

from eaglewatch.tui.app.app import DashboardApp, LaunchRequest
from eaglewatch.tui.app.screens.dialogs import HostKeyScreen
from eaglewatch.tui.app.screens.runs import RunsScreen
from eaglewatch.tui.connection import Connection

pytestmark = pytest.mark.ssh


def unknown_key_connection(server: Sshd, root: Path, tmp_path: Path) -> tuple[Connection, Path]:
    known = tmp_path / "known_hosts"
    known.write_text("")
    return Connection(server.spec, run_root=str(root), ssh_options=server.options(known_hosts=(str(known),))), known


def test_unknown_host_key_dialog_refused_connects_to_nothing(sshd_server: Sshd, run_root: Path, tmp_path: Path):
    connection, known = unknown_key_connection(sshd_server, run_root, tmp_path)
    app = DashboardApp(sshd_server.spec, connection=connection)
    fingerprint = sshd_server.host_fingerprint()

    async def scenario():
        async with app.run_test(size=(100, 30)) as pilot:
            dialog = await wait_until(pilot, lambda: isinstance(app.screen, HostKeyScreen) and app.screen, 30,
                                      what="host key dialog")
            assert dialog.fingerprint == fingerprint
            # The dialog is the active screen before it is painted: wait for the fingerprint on the screen.
            await wait_until(pilot, lambda: fingerprint in screen_text(app), 30, what="the painted fingerprint")
            await pilot.press("r")
            await wait_until(pilot, lambda: "refused the host key" in screen_text(app), 30, what="refusal")
            assert not isinstance(app.screen, RunsScreen)
            await pilot.press("ctrl+c")

    asyncio.run(scenario())
    connection.close()
    assert known.read_text() == ""


def test_accept_key_list_runs_attach_and_launch_over_ssh(sshd_server: Sshd, run_root: Path, tmp_path: Path):
    # A run already going on the host, started by someone else.
    with Connection(sshd_server.spec, run_root=str(run_root), ssh_options=sshd_server.options()) as other:
        existing = other.launch(TICKER, name="existing")["run"]
    connection, known = unknown_key_connection(sshd_server, run_root, tmp_path)
    app = DashboardApp(sshd_server.spec, connection=connection)

    async def scenario():
        async with app.run_test(size=(120, 36)) as pilot:
            await wait_until(pilot, lambda: isinstance(app.screen, HostKeyScreen), 30, what="host key dialog")
            await pilot.press("a")
            runs = await wait_until(pilot, lambda: isinstance(app.screen, RunsScreen) and app.screen, 30,
                                    what="runs list")
            await wait_until(pilot, lambda: runs.runs, 30, what="the runs")
            assert [r["run"] for r in runs.runs] == [existing]
            # The list's data arrives before the table is painted with it: wait for the screen, not just the data.
            await wait_until(pilot, lambda: existing in screen_text(app) and "running" in screen_text(app), 30,
                             what="the run shown as running")
            await pilot.press("enter")
            screen = await wait_until(pilot, lambda: run_screen(app), 30, what="run screen")
            await wait_until(pilot, lambda: "tick 3" in screen_text(app), 30, what="the run's log")
            assert screen.run_id == existing and screen.model.snapshot().host == sshd_server.spec
            await pilot.press("escape")  # back to the list
            await wait_until(pilot, lambda: app.screen is runs, 30, what="back to the list")
            await pilot.press("q")

    asyncio.run(scenario())
    assert known.read_text() == sshd_server.known_hosts_line()  # accepted in the dialog, recorded

    # Launching over SSH opens the new run; detaching leaves it running.
    launched = DashboardApp(sshd_server.spec, launch=LaunchRequest(TICKER, name="launched"),
                            connect_kwargs={"run_root": str(run_root), "ssh_options": sshd_server.options()})

    async def launch():
        async with launched.run_test(size=(100, 30)) as pilot:
            screen = await wait_until(pilot, lambda: run_screen(launched), 30, what="run screen")
            await wait_until(pilot, lambda: "tick 2" in screen_text(launched), 30, what="the new run's log")
            await pilot.press("q")
            return screen.run_id

    new = asyncio.run(launch())
    assert launched.return_value == ("detached", new)
    with Connection(sshd_server.spec, run_root=str(run_root), ssh_options=sshd_server.options()) as check:
        assert check.status(new)["state"] == "running"
        assert check.status(new)["name"] == "launched"
