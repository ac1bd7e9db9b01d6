"""Modal dialogs: confirm, restart (with editable arguments), full traceback, help, unknown host key."""

from __future__ import annotations

import shlex
from typing import Callable, Optional, Sequence

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static

from eaglewatch.safetext import safe_text
from eaglewatch.tui.app.widgets import render
from eaglewatch.tui.runstate import FailureView
from eaglewatch.tui.runstate.fmt import fmt_argv


class ConfirmScreen(ModalScreen[bool]):
    """A yes/no question. y or Enter confirms; n or Escape cancels."""

    BINDINGS = [
        Binding("y", "answer(True)", "yes"),
        Binding("n,escape", "answer(False)", "no"),
    ]

    def __init__(self, question: str, confirm_label: str = "Yes") -> None:
        super().__init__(classes="dialog-screen")
        self.question = question
        self.confirm_label = confirm_label

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(safe_text(self.question), classes="question", markup=False)
            with Horizontal(classes="buttons"):
                yield Button(f"{self.confirm_label} (y)", id="yes", variant="error")
                yield Button("Cancel (n)", id="no")

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, value: bool) -> None:
        self.dismiss(value)


class RestartScreen(ModalScreen[Optional[list[str]]]):
    """Restart the run: the same arguments, or edited ones. Dismisses with the argv, or None to cancel.

    The arguments are shown through safe_text (an escape sequence in them reads ``␛[2J``, it does not clear the
    screen). Submitted unchanged, the run's own arguments are what restarts, byte for byte; edited, the text as
    typed is the new command line."""

    BINDINGS = [Binding("escape", "cancel", "cancel")]

    def __init__(self, run: str, argv: Sequence[str]) -> None:
        super().__init__(classes="dialog-screen")
        self.run = run
        self.argv = list(argv)
        # Line ends and tabs stay (a `python -c` script holds them; the input shows them as spaces), escapes do not.
        self.shown = safe_text(fmt_argv(self.argv), keep="\n\t")

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide"):
            yield Label(f"Restart {safe_text(self.run)}? The run is stopped, its GPU memory awaited, then launched "
                        "again.", classes="question", markup=False)
            yield Label("Arguments (edit to relaunch with others):", classes="dim")
            yield Input(self.shown, id="argv")
            yield Label("", id="argv-error", classes="error", markup=False)
            with Horizontal(classes="buttons"):
                yield Button("Restart (Enter)", id="restart", variant="error")
                yield Button("Cancel (Esc)", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#argv", Input).focus()

    def _submit(self) -> None:
        text = self.query_one("#argv", Input).value
        if text == self.shown:
            self.dismiss(list(self.argv))
            return
        try:
            argv = shlex.split(text)
        except ValueError as exc:
            self.query_one("#argv-error", Label).update(f"cannot read the arguments: {exc}")
            return
        if not argv:
            self.query_one("#argv-error", Label).update("the command is empty")
            return
        self.dismiss(argv)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self._submit()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "restart":
            self._submit()
        else:
            self.dismiss(None)

    def action_cancel(self) -> None:
        self.dismiss(None)


class TracebackScreen(ModalScreen[None]):
    """One failure in full. Given ``latest`` (the run's current failures), it follows that failure while it is
    open: a provisional one is redrawn as the rest of its report arrives, and when it is closed."""

    BINDINGS = [Binding("escape,q,enter", "close", "close")]
    FOLLOW_HZ = 15

    def __init__(self, failure: FailureView,
                 latest: Optional[Callable[[], Sequence[FailureView]]] = None) -> None:
        super().__init__(classes="dialog-screen")
        self.failure = failure
        self.latest = latest

    def _title(self) -> str:
        what = "traceback so far" if self.failure.provisional else "full traceback"
        return f"failure {safe_text(self.failure.position)}: {what} (Esc closes)"

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog full"):
            yield Label(self._title(), classes="title", id="traceback-title", markup=False)
            with VerticalScroll(id="traceback-scroll"):
                yield Static(render.traceback_text(self.failure), id="traceback")

    def on_mount(self) -> None:
        if self.latest is not None and self.failure.ident:
            self.set_interval(1 / self.FOLLOW_HZ, self._follow)

    def _follow(self) -> None:
        if self.latest is None:
            return
        now = next((f for f in self.latest() if f.ident == self.failure.ident), None)
        if now is None or now == self.failure:
            return
        self.failure = now
        self.query_one("#traceback-title", Label).update(self._title())
        self.query_one("#traceback", Static).update(render.traceback_text(now))

    def action_close(self) -> None:
        self.dismiss(None)


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "close", "close")]

    def __init__(self, rows: Sequence[tuple[str, str]], read_only: bool = False) -> None:
        super().__init__(classes="dialog-screen")
        self.rows = list(rows)
        self.read_only = read_only

    def compose(self) -> ComposeResult:
        text = Text()
        for key, what in self.rows:
            text.append(f"{key:>9}  ", "bold cyan")
            text.append(what + "\n")
        if self.read_only:
            text.append("\nread-only: keys that would change the job are refused.\n", "bold yellow")
        with Vertical(classes="dialog wide"):
            yield Label("eaglewatch keys (Esc closes)", classes="title")
            with VerticalScroll():
                yield Static(text, id="help-text")

    def action_close(self) -> None:
        self.dismiss(None)


class HostKeyScreen(ModalScreen[bool]):
    """An unknown SSH host key: show its fingerprint; accept (record it in known_hosts) or refuse."""

    BINDINGS = [
        Binding("a", "answer(True)", "accept"),
        Binding("r,escape", "answer(False)", "refuse"),
    ]

    def __init__(self, host_id: str, key_type: str, fingerprint: str, known_hosts_path: str) -> None:
        super().__init__(classes="dialog-screen")
        self.host_id = host_id
        self.key_type = key_type
        self.fingerprint = fingerprint
        self.known_hosts_path = known_hosts_path

    def compose(self) -> ComposeResult:
        text = Text()
        text.append(f"The host key of {safe_text(self.host_id)} is not known.\n\n")
        text.append(f"{safe_text(self.key_type)}  ", "bold")
        text.append(safe_text(self.fingerprint) + "\n\n", "bold yellow")
        text.append("Check this fingerprint with the host's owner. Accepting records it in "
                    f"{safe_text(self.known_hosts_path)}.")
        with Vertical(classes="dialog wide"):
            yield Label("Unknown host key", classes="title")
            yield Static(text, id="hostkey-text")
            with Horizontal(classes="buttons"):
                yield Button("Accept (a)", id="accept", variant="warning")
                yield Button("Refuse (r)", id="refuse")

    def on_mount(self) -> None:
        self.query_one("#refuse", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "accept")

    def action_answer(self, value: bool) -> None:
        self.dismiss(value)
