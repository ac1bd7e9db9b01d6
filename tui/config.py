"""The operator's config file (TOML): named hosts, saved launch profiles, the dashboard's alert thresholds.

Every command that takes a HOST reads its named hosts (``eaglewatch.tui.commands._common.resolve_host``); the
profiles and thresholds are the dashboard's. Reading and parsing only: nothing here connects anywhere.

``~/.config/eaglewatch/config.toml`` (or ``$EAGLEWATCH_CONFIG``, or ``--config``)::

    [dashboard]
    stall_after_min = 5          # no progress for this long while loading or extracting: alert
    low_disk_gb = 2              # less free space than this on the output disk: alert

    [hosts.h200]
    target = "ubuntu@10.0.0.7:22"   # or an ~/.ssh/config alias
    run_root = "/data/eaglewatch/runs"
    python = "/opt/venv/bin/python"

    [alerts]                     # sent from the host by the run's supervisor, with no dashboard open
    webhook = "https://ntfy.sh/my-topic"   # and/or command = ["/usr/local/bin/page-me"]
    format = "ntfy"              # json (default), ntfy or slack

    [profiles.kimi-extract]
    host = "h200"
    name = "kimi-k2.5"
    cwd = "/data"
    argv = ["eaglewatch", "extract", "--model-path", "/shared/kimi-k2.5", "--tp-size", "8"]
    env = { VLLM_LOGGING_LEVEL = "INFO" }
"""

from __future__ import annotations

import math
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from eaglewatch.errors import UserError
from eaglewatch.safetext import safe_text

CONFIG_ENV = "EAGLEWATCH_CONFIG"
DEFAULT_CONFIG = "~/.config/eaglewatch/config.toml"


@dataclass(frozen=True)
class HostEntry:
    name: str
    target: str
    run_root: Optional[str] = None
    python: Optional[str] = None
    # The agent's environment on the host: what sbatch, squeue and the jobs it starts see (SLURM_CONF, a PATH with
    # Slurm's commands), where a non-interactive SSH session does not set it.
    agent_env: dict[str, str] = field(default_factory=dict)
    alerts: Optional["Alerts"] = None  # this host's runs alert here (else the file's [alerts])


@dataclass(frozen=True)
class Alerts:
    """Where a run's alerts go (docs/dashboard.md, "Alerts off the terminal"): a command and/or a webhook."""

    command: tuple[str, ...] = ()
    webhook: Optional[str] = None
    format: str = "json"

    def record(self, stall_after_s: float, low_disk_bytes: int) -> dict[str, Any]:
        """What the launch request carries to the agent, which keeps it in the run directory for the supervisor."""
        out: dict[str, Any] = {"format": self.format, "stall_after_s": stall_after_s,
                               "low_disk_bytes": low_disk_bytes}
        if self.command:
            out["command"] = list(self.command)
        if self.webhook:
            out["webhook"] = self.webhook
        return out


ALERT_FORMATS = ("json", "ntfy", "slack")


@dataclass(frozen=True)
class Profile:
    name: str
    argv: list[str]
    host: Optional[str] = None
    run_name: Optional[str] = None
    cwd: Optional[str] = None
    env: dict[str, str] = field(default_factory=dict)
    alerts: Optional[Alerts] = None


@dataclass(frozen=True)
class Config:
    path: Optional[Path] = None
    hosts: dict[str, HostEntry] = field(default_factory=dict)
    profiles: dict[str, Profile] = field(default_factory=dict)
    stall_after_s: float = 300.0
    low_disk_bytes: int = 2 * 1024**3
    alerts: Optional[Alerts] = None  # the file's [alerts]: every run launched with it, unless a host says otherwise

    def host(self, name: str) -> HostEntry:
        """The entry called ``name``, or ``name`` itself as a target (an ssh alias, user@host:port, local)."""
        return self.hosts.get(name) or HostEntry(name, name)

    def alerts_for(self, host: str, profile: Optional[Profile] = None) -> Optional[dict[str, Any]]:
        """The alert settings a launch on ``host`` (from ``profile``) carries: the profile's, else the host's, else
        the file's; None when none is set."""
        chosen = (profile.alerts if profile is not None else None) or self.host(host).alerts or self.alerts
        return chosen.record(self.stall_after_s, self.low_disk_bytes) if chosen is not None else None


def _loads(text: str) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:
        try:
            import tomli as tomllib  # type: ignore[import-not-found]
        except ImportError:
            raise UserError("reading the config file needs Python >= 3.11 or the tomli package") from None
    return tomllib.loads(text)


_HEADER = re.compile(r"^\s*\[\[?\s*(?P<name>[^\]]*?)\s*\]\]?\s*(?:#.*)?$")
_KNOWN = {
    "": ("dashboard", "hosts", "profiles", "alerts"),
    "dashboard": ("stall_after_min", "low_disk_gb"),
    "hosts": ("target", "run_root", "python", "agent_env", "alerts"),
    "profiles": ("host", "name", "cwd", "argv", "env", "alerts"),
    "alerts": ("command", "webhook", "format"),
}


def _section_parts(header: str) -> tuple[str, ...]:
    return tuple(part.strip().strip("\"'") for part in header.split("."))


class _Checker:
    """Reports a bad value as one line: the file, the line where the key is written (when it can be found), the
    table and key, what was found and what is wanted."""

    def __init__(self, text: str, path: Optional[Path]) -> None:
        self.lines = text.splitlines()
        self.where = str(path) if path else "config"

    def line_of(self, section: tuple[str, ...], key: Optional[str]) -> Optional[int]:
        current: tuple[str, ...] = ()
        for number, line in enumerate(self.lines, 1):
            header = _HEADER.match(line)
            if header:
                current = _section_parts(header["name"])
                if key is None and current == section:
                    return number
                continue
            if key is not None and current == section and re.match(rf"^\s*[\"']?{re.escape(key)}[\"']?\s*=", line):
                return number
        return None

    def fail(self, section: tuple[str, ...], key: Optional[str], problem: str, value: Optional[str] = None
             ) -> UserError:
        line = self.line_of(section, key)
        place = f"{self.where}:{line}" if line else self.where
        table = f"[{'.'.join(section)}]" if section else "top level"
        what = f"{table} {key}" if key else table
        if value is not None:
            what += f" = {value}"
        return UserError(safe_text(f"{place}: {what}: {problem}"))

    def table(self, value: Any, section: tuple[str, ...], key: Optional[str] = None) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(section, key, f"must be a table, not {_shown(value)}")
        return value

    def only_known(self, entry: dict[str, Any], section: tuple[str, ...], kind: str) -> None:
        known = _KNOWN[kind]
        for key in entry:
            if key not in known:
                raise self.fail(section, key, f"unknown key (known here: {', '.join(known)})")

    def number(self, entry: dict[str, Any], section: tuple[str, ...], key: str, default: float, *,
               minimum: float, above: bool, meaning: str) -> float:
        value = entry.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.fail(section, key, f"must be a finite number ({meaning})", _shown(value))
        if value < minimum or (above and value == minimum):
            bound = f"more than {minimum:g}" if above else f"{minimum:g} or more"
            raise self.fail(section, key, f"must be {bound} ({meaning})", f"{value:g}")
        return float(value)

    def text(self, entry: dict[str, Any], section: tuple[str, ...], key: str, *, one_word: bool = False
             ) -> Optional[str]:
        value = entry.get(key)
        if value is None:
            return None
        if not isinstance(value, str) or not value.strip():
            raise self.fail(section, key, f"must be a non-empty string, not {_shown(value)}")
        if any(ord(char) < 32 or ord(char) == 127 for char in value):
            raise self.fail(section, key, f"must not hold control characters: {_shown(value)}")
        if one_word and any(char.isspace() for char in value):
            raise self.fail(section, key, f"must not hold spaces: {_shown(value)}")
        return value


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def parse(text: str, path: Optional[Path] = None) -> Config:
    """The config file's text, checked: every table and value that is not what it should be is a UserError that
    names the file, the line (where it can be found), the table and the key."""
    where = str(path or "config")
    try:
        data = _loads(text)
    except UserError:
        raise
    except Exception as exc:
        raise UserError(safe_text(f"{where}: {exc}")) from None
    check = _Checker(text, path)
    check.only_known(data, (), "")
    dashboard = check.table(data.get("dashboard", {}), ("dashboard",))
    check.only_known(dashboard, ("dashboard",), "dashboard")
    stall_min = check.number(dashboard, ("dashboard",), "stall_after_min", 5, minimum=0, above=True,
                             meaning="minutes without progress before the stall alert")
    low_disk_gb = check.number(dashboard, ("dashboard",), "low_disk_gb", 2, minimum=0, above=False,
                               meaning="GiB of free space under which to alert")
    hosts = {}
    for name, value in check.table(data.get("hosts", {}), ("hosts",)).items():
        section = ("hosts", name)
        entry = check.table(value, section)
        check.only_known(entry, section, "hosts")
        if not name.strip():
            raise check.fail(section, None, "a named host needs a name")
        target = check.text(entry, section, "target", one_word=True) or name
        hosts[name] = HostEntry(name, target, check.text(entry, section, "run_root"),
                                check.text(entry, section, "python"),
                                _environment(check, section, "agent_env", entry.get("agent_env", {})),
                                _alerts(check, section + ("alerts",), entry.get("alerts")))
    profiles = {}
    for name, value in check.table(data.get("profiles", {}), ("profiles",)).items():
        section = ("profiles", name)
        entry = check.table(value, section)
        check.only_known(entry, section, "profiles")
        argv = entry.get("argv")
        if not isinstance(argv, list) or not argv or not all(isinstance(word, str) for word in argv) or not argv[0]:
            raise check.fail(section, "argv", "must be a non-empty list of strings, the command first")
        if any("\0" in word for word in argv):
            raise check.fail(section, "argv", "must not hold a NUL character")
        env = _environment(check, section, "env", entry.get("env", {}))
        host = check.text(entry, section, "host", one_word=True)
        profiles[name] = Profile(name, list(argv), host, check.text(entry, section, "name"),
                                 check.text(entry, section, "cwd"), dict(env),
                                 _alerts(check, section + ("alerts",), entry.get("alerts")))
    return Config(path, hosts, profiles, stall_min * 60, int(low_disk_gb * 1024**3),
                  _alerts(check, ("alerts",), data.get("alerts")))


def _alerts(check: "_Checker", section: tuple[str, ...], value: Any) -> Optional[Alerts]:
    """An alerts table: ``command`` (a list of strings, the program first), ``webhook`` (an http(s) URL) and
    ``format``; at least one of the first two."""
    if value is None:
        return None
    entry = check.table(value, section[:-1], section[-1]) if len(section) > 1 else check.table(value, section)
    check.only_known(entry, section, "alerts")
    command = entry.get("command")
    if command is not None and (not isinstance(command, list) or not command or not all(
            isinstance(word, str) and word and "\0" not in word for word in command)):
        raise check.fail(section, "command", "must be a non-empty list of strings, the program first")
    webhook = check.text(entry, section, "webhook", one_word=True)
    if webhook is not None and not re.match(r"^https?://[^/\s?#]+", webhook):
        raise check.fail(section, "webhook", "must be an http:// or https:// URL")
    fmt = entry.get("format", "json")
    if fmt not in ALERT_FORMATS:
        raise check.fail(section, "format", f"must be one of {', '.join(ALERT_FORMATS)}", _shown(fmt))
    if not command and webhook is None:
        raise check.fail(section, None, "needs a command or a webhook (or both)")
    return Alerts(tuple(command or ()), webhook, fmt)


def _environment(check: "_Checker", section: tuple[str, ...], key: str, value: Any) -> dict[str, str]:
    """An environment table: names (no '=', no NUL) to strings."""
    env = check.table(value, section, key)
    for name, val in env.items():
        if not name or "=" in name or "\0" in name or not isinstance(val, str) or "\0" in val:
            raise check.fail(section, key, f"must map names (no '=') to strings: {_shown(name)} = {_shown(val)}")
    return dict(env)


def load(path: Optional[str] = None) -> Config:
    """The config at ``path``, ``$EAGLEWATCH_CONFIG`` or the default place; an empty one if there is none."""
    explicit = path or os.environ.get(CONFIG_ENV)
    target = Path(os.path.expanduser(explicit or DEFAULT_CONFIG))
    if not target.exists():
        if explicit:
            raise UserError(safe_text(f"no config file at {target}"))
        return Config()
    try:
        text = target.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(safe_text(f"cannot read the config file {target}: {exc}")) from None
    return parse(text, target)
