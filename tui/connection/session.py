"""One live link to one agent: the greeting, commands matched to replies by id, and liveness.

The reader thread is the only reader of the link. It declares the link dead when the link closes, when a line is
not protocol, or when nothing at all (not even a heartbeat, which the agent sends every second) arrived for
``dead_after_s``: that last check is what notices a peer that hung without closing anything.
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any, Callable

from eaglewatch import protocol
from eaglewatch.safetext import safe_text
from eaglewatch.tui.connection.errors import AgentError, AgentStartError, ConnectionFailed, LinkLost
from eaglewatch.tui.connection.links import TIMEOUT, Link, start_error, stderr_lines

POLL_S = 0.25


class _Pending:
    __slots__ = ("event", "reply", "lost")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.reply: dict[str, Any] | None = None
        self.lost: str | None = None


class AgentSession:
    def __init__(
        self,
        link: Link,
        on_messages: Callable[["AgentSession", list[dict[str, Any]]], None],
        on_tick: Callable[["AgentSession"], None],
        on_dead: Callable[["AgentSession", str], None],
        dead_after_s: float = protocol.DEAD_AFTER_S,
    ) -> None:
        self.link = link
        self.hello: dict[str, Any] = {}
        self.dead_after_s = dead_after_s
        self.dead = threading.Event()
        self.reason = ""
        self.last_rx = time.monotonic()
        self._on_messages = on_messages
        self._on_tick = on_tick
        self._on_dead = on_dead
        self._buffer = bytearray()
        self._pending: dict[int, _Pending] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    # --- start ---------------------------------------------------------------------------------------
    def start(self, timeout_s: float = 30.0) -> dict[str, Any]:
        """Read the greeting, check its version, then start the reader thread. Raises AgentStartError."""
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                # A slow or hung host, not a broken setup: worth retrying.
                raise ConnectionFailed(f"the agent did not greet within {timeout_s:g} s ({self.link.description})")
            data = self.link.recv(min(remaining, 1.0))
            if data is TIMEOUT or not isinstance(data, bytes):
                continue
            if not data:
                if not self.link.transport_alive():
                    raise ConnectionFailed(f"the link dropped while the agent started ({self.link.description})")
                raise start_error(self.link, "the agent exited before it greeted")
            self._buffer += data
        line, _, rest = bytes(self._buffer).partition(b"\n")
        self._buffer = bytearray(rest)
        try:
            hello = protocol.decode(line)
        except protocol.ProtocolVersionError as exc:
            raise AgentStartError(f"{self.link.description}: {exc}") from None
        except protocol.ProtocolError:
            raise start_error(self.link, f"the agent's first line is not a greeting: {line[:200]!r}") from None
        if hello.get("type") != protocol.MSG_HELLO:
            raise start_error(self.link, f"expected a greeting, got {hello.get('type')!r}")
        self.hello = hello
        self.last_rx = time.monotonic()
        self._thread = threading.Thread(target=self._read_loop, name="eaglewatch-reader", daemon=True)
        self._thread.start()
        return hello

    # --- reading -------------------------------------------------------------------------------------
    def _read_loop(self) -> None:
        if self._buffer:
            self._consume(b"")
        while not self.dead.is_set():
            data = self.link.recv(POLL_S)
            now = time.monotonic()
            if data is TIMEOUT:
                if now - self.last_rx > self.dead_after_s:
                    self.die(f"nothing from the agent for {self.dead_after_s:g} s: the link or the host hangs")
                    return
            elif not data:
                # One status line: the stderr's last line (a traceback's root cause), already through safe_text.
                last = stderr_lines(self.link.stderr_text(), limit=1)
                self.die("the link closed" + (f" ({last[0]})" if last else ""))
                return
            else:
                self.last_rx = now
                if not self._consume(data):  # type: ignore[arg-type]
                    return
            if not self.dead.is_set():
                self._on_tick(self)

    def _consume(self, data: bytes) -> bool:
        self._buffer += data
        end = self._buffer.rfind(b"\n") + 1
        if not end:
            return True
        lines = bytes(self._buffer[:end]).split(b"\n")[:-1]
        del self._buffer[:end]
        messages = []
        for line in lines:
            try:
                message = protocol.decode(line)
            except protocol.ProtocolError as exc:
                self.die(f"the agent sent a line this client cannot read: {safe_text(exc)}")
                return False
            if message.get("type") == protocol.MSG_REPLY:
                self._resolve(message)
            else:
                messages.append(message)
        if messages and not self.dead.is_set():
            self._on_messages(self, messages)
        return True

    def _resolve(self, reply: dict[str, Any]) -> None:
        with self._lock:
            pending = self._pending.pop(reply.get("id"), None)  # type: ignore[arg-type]
        if pending is not None:
            pending.reply = reply
            pending.event.set()

    # --- commands ------------------------------------------------------------------------------------
    def send_command(self, op: str, request_id: int = 0, **args: Any) -> None:
        try:
            self.link.send(protocol.encode(protocol.command_message(request_id, op, **args)))
        except Exception as exc:
            self.die(f"sending to the agent failed: {exc}")
            raise LinkLost(self.reason) from None

    def request(self, op: str, timeout_s: float | None = 60.0, **args: Any) -> Any:
        if self.dead.is_set():
            raise LinkLost(self.reason)
        pending = _Pending()
        with self._lock:
            request_id = next(self._ids)
            self._pending[request_id] = pending
        self.send_command(op, request_id, **args)
        if not pending.event.wait(timeout_s):
            with self._lock:
                self._pending.pop(request_id, None)
            raise TimeoutError(f"the agent did not answer {op!r} within {timeout_s:g} s")
        if pending.reply is None:
            raise LinkLost(pending.lost or self.reason)
        if not pending.reply.get("ok"):
            error = pending.reply.get("error") or {}
            raise AgentError(str(error.get("code", "failed")), str(error.get("message", "the agent refused")))
        return pending.reply.get("result")

    # --- ending --------------------------------------------------------------------------------------
    def die(self, reason: str, notify: bool = True) -> None:
        with self._lock:
            if self.dead.is_set():
                return
            self.reason = reason
            self.dead.set()
            pending, self._pending = self._pending, {}
        for item in pending.values():
            item.lost = reason
            item.event.set()
        # Closing a hung transport must not block whoever noticed it.
        threading.Thread(target=self.link.close, name="eaglewatch-link-close", daemon=True).start()
        if notify:
            self._on_dead(self, reason)

    def close(self) -> None:
        self.die("closed", notify=False)
