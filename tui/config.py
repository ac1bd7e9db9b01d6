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

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from eaglewatch.errors import UserError

CONFIG_ENV = "EAGLEWATCH_CONFIG"
DEFAULT_CONFIG = "~/.config/eaglewatch/config.toml"


@dataclass(frozen=True)
class HostEntry:
    name: str
    target: str
    run_root: Optional[str] = None
    python: Optional[str] = None


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


def _strings(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise UserError(f"{where}: argv must be a non-empty list of strings")
    return list(value)


def parse(text: str, path: Optional[Path] = None) -> Config:
    where = str(path or "config")
    try:
        data = _loads(text)
    except UserError:
        raise
    except Exception as exc:
        raise UserError(f"{where}: {exc}") from None
    dashboard = data.get("dashboard") or {}
    hosts = {}
    for name, entry in (data.get("hosts") or {}).items():
        if not isinstance(entry, dict) or not isinstance(entry.get("target", name), str):
            raise UserError(f"{where}: [hosts.{name}] needs target = \"user@host[:port]\" or an ssh alias")
        for key in ("run_root", "python"):
            if not isinstance(entry.get(key, ""), str):
                raise UserError(f"{where}: [hosts.{name}] {key} must be a string")
        hosts[name] = HostEntry(name, entry.get("target", name), entry.get("run_root"), entry.get("python"))
    profiles = {}
    for name, entry in (data.get("profiles") or {}).items():
        if not isinstance(entry, dict):
            raise UserError(f"{where}: [profiles.{name}] must be a table")
        env = entry.get("env") or {}
        if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
            raise UserError(f"{where}: [profiles.{name}] env values must be strings")
        profiles[name] = Profile(name, _strings(entry.get("argv"), f"[profiles.{name}]"), entry.get("host"),
                                 entry.get("name"), entry.get("cwd"), dict(env))
    try:
        stall = float(dashboard.get("stall_after_min", 5)) * 60
        low_disk = int(float(dashboard.get("low_disk_gb", 2)) * 1024**3)
    except (TypeError, ValueError):
        raise UserError(f"{where}: [dashboard] stall_after_min and low_disk_gb are numbers") from None
    return Config(path, hosts, profiles, stall, low_disk)


def load(path: Optional[str] = None) -> Config:
    """The config at ``path``, ``$EAGLEWATCH_CONFIG`` or the default place; an empty one if there is none."""
    explicit = path or os.environ.get(CONFIG_ENV)
    target = Path(os.path.expanduser(explicit or DEFAULT_CONFIG))
    if not target.exists():
        if explicit:
            raise UserError(f"no config file at {target}")
        return Config()
    return parse(target.read_text(encoding="utf-8"), target)
