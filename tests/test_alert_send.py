"""Alert delivery (pipeline/agent/alert_send.py) against a real HTTP server on 127.0.0.1 and real commands.

The server records each request (path, headers, body) and answers from a plan the test sets: 500, 429, 404, 302,
or "hang" (no answer until the test ends or releases it). Tests wait on conditions (a request recorded, a file
written, a process gone), never on a bare sleep."""

from __future__ import annotations

import base64
import json
import os
import socket
import sys
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from webhook_support import no_proxy  # noqa: F401  (autouse fixture)

from eaglewatch.pipeline.agent.alert_send import (
    ENV_KIND,
    ENV_RUN,
    ENV_TITLE,
    JSON_MESSAGE_LIMIT,
    NTFY_BODY_LIMIT,
    SLACK_TEXT_LIMIT,
    AlertSender,
    AlertSinks,
    body_for,
    make_alert,
    post,
    redact_url,
    run_command,
)

SECRETS = ("secret-topic", "hunter2", "pa55", "alice")


class Recorder:
    """What the server was sent, and how it is to answer the next requests."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.plan: deque[str] = deque()
        self.cond = threading.Condition()
        self.release = threading.Event()

    def record(self, path: str, headers: dict[str, str], body: bytes) -> str:
        with self.cond:
            self.requests.append({"path": path, "headers": headers, "body": body})
            self.cond.notify_all()
            return self.plan.popleft() if self.plan else "200"

    def wait_for(self, count: int, timeout_s: float = 10.0) -> list[dict]:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.requests) >= count, timeout_s), \
                f"the server got {len(self.requests)} request(s), not {count}"
            return list(self.requests)


class Server:
    def __init__(self, recorder: Recorder, port: int) -> None:
        self.recorder = recorder
        self.port = port
        self.url = f"http://127.0.0.1:{port}/topic"


@pytest.fixture
def server():
    recorder = Recorder()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            action = recorder.record(self.path, dict(self.headers.items()), body)
            if action == "hang":
                recorder.release.wait(30)
                action = "200"
            if action == "302":
                self.send_response(302)
                self.send_header("Location", "/elsewhere")
            else:
                self.send_response(int(action))
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield Server(recorder, httpd.server_address[1])
    finally:
        recorder.release.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join(10)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def alert(kind: str = "failure", **fields) -> dict:
    return make_alert(kind, fields.pop("run", "r-123"), fields.pop("title", f"run r-123: {kind}"),
                      fields.pop("message", "Traceback (most recent call last):\n  boom"),
                      host="gpu-1", at=1700000000.5, **fields)


def no_secrets(text: str) -> bool:
    return not any(secret in text for secret in SECRETS)


# --- bodies ------------------------------------------------------------------------------------------------------

def test_json_body_and_headers(server) -> None:
    sent = alert(name="evil\x1b]0;title\x07", message="line 1\nline 2\x1b[2J", extra={"nested": ["a\x07"]})
    body, headers = body_for(sent, "json")
    delivery = post(server.url, body, headers)
    assert delivery.ok and delivery.attempts == 1
    (request,) = server.recorder.wait_for(1)
    assert request["path"] == "/topic"
    assert request["headers"]["Content-Type"] == "application/json"
    got = json.loads(request["body"])
    assert got["kind"] == "failure" and got["run"] == "r-123" and got["host"] == "gpu-1"
    assert got["severity"] == "error" and got["at"] == 1700000000.5
    assert got["name"] == "evil\u241b]0;title\\x07"
    assert got["message"] == "line 1\nline 2\u241b[2J"
    assert got["extra"] == {"nested": ["a\\x07"]}


def test_json_message_is_cut_with_a_note() -> None:
    body, _ = body_for(alert(message="x" * (JSON_MESSAGE_LIMIT * 2)), "json")
    message = json.loads(body)["message"]
    assert len(message) <= JSON_MESSAGE_LIMIT and "cut" in message


def test_ntfy_body_and_headers(server) -> None:
    sent = alert(title="Ölfeld 🚀 failed\r\nInjected: yes", message="first\nsecond ✓")
    body, headers = body_for(sent, "ntfy")
    assert post(server.url, body, headers).ok
    (request,) = server.recorder.wait_for(1)
    got = request["headers"]
    assert request["body"].decode("utf-8") == "first\nsecond ✓"
    assert got["Title"] == "Ölfeld ? failed Injected: yes"
    assert "Injected" not in got
    assert got["Priority"] == "urgent" and got["Tags"] == "rotating_light"
    assert got["Content-Type"].startswith("text/plain")


@pytest.mark.parametrize(("kind", "severity", "priority", "tag"), [
    ("failure", "error", "urgent", "rotating_light"),
    ("stall", "warning", "high", "hourglass"),
    ("low_disk", "warning", "high", "floppy_disk"),
    ("time_limit", "warning", "high", "alarm_clock"),
    ("end", "info", "default", "checkered_flag"),
])
def test_ntfy_priority_and_tags(kind: str, severity: str, priority: str, tag: str) -> None:
    _, headers = body_for(alert(kind), "ntfy")
    assert (headers["Priority"], headers["Tags"]) == (priority, tag)
    assert alert(kind)["severity"] == severity


def test_ntfy_body_is_cut_at_4000_bytes_on_a_character_boundary() -> None:
    body, headers = body_for(alert(message="é✓" * 5000, title="t\x1b[2J"), "ntfy")
    assert len(body) <= NTFY_BODY_LIMIT
    assert "cut" in body.decode("utf-8")  # strict decoding: no character was split
    assert headers["Title"] == "t?[2J"  # ␛ is not latin-1
    headers["Title"].encode("latin-1")


def test_slack_body_escapes_and_cuts(server) -> None:
    body, headers = body_for(alert(title="run <r> & co", message="<!channel> look\n" + "&" * 5000), "slack")
    assert headers["Content-Type"] == "application/json"
    assert post(server.url, body, headers).ok
    text = json.loads(server.recorder.wait_for(1)[0]["body"])["text"]
    assert text.startswith("*run &lt;r&gt; &amp; co*\n&lt;!channel&gt; look\n")
    assert len(text) <= SLACK_TEXT_LIMIT and "cut" in text
    assert "&am\n" not in text and "&a\n" not in text and "&\n" not in text  # never cut inside an escape


def test_slack_short_message_is_whole() -> None:
    body, _ = body_for(alert("end", title="done", message="all good"), "slack")
    assert json.loads(body) == {"text": "*done*\nall good"}


# --- post ----------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("status", ["500", "429"])
def test_retry_then_success(server, status: str) -> None:
    server.recorder.plan.extend([status])
    sleeps: list[float] = []
    delivery = post(server.url, b"{}", {"Content-Type": "application/json"}, sleep=sleeps.append)
    assert delivery.ok and delivery.attempts == 2
    assert sleeps == [1.0]
    assert len(server.recorder.wait_for(2)) == 2
    assert "HTTP 200 after 2 attempts" in delivery.detail


def test_5xx_every_time_gives_up_after_the_attempts(server) -> None:
    server.recorder.plan.extend(["500"] * 5)
    sleeps: list[float] = []
    delivery = post(server.url, b"{}", {}, attempts=4, backoff_s=(1.0, 4.0), sleep=sleeps.append)
    assert not delivery.ok and delivery.attempts == 4
    assert sleeps == [1.0, 4.0, 4.0]
    assert "HTTP 500" in delivery.detail


def test_404_is_not_retried(server) -> None:
    server.recorder.plan.extend(["404"])
    sleeps: list[float] = []
    delivery = post(server.url, b"{}", {}, sleep=sleeps.append)
    assert not delivery.ok and delivery.attempts == 1 and sleeps == []
    assert delivery.detail == f"webhook http://127.0.0.1:{server.port}/…: HTTP 404"
    assert len(server.recorder.wait_for(1)) == 1


def test_redirect_is_not_followed(server) -> None:
    server.recorder.plan.extend(["302"])
    delivery = post(server.url, b"{}", {}, sleep=lambda s: None)
    assert not delivery.ok and delivery.attempts == 1 and "302" in delivery.detail
    assert [r["path"] for r in server.recorder.wait_for(1)] == ["/topic"]


def test_timeout_is_bounded(server) -> None:
    server.recorder.plan.extend(["hang"] * 3)
    timeout_s, attempts, backoff = 0.3, 2, 0.05
    started = time.monotonic()
    delivery = post(server.url, b"{}", {}, timeout_s=timeout_s, attempts=attempts, backoff_s=(backoff,))
    elapsed = time.monotonic() - started
    assert not delivery.ok and delivery.attempts == 2 and "timed out" in delivery.detail
    assert elapsed < attempts * timeout_s + backoff + 0.5
    assert len(server.recorder.wait_for(2)) == 2


def test_unreachable_port_fails_cleanly() -> None:
    port = closed_port()
    sleeps: list[float] = []
    delivery = post(f"http://127.0.0.1:{port}/x", b"{}", {}, timeout_s=2.0, sleep=sleeps.append)
    assert not delivery.ok and delivery.attempts == 3 and len(sleeps) == 2
    assert delivery.detail.startswith(f"webhook http://127.0.0.1:{port}/…: ")
    assert "\n" not in delivery.detail


def test_invalid_url_fails_cleanly() -> None:
    for url in ("ftp://host/secret-topic", "not a url secret-topic", "http://[::1/secret-topic"):
        delivery = post(url, b"{}", {}, sleep=lambda s: None)
        assert not delivery.ok and no_secrets(delivery.detail), delivery.detail


@pytest.mark.parametrize("plan", [[], ["404"], ["500"] * 3, ["hang"] * 3])
def test_detail_never_holds_the_url_path_query_or_userinfo(server, plan: list[str]) -> None:
    server.recorder.plan.extend(plan)
    url = f"http://alice:hunter2@127.0.0.1:{server.port}/secret-topic/x?token=pa55#frag"
    delivery = post(url, b"{}", {}, timeout_s=0.3, sleep=lambda s: None)
    assert delivery.detail.startswith(f"webhook http://127.0.0.1:{server.port}/…: ")
    assert no_secrets(delivery.detail), delivery.detail
    request = server.recorder.wait_for(1)[0]
    assert request["path"] == "/secret-topic/x?token=pa55"  # sent where asked, with the credentials as Basic auth
    assert request["headers"]["Authorization"] == "Basic " + base64.b64encode(b"alice:hunter2").decode()


def test_redact_url() -> None:
    assert redact_url("https://user:pw@hooks.slack.com/services/T/B/X?q=1#f") == "https://hooks.slack.com/…"
    assert redact_url("https://ntfy.sh/secret-topic") == "https://ntfy.sh/…"
    assert redact_url("http://127.0.0.1:8080") == "http://127.0.0.1:8080/…"
    assert redact_url("http://[::1]:80/x") == "http://[::1]:80/…"
    for bad in ("hooks.slack.com/services/secret-topic", "http://h:port/secret-topic", "", None, 3):
        assert redact_url(bad) == "<invalid URL>"


# --- commands ----------------------------------------------------------------------------------------------------

def test_command_gets_the_alert_on_stdin_and_in_its_environment(tmp_path: Path) -> None:
    out = tmp_path / "got.json"
    script = ("import json, os, sys; data = sys.stdin.read(); "
              f"env = {{k: os.environ.get(k) for k in ({ENV_KIND!r}, {ENV_RUN!r}, {ENV_TITLE!r})}}; "
              f"open({str(out)!r}, 'w').write(json.dumps({{'stdin': data, 'env': env}}))")
    sent = alert("stall", title="stalled\nfor 10 min \x1b[2J")
    delivery = run_command([sys.executable, "-c", script], sent)
    assert delivery.ok and delivery.attempts == 1, delivery.detail
    got = json.loads(out.read_text())
    assert got["stdin"].encode("utf-8") == body_for(sent, "json")[0]
    assert got["env"] == {ENV_KIND: "stall", ENV_RUN: "r-123", ENV_TITLE: "stalled for 10 min \u241b[2J"}


def test_command_failure_says_one_line_of_its_output() -> None:
    script = "import sys; print(); print('boom: \\x1b[2J bad'); print('second'); sys.stdout.write('x' * 100000); sys.exit(3)"
    delivery = run_command([sys.executable, "-c", script], alert())
    assert not delivery.ok
    assert delivery.detail == f"command {os.path.basename(sys.executable)}: exit 3: boom: \u241b[2J bad"


def test_command_that_does_not_read_a_large_stdin() -> None:
    delivery = run_command([sys.executable, "-c", "pass"], alert(message="m" * 200_000))
    assert delivery.ok, delivery.detail


def test_missing_command_is_a_failed_delivery(tmp_path: Path) -> None:
    delivery = run_command([str(tmp_path / "no-such-notifier"), "--x"], alert())
    assert not delivery.ok and "no-such-notifier: cannot start" in delivery.detail
    assert not run_command([], alert()).ok
    assert not run_command(["bad\0arg"], alert()).ok


def _gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[0] == "Z"


def _wait_until(condition, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        threading.Event().wait(0.02)
    return condition()


def test_command_timeout_kills_its_process_group(tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild.pid"
    script = ("import subprocess, sys, time; "
              "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
              f"open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(60)")
    started = time.monotonic()
    delivery = run_command([sys.executable, "-c", script], alert(), timeout_s=1.5)
    assert time.monotonic() - started < 1.5 + 3.0
    assert not delivery.ok and "timed out after 1.5 s, killed" in delivery.detail
    assert _wait_until(pid_file.exists)
    grandchild = int(pid_file.read_text())
    assert _wait_until(lambda: _gone(grandchild)), "the notifier's child outlived the timeout"


# --- the sender --------------------------------------------------------------------------------------------------

def test_sender_delivers_in_order_and_close_waits(server, tmp_path: Path) -> None:
    log = tmp_path / "kinds"
    script = f"import os; open({str(log)!r}, 'a').write(os.environ[{ENV_KIND!r}] + '\\n')"
    notes: list[str] = []
    sinks = AlertSinks(command=(sys.executable, "-c", script), webhook=server.url, format="json")
    sender = AlertSender(sinks, notes.append)
    kinds = ["failure", "stall", "low_disk", "time_limit", "end"]
    for kind in kinds:
        sender.send(alert(kind))
    assert sender.close(30)
    assert log.read_text().split() == kinds
    assert [json.loads(r["body"])["kind"] for r in server.recorder.wait_for(5)] == kinds
    assert len(notes) == 10 and all(note.startswith("alert ") and " sent: " in note for note in notes), notes
    sender.send(alert("end"))  # after close: dropped, said so
    assert notes[-1] == "alert end dropped, not sent: the sender is closed"


def test_hanging_webhook_does_not_block_send(server) -> None:
    server.recorder.plan.extend(["hang"] * 10)
    notes: list[str] = []
    sender = AlertSender(AlertSinks(webhook=server.url + "/secret-topic?k=hunter2"), notes.append,
                         webhook_timeout_s=0.5, attempts=1)
    started = time.monotonic()
    for kind in ("failure", "stall", "end"):
        sender.send(alert(kind))
    assert time.monotonic() - started < 0.2
    server.recorder.wait_for(1)
    assert sender.close(10)
    assert len(notes) == 3 and all("not sent" in note and "timed out" in note for note in notes), notes
    assert all(no_secrets(note) for note in notes)


def test_close_is_bounded_when_delivery_hangs(server) -> None:
    server.recorder.plan.extend(["hang"])
    notes: list[str] = []
    sender = AlertSender(AlertSinks(webhook=server.url), notes.append, webhook_timeout_s=30, attempts=1)
    sender.send(alert("end"))
    server.recorder.wait_for(1)
    started = time.monotonic()
    assert not sender.close(0.3)
    assert time.monotonic() - started < 2.0
    assert notes == ["1 alert(s) not delivered: still under way after 0.3 s"]


def test_full_queue_drops_the_oldest_alert_that_is_not_an_end(server) -> None:
    server.recorder.plan.extend(["hang"])
    notes: list[str] = []
    sender = AlertSender(AlertSinks(webhook=server.url), notes.append, queue_limit=2, webhook_timeout_s=30)
    sender.send(alert("failure"))
    server.recorder.wait_for(1)  # the failure is being delivered: out of the queue
    for kind in ("end", "stall", "low_disk"):
        sender.send(alert(kind))
    assert notes == ["alert stall dropped, not sent: 2 alerts were waiting to be sent"]
    server.recorder.release.set()
    assert sender.close(10)
    assert [json.loads(r["body"])["kind"] for r in server.recorder.wait_for(3)] == ["failure", "end", "low_disk"]


def test_a_failing_note_and_a_dead_webhook_never_reach_the_caller() -> None:
    def note(line: str) -> None:
        raise RuntimeError("log gone")

    sender = AlertSender(AlertSinks(webhook=f"http://127.0.0.1:{closed_port()}/x"), note, attempts=1)
    sender.send(alert())
    assert sender.close(10)


def test_no_sinks_sends_nothing() -> None:
    notes: list[str] = []
    sender = AlertSender(AlertSinks(), notes.append)
    sender.send(alert())
    assert sender.close(1) and notes == []


# --- settings ----------------------------------------------------------------------------------------------------

def test_from_record_valid() -> None:
    sinks, problems = AlertSinks.from_record(
        {"command": ["notify", "--urgent"], "webhook": "https://ntfy.sh/secret-topic", "format": "ntfy"})
    assert problems == []
    assert sinks == AlertSinks(command=("notify", "--urgent"), webhook="https://ntfy.sh/secret-topic", format="ntfy")
    assert sinks and not sinks.empty
    assert AlertSinks.from_record(None) == (AlertSinks(), [])
    assert not AlertSinks() and AlertSinks().empty


@pytest.mark.parametrize(("record", "expected", "problem"), [
    ({"command": "notify --x"}, AlertSinks(), "alert command: expected a list"),
    ({"command": ["notify", 3]}, AlertSinks(), "alert command: item 1 is a number"),
    ({"command": [""]}, AlertSinks(), "alert command: the program (item 0) is empty"),
    ({"webhook": 42}, AlertSinks(), "alert webhook: expected a string"),
    ({"webhook": "ftp://host/secret-topic"}, AlertSinks(), "alert webhook: not an http:// or https:// URL"),
    ({"webhook": "hooks.slack.com/services/secret-topic"}, AlertSinks(), "alert webhook: not an http:// or https://"),
    ({"webhook": "https://host/secret-topic hunter2"}, AlertSinks(), "alert webhook: the URL holds spaces"),
    ({"webhook": "https://host:99999/secret-topic"}, AlertSinks(), "alert webhook: not a valid URL"),
    ({"webhook": "https:///secret-topic"}, AlertSinks(), "alert webhook: the URL names no host"),
    ({"webhook": "https://h/x", "format": "teams"}, AlertSinks(webhook="https://h/x"),
     "alert format: 'teams' is not one of json, ntfy, slack; json is used"),
    ({"command": ["n"], "colour": "red\x1b[2J"}, AlertSinks(command=("n",)), "alert settings: unknown key 'colour'"),
    (["https://h/secret-topic"], AlertSinks(), "alert settings: expected a JSON object, got a list"),
])
def test_from_record_problems(record: object, expected: AlertSinks, problem: str) -> None:
    sinks, problems = AlertSinks.from_record(record)
    assert sinks == expected
    assert len(problems) == 1 and problems[0].startswith(problem), problems
    assert "\n" not in problems[0] and "\x1b" not in problems[0] and no_secrets(problems[0])


def test_sinks_refuse_an_unknown_format() -> None:
    with pytest.raises(ValueError):
        AlertSinks(webhook="https://h/x", format="teams")
