"""Errors of the connection to a GPU host. Each message says what happened and what the operator can do."""

from __future__ import annotations

from typing import Any


class ConnectionFailed(Exception):
    """The link could not be made. ``fatal`` ones (host key, authentication) are not retried by reconnecting."""

    fatal = False


class UnknownHostKeyError(ConnectionFailed):
    """The host presented a key that no known_hosts file lists. Accepting it is the operator's decision:
    show ``fingerprint`` and call ``accept_host_key(error)`` (or the CLI's ``--accept-host-key FINGERPRINT``)."""

    fatal = True

    def __init__(self, host_id: str, key_type: str, fingerprint: str, key: Any, known_hosts_path: str) -> None:
        self.host_id = host_id
        self.key_type = key_type
        self.fingerprint = fingerprint
        self.key = key
        self.known_hosts_path = known_hosts_path
        super().__init__(
            f"the host key of {host_id} is not known: {key_type} {fingerprint}. "
            f"Check that fingerprint with the host's owner, then accept it (it will be added to {known_hosts_path})"
        )


class HostKeyChangedError(ConnectionFailed):
    """The host presented a key that differs from the one on record: possibly an attack. Never accepted here."""

    fatal = True

    def __init__(self, host_id: str, key_type: str, fingerprint: str, known_fingerprint: str | None) -> None:
        self.host_id = host_id
        self.key_type = key_type
        self.fingerprint = fingerprint
        self.known_fingerprint = known_fingerprint
        super().__init__(
            f"the host key of {host_id} has CHANGED: it now presents {key_type} {fingerprint}"
            + (f", but known_hosts holds {known_fingerprint}" if known_fingerprint else "")
            + ". Someone may be intercepting the connection. If the host was really reinstalled, remove its old "
            f"line with `ssh-keygen -R '{host_id}'` and connect again"
        )


class AuthenticationFailed(ConnectionFailed):
    fatal = True


class AgentStartError(ConnectionFailed):
    """The agent process did not start or did not greet us properly (wrong Python, old eaglewatch, ...)."""

    fatal = True


class LinkLost(Exception):
    """The link died while a command was in flight; whether the command took effect is unknown."""


class AgentError(Exception):
    """The agent answered a command with an error."""

    def __init__(self, code: str, message: str) -> None:
        self.code = code
        super().__init__(message)
