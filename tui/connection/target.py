"""HOST as the operator writes it: ``local``, an ssh-config alias, or ``user@host[:port]``; resolved through
``~/.ssh/config`` (HostName, User, Port, IdentityFile, ProxyJump)."""

from __future__ import annotations

import getpass
import os
import re
from dataclasses import dataclass, field

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

    @property
    def host_id(self) -> str:
        """The name this host has in known_hosts (OpenSSH's form)."""
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
    return paramiko.SSHConfig.from_path(full)


def resolve(spec: str, config_path: str | None = DEFAULT_SSH_CONFIG, _depth: int = 0) -> Endpoint:
    """Parse spec and apply the matching ~/.ssh/config entries. Values written in the spec win over the config."""
    match = _SPEC.match(spec.strip())
    if not match:
        raise ValueError(f"{spec!r} is not a host: use an ssh-config alias, user@host[:port], or 'local'")
    if _depth > 8:
        raise ValueError(f"ProxyJump chain for {spec!r} is too long (a loop in ~/.ssh/config?)")
    alias = match["host"].strip("[]")
    config = _load_config(config_path).lookup(alias)
    hostname = config.get("hostname", alias)
    user = match["user"] or config.get("user") or getpass.getuser()
    port = int(match["port"] or config.get("port") or 22)
    identity = tuple(os.path.expanduser(path) for path in config.get("identityfile", []))
    jumps: tuple[Endpoint, ...] = ()
    proxy_jump = config.get("proxyjump")
    if proxy_jump and proxy_jump.lower() != "none":
        hops = []
        for hop in proxy_jump.split(","):
            hop = hop.strip()
            if hop.startswith("ssh://"):
                hop = hop[len("ssh://") :]
            resolved = resolve(hop, config_path, _depth + 1)
            # A hop's own ProxyJump comes before the hop itself.
            hops.extend(resolved.jumps)
            hops.append(Endpoint(resolved.alias, resolved.hostname, resolved.port, resolved.user,
                                 resolved.identity_files))
        jumps = tuple(hops)
    return Endpoint(alias, hostname, port, user, identity, jumps)
