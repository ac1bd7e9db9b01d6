"""The command as the operator can run it: hints name ``eaglewatch`` the way this shell finds it, a folder named
``eaglewatch`` in the working directory (a checkout's top) does not stand in for the package, and an agent that dies
as it starts shows its stderr as lines."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agent_support import PYTHON, run_root  # noqa: F401  (run_root: fixture)

from eaglewatch.demo import shadows_the_package
from eaglewatch.tui.commands._common import command_prefix, hint_command

VENV_SCRIPT = Path(sys.executable).parent / "eaglewatch"
ROOT = Path(__file__).resolve().parent.parent


def console_script(folder: Path) -> Path:
    """An executable file named ``eaglewatch`` in ``folder``: the shape of a console script on disk."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "eaglewatch"
    script.write_text(f"#!{sys.executable}\nfrom eaglewatch.cli import main\nraise SystemExit(main())\n")
    script.chmod(0o755)
    return script


def clone_like(parent: Path) -> Path:
    """``parent/eaglewatch``: the top of a checkout named eaglewatch (README, a pipeline folder), no package."""
    top = parent / "eaglewatch"
    (top / "pipeline").mkdir(parents=True)
    (top / "README.md").write_text("# eaglewatch\n")
    return parent


# --- the command a hint names ---------------------------------------------------------------------------------

def test_the_console_script_on_the_path_is_named_by_its_name(tmp_path, monkeypatch) -> None:
    script = console_script(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}/usr/bin:/bin")
    assert command_prefix(str(script), sys.executable) == "eaglewatch"


def test_a_console_script_off_the_path_is_named_by_its_absolute_path(tmp_path, monkeypatch) -> None:
    script = console_script(tmp_path / "a b" / ".venv" / "bin")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    relative = os.path.relpath(script, tmp_path)  # how `./run` or a user may have started it
    assert command_prefix(relative, sys.executable) == f"'{script}'"  # quoted: the path has a space


def test_another_eaglewatch_first_on_the_path_is_not_taken_for_this_one(tmp_path, monkeypatch) -> None:
    other = console_script(tmp_path / "other")
    ours = console_script(tmp_path / "ours")
    monkeypatch.setenv("PATH", f"{other.parent}{os.pathsep}/usr/bin:/bin")
    assert command_prefix(str(ours), sys.executable) == str(ours)


def test_python_m_names_the_console_script_beside_that_python(tmp_path, monkeypatch) -> None:
    # `python -m eaglewatch` would look in the working folder first; the console script does not.
    bin_dir = tmp_path / "venv" / "bin"
    console_script(bin_dir)
    python = bin_dir / "python"
    python.symlink_to(sys.executable)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    main = str(ROOT / "eaglewatch" / "__main__.py")
    assert command_prefix(main, str(python)) == str(bin_dir / "eaglewatch")
    assert command_prefix(main, "/nonexistent/bin/python3") == "/nonexistent/bin/python3 -m eaglewatch"


def test_a_hint_runs_as_printed_in_a_shell_without_eaglewatch_on_its_path(tmp_path, run_root: Path) -> None:
    if not VENV_SCRIPT.exists():
        pytest.skip(f"no console script at {VENV_SCRIPT} (eaglewatch not installed into this Python's environment)")
    env = {**os.environ, "PATH": "/usr/bin:/bin", "EAGLEWATCH_RUN_ROOT": str(run_root)}
    launched = subprocess.run([str(VENV_SCRIPT), "launch", "local", "--no-tui", "--", "sh", "-c", "echo from-the-job"],
                              capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert launched.returncode == 0, launched.stderr
    (line,) = [line for line in launched.stderr.splitlines() if "follow it: " in line]
    hint = line.split("follow it: ", 1)[1]
    assert hint.startswith(f"{VENV_SCRIPT} attach local "), hint
    followed = subprocess.run(["sh", "-c", hint], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert followed.returncode == 0, followed.stderr
    assert "from-the-job" in followed.stdout


def test_hint_command_quotes_every_word_and_shows_controls_visibly() -> None:
    hint = hint_command("attach", "a b", "run\x1b]0;x\x07")
    assert hint.endswith("attach 'a b' 'run␛]0;x\\x07'") and "\x1b" not in hint


# --- a folder named eaglewatch in the working directory ------------------------------------------------------

def test_the_local_agent_works_from_a_folder_that_holds_a_checkout_named_eaglewatch(tmp_path, run_root: Path) -> None:
    parent = clone_like(tmp_path / "work")
    base = [str(VENV_SCRIPT)] if VENV_SCRIPT.exists() else [PYTHON, "-m", "eaglewatch"]
    if base[0] == PYTHON:
        pytest.skip("the shadowing needs the console script (python -m would itself import the folder)")
    env = {**os.environ, "EAGLEWATCH_RUN_ROOT": str(run_root)}
    env.pop("PYTHONPATH", None)  # a PYTHONPATH naming the checkout would hide the problem
    listed = subprocess.run([*base, "runs", "local"], capture_output=True, text=True, timeout=120, env=env,
                            cwd=parent)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.strip() == "no runs"
    job = subprocess.run([*base, "launch", "local", "--attach", "--", "sh", "-c", "pwd"],
                         capture_output=True, text=True, timeout=120, env=env, cwd=parent)
    assert job.returncode == 0, job.stderr
    assert job.stdout.splitlines()[-1] == str(parent), "the job runs in the operator's folder, as before"


def test_the_agent_run_with_python_m_under_a_standin_folder_says_so_in_one_line(tmp_path) -> None:
    # The folder's own copy of the agent's entry runs (python -m found it there): it names the folder instead of
    # failing on an import.
    parent = clone_like(tmp_path / "work")
    agent = parent / "eaglewatch" / "pipeline" / "agent"
    agent.mkdir()
    (parent / "eaglewatch" / "pipeline" / "__init__.py").write_text("")
    (agent / "__init__.py").write_text("")
    shutil.copy(ROOT / "pipeline" / "agent" / "__main__.py", agent / "__main__.py")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([PYTHON, "-m", "eaglewatch.pipeline.agent", "serve"], capture_output=True, text=True,
                          timeout=60, env=env, cwd=parent, stdin=subprocess.DEVNULL)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"eaglewatch agent: {parent / 'eaglewatch'} stands in for the eaglewatch package (python -m looks in the "
        "working directory first): start the agent from another folder, or with python -P (Python 3.11+)"]


def test_shadows_the_package_tells_a_checkout_top_from_the_package(tmp_path) -> None:
    assert shadows_the_package(str(clone_like(tmp_path / "work")))
    assert not shadows_the_package(str(ROOT))  # the checkout itself: its eaglewatch folder is the package
    assert not shadows_the_package(str(tmp_path / "nothing-here"))


# --- an agent that dies as it starts ---------------------------------------------------------------------------

DYING = """\
import os, sys
sys.stderr.write("Traceback (most recent call last):\\n  File \\"x.py\\", line 1, in <module>\\n"
                 "    import missing\\n\\x1b]0;retitled\\x07ModuleNotFoundError: No module named 'missing'\\n")
sys.stderr.flush()
os._exit(3)
"""


def test_an_agent_that_dies_at_start_shows_its_stderr_as_lines(tmp_path, run_root: Path) -> None:
    # sitecustomize runs in the agent only (--agent-env puts it on the agent's PYTHONPATH): a real agent process
    # that writes a traceback and dies before it greets.
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(DYING)
    done = subprocess.run([PYTHON, "-m", "eaglewatch", "runs", "local", "--run-root", str(run_root),
                           "--agent-env", f"PYTHONPATH={site}"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    lines = done.stderr.splitlines()
    assert lines[0] == "eaglewatch runs: error: the agent exited before it greeted (local agent); it said:"
    assert lines[1:] == [
        "    Traceback (most recent call last):",
        '      File "x.py", line 1, in <module>',
        "        import missing",
        "    ␛]0;retitled\\x07ModuleNotFoundError: No module named 'missing'",
    ]
    assert "\x1b" not in done.stderr and "\\n" not in done.stderr
