"""HOST as the operator writes it: ``local``, an ssh-config alias, or ``user@host[:port]``; resolved through
``~/.ssh/config`` (HostName, User, Port, IdentityFile, ProxyJump, UserKnownHostsFile, GlobalKnownHostsFile,
HostKeyAlias).

StrictHostKeyChecking is not read, on purpose: an unknown host key is refused until the operator accepts it,
whatever the config says (``no`` and ``accept-new`` would trust a first contact blindly)."""

from __future__ import annotations

import getpass
import os
import re
from dataclasses import dataclass, field, replace

LOCAL = "local"
DEFAULT_SSH_CONFIG = "~/.ssh/config"

_SPEC = re.compile(r"^(?:(?P<user>[^@\s]+)@)?(?P<host>\[[^\]]+\]|[^:\s@]+)(?::(?P<port>\d+))?$")


@dataclass(frozen=True)
class Endpoint:
    """One SSH hop: where to connect and as whom. ``jumps`` are the ProxyJump hops, outermost first."""

    alias: str
    hostname: str
    port: int
    user: str
    identity_files: tuple[str, ...] = ()
    jumps: tuple["Endpoint", ...] = field(default=())
    # From the ssh config: UserKnownHostsFile then GlobalKnownHostsFile (empty when it sets neither), HostKeyAlias.
    known_hosts: tuple[str, ...] = ()
    host_key_alias: str | None = None

    @property
    def host_id(self) -> str:
        """The name this host has in known_hosts (OpenSSH's form; HostKeyAlias replaces it, port included)."""
        if self.host_key_alias:
            return self.host_key_alias
        return self.hostname if self.port == 22 else f"[{self.hostname}]:{self.port}"

    def __str__(self) -> str:
        return f"{self.user}@{self.hostname}:{self.port}"


def is_local(spec: str) -> bool:
    return spec == LOCAL


def _load_config(path: str | None):
    import paramiko

    if path is None:
        return paramiko.SSHConfig()
    full = os.path.expanduser(path)
    if not os.path.exists(full):
        return paramiko.SSHConfig()
    try:
        return paramiko.SSHConfig.from_path(full)
    except (OSError, UnicodeDecodeError, paramiko.SSHException) as exc:
        raise ValueError(f"cannot read the ssh config {full}: {exc}") from None


def _port(value: object, where: str) -> int:
    try:
        port = int(str(value))
    except ValueError:
        raise ValueError(f"{where}: the port {value!r} is not a number") from None
    if not 1 <= port <= 65535:
        raise ValueError(f"{where}: the port {port} is not between 1 and 65535")
    return port


def resolve(spec: str, config_path: str | None = DEFAULT_SSH_CONFIG, _depth: int = 0) -> Endpoint:
    """Parse spec and apply the matching ~/.ssh/config entries. Values written in the spec win over the config."""
    printable = not any(ord(char) < 32 or 127 <= ord(char) < 160 for char in spec)
    match = _SPEC.match(spec.strip()) if len(spec) <= 1024 and printable else None
    if not match:
        shown = spec if len(spec) <= 80 else spec[:77] + "..."
        raise ValueError(f"{shown!r} is not a host: use an ssh-config alias, user@host[:port], or 'local'")
    if _depth > 8:
        raise ValueError(f"ProxyJump chain for {spec!r} is too long (a loop in ~/.ssh/config?)")
    alias = match["host"].strip("[]")
    if not alias or alias.startswith("-"):
        raise ValueError(f"{spec!r} is not a host: use an ssh-config alias, user@host[:port], or 'local'")
    ssh_config = _load_config(config_path)
    try:
        config = ssh_config.lookup(alias)
    except Exception as exc:  # paramiko's Match and token expansion fail in many ways on odd configs
        raise ValueError(f"the ssh config {config_path} cannot be applied to {alias!r}: {exc}") from None
    hostname = config.get("hostname", alias)
    user = match["user"] or config.get("user") or getpass.getuser()
    where = repr(spec) if match["port"] else f"the ssh config for {alias!r}"
    port = _port(match["port"] or config.get("port") or 22, where)
    identity = tuple(os.path.expanduser(path) for path in config.get("identityfile", []))
    known_hosts = _known_hosts_files(config)
    jumps: tuple[Endpoint, ...] = ()
    proxy_jump = config.get("proxyjump")
    if proxy_jump and proxy_jump.lower() != "none":
        hops: list[Endpoint] = []
        for hop in proxy_jump.split(","):
            hop = hop.strip()
            if hop.startswith("ssh://"):
                hop = hop[len("ssh://") :]
            resolved = resolve(hop, config_path, _depth + 1)
            # A hop's own ProxyJump comes before the hop itself.
            hops.extend(resolved.jumps)
            hops.append(replace(resolved, jumps=()))
        jumps = tuple(hops)
    return Endpoint(alias, hostname, port, user, identity, jumps, known_hosts, config.get("hostkeyalias"))


def _known_hosts_files(config: dict) -> tuple[str, ...]:
    """The files the config names for this host's keys, user files first (where an accepted key is written)."""
    user, system = config.get("userknownhostsfile"), config.get("globalknownhostsfile")
    if not user and not system:
        return ()
    user_files = user.split() if user else ["~/.ssh/known_hosts"]
    system_files = system.split() if system else ["/etc/ssh/ssh_known_hosts"]
    return tuple(user_files + system_files)
