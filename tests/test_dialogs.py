"""Every dialog whose yes changes something keeps one rule for its keys: Enter presses the focused button and focus
starts on the safe one, so Enter alone never stops, cancels, restarts or accepts; a letter does (y, a), n (r) or
Escape backs out, and the dialog's last line says so. Each dialog here is pushed on a bare app with the dashboard's
own stylesheet and answered from the keyboard."""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Sequence

import pytest

pytest.importorskip("textual")

from textual.app import App
from textual.widgets import Button, Input

from app_support import screen_text, wait_until
from eaglewatch.tui.app.app import _css_path
from eaglewatch.tui.app.screens.dialogs import ConfirmScreen, HostKeyScreen, RestartScreen

NOT_YET = object()
ARGV = ["python", "-c", "print('tick')", "--steps", "3"]


class Host(App):
    """An app with nothing on it but the dialog under test; ``answers`` holds what the dialog dismissed with."""

    CSS_PATH = _css_path()

    def __init__(self, make: Callable[[], Any]) -> None:
        super().__init__()
        self.make = make
        self.answers: list[Any] = []
        self.dialog: Any = None

    def on_mount(self) -> None:
        self.dialog = self.make()
        self.push_screen(self.dialog, self.answers.append)


def answer(make: Callable[[], Any], keys: Sequence[str], before: Callable[[Any], None] | None = None) -> Any:
    """Open the dialog, press ``keys``, and return what it dismissed with (NOT_YET when it is still open)."""
    app = Host(make)

    async def scenario() -> Any:
        async with app.run_test(size=(110, 30)) as pilot:
            await wait_until(pilot, lambda: app.screen is app.dialog, 30, what="the dialog")
            if before is not None:
                before(app.dialog)
            for key in keys:
                await pilot.press(key)
            await pilot.pause()
            if app.answers:
                return app.answers[0]
            assert app.screen is app.dialog, "the dialog closed without an answer"
            return NOT_YET

    return asyncio.run(scenario())


def stop_dialog() -> ConfirmScreen:
    return ConfirmScreen("Stop run r1? Its whole process group gets SIGTERM, then SIGKILL after 10 s.", "Stop")


def restart_dialog() -> RestartScreen:
    return RestartScreen("r1", ARGV)


def host_key_dialog() -> HostKeyScreen:
    return HostKeyScreen("gpu-box", "ssh-ed25519", "SHA256:abc", "/home/op/.ssh/known_hosts")


@pytest.mark.parametrize("keys, expected", [
    (["enter"], False),  # focus starts on Cancel: Enter cancels, as the dialog says
    (["y"], True),
    (["n"], False),
    (["escape"], False),
    (["tab", "enter"], True),  # Enter presses the focused button: moved to Stop, it stops
    (["left", "enter"], True),
    (["left", "right", "enter"], False),
    (["tab", "escape"], False),  # Escape cancels wherever the focus is
    (["tab", "n"], False),
], ids=lambda value: "+".join(value) if isinstance(value, list) else None)
def test_the_stop_confirm(keys, expected):
    assert answer(stop_dialog, keys) is expected


def test_the_confirm_starts_on_its_safe_button_and_says_which_key_does_what():
    app = Host(lambda: ConfirmScreen("Cancel job j1? Scancel of the whole job.", "Cancel job", "Keep the job"))

    async def scenario() -> None:
        async with app.run_test(size=(110, 30)) as pilot:
            await wait_until(pilot, lambda: app.screen is app.dialog, 30, what="the dialog")
            assert app.dialog.focused is app.dialog.query_one("#no", Button)
            await wait_until(pilot, lambda: "y cancel job · n/Esc keep the job · Enter: focused button"
                             in screen_text(app), 30, what="the keys line")
            text = screen_text(app)
            assert "Cancel job (y)" in text and "Keep the job (n)" in text

    asyncio.run(scenario())


@pytest.mark.parametrize("keys, expected", [
    (["enter"], None),  # focus starts on Cancel
    (["y"], ARGV),
    (["n"], None),
    (["escape"], None),
    (["shift+tab", "enter"], ARGV),  # back from Cancel to Restart: Enter presses it
    (["left", "enter"], ARGV),
], ids=lambda value: "+".join(value) if isinstance(value, list) else None)
def test_the_restart_dialog(keys, expected):
    assert answer(restart_dialog, keys) == expected


def _focus_field(dialog: RestartScreen) -> None:
    dialog.query_one("#argv", Input).focus()


def test_enter_in_the_arguments_moves_to_restart_and_only_a_second_enter_restarts():
    app = Host(restart_dialog)

    async def scenario() -> None:
        async with app.run_test(size=(110, 30)) as pilot:
            dialog = await wait_until(pilot, lambda: app.screen is app.dialog and app.dialog, 30, what="the dialog")
            await wait_until(pilot, lambda: "y restart · n/Esc cancel · Enter: focused button"
                             in screen_text(app), 30, what="the keys line")
            await pilot.press("tab")  # from Cancel round to the arguments
            field = dialog.query_one("#argv", Input)
            assert dialog.focused is field
            await pilot.press("end", "space", "y", "n")  # letters in the field are text, not answers
            await pilot.pause()
            assert not app.answers and field.value.endswith(" yn")
            await pilot.press("enter")
            await wait_until(pilot, lambda: dialog.focused is dialog.query_one("#restart", Button), 30,
                             what="the focus on Restart")
            assert not app.answers
            await pilot.press("enter")
            await wait_until(pilot, lambda: app.answers, 30, what="the answer")
            assert app.answers == [[*ARGV, "yn"]]

    asyncio.run(scenario())


def test_arguments_that_cannot_be_read_keep_the_dialog_open_and_say_why():
    app = Host(restart_dialog)

    async def scenario() -> None:
        async with app.run_test(size=(110, 30)) as pilot:
            dialog = await wait_until(pilot, lambda: app.screen is app.dialog and app.dialog, 30, what="the dialog")
            field = dialog.query_one("#argv", Input)
            field.value = "python -c 'unclosed"
            field.focus()
            await pilot.press("enter")
            await wait_until(pilot, lambda: "cannot read the arguments" in screen_text(app), 30, what="the error")
            assert dialog.focused is field and not app.answers
            await pilot.press("shift+tab", "shift+tab", "enter")  # Restart itself refuses them too
            await pilot.pause()
            assert not app.answers and app.screen is dialog
            await pilot.press("escape")
            await wait_until(pilot, lambda: app.answers, 30, what="the answer")
            assert app.answers == [None]

    asyncio.run(scenario())


@pytest.mark.parametrize("keys, expected", [(["escape"], None), (["enter"], NOT_YET)])
def test_escape_in_the_arguments_cancels_and_enter_there_does_not_restart(keys, expected):
    assert answer(restart_dialog, keys, before=_focus_field) is expected


@pytest.mark.parametrize("keys, expected", [
    (["enter"], False),  # focus starts on Refuse
    (["a"], True),
    (["r"], False),
    (["escape"], False),
    (["left", "enter"], True),
], ids=lambda value: "+".join(value) if isinstance(value, list) else None)
def test_the_host_key_dialog(keys, expected):
    assert answer(host_key_dialog, keys) is expected
