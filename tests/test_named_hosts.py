"""A named host of the config file is a HOST for every command: runs, attach, stop, restart, launch, the dashboard.

The commands run as the operator runs them (subprocesses of the real CLI), against the real local agent through a
named host whose target is `local`, and once over the real test sshd, where the named host's `python` matters.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from agent_support import PYTHON, run_root, wait_for  # noqa: F401  (run_root: fixture)
from conftest import run_cli
from sshd import Sshd, sshd_server  # noqa: F401  (sshd_server: fixture)

from eaglewatch.tui.connection import Connection

TICKER = "import time\nfor i in range(100000):\n    print(f'tick {i}', flush=True)\n    time.sleep(0.05)\n"


@pytest.fixture
def named(tmp_path: Path, run_root: Path) -> Path:
    """A config file naming the local agent, with a run root of its own, as ``box``."""
    config = tmp_path / "config.toml"
    config.write_text(f'[hosts.box]\ntarget = "local"\nrun_root = "{run_root}"\n')
    return config


def cli(*words: object, home: Path) -> subprocess.CompletedProcess[str]:
    """The real CLI. HOME elsewhere and no $EAGLEWATCH_CONFIG: no config file of this machine's user takes part.
    $EAGLEWATCH_RUN_ROOT names another folder: a run found in the named host's run root was found through it."""
    env = {"HOME": str(home), "EAGLEWATCH_CONFIG": "", "EAGLEWATCH_RUN_ROOT": str(home / "not-the-run-root")}
    return run_cli(*words, env=env, timeout=120)


def ticking_run(run_root: Path) -> str:
    with Connection("local", run_root=str(run_root)) as connection:
        run = connection.launch([PYTHON, "-u", "-c", TICKER], name="ticker")["run"]
        wait_for(lambda: connection.status(run)["state"] == "running", what="the ticker running")
    return run


def test_launch_takes_a_named_host(named: Path, run_root: Path, tmp_path: Path) -> None:
    # --config between HOST and --, where launch's own options go.
    proc = cli("launch", "box", "--config", named, "--name", "hello", "--", PYTHON, "-c", "print('hello')",
               home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    run = proc.stdout.strip()
    assert (run_root / run / "cmd.json").exists() and "on box" in proc.stderr


def test_runs_takes_a_named_host(named: Path, run_root: Path, tmp_path: Path) -> None:
    run = ticking_run(run_root)
    proc = cli("runs", "box", "--config", named, "--json", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(line)["run"] for line in proc.stdout.splitlines()] == [run]


def test_attach_takes_a_named_host(named: Path, run_root: Path, tmp_path: Path) -> None:
    with Connection("local", run_root=str(run_root)) as connection:
        run = connection.launch([PYTHON, "-c", "print('done here'); raise SystemExit(3)"])["run"]
    proc = cli("attach", "box", run, "--config", named, home=tmp_path)
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout == "done here\n" and "exit code 3" in proc.stderr


def test_stop_takes_a_named_host(named: Path, run_root: Path, tmp_path: Path) -> None:
    run = ticking_run(run_root)
    proc = cli("stop", "box", run, "--config", named, "--grace", "2", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"{run}\tstopped by the operator (SIGTERM)\n"


def test_restart_takes_a_named_host(named: Path, run_root: Path, tmp_path: Path) -> None:
    run = ticking_run(run_root)
    proc = cli("restart", "box", run, "--config", named, "--grace", "2", "--gpu-timeout", "10", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    new = proc.stdout.strip()
    assert new != run and f"{run} stopped by the operator (SIGTERM); restarted as {new}" in proc.stderr
    with Connection("local", run_root=str(run_root)) as connection:
        assert connection.status(new)["restart_of"] == run
        connection.stop(new, grace_s=1)


def dashboard_args(*words: str) -> argparse.Namespace:
    from eaglewatch.tui.app import cli as dashboard

    parser = argparse.ArgumentParser()
    dashboard.add_arguments(parser)
    return parser.parse_args(list(words))


def test_the_dashboard_resolves_hosts_the_same_way(named: Path, run_root: Path, monkeypatch) -> None:
    from eaglewatch.tui.commands._common import resolve_host

    target = resolve_host(dashboard_args("box", "--config", str(named)))
    assert (target.name, target.spec, target.run_root) == ("box", "local", str(run_root))
    # The config file named by $EAGLEWATCH_CONFIG, as with --config.
    monkeypatch.setenv("EAGLEWATCH_CONFIG", str(named))
    assert resolve_host(dashboard_args("box")).spec == "local"
    # What the command line says wins over the named host's settings; a name not in the file is a target itself.
    assert resolve_host(dashboard_args("box", "--run-root", "/elsewhere")).run_root == "/elsewhere"
    other = resolve_host(dashboard_args("user@gpu-box:2222"))
    assert (other.spec, other.run_root) == ("user@gpu-box:2222", None)


@pytest.mark.ssh
def test_a_named_host_gives_its_python_and_run_root_over_ssh(sshd_server: Sshd, run_root: Path,
                                                             tmp_path: Path) -> None:
    # The host's Python, as the config file names it: a wrapper that leaves a mark, then runs the real one.
    marker = tmp_path / "python-used"
    python = tmp_path / "python-of-gpu"
    python.write_text(f"#!/bin/sh\necho used >> {marker}\nexec {PYTHON} \"$@\"\n")
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    config = tmp_path / "config.toml"
    config.write_text(f'[hosts.gpu]\ntarget = "testhost"\nrun_root = "{run_root}"\npython = "{python}"\n')
    with Connection(sshd_server.spec, run_root=str(run_root), ssh_options=sshd_server.options()) as other:
        run = other.launch([PYTHON, "-c", "print('remote')"], name="remote")["run"]
    env = {**os.environ, "HOME": str(tmp_path), "EAGLEWATCH_CONFIG": ""}
    env.pop("EAGLEWATCH_REMOTE_PYTHON", None)
    proc = subprocess.run(
        [sys.executable, "-m", "eaglewatch", "runs", "gpu", "--config", str(config), "--json",
         "--ssh-config", str(sshd_server.ssh_config), "--known-hosts", str(sshd_server.known_hosts),
         "--no-ssh-agent"], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(line)["run"] for line in proc.stdout.splitlines()] == [run]
    assert "used" in marker.read_text()
