"""ssh-config options eaglewatch does not apply are named, one warning line each, never dropped silently.

``target.SSH_CONFIG_OPTIONS`` is the table: applied, harmless (one line for all of them), not applied on purpose
(StrictHostKeyChecking), not supported (ProxyCommand, Include, forwards …, and anything the table does not know).
The warnings are printed once per host by every command (``_common.resolve_host``); a connection that fails where
the config has a ProxyCommand says so in its error line too.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from agent_support import run_root  # noqa: F401  (run_root: fixture)
from sshd import Sshd, sshd_server  # noqa: F401  (sshd_server: fixture)

from eaglewatch.tui.commands import _common
from eaglewatch.tui.connection.target import SSH_CONFIG_OPTIONS, USED, config_warnings, resolve

CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")

# (options in gpu1's entry, the warning lines wanted: pieces each line holds, in order)
ROWS = [
    ("ProxyCommand ssh -W %h:%p bastion",
     [["host gpu1: CONFIG option ProxyCommand is not supported by eaglewatch; connecting without it",
       "ProxyJump BASTION"]]),
    ("LocalForward 8080 localhost:80\nLocalForward 8081 localhost:81",
     [["option LocalForward is not supported", "no port is forwarded"]]),
    ("CertificateFile ~/.ssh/id-cert.pub", [["option CertificateFile is not supported", "certificates"]]),
    ("RemoteCommand tmux", [["option RemoteCommand is not supported"]]),
    ("IdentityAgent /tmp/agent.sock", [["option IdentityAgent is not supported", "SSH_AUTH_SOCK"]]),
    ("KexAlgorithms curve25519-sha256", [["host gpu1: CONFIG option KexAlgorithms is not supported by eaglewatch; "
                                          "connecting without it"]]),
    ("StrictHostKeyChecking accept-new",
     [["option StrictHostKeyChecking is not applied by eaglewatch", "refused until you accept it"]]),
    ("ServerAliveInterval 30\nControlMaster auto\nCompression yes",
     [["host gpu1: CONFIG options ServerAliveInterval, ControlMaster, Compression are not applied"]]),
    ("ProxyCommand nc %h %p\nServerAliveInterval 30",
     [["option ProxyCommand is not supported"], ["options ServerAliveInterval are not applied"]]),
    ("HostName 10.1.2.3\nUser op\nPort 2222\nIdentityFile ~/.ssh/k\nHostKeyAlias gpu\nUserKnownHostsFile /k", []),
]


def _config(tmp_path: Path, entry: str, head: str = "") -> Path:
    path = tmp_path / "ssh_config"
    body = "\n".join("  " + line for line in entry.splitlines())
    path.write_text(f"{head}Host gpu1\n{body}\n\nHost bastion\n  HostName 10.0.0.9\n")
    return path


@pytest.mark.parametrize("entry,wanted", ROWS, ids=[row[0].split()[0] for row in ROWS])
def test_each_option_not_applied_is_one_warning_line(entry: str, wanted: list[list[str]], tmp_path: Path) -> None:
    config = _config(tmp_path, entry)
    lines = config_warnings(resolve("gpu1", str(config)), "gpu1", str(config))
    assert len(lines) == len(wanted), lines
    for line, pieces in zip(lines, wanted):
        assert "\n" not in line
        for piece in pieces:
            assert piece.replace("CONFIG", str(config)) in line, (piece, line)


def test_include_match_and_proxyjump_hops(tmp_path: Path) -> None:
    # Include is not read (its options would be missing); Match is (paramiko applies it); a hop's own options are
    # named with the hop, an option both set is one line naming both.
    config = tmp_path / "ssh_config"
    config.write_text("Include ~/.ssh/more.conf\n"
                      "Host gpu2\n  ProxyJump bastion\n  LocalForward 1 a:1\n"
                      "Host bastion\n  HostName 10.0.0.9\n  ProxyCommand nc %h %p\n  LocalForward 2 b:2\n"
                      "Match host gpu2\n  User bob\n")
    endpoint = resolve("gpu2", str(config))
    assert endpoint.user == "bob" and [hop.alias for hop in endpoint.jumps] == ["bastion"]
    lines = config_warnings(endpoint, "gpu2", str(config))
    assert lines[0].startswith("host gpu2, bastion (ProxyJump hop): ") and "option Include is not supported" in \
        lines[0] and "not read" in lines[0]
    assert any(line.startswith("host gpu2, bastion (ProxyJump hop): ") and "option LocalForward" in line
               for line in lines), lines
    assert any(line.startswith("host bastion (ProxyJump hop): ") and "option ProxyCommand" in line
               for line in lines), lines
    assert len(lines) == 3, lines


def test_the_table_is_data_and_names_every_applied_option_once() -> None:
    names = [name.lower() for name, _, _ in SSH_CONFIG_OPTIONS]
    assert len(names) == len(set(names))
    assert {name for name, how, _ in SSH_CONFIG_OPTIONS if how == USED} == {
        "HostName", "User", "Port", "IdentityFile", "ProxyJump", "UserKnownHostsFile", "GlobalKnownHostsFile",
        "HostKeyAlias"}


def _args(config: Path, host: str) -> argparse.Namespace:
    return argparse.Namespace(host=host, config=None, python=None, run_root=None, ssh_config=str(config),
                              known_hosts=None, identity=[], no_ssh_agent=True)


def test_every_command_warns_once_per_host(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EAGLEWATCH_CONFIG", "")
    monkeypatch.setattr(_common, "_SSH_CONFIG_WARNED", set())
    config = _config(tmp_path, "ProxyCommand nc %h %p")
    for _ in range(3):
        _common.resolve_host(_args(config, "gpu1"))
    _common.resolve_host(_args(config, "local"))
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("eaglewatch: host gpu1: ") and "ProxyCommand" in err[0], err


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _cli(*words: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HOME": str(home), "EAGLEWATCH_CONFIG": ""}
    return subprocess.run([sys.executable, "-m", "eaglewatch", *words], capture_output=True, text=True, timeout=120,
                          env=env)


def test_a_host_reached_only_through_its_proxycommand_fails_saying_so(tmp_path: Path) -> None:
    config = _config(tmp_path, f"HostName 127.0.0.1\nPort {_closed_port()}\nProxyCommand ssh -W %h:%p bastion")
    proc = _cli("runs", "gpu1", "--ssh-config", str(config), "--no-ssh-agent", home=tmp_path)
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2, proc.stderr
    assert lines[0].startswith("eaglewatch: host gpu1: ") and "option ProxyCommand is not supported" in lines[0]
    assert lines[-1].startswith("eaglewatch runs: error: ") and "ProxyCommand" in lines[-1] \
        and "use ProxyJump" in lines[-1] and "Traceback" not in proc.stderr
    assert len(lines) == 2 and not CONTROL.search(proc.stderr), proc.stderr


@pytest.mark.ssh
def test_a_host_reachable_without_them_connects_and_says_what_was_left_out(sshd_server: Sshd, run_root: Path,
                                                                          tmp_path: Path) -> None:
    config = tmp_path / "ssh_config"
    config.write_text(sshd_server.ssh_config.read_text().replace(
        "Host testhost\n", "Host testhost\n  ProxyCommand nc %h %p\n  LocalForward 8080 localhost:80\n"
                           "  ServerAliveInterval 15\n"))
    proc = _cli("runs", "testhost", "--ssh-config", str(config), "--known-hosts", str(sshd_server.known_hosts),
                "--no-ssh-agent", "--run-root", str(run_root), "--json", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    warned = [line for line in proc.stderr.splitlines() if line.startswith("eaglewatch: host testhost: ")]
    assert len(warned) == 3 and "ProxyCommand is not supported" in warned[0] and "connecting without it" in warned[0]
    assert "LocalForward" in warned[1] and "ServerAliveInterval" in warned[2], proc.stderr
