"""HOST as the operator writes it: ``local``, an ssh-config alias, or ``user@host[:port]``; resolved through
``~/.ssh/config`` (HostName, User, Port, IdentityFile, ProxyJump, UserKnownHostsFile, GlobalKnownHostsFile,
HostKeyAlias).

StrictHostKeyChecking is not read, on purpose: an unknown host key is refused until the operator accepts it,
whatever the config says (``no`` and ``accept-new`` would trust a first contact blindly). Every option a host's entry
sets that is not applied is named in a warning (``SSH_CONFIG_OPTIONS``, ``config_warnings``), never dropped silently."""

from __future__ import annotations

import getpass
import os
import re
from dataclasses import dataclass, field, replace

LOCAL = "local"
DEFAULT_SSH_CONFIG = "~/.ssh/config"

# How eaglewatch treats the ssh-config options of a host's entry: (OpenSSH's name, how, why). USED: applied.
# HARMLESS: not applied, and changing nothing of where eaglewatch connects or how it logs in (its own keepalive,
# its own connection reuse): named together in one line. NOT_APPLIED: not applied on purpose, said with why.
# Any other option, listed here or not, is not supported: named in a line of its own, "connecting without it".
USED, HARMLESS, NOT_APPLIED, UNSUPPORTED = "used", "harmless", "not applied", "unsupported"
SSH_CONFIG_OPTIONS: tuple[tuple[str, str, str], ...] = (
    ("HostName", USED, ""),
    ("User", USED, ""),
    ("Port", USED, ""),
    ("IdentityFile", USED, ""),
    ("ProxyJump", USED, ""),
    ("UserKnownHostsFile", USED, ""),
    ("GlobalKnownHostsFile", USED, ""),
    ("HostKeyAlias", USED, ""),
    ("StrictHostKeyChecking", NOT_APPLIED, "an unknown host key is refused until you accept it (--accept-host-key)"),
    ("ProxyCommand", UNSUPPORTED, "if the host is reached only through it, write ProxyJump BASTION instead of "
                                  "ProxyCommand ssh -W %h:%p BASTION"),
    ("Include", UNSUPPORTED, "the options in the files it names are not read"),
    ("CertificateFile", UNSUPPORTED, "keys are offered without their certificates"),
    ("IdentityAgent", UNSUPPORTED, "the ssh-agent of $SSH_AUTH_SOCK is asked"),
    ("LocalForward", UNSUPPORTED, "no port is forwarded"),
    ("RemoteForward", UNSUPPORTED, "no port is forwarded"),
    ("DynamicForward", UNSUPPORTED, "no port is forwarded"),
    ("RemoteCommand", UNSUPPORTED, "eaglewatch runs its own agent"),
    ("ServerAliveInterval", HARMLESS, ""),
    ("ServerAliveCountMax", HARMLESS, ""),
    ("TCPKeepAlive", HARMLESS, ""),
    ("ConnectTimeout", HARMLESS, ""),
    ("Compression", HARMLESS, ""),
    ("ControlMaster", HARMLESS, ""),
    ("ControlPath", HARMLESS, ""),
    ("ControlPersist", HARMLESS, ""),
    ("LogLevel", HARMLESS, ""),
    ("VisualHostKey", HARMLESS, ""),
    ("HashKnownHosts", HARMLESS, ""),
    ("UpdateHostKeys", HARMLESS, ""),
    ("AddKeysToAgent", HARMLESS, ""),
    ("UseKeychain", HARMLESS, ""),
    ("IgnoreUnknown", HARMLESS, ""),
    ("ForwardX11", HARMLESS, ""),
    ("ForwardX11Trusted", HARMLESS, ""),
)
# paramiko's lookup gives the options lower-cased.
_OPTIONS = {name.lower(): (name, how, why) for name, how, why in SSH_CONFIG_OPTIONS}

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
    # The options of this host's ssh-config entry that are not applied, named as the file writes them, in its order.
    not_applied: tuple[str, ...] = ()

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
    written = _names_as_written(config_path)
    not_applied = tuple(written.get(key, key) for key in config if _OPTIONS.get(key, ("", UNSUPPORTED, ""))[1] != USED)
    return Endpoint(alias, hostname, port, user, identity, jumps, known_hosts, config.get("hostkeyalias"),
                    not_applied)


def _names_as_written(config_path: str | None) -> dict[str, str]:
    """Option names as the config file writes them, by their lower-case form (paramiko lower-cases them): a warning
    names the option the operator wrote."""
    try:
        with open(os.path.expanduser(config_path or ""), encoding="utf-8", errors="replace") as fh:
            words = [line.strip().replace("=", " ").split(None, 1) for line in fh]
    except OSError:
        return {}
    return {word[0].lower(): word[0] for word in words if word and not word[0].startswith("#")}


def config_warnings(endpoint: Endpoint, host: str, config_path: str | None = DEFAULT_SSH_CONFIG) -> list[str]:
    """One line for each option of the host's ssh-config entries (its ProxyJump hops' too) that eaglewatch does not
    support or does not apply, and one for all the harmless ones. Lines hold text from the config: show them through
    safe_text."""
    hosts: dict[str, list[str]] = {}  # option (lower-case) -> the hosts whose entry sets it, in order
    written = {name.lower(): name for hop in (endpoint, *endpoint.jumps) for name in hop.not_applied}
    for hop, label in [(endpoint, host), *((jump, f"{jump.alias} (ProxyJump hop)") for jump in endpoint.jumps)]:
        for key in (name.lower() for name in hop.not_applied):
            hosts.setdefault(key, [])
            if label not in hosts[key]:
                hosts[key].append(label)
    lines, harmless = [], []
    where = config_path or DEFAULT_SSH_CONFIG
    for key, labels in hosts.items():
        name, how, why = _OPTIONS.get(key, (written[key], UNSUPPORTED, ""))
        prefix = f"host {', '.join(labels)}: {where} option {name}"
        if how == HARMLESS:
            harmless.append(name)
        elif how == NOT_APPLIED:
            lines.append(f"{prefix} is not applied by eaglewatch: {why}")
        else:
            note = f" ({why})" if why else ""
            lines.append(f"{prefix} is not supported by eaglewatch; connecting without it{note}")
    if harmless:
        lines.append(f"host {host}: {where} options {', '.join(harmless)} are not applied by eaglewatch (they change "
                     "nothing of where it connects or how it logs in)")
    return lines


def _known_hosts_files(config: dict) -> tuple[str, ...]:
    """The files the config names for this host's keys, user files first (where an accepted key is written)."""
    user, system = config.get("userknownhostsfile"), config.get("globalknownhostsfile")
    if not user and not system:
        return ()
    user_files = user.split() if user else ["~/.ssh/known_hosts"]
    system_files = system.split() if system else ["/etc/ssh/ssh_known_hosts"]
    return tuple(user_files + system_files)
