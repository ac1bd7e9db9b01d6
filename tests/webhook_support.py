"""A real local HTTP server standing in for an alert webhook (ntfy, Slack, a pager's endpoint): it records every POST
and lets a test wait, on a condition it can see, for the alert it expects."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

import pytest

PROXY_VARIABLES = ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY")


@pytest.fixture(autouse=True)
def no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """A proxy in the environment would carry a POST to 127.0.0.1 elsewhere: imported by a module, for all its tests
    (and the agents and supervisors they start)."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)


class Webhook:
    def __init__(self) -> None:
        self.alerts: list[dict[str, Any]] = []
        self.changed = threading.Condition()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    alert = json.loads(body)
                except ValueError:
                    alert = {"raw": body.decode("utf-8", "replace")}
                with owner.changed:
                    owner.alerts.append(alert)
                    owner.changed.notify_all()
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/secret-token-7f3a"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def wait_for(self, predicate: Callable[[dict[str, Any]], bool], timeout_s: float, what: str) -> dict[str, Any]:
        """The first alert received that ``predicate`` accepts, waiting for it up to ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        with self.changed:
            while True:
                found = next((alert for alert in self.alerts if predicate(alert)), None)
                if found is not None:
                    return found
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no {what} alert within {timeout_s} s; received: {self.alerts}")
                self.changed.wait(left)

    def kinds(self) -> list[str]:
        with self.changed:
            return [str(alert.get("kind")) for alert in self.alerts]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
