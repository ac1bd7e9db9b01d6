"""``eaglewatch attach HOST RUN``: stream a run's log to this terminal, as plain text, until it ends.

The log's text is written as the host's log holds it, with its line ends, tabs and SGR colours; every other escape
or control sequence (titles, the clipboard, cursor moves, screen clears, C1 controls, bidi overrides) is shown
visibly instead (``eaglewatch.safetext.TerminalStream``), and so is everything else this command prints from the
host. The link may drop and come back: streaming resumes where it stopped, nothing repeated or skipped. Ctrl-C
detaches; the job keeps running. The exit status is the job's (128 + signal when a signal ended it).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any, Mapping, Sequence, cast

from eaglewatch.errors import UserError
from eaglewatch.safetext import TerminalStream, safe_text
from eaglewatch.tui.commands import _common
from eaglewatch.tui.messages import Event, JobState, LinkState, LogChunk, Notice, RunSummary, Telemetry, unexpected_item

if TYPE_CHECKING:
    from eaglewatch.tui.connection import Connection

HELP = "stream a run's log from a host until the run ends (Ctrl-C detaches, the job keeps running)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _common.add_host_arguments(parser)
    parser.add_argument("run", metavar="RUN", help="run id, a unique prefix of it, or the run's name")
    parser.add_argument("--from-end", action="store_true", help="skip what the log already holds")
    parser.add_argument("--events", action="store_true", help="also print the pipeline's events (to stderr)")
    parser.add_argument("--decoded", action="store_true",
                        help="print the decoder's view (new lanes, failures, finished bars, then a summary) "
                             "instead of the raw bytes")


class _SafeOut:
    """stdout for text that quotes the log (the decoder's notes): every write goes through safe_text."""

    def write(self, text: str) -> int:
        return sys.stdout.write(safe_text(text, keep="\n\t"))

    def flush(self) -> None:
        sys.stdout.flush()


def _say(message: str) -> None:
    print(f"[eaglewatch] {safe_text(message)}", file=sys.stderr)


class _DecodedView:
    """Feeds the stream to eaglewatch.decode and prints its live notes and final summary as text."""

    def __init__(self, label: str) -> None:
        from eaglewatch.decode.decoder import Decoder
        from eaglewatch.decode.live import LiveNotes

        self.label = label
        self.decoder = Decoder()
        self.notes = LiveNotes(self.decoder.state, out=_SafeOut())  # type: ignore[arg-type]

    def feed(self, data: bytes) -> None:
        self.notes.emit(self.decoder.feed(data))

    def idle(self) -> None:
        self.notes.emit(self.decoder.flush_idle())

    def finish(self) -> None:
        from eaglewatch.decode.report import render_text

        self.notes.emit(self.decoder.finish())
        sys.stdout.write(safe_text(render_text(self.decoder.state, self.label), keep="\n\t"))
        sys.stdout.flush()


def refuse_unreadable(summary: RunSummary, show_events: bool) -> None:
    """The agent never reads a run file that is a FIFO, a device or a socket (reading one can wait forever or never
    end) and lists those in the summary's ``not_regular``. Without its log (or, with --events, its events) there is
    nothing to follow: say so in one line (exit 2) rather than wait for bytes that will not come."""
    found = cast(Mapping[str, Any], summary).get("not_regular")
    if not isinstance(found, dict):
        return
    for name in ("log", "events.jsonl") if show_events else ("log",):
        if found.get(name):
            raise UserError(f"run {summary.get('run')}'s {name} is not a regular file ({found[name]}); "
                            "not reading it")


def follow(connection: "Connection", run: str, from_end: bool, show_events: bool, decoded: bool = False,
           host: str | None = None, hint_options: Sequence[str] = ()) -> int:
    """Stream ``run``'s log until it ends. ``host`` (the operator's name for it, else the connection's) and
    ``hint_options`` make the command that a Ctrl-C prints for following it again."""
    summary = _common.agent_call(connection.status, run)
    refuse_unreadable(summary, show_events)
    view = None
    if decoded:
        try:
            view = _DecodedView(f"{connection.host}:{summary['run']}")
        except ImportError as exc:
            raise UserError(f"the decoder is not available here ({exc}); attach without --decoded") from None
    offset = int(summary.get("log_size") or 0) if from_end else 0
    watch = _common.agent_call(connection.watch, summary["run"], log_offset=offset)
    out = sys.stdout.buffer
    raw = TerminalStream()
    final: RunSummary = summary
    run_id = safe_text(summary["run"])
    try:
        while True:
            batch = watch.get(timeout=0.5)
            for item in batch:
                match item:
                    case LogChunk():
                        if view is not None:
                            view.feed(item.data)
                        else:
                            out.write(raw.feed(item.data))
                    case Event():
                        if show_events:
                            print(f"[event] {json.dumps(item.event if item.event is not None else item.raw)}",
                                  file=sys.stderr)
                    case JobState():
                        final = item.summary or final
                        refuse_unreadable(final, show_events)  # the log was replaced while we watched
                    case Notice():
                        _say(item.message)
                    case LinkState():
                        if item.state != "closed":
                            _say(f"link {item.state}{': ' + item.detail if item.detail else ''}")
                        if item.state == "failed":
                            return 255
                    case Telemetry():
                        pass  # host-wide, not the run's; a watch does not deliver it
                    case _:
                        unexpected_item(item)
            out.flush()
            if view is not None and not batch:
                view.idle()
            if watch.finished.is_set() and watch.queue.empty():
                break
    except KeyboardInterrupt:
        out.write(raw.finish())
        out.flush()
        again = _common.hint_command("attach", host or connection.host, summary["run"], *hint_options)
        print(f"\n[eaglewatch] detached from {run_id}; it keeps running. Follow it again: {again}", file=sys.stderr)
        return 130
    out.write(raw.finish())
    out.flush()
    if view is not None:
        view.finish()
    print(f"[eaglewatch] run {run_id} {_common.describe_exit(final)}", file=sys.stderr)
    return _common.exit_status(final)


def run(args: argparse.Namespace) -> int:
    connection = _common.connect(args)
    try:
        return follow(connection, args.run, args.from_end, args.events, args.decoded, host=args.host,
                      hint_options=_common.where_options(args))
    finally:
        _common.close_quietly(connection)
