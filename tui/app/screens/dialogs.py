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

from eaglewatch.decode import stackgroups
from eaglewatch.safetext import safe_text
from eaglewatch.tui.app.widgets import render
from eaglewatch.tui.runstate import FailureView
from eaglewatch.tui.runstate.fmt import fmt_argv


# One rule for every question whose yes changes something (stop a run, cancel a job, restart, accept a host key):
# Enter presses the focused button, and focus starts on the safe one, so Enter alone never does the drastic thing.
# A letter does it (y; a for a host key), n (r) or Escape backs out, and Tab or the arrow keys move between the
# buttons. Each dialog says so in its last line.
MOVE_BINDINGS = [
    Binding("left,up", "app.focus_previous", "previous button", show=False),
    Binding("right,down", "app.focus_next", "next button", show=False),
]


def keys_line(yes_key: str, yes: str, no_keys: str, no: str) -> Label:
    """The dialog's last line: which key does what (``y stop · n/Esc cancel · Enter: focused button``)."""
    line = Label(f"{yes_key} {yes} · {no_keys}/Esc {no} · Enter: focused button", classes="dim keys", markup=False)
    line.styles.width = "100%"  # wraps in a narrow dialog rather than losing its end
    return line


class ConfirmScreen(ModalScreen[bool]):
    """A yes/no question about something drastic (stop a run, cancel a job). Dismisses with True to go ahead.

    Enter presses the focused button, and focus starts on the cancel button: Enter alone cancels. y confirms,
    n or Escape cancels, whatever is focused; Tab or the arrow keys move to the other button (then Enter presses
    that one)."""

    BINDINGS = [
        Binding("y", "answer(True)", "yes"),
        Binding("n,escape", "answer(False)", "no"),
        *MOVE_BINDINGS,
    ]

    def __init__(self, question: str, confirm_label: str = "Yes", cancel_label: str = "Cancel") -> None:
        super().__init__(classes="dialog-screen")
        self.question = question
        self.confirm_label = confirm_label
        self.cancel_label = cancel_label

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(safe_text(self.question), classes="question", markup=False)
            with Horizontal(classes="buttons"):
                yield Button(f"{self.confirm_label} (y)", id="yes", variant="error")
                yield Button(f"{self.cancel_label} (n)", id="no")
            yield keys_line("y", self.confirm_label.lower(), "n", self.cancel_label.lower())

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(event.button.id == "yes")

    def action_answer(self, value: bool) -> None:
        self.dismiss(value)


class RestartScreen(ModalScreen[Optional[list[str]]]):
    """Restart the run: the same arguments, or edited ones. Dismisses with the argv, or None to cancel.

    The keys are the confirm dialog's: focus starts on Cancel, Enter presses the focused button, y restarts, n or
    Escape cancels. Tab reaches the arguments; there the letters are typed, Escape still cancels, and Enter checks
    the arguments and moves to the Restart button, so that a second Enter (or y) restarts: Enter never restarts
    from the field.

    The arguments are shown through safe_text (an escape sequence in them reads ``␛[2J``, it does not clear the
    screen). Submitted unchanged, the run's own arguments are what restarts, byte for byte; edited, the text as
    typed is the new command line."""

    BINDINGS = [
        Binding("y", "restart", "restart"),
        Binding("n,escape", "cancel", "cancel"),
        *MOVE_BINDINGS,
    ]

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
            yield Label("Arguments (Tab to edit them and relaunch with others):", classes="dim")
            yield Input(self.shown, id="argv")
            yield Label("", id="argv-error", classes="error", markup=False)
            with Horizontal(classes="buttons"):
                yield Button("Restart (y)", id="restart", variant="error")
                yield Button("Cancel (n)", id="cancel")
            yield keys_line("y", "restart", "n", "cancel")

    def on_mount(self) -> None:
        self.query_one("#cancel", Button).focus()

    def _argv(self) -> Optional[list[str]]:
        """The arguments to restart with, or None (and the reason shown) when the field cannot be read as such."""
        text = self.query_one("#argv", Input).value
        if text == self.shown:
            return list(self.argv)
        try:
            argv = shlex.split(text)
        except ValueError as exc:
            self.query_one("#argv-error", Label).update(f"cannot read the arguments: {exc}")
            return None
        if not argv:
            self.query_one("#argv-error", Label).update("the command is empty")
            return None
        self.query_one("#argv-error", Label).update("")
        return argv

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        if self._argv() is not None:
            self.query_one("#restart", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.id == "restart":
            self.action_restart()
        else:
            self.dismiss(None)

    def action_restart(self) -> None:
        argv = self._argv()
        if argv is not None:
            self.dismiss(argv)

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


class StacksScreen(ModalScreen[None]):
    """Where every process of the run is: the stacks the feed took (at the stall alert, or on ``k``), grouped by
    rank (decode/stackgroups.py, the text ``eaglewatch stacks`` prints). ``k`` again takes them anew; it follows the
    model while open, so new stacks show when they arrive."""

    BINDINGS = [Binding("escape,q", "close", "close"), Binding("k", "again", "take again"),
                Binding("a", "all_threads", "all threads")]
    FOLLOW_HZ = 4

    def __init__(self, latest: Callable[[], Optional[dict]], again: Callable[[], None]) -> None:
        super().__init__(classes="dialog-screen")
        self.latest = latest
        self.again = again
        self.shown: object = object()
        self.all_threads = False

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog full"):
            yield Label("stacks of every process (k: take again · a: all threads · Esc closes)", classes="title",
                        markup=False)
            with VerticalScroll(id="stacks-scroll"):
                yield Static("", id="stacks", markup=False)

    def on_mount(self) -> None:
        self._follow()
        self.set_interval(1 / self.FOLLOW_HZ, self._follow)

    def _follow(self, force: bool = False) -> None:
        taken = self.latest()
        if taken is self.shown and not force:
            return
        self.shown = taken
        self.query_one("#stacks", Static).update(Text("\n".join(stackgroups.report(taken, self.all_threads))))

    def action_again(self) -> None:
        self.again()
        self.app.notify("taking the stacks of every process of the run", timeout=3)

    def action_all_threads(self) -> None:
        self.all_threads = not self.all_threads
        self._follow(force=True)

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
    """An unknown SSH host key: show its fingerprint; accept (record it in known_hosts) or refuse.

    The confirm dialog's keys: focus starts on Refuse and Enter presses the focused button, a accepts, r or Escape
    refuses."""

    BINDINGS = [
        Binding("a", "answer(True)", "accept"),
        Binding("r,escape", "answer(False)", "refuse"),
        *MOVE_BINDINGS,
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
            yield keys_line("a", "accept", "r", "refuse")

    def on_mount(self) -> None:
        self.query_one("#refuse", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(event.button.id == "accept")

    def action_answer(self, value: bool) -> None:
        self.dismiss(value)
