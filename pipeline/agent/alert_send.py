"""Sending a run's alerts (failure, stall, low disk, Slurm time limit, end) to where the operator asked: a command
and/or a webhook.

The supervisor runs from a zipapp on a bare host Python, so this is standard library only. What it must never do
is hold up or break the run it watches: :class:`AlertSender` queues an alert and returns at once, one daemon thread
delivers, a webhook that hangs or a command that never ends is cut off after a bounded time, and nothing here
raises into the caller. What happened goes to ``note`` (the run's log), one line per delivery.

Secrets: a Slack or ntfy webhook URL carries its secret in its path (``hooks.slack.com/services/T…/B…/x…``), and a
URL may carry ``user:password@``. So no log line, problem or :class:`Delivery` detail ever holds more of the URL
than :func:`redact_url` keeps: its scheme, host and port.

Hostile text: an alert carries a run's name, its log and its stacks, which anyone who can start a run writes. Every
string that leaves goes through :func:`eaglewatch.safetext.safe_text` (``\\n`` kept only in message bodies); a
Slack message also has ``& < >`` escaped, so that a log line holding ``<!channel>`` does not page a whole channel.
"""

from __future__ import annotations

import base64
import json
import math
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from eaglewatch.safetext import safe_text

FORMATS = ("json", "ntfy", "slack")
KINDS = ("failure", "stall", "low_disk", "time_limit", "end")
SEVERITIES = ("error", "warning", "info")
END_KIND = "end"

TITLE_LIMIT = 250  # characters: a title is one line, and in ntfy a header
JSON_MESSAGE_LIMIT = 16_000  # characters of the message in a JSON alert (grouped stacks can be long)
SLACK_TEXT_LIMIT = 3_000  # characters of a Slack message: longer ones are cut or refused by Slack
NTFY_BODY_LIMIT = 4_000  # bytes: ntfy turns a longer message into an attachment
OUTPUT_LIMIT = 2048  # bytes of a command's output kept (for one line of the outcome)
DETAIL_LIMIT = 200  # characters of a quoted piece (a command's output line) in a one-line outcome
QUEUE_LIMIT = 32

NTFY_PRIORITY = {"error": "urgent", "warning": "high", "info": "default"}
NTFY_TAGS = {"failure": "rotating_light", "stall": "hourglass", "low_disk": "floppy_disk",
             "time_limit": "alarm_clock", "end": "checkered_flag"}
DEFAULT_SEVERITY = {"failure": "error", "stall": "warning", "low_disk": "warning", "time_limit": "warning",
                    "end": "info"}

ENV_KIND = "EAGLEWATCH_ALERT_KIND"
ENV_RUN = "EAGLEWATCH_ALERT_RUN"
ENV_TITLE = "EAGLEWATCH_ALERT_TITLE"

USER_AGENT = "eaglewatch-alerts"
_ONE_LINE_FIELDS = ("kind", "run", "name", "host", "title", "severity")
_RECORD_KEYS = ("command", "webhook", "format")
_INVALID_URL = "<invalid URL>"


# --- what the operator configured --------------------------------------------------------------------------------

@dataclass(frozen=True)
class AlertSinks:
    """Where alerts go: ``command`` (an argv, run without a shell) and/or ``webhook`` (an http(s) URL, sent in
    ``format``). Falsy when neither is set."""

    command: tuple[str, ...] = ()
    webhook: str | None = None
    format: str = "json"

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(f"alert format must be one of {', '.join(FORMATS)}, not {_quoted(self.format)}")
        object.__setattr__(self, "command", tuple(self.command))

    @property
    def empty(self) -> bool:
        return not self.command and self.webhook is None

    def __bool__(self) -> bool:
        return not self.empty

    @classmethod
    def from_record(cls, record: object) -> tuple[AlertSinks, list[str]]:
        """The sinks a JSON record (``{"command": [...], "webhook": "https://…", "format": "ntfy"}``) asks for, and
        what is wrong with it, one line per problem. A bad entry is left out (the rest still works); an unknown key
        is reported and ignored. No problem quotes the webhook beyond :func:`redact_url`: its path is a secret."""
        if record is None:
            return cls(), []
        if not isinstance(record, dict):
            return cls(), [f"alert settings: expected a JSON object, got {_type_name(record)}"]
        problems = [f"alert settings: unknown key {_quoted(key)} (ignored)"
                    for key in record if key not in _RECORD_KEYS]
        command, problem = _command_from(record.get("command"))
        if problem:
            problems.append(problem)
        webhook, problem = _webhook_from(record.get("webhook"))
        if problem:
            problems.append(problem)
        fmt = record.get("format", "json")
        if fmt is None:
            fmt = "json"
        if not isinstance(fmt, str) or fmt not in FORMATS:
            problems.append(f"alert format: {_quoted(fmt)} is not one of {', '.join(FORMATS)}; json is used")
            fmt = "json"
        return cls(command=command, webhook=webhook, format=fmt), problems


def _command_from(value: object) -> tuple[tuple[str, ...], str | None]:
    if value is None:
        return (), None
    if not isinstance(value, (list, tuple)):
        return (), f"alert command: expected a list of strings (an argv), got {_type_name(value)}; no command is run"
    for index, item in enumerate(value):
        if not isinstance(item, str):
            return (), f"alert command: item {index} is {_type_name(item)}, not a string; no command is run"
        if "\0" in item:
            return (), f"alert command: item {index} holds a NUL character; no command is run"
    if value and not value[0]:
        return (), "alert command: the program (item 0) is empty; no command is run"
    return tuple(value), None


def _webhook_from(value: object) -> tuple[str | None, str | None]:
    if value is None:
        return None, None
    if not isinstance(value, str):
        return None, f"alert webhook: expected a string (an http(s) URL), got {_type_name(value)}; no webhook is used"
    if any(char.isspace() or not char.isprintable() for char in value):
        return None, "alert webhook: the URL holds spaces or control characters; no webhook is used"
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018  (raises ValueError for a port that is not a number in range)
    except ValueError:
        return None, "alert webhook: not a valid URL; no webhook is used"
    if parts.scheme.lower() not in ("http", "https"):
        # The scheme is not quoted: "hooks.slack.com/services/…" without one parses as a path, or as a scheme.
        return None, "alert webhook: not an http:// or https:// URL; no webhook is used"
    if not parts.hostname:
        return None, "alert webhook: the URL names no host; no webhook is used"
    return value, None


def redact_url(url: object) -> str:
    """``scheme://host[:port]/…``: what of a webhook URL may appear in a log line. The path, query, fragment and
    ``user:password@`` are left out (a Slack or ntfy URL's path is its secret)."""
    if not isinstance(url, str):
        return _INVALID_URL
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError:
        return _INVALID_URL
    if not parts.scheme or not host:
        return _INVALID_URL
    host = safe_text(host)[:255]
    if ":" in host:  # IPv6
        host = f"[{host}]"
    where = f"{host}:{port}" if port is not None else host
    return f"{safe_text(parts.scheme.lower())[:16]}://{where}/…"


# --- the alert and what is sent ----------------------------------------------------------------------------------

def make_alert(kind: str, run: str, title: str, message: str = "", *, severity: str | None = None,
               name: str | None = None, host: str | None = None, at: float | None = None,
               **extra: Any) -> dict[str, Any]:
    """An alert in the shape :meth:`AlertSender.send` takes; ``severity`` defaults by kind (a failure is an error,
    an end is info), ``host`` to this host's name, ``at`` to now."""
    if host is None:
        host = os.uname().nodename
    alert: dict[str, Any] = {
        "kind": kind, "run": run, "name": name, "host": host, "title": title, "message": message,
        "severity": severity or DEFAULT_SEVERITY.get(kind, "info"), "at": time.time() if at is None else at,
    }
    alert.update(extra)
    return alert


def body_for(alert: dict[str, Any], format: str) -> tuple[bytes, dict[str, str]]:
    """The request body and headers that send ``alert`` to a webhook of ``format`` (one of :data:`FORMATS`).

    * ``json``: the alert itself (its message cut at :data:`JSON_MESSAGE_LIMIT` characters);
    * ``slack``: ``{"text": "*title*\\nmessage"}``, what a Slack incoming webhook takes, under
      :data:`SLACK_TEXT_LIMIT` characters;
    * ``ntfy``: the message as a UTF-8 text body (under :data:`NTFY_BODY_LIMIT` bytes), the title, priority and an
      emoji tag in ntfy's headers."""
    if format == "json":
        clean = _clean_alert(alert)
        clean["message"] = _cut_chars(clean.get("message") or "", JSON_MESSAGE_LIMIT)
        return _json_bytes(clean), {"Content-Type": "application/json"}
    title, message = _title(alert), _message(alert)
    if format == "slack":
        head = f"*{_slack_escape(title)}*\n"
        text = head + _slack_cut(_slack_escape(message), SLACK_TEXT_LIMIT - len(head))
        return _json_bytes({"text": text.rstrip("\n")}), {"Content-Type": "application/json"}
    if format == "ntfy":
        body = _cut_bytes(message or title, NTFY_BODY_LIMIT)
        kind, severity = alert.get("kind"), alert.get("severity")
        headers = {
            "Content-Type": "text/plain; charset=utf-8",
            "Title": _header_value(title),
            "Priority": NTFY_PRIORITY.get(severity if isinstance(severity, str) else "", "default"),
        }
        tag = NTFY_TAGS.get(kind if isinstance(kind, str) else "")
        if tag:
            headers["Tags"] = tag
        return body, headers
    raise ValueError(f"alert format must be one of {', '.join(FORMATS)}, not {_quoted(format)}")


def _title(alert: dict[str, Any]) -> str:
    """One line: CR and LF become spaces (a title is a header in ntfy), every other control character is shown."""
    title = alert.get("title") or alert.get("kind") or "eaglewatch alert"
    text = str(title).replace("\r\n", " ").replace("\r", " ").replace("\n", " ")
    return _cut_chars(safe_text(text), TITLE_LIMIT, note=False)


def _message(alert: dict[str, Any]) -> str:
    return safe_text(alert.get("message"), keep="\n")


def _header_value(text: str) -> str:
    """An HTTP header value: latin-1 (what http.client encodes headers in), what it cannot hold as ``?``."""
    return text.encode("latin-1", "replace").decode("latin-1")


def _clean_alert(alert: dict[str, Any]) -> dict[str, Any]:
    """The alert with every string made safe (``\\n`` kept but in the one-line fields), every value plain JSON."""
    clean: dict[str, Any] = {}
    for key, value in alert.items():
        name = safe_text(key)
        if name == "title":
            clean[name] = _title(alert)
        elif name in _ONE_LINE_FIELDS:
            clean[name] = _clean_value(value, keep="")
        else:
            clean[name] = _clean_value(value, keep="\n")
    return clean


def _clean_value(value: Any, keep: str, depth: int = 0) -> Any:
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        return safe_text(value, keep=keep)
    if depth < 8 and isinstance(value, dict):
        return {safe_text(key): _clean_value(item, keep, depth + 1) for key, item in value.items()}
    if depth < 8 and isinstance(value, (list, tuple)):
        return [_clean_value(item, keep, depth + 1) for item in value]
    return safe_text(value, keep=keep)


def _json_bytes(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, allow_nan=False).encode("utf-8")


def _cut_note(left: int, unit: str) -> str:
    return f"\n… (cut: {left} more {unit})"


def _cut_chars(text: str, limit: int, note: bool = True) -> str:
    """``text`` in at most ``limit`` characters, with a note of how much was cut when it had to be."""
    if len(text) <= limit:
        return text
    if not note:
        return text[: limit - 1] + "…"
    keep = max(0, limit - len(_cut_note(len(text), "characters")))
    return text[:keep] + _cut_note(len(text) - keep, "characters")


def _cut_bytes(text: str, limit: int) -> bytes:
    """``text`` as UTF-8 in at most ``limit`` bytes, cut on a character boundary, with a note when cut."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return data
    keep = max(0, limit - len(_cut_note(len(data), "bytes").encode("utf-8")))
    head = data[:keep].decode("utf-8", "ignore").encode("utf-8")
    return head + _cut_note(len(data) - len(head), "bytes").encode("utf-8")


def _slack_escape(text: str) -> str:
    """Slack's three escapes: ``<!channel>``, ``<@U123>`` and ``<url|label>`` in a log line stay plain text."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _slack_cut(text: str, limit: int) -> str:
    """Escaped text in ``limit`` characters, never cut inside an ``&amp;``-style escape."""
    if len(text) <= limit:
        return text
    keep = max(0, limit - len(_cut_note(len(text), "characters")))
    amp = text.rfind("&", max(0, keep - 4), keep)
    if amp >= 0 and ";" not in text[amp:keep]:
        keep = amp
    return text[:keep] + _cut_note(len(text) - keep, "characters")


def _quoted(value: object) -> str:
    """A short, safe quotation of a configured value (never of a URL) for a problem line."""
    return _cut_chars(safe_text(repr(value)), 40, note=False)


def _type_name(value: object) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number",
            float: "a number", type(None): "null"}.get(type(value), type(value).__name__)


# --- delivery ----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Delivery:
    """How one delivery went: ``detail`` is one line, safe to log (a webhook only as :func:`redact_url`)."""

    ok: bool
    attempts: int
    detail: str


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is an answer, not followed: urllib would re-send a POST as a GET without its body."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


def _with_credentials(url: str, headers: dict[str, str]) -> tuple[str, dict[str, str]]:
    """``https://user:password@host/…`` as the URL without them and an ``Authorization: Basic`` header (a protected
    ntfy topic): urllib would otherwise take ``user:password@host`` for the host."""
    parts = urlsplit(url)
    userinfo, at, hostport = parts.netloc.rpartition("@")
    if not at:
        return url, headers
    user, _, password = userinfo.partition(":")
    token = base64.b64encode(f"{unquote(user)}:{unquote(password)}".encode("utf-8")).decode("ascii")
    if not any(name.lower() == "authorization" for name in headers):
        headers = {**headers, "Authorization": f"Basic {token}"}
    return urlunsplit(parts._replace(netloc=hostport)), headers


def post(url: str, body: bytes, headers: dict[str, str], timeout_s: float = 5.0, attempts: int = 3,
         backoff_s: Sequence[float] = (1.0, 4.0), sleep: Callable[[float], None] = time.sleep) -> Delivery:
    """POST ``body`` to ``url``; never raises. A network error, a timeout, HTTP 5xx and 429 are tried again (up to
    ``attempts`` times, after ``backoff_s[i]`` seconds, the last one repeated); any other answer is final.

    Each attempt runs in a thread of its own and is given up after ``timeout_s``: a socket timeout bounds each read,
    not a host name lookup (getaddrinfo ignores it) nor a server that trickles its answer a byte at a time. So the
    whole call takes at most about ``attempts * timeout_s + sum of the backoffs``."""
    attempts = max(1, int(attempts))
    label = f"webhook {redact_url(url)}"
    request_headers = {"User-Agent": USER_AGENT, **headers}
    outcome = "not sent"
    for attempt in range(1, attempts + 1):
        ok, outcome, again = _post_once(url, body, request_headers, timeout_s)
        if ok or not again or attempt == attempts:
            tries = f" after {attempt} attempts" if attempt > 1 else ""
            return Delivery(ok, attempt, _scrub(f"{label}: {outcome}{tries}", url))
        if backoff_s:
            sleep(max(0.0, float(backoff_s[min(attempt - 1, len(backoff_s) - 1)])))
    return Delivery(False, attempts, _scrub(f"{label}: {outcome}", url))  # not reached


def _post_once(url: str, body: bytes, headers: dict[str, str], timeout_s: float) -> tuple[bool, str, bool]:
    """(delivered, what happened, worth another attempt), the attempt given up after ``timeout_s``."""
    result: list[tuple[bool, str, bool]] = []

    def attempt() -> None:
        result.append(_request(url, body, headers, timeout_s))

    worker = threading.Thread(target=attempt, name="eaglewatch-alert-post", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if result:
        return result[0]
    return False, f"timed out after {timeout_s:g} s", True


def _request(url: str, body: bytes, headers: dict[str, str], timeout_s: float) -> tuple[bool, str, bool]:
    try:
        target, headers = _with_credentials(url, headers)
        request = urllib.request.Request(target, data=body, headers=headers, method="POST")
        # Built per request: the proxy settings (https_proxy, no_proxy) are read from the environment of now.
        opener = urllib.request.build_opener(_NoRedirect)
        with opener.open(request, timeout=timeout_s) as response:
            status = int(response.status)
    except urllib.error.HTTPError as exc:
        exc.close()
        if 300 <= exc.code < 400:
            return False, f"HTTP {exc.code} (a redirect, not followed)", False
        return False, f"HTTP {exc.code}", exc.code >= 500 or exc.code == 429
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, TimeoutError):
            return False, f"timed out after {timeout_s:g} s", True
        if isinstance(reason, OSError):
            return False, reason.strerror or type(reason).__name__, True
        if isinstance(reason, str) and reason.startswith("unknown url type"):
            return False, "not an http(s) URL", False
        return False, f"network error ({type(reason).__name__})", True
    except TimeoutError:
        return False, f"timed out after {timeout_s:g} s", True
    except OSError as exc:  # a reset or a closed connection, http.client's RemoteDisconnected (a ConnectionError)
        return False, exc.strerror or type(exc).__name__, True
    except ValueError:  # a malformed URL; http.client.InvalidURL; a header value it cannot send
        return False, "invalid URL or header", False
    except Exception as exc:  # http.client.HTTPException (a bad status line) and anything else: no raise, ever
        return False, f"failed ({type(exc).__name__})", True
    if 200 <= status < 300:
        return True, f"HTTP {status}", False
    return False, f"HTTP {status}", status >= 500 or status == 429


def _scrub(text: str, url: str) -> str:
    """One safe line without any of the URL but what :func:`redact_url` keeps (a message quoting it is cut out)."""
    line = safe_text(text)
    try:
        parts = urlsplit(url)
        secrets = [url, parts.path, parts.query, parts.fragment, parts.netloc.rpartition("@")[0]]
    except ValueError:
        secrets = [url]
    for secret in sorted((s for s in secrets if len(s) > 1), key=len, reverse=True):
        line = line.replace(secret, "…").replace(safe_text(secret), "…")
    return line


def alert_environment(alert: dict[str, Any]) -> dict[str, str]:
    """What a command sink finds in its environment about the alert (the whole alert is on its stdin)."""
    return {ENV_KIND: safe_text(alert.get("kind")), ENV_RUN: safe_text(alert.get("run")), ENV_TITLE: _title(alert)}


def run_command(argv: Sequence[str], alert: dict[str, Any], timeout_s: float = 30.0) -> Delivery:
    """Run ``argv`` (no shell) with the alert as JSON on its stdin and :func:`alert_environment` added to its
    environment; never raises. Its output is read (so it never blocks on a full pipe) but only the first
    :data:`OUTPUT_LIMIT` bytes kept, for one line of the outcome. It runs in a session of its own, and after
    ``timeout_s`` that whole process group is killed: a notifier that hangs takes its children with it."""
    program = safe_text(os.path.basename(str(argv[0]))) if argv else ""
    label = f"command {_cut_chars(program, 60, note=False)}"
    if not argv or not argv[0]:
        return Delivery(False, 0, "command: no program given")
    body, _ = body_for(alert, "json")
    env = dict(os.environ)
    env.update(alert_environment(alert))
    try:
        child = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 env=env, close_fds=True, start_new_session=True)
    except OSError as exc:
        return Delivery(False, 1, f"{label}: cannot start: {safe_text(exc.strerror or type(exc).__name__)}")
    except (ValueError, TypeError) as exc:
        return Delivery(False, 1, f"{label}: cannot start: {type(exc).__name__}")
    assert child.stdin is not None and child.stdout is not None
    captured = bytearray()
    feeder = threading.Thread(target=_feed, args=(child.stdin, body), name="eaglewatch-alert-stdin", daemon=True)
    reader = threading.Thread(target=_drain, args=(child.stdout, captured), name="eaglewatch-alert-out", daemon=True)
    feeder.start()
    reader.start()
    timed_out = False
    try:
        code = child.wait(timeout=max(0.0, timeout_s))
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(child.pid)
        try:
            code = child.wait(timeout=5.0)
        except subprocess.TimeoutExpired:  # unkillable (D state): leave it, say so
            code = None
    # A child it left behind (in its group, until killed, or out of it) may still hold the pipes: wait only briefly.
    for thread in (feeder, reader):
        thread.join(1.0)
    line = _first_line(bytes(captured[:OUTPUT_LIMIT]))
    said = f": {line}" if line else ""
    if timed_out:
        return Delivery(False, 1, f"{label}: timed out after {timeout_s:g} s, killed{said}")
    if code == 0:
        return Delivery(True, 1, f"{label}: exit 0")
    if code is not None and code < 0:
        try:
            how = f"killed by {signal.Signals(-code).name}"
        except ValueError:
            how = f"killed by signal {-code}"
        return Delivery(False, 1, f"{label}: {how}{said}")
    return Delivery(False, 1, f"{label}: exit {code}{said}")


def _feed(stream: Any, data: bytes) -> None:
    try:
        stream.write(data)
    except (OSError, ValueError):  # the command does not read its stdin (BrokenPipeError) or was killed
        pass
    finally:
        _close_quietly(stream)


def _drain(stream: Any, captured: bytearray) -> None:
    try:
        while True:
            chunk = stream.read1(65536)
            if not chunk:
                break
            if len(captured) < OUTPUT_LIMIT:
                captured += chunk[: OUTPUT_LIMIT - len(captured)]
    except (OSError, ValueError):
        pass
    finally:
        _close_quietly(stream)


def _close_quietly(stream: Any) -> None:
    try:
        stream.close()
    except OSError:
        pass


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:  # already gone
        pass


def _first_line(output: bytes) -> str:
    for line in output.decode("utf-8", "replace").splitlines():
        if line.strip():
            return _cut_chars(safe_text(line.strip()), DETAIL_LIMIT, note=False)
    return ""


# --- the sender --------------------------------------------------------------------------------------------------

class AlertSender:
    """Delivers alerts in the background, in order, to the command and then the webhook of ``sinks``.

    :meth:`send` never blocks and never raises: the alert joins a queue of at most ``queue_limit``; when it is
    full, the oldest alert that is not an end alert is dropped (the end of a run is the alert that must get out),
    and ``note`` says so. One daemon thread, started with the first alert, delivers; each delivery, sent or not,
    is one line to ``note``. :meth:`close` waits, bounded, for what is queued: the supervisor calls it before it
    exits, so the end alert is sent."""

    def __init__(self, sinks: AlertSinks, note: Callable[[str], None], *, queue_limit: int = QUEUE_LIMIT,
                 webhook_timeout_s: float = 5.0, attempts: int = 3, backoff_s: Sequence[float] = (1.0, 4.0),
                 command_timeout_s: float = 30.0) -> None:
        self.sinks = sinks
        self._note_to = note
        self._limit = max(1, queue_limit)
        self._webhook_timeout_s = webhook_timeout_s
        self._attempts = attempts
        self._backoff_s = tuple(backoff_s)
        self._command_timeout_s = command_timeout_s
        self._cond = threading.Condition()
        self._queue: deque[dict[str, Any]] = deque()
        self._busy = False
        self._closed = False
        self._worker: threading.Thread | None = None

    def send(self, alert: dict[str, Any]) -> None:
        """Queue ``alert`` for delivery and return at once."""
        if not self.sinks:
            return
        dropped: dict[str, Any] | None = None
        with self._cond:
            if self._closed:
                dropped, why = alert, "the sender is closed"
            else:
                if len(self._queue) >= self._limit:
                    victim = next((queued for queued in self._queue if queued.get("kind") != END_KIND),
                                  self._queue[0])
                    self._queue.remove(victim)
                    dropped, why = victim, f"{self._limit} alerts were waiting to be sent"
                self._queue.append(alert)
                if self._worker is None:
                    self._worker = threading.Thread(target=self._work, name="eaglewatch-alerts", daemon=True)
                    self._worker.start()
                self._cond.notify_all()
        if dropped is not None:
            self._note(f"alert {_kind(dropped)} dropped, not sent: {why}")

    def close(self, timeout_s: float = 30.0) -> bool:
        """Take no more alerts and wait up to ``timeout_s`` for the queued ones to be delivered. True when all
        were (sent or failed); otherwise the rest is left to the daemon thread, which ends with the process."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            done = self._cond.wait_for(lambda: not self._queue and not self._busy,
                                       max(0.0, deadline - time.monotonic()))
            left = len(self._queue) + (1 if self._busy else 0)
        if not done:
            self._note(f"{left} alert(s) not delivered: still under way after {timeout_s:g} s")
        return done

    def _work(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._queue) or self._closed)
                if not self._queue:
                    return
                alert = self._queue.popleft()
                self._busy = True
            try:
                self._deliver(alert)
            except Exception as exc:  # a bug here must not end the thread: later alerts still go out
                self._note(f"alert {_kind(alert)} not sent: internal error ({type(exc).__name__})")
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _deliver(self, alert: dict[str, Any]) -> None:
        kind = _kind(alert)
        if self.sinks.command:
            delivery = run_command(self.sinks.command, alert, self._command_timeout_s)
            self._note(f"alert {kind} {'sent' if delivery.ok else 'not sent'}: {delivery.detail}")
        if self.sinks.webhook is not None:
            body, headers = body_for(alert, self.sinks.format)
            delivery = post(self.sinks.webhook, body, headers, timeout_s=self._webhook_timeout_s,
                            attempts=self._attempts, backoff_s=self._backoff_s)
            self._note(f"alert {kind} {'sent' if delivery.ok else 'not sent'}: {delivery.detail}")

    def _note(self, line: str) -> None:
        try:
            self._note_to(safe_text(line))
        except Exception:  # where notes go is the caller's; its failure is not the alert's
            pass


def _kind(alert: object) -> str:
    kind = alert.get("kind") if isinstance(alert, dict) else None
    return _cut_chars(safe_text(kind or "?"), 32, note=False)


__all__ = [
    "FORMATS", "KINDS", "SEVERITIES", "AlertSender", "AlertSinks", "Delivery", "alert_environment", "body_for",
    "make_alert", "post", "redact_url", "run_command",
]
