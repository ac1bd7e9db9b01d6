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


@dataclass(frozen=True)
class Profile:
    name: str
    argv: list[str]
    host: Optional[str] = None
    run_name: Optional[str] = None
    cwd: Optional[str] = None
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Config:
    path: Optional[Path] = None
    hosts: dict[str, HostEntry] = field(default_factory=dict)
    profiles: dict[str, Profile] = field(default_factory=dict)
    stall_after_s: float = 300.0
    low_disk_bytes: int = 2 * 1024**3

    def host(self, name: str) -> HostEntry:
        """The entry called ``name``, or ``name`` itself as a target (an ssh alias, user@host:port, local)."""
        return self.hosts.get(name) or HostEntry(name, name)


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
    "": ("dashboard", "hosts", "profiles"),
    "dashboard": ("stall_after_min", "low_disk_gb"),
    "hosts": ("target", "run_root", "python", "agent_env"),
    "profiles": ("host", "name", "cwd", "argv", "env"),
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
                                _environment(check, section, "agent_env", entry.get("agent_env", {})))
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
                                 check.text(entry, section, "cwd"), dict(env))
    return Config(path, hosts, profiles, stall_min * 60, int(low_disk_gb * 1024**3))


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
