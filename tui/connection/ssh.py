"""paramiko transport to a GPU host: host key checks, key and ssh-agent authentication, ProxyJump.

Nothing here ever asks for, takes or stores a password: keys (files or ssh-agent) only.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from eaglewatch.safetext import safe_text

from eaglewatch.tui.connection.errors import (
    AuthenticationFailed,
    ConnectionFailed,
    HostKeyChangedError,
    UnknownHostKeyError,
)
from eaglewatch.tui.connection.target import DEFAULT_SSH_CONFIG, Endpoint

# paramiko's transport thread logs what went wrong, with a traceback, to this logger's children; without a handler
# Python's last-resort handler would print that on the operator's stderr beside the one clear sentence the
# connection raises (and quote the host's bytes raw). Configure logging to see them.
LOG_CHANNEL = "eaglewatch.ssh"
logging.getLogger(LOG_CHANNEL).addHandler(logging.NullHandler())

DEFAULT_KNOWN_HOSTS = ("~/.ssh/known_hosts", "/etc/ssh/ssh_known_hosts")
DEFAULT_IDENTITIES = ("~/.ssh/id_ed25519", "~/.ssh/id_ecdsa", "~/.ssh/id_rsa")


@dataclass
class SSHOptions:
    """Where to look for configuration and keys. The defaults are the operator's usual OpenSSH files."""

    config_path: str | None = DEFAULT_SSH_CONFIG
    # None: the files the ssh config names for the host (UserKnownHostsFile, GlobalKnownHostsFile), else the defaults.
    known_hosts: tuple[str, ...] | None = None
    # Where an accepted host key is written (the first known_hosts file unless set).
    known_hosts_write: str | None = None
    identity_files: tuple[str, ...] = ()
    use_ssh_agent: bool = True
    connect_timeout_s: float = 10.0
    # A server that accepts TCP but sends no SSH banner in this long is not an SSH server we can use (a hung sshd,
    # a port forwarded to nothing, another service): said at once rather than after the whole connect timeout.
    banner_timeout_s: float = 5.0
    # The remote interpreter that runs the agent (absolute paths avoid a PATH lookup through the login shell).
    python: str = "python3"
    # The agent's environment on the host, beside what its SSH session gives it (SLURM_CONF, PATH): what sbatch,
    # squeue and the jobs it starts see. Passed as ``env NAME=VALUE … python3 agent`` (every word quoted).
    agent_env: tuple[tuple[str, str], ...] = ()
    # Where the agent zipapp is uploaded, relative to the remote home unless absolute.
    agent_dir: str = ".eaglewatch/agent"
    extra: dict[str, Any] = field(default_factory=dict)

    def known_hosts_for(self, endpoint: Endpoint) -> tuple[str, ...]:
        if self.known_hosts is not None:
            return self.known_hosts
        return endpoint.known_hosts or DEFAULT_KNOWN_HOSTS

    def write_path_for(self, endpoint: Endpoint) -> str:
        return os.path.expanduser(self.known_hosts_write or self.known_hosts_for(endpoint)[0])


def _host_keys(options: SSHOptions, endpoint: Endpoint):
    import paramiko

    keys = paramiko.HostKeys()
    for path in options.known_hosts_for(endpoint):
        full = os.path.expanduser(path)
        if os.path.exists(full):
            try:
                keys.load(full)
            except (OSError, paramiko.SSHException) as exc:
                raise ConnectionFailed(f"cannot read known_hosts file {full}: {exc}") from None
    return keys


def verify_host_key(endpoint: Endpoint, key: Any, options: SSHOptions) -> None:
    """Raise UnknownHostKeyError or HostKeyChangedError unless known_hosts lists exactly this key."""
    known = _host_keys(options, endpoint).lookup(endpoint.host_id)
    key_type = key.get_name()
    if not known:
        raise UnknownHostKeyError(endpoint.host_id, key_type, key.fingerprint, key, options.write_path_for(endpoint))
    recorded = known.get(key_type)
    if recorded is not None and recorded.asbytes() == key.asbytes():
        return
    if recorded is None:
        # The host is known under other key types only: the safe reading is that its key changed.
        others = ", ".join(f"{name} {value.fingerprint}" for name, value in known.items())
        raise HostKeyChangedError(endpoint.host_id, key_type, key.fingerprint, others)
    raise HostKeyChangedError(endpoint.host_id, key_type, key.fingerprint, recorded.fingerprint)


def accept_host_key(error: UnknownHostKeyError, path: str | None = None) -> str:
    """Record the key the operator accepted in known_hosts (OpenSSH's format). Returns the file written."""
    target = os.path.expanduser(path or error.known_hosts_path)
    folder = os.path.dirname(target)
    if folder and not os.path.isdir(folder):
        os.makedirs(folder, mode=0o700, exist_ok=True)
    line = f"{error.host_id} {error.key_type} {error.key.get_base64()}\n"
    needs_newline = False
    if os.path.exists(target) and os.path.getsize(target) > 0:
        with open(target, "rb") as fh:
            fh.seek(-1, os.SEEK_END)
            needs_newline = fh.read(1) != b"\n"
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "a", encoding="ascii") as fh:
        fh.write(("\n" if needs_newline else "") + line)
    return target


def _load_key_file(path: str):
    import paramiko

    return paramiko.PKey.from_path(path)


def authenticate(transport: Any, endpoint: Endpoint, options: SSHOptions) -> None:
    import paramiko

    tried: list[str] = []
    skipped: list[str] = []

    def attempt(key: Any, label: str) -> bool:
        try:
            transport.auth_publickey(endpoint.user, key)
        except paramiko.BadAuthenticationType as exc:
            raise AuthenticationFailed(
                f"{endpoint} does not accept public keys (it allows: {', '.join(exc.allowed_types)}); "
                "eaglewatch authenticates with keys and ssh-agent only"
            ) from None
        except paramiko.AuthenticationException:
            tried.append(f"{label} ({key.fingerprint})")
            return False
        return transport.is_authenticated()

    if options.use_ssh_agent and os.environ.get("SSH_AUTH_SOCK"):
        try:
            agent_keys = paramiko.Agent().get_keys()
        except paramiko.SSHException:
            agent_keys = ()
        for key in agent_keys:
            if attempt(key, "ssh-agent key"):
                return
    files = list(options.identity_files) + list(endpoint.identity_files)
    if not files:
        files = [path for path in DEFAULT_IDENTITIES if os.path.exists(os.path.expanduser(path))]
    for path in files:
        full = os.path.expanduser(path)
        try:
            key = _load_key_file(full)
        except FileNotFoundError:
            skipped.append(f"{full} (missing)")
            continue
        except paramiko.PasswordRequiredException:
            skipped.append(f"{full} (encrypted: load it into ssh-agent)")
            continue
        except (OSError, paramiko.SSHException, ValueError) as exc:
            skipped.append(f"{full} (unreadable: {exc})")
            continue
        if attempt(key, full):
            return
    detail = "; ".join(tried) if tried else "no key was available"
    if skipped:
        detail += "; skipped " + ", ".join(skipped)
    raise AuthenticationFailed(
        f"{endpoint} refused authentication: tried {detail}. Add your public key to the host's "
        "~/.ssh/authorized_keys, load the right key into ssh-agent, or name it with IdentityFile"
    )


class SSHChain:
    """An authenticated transport to the target, with the jump transports it runs through."""

    def __init__(self, transports: list[Any]) -> None:
        self.transports = transports

    @property
    def transport(self) -> Any:
        return self.transports[-1]

    def close(self) -> None:
        for transport in reversed(self.transports):
            try:
                transport.close()
            except Exception:
                pass


def _open_transport(endpoint: Endpoint, sock: Any, options: SSHOptions) -> Any:
    import paramiko

    transport = paramiko.Transport(sock)
    transport.set_log_channel(f"{LOG_CHANNEL}.{endpoint.hostname}")
    security = transport.get_security_options()
    # AES-GCM first: an AEAD cipher needs no separate MAC, whose check paramiko does byte by byte in Python for
    # every packet; with one packet per log write that check is most of the client's CPU.
    aead = [name for name in security.ciphers if name.endswith("-gcm@openssh.com")]
    security.ciphers = aead + [name for name in security.ciphers if name not in aead]
    known = _host_keys(options, endpoint).lookup(endpoint.host_id)
    if known:
        # Ask for a key type we already hold for this host, so that a known host is checked, not re-asked.
        security = transport.get_security_options()
        preferred = [name for name in security.key_types if name in known or
                     (name.startswith("rsa-sha2") and "ssh-rsa" in known)]
        security.key_types = preferred + [name for name in security.key_types if name not in preferred]
    transport.banner_timeout = options.banner_timeout_s
    started = time.monotonic()
    try:
        try:
            transport.start_client(timeout=options.connect_timeout_s)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise _handshake_failure(endpoint, transport, exc, time.monotonic() - started, options) from None
        if not transport.is_active() or not transport.initial_kex_done:
            raise ConnectionFailed(
                f"{endpoint.hostname}:{endpoint.port} did not finish the SSH handshake within "
                f"{options.connect_timeout_s:g} s" + (f" (it says it is {safe_text(transport.remote_version)})"
                                                       if transport.remote_version else "")
            )
        verify_host_key(endpoint, transport.get_remote_server_key(), options)
        authenticate(transport, endpoint, options)
    except BaseException:
        transport.close()
        raise
    return transport


def _handshake_failure(endpoint: Endpoint, transport: Any, exc: BaseException, elapsed_s: float,
                       options: SSHOptions) -> ConnectionFailed:
    """The handshake failed: say whether anything SSH ever answered, in words, quoting the server safely."""
    where = f"{endpoint.hostname}:{endpoint.port}"
    text = str(exc)
    if not transport.remote_version:
        if text.startswith("Indecipherable protocol version"):
            said = text.partition('"')[2].rstrip('"')[:120]
            return ConnectionFailed(f"{where} is not an SSH server: it answered {safe_text(repr(said))} instead of "
                                    "an SSH banner")
        if elapsed_s >= options.banner_timeout_s * 0.9:
            return ConnectionFailed(f"{where} accepted the connection but sent no SSH banner within "
                                    f"{options.banner_timeout_s:g} s: is an SSH server listening on that port?")
        return ConnectionFailed(f"{where} closed the connection without sending an SSH banner")
    return ConnectionFailed(f"SSH to {endpoint} failed: {safe_text(text or type(exc).__name__)}")


def connect(endpoint: Endpoint, options: SSHOptions) -> SSHChain:
    """Connect through every ProxyJump hop (each a direct-tcpip channel of the previous one)."""
    import paramiko

    hops = list(endpoint.jumps) + [endpoint]
    transports: list[Any] = []
    try:
        for index, hop in enumerate(hops):
            if index == 0:
                try:
                    sock: Any = socket.create_connection((hop.hostname, hop.port), timeout=options.connect_timeout_s)
                except (OSError, OverflowError, UnicodeError) as exc:
                    detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
                    raise ConnectionFailed(f"cannot reach {hop}: {safe_text(detail)}") from None
            else:
                try:
                    sock = transports[-1].open_channel(
                        "direct-tcpip", (hop.hostname, hop.port), ("127.0.0.1", 0),
                        timeout=options.connect_timeout_s,
                    )
                except (paramiko.SSHException, OSError) as exc:
                    raise ConnectionFailed(
                        f"jump host {hops[index - 1]} cannot reach {hop}: {safe_text(exc)}") from None
            try:
                transports.append(_open_transport(hop, sock, options))
            except (paramiko.SSHException, EOFError, OSError) as exc:
                raise ConnectionFailed(f"SSH to {hop} failed: {safe_text(exc) or type(exc).__name__}") from None
    except BaseException:
        for transport in reversed(transports):
            transport.close()
        raise
    return SSHChain(transports)
