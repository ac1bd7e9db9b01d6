"""One connection per host of a job, made the way every command connects (named hosts of the config file, ssh
config aliases, ``user@host[:port]``, ``local``; see ``_common.resolve_host``), and shared by all the ranks on it."""

from __future__ import annotations

import argparse
import threading
import time
from typing import TYPE_CHECKING, Callable, Iterable, Optional

from eaglewatch.errors import UserError
from eaglewatch.tui.commands import _common

if TYPE_CHECKING:
    from eaglewatch.tui.connection import Connection

RETRY_AFTER_S = 15.0  # a host that could not be reached is not tried again sooner (a dead one costs a timeout)


def connect_quietly(args: argparse.Namespace) -> "Connection":
    """Connect to ``args.host`` without asking anything: an unknown host key is refused with what to do, for a
    caller that has no terminal to ask on (a dashboard's worker)."""
    from eaglewatch.tui.connection import Connection, ConnectionFailed, UnknownHostKeyError

    target = _common.resolve_host(args)
    try:
        connection = Connection(target.spec, run_root=target.run_root, ssh_options=target.ssh_options)
    except ValueError as exc:
        raise _common.user_error(exc) from None
    try:
        connection.connect()
    except ValueError as exc:
        raise _common.user_error(exc) from None
    except UnknownHostKeyError as exc:
        raise _common.user_error(f"{exc}; accept it first, e.g. "
                                 f"{_common.hint_command('runs', args.host, '--accept-host-key', exc.fingerprint)}"
                                 ) from None
    except ConnectionFailed as exc:
        raise _common.user_error(f"{exc}{_common.ssh_config_hint(connection)}") from None
    return connection


class HostPool:
    """Connections by host name (as the operator wrote it), made on first use. ``interactive``: an unknown host
    key may be asked about on the terminal (a command); else it is an error (the dashboard)."""

    def __init__(self, args: argparse.Namespace, interactive: bool = True,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.args = args
        self.interactive = interactive
        self.clock = clock
        self._connections: dict[str, "Connection"] = {}
        self._failed: dict[str, tuple[float, UserError]] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()
        self._closed = False

    def _args_for(self, host: str) -> argparse.Namespace:
        args = argparse.Namespace(**vars(self.args))
        args.host = host
        return args

    def get(self, host: str) -> "Connection":
        """The connection to ``host``, connecting now if there is none; a UserError says why there cannot be."""
        with self._lock:
            if self._closed:
                raise UserError("the job's connections are closed")
            if host in self._connections:
                return self._connections[host]
            lock = self._locks.setdefault(host, threading.Lock())
        with lock:  # one connect per host at a time; other hosts do not wait for it
            with self._lock:
                if host in self._connections:
                    return self._connections[host]
                failed = self._failed.get(host)
            if failed is not None and self.clock() - failed[0] < RETRY_AFTER_S:
                raise failed[1]
            try:
                args = self._args_for(host)
                connection = _common.connect(args) if self.interactive else connect_quietly(args)
            except UserError as exc:
                with self._lock:
                    self._failed[host] = (self.clock(), exc)
                raise
            with self._lock:
                if self._closed:
                    _common.close_quietly(connection)
                    raise UserError("the job's connections are closed")
                self._failed.pop(host, None)
                self._connections[host] = connection
            return connection

    def connect_all(self, hosts: Iterable[str]) -> None:
        """Connect to every host now, in order (a command does this before it launches anything)."""
        for host in dict.fromkeys(hosts):
            self.get(host)

    def connected(self) -> dict[str, "Connection"]:
        with self._lock:
            return dict(self._connections)

    def python_of(self, host: str) -> Optional[str]:
        """The Python named for the host (``--python``, its config entry, ``$EAGLEWATCH_REMOTE_PYTHON``)."""
        return _common.resolve_host(self._args_for(host)).named_python

    def alerts_of(self, host: str) -> Optional[dict]:
        """Where the runs launched on the host send their alerts (the config file's), or None."""
        return _common.resolve_host(self._args_for(host)).alerts

    def close(self) -> None:
        with self._lock:
            self._closed = True
            connections, self._connections = list(self._connections.values()), {}
        for connection in connections:
            _common.close_quietly(connection)
