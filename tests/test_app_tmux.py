"""End to end: the real `eaglewatch demo` in a real terminal (tmux), driven by keys, read with capture-pane."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture
def tmux(tmp_path):
    if shutil.which("tmux") is None:
        message = "tmux is missing: apt-get install -y tmux"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    socket = f"eaglewatch-test-{uuid.uuid4().hex[:8]}"

    def run(*args: str) -> str:
        return subprocess.run(["tmux", "-L", socket, *args], check=True, capture_output=True, text=True).stdout

    yield run
    subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True)


def wait_for_screen(tmux, predicate, timeout_s: float, what: str) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        screen = tmux("capture-pane", "-p", "-t", "demo")
        if predicate(screen):
            return screen
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not seen within {timeout_s} s; screen:\n{screen}")
        time.sleep(0.2)


def test_demo_in_a_terminal_opens_the_dashboard_and_q_detaches(tmux, tmp_path):
    runs = tmp_path / "runs"
    env = {"EAGLEWATCH_RUN_ROOT": str(runs), "TERM": "xterm-256color", "PYTHONPATH": os.getcwd()}
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    command = (f"env {exports} {shlex.quote(sys.executable)} -m eaglewatch demo --engine hf "
               f"--workdir {shlex.quote(str(tmp_path / 'demo'))}; echo EXIT=$?; sleep 60")
    tmux("new-session", "-d", "-s", "demo", "-x", "100", "-y", "30", command)
    screen = wait_for_screen(tmux, lambda s: "DONE" in s and "exit code 0" in s and "64/64" in s, 300,
                             "the finished run")
    assert "local" in screen
    tmux("send-keys", "-t", "demo", "?")
    wait_for_screen(tmux, lambda s: "eaglewatch keys" in s and "detach" in s, 60, "the help screen")
    tmux("send-keys", "-t", "demo", "Escape")
    wait_for_screen(tmux, lambda s: "eaglewatch keys" not in s, 60, "help closed")
    tmux("send-keys", "-t", "demo", "q")
    screen = wait_for_screen(tmux, lambda s: "EXIT=" in s, 60, "the dashboard's exit")
    assert "EXIT=0" in screen and "has ended (exit code 0)" in screen and "keeps running" not in screen
    # The run lives in the run directory, as the agent wrote it.
    (run_dir,) = runs.iterdir()
    assert (run_dir / "exit.json").exists() and b"phase: done" in (run_dir / "log").read_bytes()


def test_the_demo_from_a_folder_holding_a_checkout_named_eaglewatch_and_its_exit_hint_runs_as_printed(tmux, tmp_path):
    # What `./run demo` ends with (`exec .venv/bin/eaglewatch demo`), typed into a shell whose PATH does not hold
    # .venv/bin, in the folder that `git clone … eaglewatch` was run in: the clone's top folder is `./eaglewatch`.
    script = os.path.join(os.path.dirname(sys.executable), "eaglewatch")
    if not os.path.exists(script):
        pytest.skip(f"no console script at {script}: eaglewatch is not installed beside this Python")
    parent = tmp_path / "home"
    (parent / "eaglewatch" / "pipeline").mkdir(parents=True)
    (parent / "eaglewatch" / "README.md").write_text("# eaglewatch\n")
    runs = tmp_path / "runs"
    env = {"EAGLEWATCH_RUN_ROOT": str(runs), "TERM": "xterm-256color", "PATH": "/usr/bin:/bin", "PS1": "$ ",
           "HOME": str(parent)}
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    # No PYTHONPATH: one naming the checkout would hide what a folder named eaglewatch does.
    tmux("new-session", "-d", "-s", "demo", "-x", "200", "-y", "30", "-c", str(parent),
         f"env -u PYTHONPATH {exports} bash --norc --noprofile")
    demo = f"{shlex.quote(script)} demo --engine hf --workdir {shlex.quote(str(tmp_path / 'demo'))}"
    tmux("send-keys", "-t", "demo", f"{demo}; echo EXIT=$?", "Enter")
    wait_for_screen(tmux, lambda s: "DONE" in s and "exit code 0" in s and "64/64" in s, 300, "the finished run")
    tmux("send-keys", "-t", "demo", "q")
    # The typed line holds "EXIT=$?"; the shell's answer is a number.
    screen = wait_for_screen(tmux, lambda s: re.search(r"EXIT=\d", s), 60, "the dashboard's exit")
    assert "EXIT=0" in screen, screen
    joined = tmux("capture-pane", "-p", "-J", "-t", "demo")
    (hint,) = [line.split("Look again: ", 1)[1].strip() for line in joined.splitlines() if "Look again: " in line]
    (run_dir,) = runs.iterdir()
    assert hint.endswith(f" local {run_dir.name}"), hint
    tmux("send-keys", "-t", "demo", "clear", "Enter")
    wait_for_screen(tmux, lambda s: "EXIT=" not in s, 30, "a clear screen")
    tmux("send-keys", "-t", "demo", f"{hint}; echo AGAIN=$?", "Enter")  # the printed command, as printed
    screen = wait_for_screen(tmux, lambda s: ("DONE" in s and "exit code 0" in s and run_dir.name[:15] in s)
                             or re.search(r"AGAIN=\d", s), 120, "the dashboard on the same run, from the printed command")
    assert not re.search(r"AGAIN=\d", screen), f"the printed command did not open the dashboard:\n{screen}"
    tmux("send-keys", "-t", "demo", "q")
    screen = wait_for_screen(tmux, lambda s: re.search(r"AGAIN=\d", s), 60, "the second dashboard's exit")
    assert "AGAIN=0" in screen and "command not found" not in screen, screen
