"""The operator's commands against hostile runs, through the real CLI and the real local agent: names, arguments,
exit records and logs that try to drive the terminal (clipboard, title, screen clear, DCS, 8-bit C1, bidi, NUL)
come out as visible text; and bad input of every kind is one clear line and exit code 2, never a traceback."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from agent_support import PYTHON, run_root, wait_for  # noqa: F401  (run_root: fixture)
from conftest import run_cli
from hostile_support import (
    BIDI_OVERRIDE,
    C1_CSI,
    CSI_CLEAR,
    DCS,
    HOSTILE,
    HOSTILE_LOG,
    NUL,
    OSC0_TITLE,
    OSC52_CLIPBOARD,
    SHOWN,
    assert_safe,
)

from eaglewatch.tui.connection import AgentError, Connection

EAGLEWATCH = [sys.executable, "-m", "eaglewatch"]
HOSTILE_NAMES = (*HOSTILE, "two\nlines")
# A traceback whose message tries everything; the decoder strips ESC sequences, the rest is safe_text's.
HOSTILE_TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/srv/job.py", line 3, in <module>\n'
    "    main()\n"
    f"RuntimeError: boom {OSC0_TITLE}{CSI_CLEAR}{C1_CSI} {BIDI_OVERRIDE}gpj.exe bell\x07\n"
).encode()


def cli(*words: object, home: Path, timeout: float = 120):
    """The real CLI, with HOME elsewhere so that no config file of this machine's user takes part."""
    return run_cli(*words, env={"HOME": str(home), "EAGLEWATCH_CONFIG": ""}, timeout=timeout)


def one_clear_line(proc, command: str) -> str:
    """A refusal: exit code 2, no traceback, the last line of stderr names the command; returns that line."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert_safe(proc.stderr, what="stderr")
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"eaglewatch {command}: error:") or last.startswith("eaglewatch: error:"), proc.stderr
    return last


@pytest.fixture
def hostile_runs(run_root: Path) -> list[str]:
    """Runs whose names and arguments each carry one hostile sequence, finished."""
    with Connection("local", run_root=str(run_root)) as connection:
        runs = [connection.launch(["sh", "-c", "exit 0", hostile, "x"], name=name)["run"]
                for hostile, name in zip(HOSTILE + ("plain",), HOSTILE_NAMES)]
        wait_for(lambda: all(connection.status(run)["state"] == "exited" for run in runs), what="the runs' ends")
    return runs


def test_runs_shows_hostile_names_and_arguments_visibly(hostile_runs: list[str], run_root: Path, tmp_path: Path):
    proc = cli("runs", "local", "--run-root", run_root, home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert_safe(proc.stdout, what="runs")
    assert_safe(proc.stderr, what="runs stderr")
    lines = proc.stdout.splitlines()
    assert len(lines) == 1 + len(hostile_runs)  # the name with a newline did not add a line
    for hostile in HOSTILE:
        in_command = f"'{SHOWN[hostile]}' x"  # shell-quoted, in the command column
        assert in_command in proc.stdout, hostile
        assert SHOWN[hostile] in proc.stdout.replace(in_command, ""), hostile  # and in the name column
    assert "two\\nlines" in proc.stdout


def test_runs_json_is_ascii_and_gives_the_names_back_exactly(hostile_runs: list[str], run_root: Path,
                                                              tmp_path: Path):
    proc = cli("runs", "local", "--run-root", run_root, "--json", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    proc.stdout.encode("ascii")  # no raw control, C1 or bidi character can be in pure ASCII JSON
    assert_safe(proc.stdout)
    names = {json.loads(line)["name"] for line in proc.stdout.splitlines()}
    assert names == set(HOSTILE_NAMES)


def test_a_hand_edited_run_directory_cannot_break_or_drive_runs(run_root: Path, tmp_path: Path):
    with Connection("local", run_root=str(run_root)) as connection:
        run = connection.launch(["sh", "-c", "exit 3"], name="edited")["run"]
        wait_for(lambda: connection.status(run)["state"] == "exited", what="the run's end")
    folder = run_root / run
    # A NUL and a lone surrogate (which UTF-8 cannot even hold), and fields of the wrong types.
    (folder / "cmd.json").write_text(
        '{"run": "%s", "name": "nul\\u0000 half\\udc80 %s", "argv": "not a list \\u001b[2J", '
        '"started_at": "yesterday", "restart_of": null}' % (run, "\\u001b]0;PW\\u0007"))
    (folder / "exit.json").write_text('{"code": "x", "signal": "\\u001b[2J", "error": "\\u009b2J no start"}')
    proc = cli("runs", "local", "--run-root", run_root, home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert_safe(proc.stdout)
    assert "nul\\x00 half\\udc80" in proc.stdout and "not a list ␛[2J" in proc.stdout  # the name is clipped
    assert "did not start: \\x9b2J no start" in proc.stdout
    as_json = cli("runs", "local", "--run-root", run_root, "--json", home=tmp_path)
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout.splitlines()[0])["name"] == "nul\x00 half\udc80 \x1b]0;PW\x07"
    host_side = run_cli("agent", "runs", "--run-root", run_root)
    assert host_side.returncode == 0, host_side.stderr
    assert_safe(host_side.stdout)
    assert "nul\\x00 half\\udc80" in host_side.stdout


@pytest.fixture
def hostile_log_run(run_root: Path, tmp_path: Path) -> str:
    log = tmp_path / "hostile.log"
    log.write_bytes(HOSTILE_LOG + HOSTILE_TRACEBACK)
    name = f"log {OSC52_CLIPBOARD}"
    with Connection("local", run_root=str(run_root)) as connection:
        run = connection.launch(["sh", "-c", 'cat "$1"; exit 1', "sh", str(log)], name=name)["run"]
        wait_for(lambda: connection.status(run)["state"] == "exited", what="the run's end")
    return run


def test_attach_passes_text_and_colour_and_shows_every_other_sequence(hostile_log_run: str, run_root: Path,
                                                                      tmp_path: Path):
    proc = run_cli_bytes("attach", "local", hostile_log_run, "--run-root", run_root, home=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert_safe(proc.stdout, allow_sgr=True, allow_cr=True, what="attach")
    assert_safe(proc.stderr, what="attach stderr")
    out = proc.stdout.decode()
    assert out.startswith("plain line one\n") and "plain last line\n" in out
    assert "\x1b[1;31mred words\x1b[0m and \x1b[32mgreen\x1b[0m\n" in out
    assert "progress 10%\rprogress 20%\rprogress 100%\n" in out and "tab\tend" in out
    for hostile in (*HOSTILE, NUL):
        assert SHOWN[hostile] in out, hostile
    assert "\\x9b2J raw 8-bit csi" in out
    assert "exit code 1" in proc.stderr.decode()


def test_attach_decoded_shows_a_hostile_failure_safely(hostile_log_run: str, run_root: Path, tmp_path: Path):
    pytest.importorskip("eaglewatch.decode.decoder")
    proc = run_cli_bytes("attach", "local", hostile_log_run, "--run-root", run_root, "--decoded", home=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert_safe(proc.stdout, what="attach --decoded")  # no colour either: the decoder's view is plain text
    assert_safe(proc.stderr, what="attach --decoded stderr")
    out = proc.stdout.decode()
    assert "RuntimeError: boom" in out and "\\u202egpj.exe" in out and "\\x9b2J" in out


def test_attach_events_and_the_runs_own_words_are_safe(run_root: Path, tmp_path: Path):
    script = ("import json, os\n"
              "with open(os.environ['EAGLEWATCH_EVENTS_FILE'], 'a') as f:\n"
              "    f.write(json.dumps({'v': 1, 'kind': 'phase', 'phase': 'loading', 'detail': '\\x1b]0;PW\\x07'}))\n"
              "    f.write('\\n\\x1b[2J not json\\n')\n")
    with Connection("local", run_root=str(run_root)) as connection:
        run = connection.launch([PYTHON, "-c", script], name=DCS)["run"]
        wait_for(lambda: connection.status(run)["state"] == "exited", what="the run's end")
    proc = run_cli_bytes("attach", "local", run, "--run-root", run_root, "--events", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert_safe(proc.stderr, what="attach --events")
    assert b"\\u001b]0;PW\\u0007" in proc.stderr and b"\\u001b[2J not json" in proc.stderr


def test_stop_and_launch_print_host_words_safely(run_root: Path, tmp_path: Path):
    with Connection("local", run_root=str(run_root)) as connection:
        run = connection.launch([PYTHON, "-c", "import time; time.sleep(600)"], name=OSC0_TITLE)["run"]
        wait_for(lambda: connection.status(run)["state"] == "running", what="the sleeper running")
        folder = run_root / run
    stopped = cli("stop", "local", OSC0_TITLE, "--run-root", run_root, "--grace", "1", home=tmp_path)
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout == f"{run}\tstopped by the operator (SIGTERM)\n"
    assert (folder / "exit.json").exists()
    launched = cli("launch", "local", "--run-root", run_root, "--name", CSI_CLEAR, "--json", "--", "true",
                   OSC52_CLIPBOARD, home=tmp_path)
    assert launched.returncode == 0, launched.stderr
    launched.stdout.encode("ascii")
    assert json.loads(launched.stdout)["argv"] == ["true", OSC52_CLIPBOARD]
    assert_safe(launched.stderr)


def run_cli_bytes(*words: object, home: Path, timeout: float = 120):
    import subprocess

    env = {**os.environ, "HOME": str(home), "EAGLEWATCH_CONFIG": ""}
    return subprocess.run([*EAGLEWATCH, *map(str, words)], capture_output=True, timeout=timeout, env=env)


# --- bad input: one clear line, exit code 2 --------------------------------------------------------------------

def test_hostile_host_specs_are_refused_in_one_line(tmp_path: Path):
    odd_config = tmp_path / "ssh_config"
    odd_config.write_text("Host odd\n  Port abc\n\nHost loop\n  ProxyJump loop\n")
    binary_config = tmp_path / "binary_config"
    binary_config.write_bytes(b"\xff\xfeHost x\n")
    cases = [
        (("runs", ""), "HOST is empty"),
        (("runs", "   "), "HOST is empty"),
        (("runs", "user@127.0.0.1:99999"), "not between 1 and 65535"),
        (("runs", "user@127.0.0.1:0"), "not between 1 and 65535"),
        (("runs", "two\nlines"), "is not a host"),
        (("runs", "a b"), "is not a host"),
        (("runs", "@host"), "is not a host"),
        (("runs", "user@:22"), "is not a host"),
        (("runs", "[::1"), "is not a host"),
        (("runs", f"host{OSC0_TITLE}"), "is not a host"),
        (("runs", "h" * 100_000), "is not a host"),
        (("runs", "odd", "--ssh-config", odd_config), "is not a number"),
        (("runs", "loop", "--ssh-config", odd_config), "too long"),
        (("runs", "user@127.0.0.1:1", "--ssh-config", binary_config), "cannot read the ssh config"),
        (("runs", "user@127.0.0.1:1", "--ssh-config", tmp_path), "cannot read the ssh config"),
    ]
    for words, said in cases:
        line = one_clear_line(cli(*words, home=tmp_path), words[0])
        assert said in line, (words, line)
        assert len(line) < 400, line  # a huge input is not echoed back whole


def test_bad_run_names_options_and_commands_are_refused_in_one_line(run_root: Path, tmp_path: Path):
    root = ("--run-root", run_root)
    cases = [
        (("attach", "local", "", *root), "no run given"),
        (("attach", "local", OSC52_CLIPBOARD, *root), "no run '\\x1b]52"),
        (("stop", "local", "x; rm -rf ~", *root), "no run"),
        (("stop", "local", "$(touch pwned)", *root), "no run"),
        (("stop", "local", "x", "--grace", "nan", *root), "finite number of seconds"),
        (("stop", "local", "x", "--grace", "-1", *root), "finite number of seconds"),
        (("stop", "local", "x", "--grace", "inf", *root), "finite number of seconds"),
        (("restart", "local", "x", "--grace", "nan", *root), "finite number of seconds"),
        (("restart", "local", "x", "--gpu-timeout", "-5", *root), "finite number of seconds"),
        (("restart", "local", "x", "--bogus", *root), "unrecognized arguments"),
        (("launch", "local", *root), "give the command after --"),
        (("launch", "local", "--name", "x", *root), "give the command after --"),
        (("launch", "local", *root, "--"), "give the command after --"),
        (("launch", "local", *root, "--", ""), "must not be empty"),
        (("launch", "local", *root, "-e", "=x", "--", "true"), "NAME=VALUE"),
        (("launch", "local", *root, "-e", "NOVALUE", "--", "true"), "NAME=VALUE"),
        (("launch", "local", *root, "--cwd", "/nonexistent/\x1b[2J", "--", "true"), "does not exist"),
        (("launch", "local", *root, "--bogus", "--", "true"), "unrecognized arguments"),
        (("dashboard", "local", "--stall-after", "-1"), "finite number above 0"),
        (("dashboard", "local", "--stall-after", "nan"), "finite number above 0"),
        (("dashboard", "local", *root), "needs a terminal"),  # no terminal here: it says what to use instead
    ]
    for words, said in cases:
        line = one_clear_line(cli(*words, home=tmp_path), words[0])
        assert said in line, (words, line)
    assert not (tmp_path / "pwned").exists()
    assert not list(run_root.glob("*")) if run_root.exists() else True  # nothing was launched


def test_shell_metacharacters_newlines_and_huge_names_are_only_text(run_root: Path, tmp_path: Path):
    canary = tmp_path / "canary"
    name = f"$(touch {canary}); `touch {canary}` | && \n" + "n" * 100_000
    proc = cli("launch", "local", "--run-root", run_root, "--name", name, "--", "sh", "-c", 'printf "%s" "$1"',
               "sh", f"'; touch {canary}; '", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    run = proc.stdout.strip()
    with Connection("local", run_root=str(run_root)) as connection:
        wait_for(lambda: connection.status(run)["state"] == "exited", what="the run's end")
        assert connection.status(run)["name"] == name
    listed = cli("runs", "local", "--run-root", run_root, home=tmp_path)
    assert listed.returncode == 0 and not canary.exists()
    assert max(len(line) for line in listed.stdout.splitlines()) < 250  # clipped, on one line
    attach = run_cli_bytes("attach", "local", name, "--run-root", run_root, home=tmp_path)
    assert attach.returncode == 0 and attach.stdout == f"'; touch {canary}; '".encode()
    assert not canary.exists()


def test_a_nul_in_a_name_or_argument_is_refused_by_the_agent(run_root: Path):
    with Connection("local", run_root=str(run_root)) as connection:
        for kwargs in ({"argv": ["true"], "name": f"a{NUL}b"}, {"argv": ["true", f"a{NUL}b"]}):
            with pytest.raises(AgentError, match="NUL"):
                connection.launch(**kwargs)


CONFIG_CASES = [
    ("[dashboard]\nlow_disk_gb = -5\n", ":2: [dashboard] low_disk_gb = -5: must be 0 or more"),
    ("[dashboard]\nstall_after_min = 0\n", ":2: [dashboard] stall_after_min = 0: must be more than 0"),
    ("# thresholds\n[dashboard]\nstall_after_min = -1.5\n", ":3: [dashboard] stall_after_min = -1.5"),
    ("[dashboard]\nstall_after_min = nan\n", "must be a finite number"),
    ("[dashboard]\nlow_disk_gb = inf\n", "must be a finite number"),
    ("[dashboard]\nlow_disk_gb = true\n", "must be a finite number"),
    ("[dashboard]\nlow_disk_gb = \"2\"\n", "must be a finite number"),
    ("[dashboard]\nlow_disk = 2\n", ":2: [dashboard] low_disk: unknown key"),
    ("dashboard = 5\n", "[dashboard]: must be a table"),
    ("[hosts.box]\ntarget = \"\"\n", ":2: [hosts.box] target: must be a non-empty string"),
    ("[hosts.box]\ntarget = \"a b\"\n", "must not hold spaces"),
    ("[hosts.box]\ntarget = \"local\"\npython = 3\n", ":3: [hosts.box] python: must be a non-empty string"),
    ("[hosts.box]\ntarget = \"local\"\nrun_root = \"a\\u001b[2Jb\"\n", "must not hold control characters"),
    ("[hosts]\nbox = 3\n", "[hosts.box]: must be a table"),
    ("[profiles.p]\nargv = []\n", ":2: [profiles.p] argv: must be a non-empty list"),
    ("[profiles.p]\nargv = [\"x\"]\nenv = { A = 1 }\n", "[profiles.p] env: must map names"),
    ("[dashboard]\nlow_disk_gb = \n", "Invalid value"),
    ("[dashboard]\n[dashboard]\n", "Cannot declare"),
]


def test_config_values_that_make_no_sense_are_refused_with_file_key_and_line(tmp_path: Path):
    from eaglewatch.errors import UserError
    from eaglewatch.tui import config

    path = tmp_path / "config.toml"
    for text, said in CONFIG_CASES:
        path.write_text(text)
        with pytest.raises(UserError) as caught:
            config.load(str(path))
        message = str(caught.value)
        assert message.startswith(str(path)) and said in message and "\n" not in message, (text, message)
    # Every command reads the file the same way: one line, exit code 2, before connecting anywhere.
    for text, said in CONFIG_CASES[:3]:
        path.write_text(text)
        for words in (("runs", "local"), ("attach", "local", "x"), ("launch", "local", "--", "true")):
            line = one_clear_line(cli(*words[:2], "--config", path, *words[2:], home=tmp_path), words[0])
            assert f"{path}" in line and said in line, (text, line)


def test_an_unreadable_config_file_is_refused_in_one_line(tmp_path: Path):
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\xff\xfe[dashboard]\n")
    for path, said in ((binary, "cannot read the config file"), (tmp_path, "cannot read the config file"),
                       (tmp_path / "missing.toml", "no config file at")):
        line = one_clear_line(cli("runs", "local", "--config", path, home=tmp_path), "runs")
        assert said in line, line


def test_a_sensible_config_file_is_still_read(tmp_path: Path, run_root: Path):
    from eaglewatch.tui import config

    text = ("[dashboard]\nstall_after_min = 0.5\nlow_disk_gb = 0\n\n"
            f'[hosts.box]\ntarget = "local"\nrun_root = "{run_root}"\n\n'
            '[profiles.p]\nhost = "box"\nargv = ["true"]\nenv = { A = "1" }\n')
    parsed = config.parse(text)
    assert (parsed.stall_after_s, parsed.low_disk_bytes) == (30.0, 0)
    assert parsed.hosts["box"].run_root == str(run_root) and parsed.profiles["p"].env == {"A": "1"}
    path = tmp_path / "config.toml"
    path.write_text(text)
    proc = cli("runs", "box", "--config", path, home=tmp_path)
    assert proc.returncode == 0, proc.stderr
