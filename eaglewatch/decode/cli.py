"""``eaglewatch decode LOGFILE [--json] [--follow]``: a post-mortem of a job's raw log.

Prints the lanes, the last state of every progress bar and the failures grouped across ranks, root cause
first, with the failing line and a hint. ``--json`` prints the same as one JSON document (docs/decode.md);
``--follow`` keeps reading as the file grows and prints the summary when stopped (Ctrl-C or SIGTERM).
Imports nothing outside the standard library.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from typing import IO, Any, Optional

from eaglewatch.errors import UserError

HELP = "Decode a job log: lanes, progress bars, failures with the root cause first, hints."

_CHUNK = 1 << 20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("logfile", metavar="LOGFILE", help="the raw log (stdout and stderr of a run); '-' reads stdin")
    parser.add_argument("--json", action="store_true", help="print one JSON document (schema: docs/decode.md)")
    parser.add_argument(
        "--follow", "-f", action="store_true",
        help="keep reading as the file grows; print the summary when stopped with Ctrl-C or SIGTERM",
    )
    parser.add_argument(
        "--tracebacks", action="store_true", help="print the traceback of every failure, not only the root cause's"
    )
    parser.add_argument("--interval", type=float, default=0.5, metavar="SECONDS",
                        help="how often --follow looks for new data (default 0.5)")


def _open(path: str) -> IO[bytes]:
    if path == "-":
        return sys.stdin.buffer
    if os.path.isdir(path):
        raise UserError(f"{path} is a directory; give the log file (in a run directory: {os.path.join(path, 'log')})")
    try:
        return open(path, "rb")
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except PermissionError:
        raise UserError(f"{path}: permission denied") from None


def run(args: argparse.Namespace) -> int:
    from eaglewatch.decode.decoder import Decoder

    decoder = Decoder()
    stream = _open(args.logfile)
    label = "stdin" if args.logfile == "-" else args.logfile
    try:
        if args.follow and args.logfile != "-":
            decoder = _follow(stream, args, decoder)
        else:
            while True:
                chunk = stream.read(_CHUNK)
                if not chunk:
                    break
                decoder.feed(chunk)
            decoder.finish()
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()
    _print_summary(decoder, label, args)
    return 0


def _print_summary(decoder: Any, label: str, args: argparse.Namespace) -> None:
    from eaglewatch.decode.report import render_text, to_dict

    try:
        if args.json:
            sys.stdout.write(json.dumps(to_dict(decoder.state, label), indent=2, ensure_ascii=False) + "\n")
        else:
            sys.stdout.write(render_text(decoder.state, label, all_tracebacks=args.tracebacks))
        sys.stdout.flush()
    except BrokenPipeError:
        # `eaglewatch decode log | head`: the reader left; that is not an error.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


class _Stop(Exception):
    pass


def _follow(stream: IO[bytes], args: argparse.Namespace, decoder: Any) -> Any:
    """Read until interrupted, printing new lanes, failures and finished bars as they appear (text mode).

    Returns the decoder that holds the final state (a new one when the file was truncated and restarted).
    """
    from eaglewatch.decode.decoder import Decoder
    from eaglewatch.decode.live import LiveNotes

    notes = LiveNotes(decoder.state, quiet=args.json)

    def _on_term(signum: int, frame: Optional[object]) -> None:
        raise _Stop()

    try:
        previous = signal.signal(signal.SIGTERM, _on_term)
    except ValueError:  # not the main thread
        previous = None
    try:
        while True:
            chunk = stream.read(_CHUNK)
            if chunk:
                notes.emit(decoder.feed(chunk))
                continue
            try:
                size = os.fstat(stream.fileno()).st_size
            except OSError:
                size = stream.tell()
            if size < stream.tell():
                notes.say(f"-- {args.logfile} was truncated; decoding it again from the start")
                stream.seek(0)
                decoder = Decoder()
                notes = LiveNotes(decoder.state, quiet=args.json)
                continue
            notes.emit(decoder.flush_idle())
            time.sleep(max(0.05, args.interval))
    except (KeyboardInterrupt, _Stop):
        pass
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    notes.emit(decoder.finish())
    return decoder
