"""A run directory's files swapped for a FIFO, a device, a folder, a huge or a broken file: ``attach`` and ``runs``
(through the real CLI and the real local agent, and ``attach`` over SSH) end within a bound, with no traceback and
at most one clear line about it, and leave the run directory as it was. The agent opens run files through one helper
(``rundir.open_run_file``): regular files only, never an open that waits for a FIFO's writer, reads bounded."""

from __future__ import annotations

import errno
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

from agent_support import PYTHON, wait_for

from eaglewatch.pipeline.agent import rundir
from eaglewatch.tui.connection import Connection

BOUND_S = 30  # a hang turns into a failure after this; every command here takes a few seconds at most
EAGLEWATCH = [sys.executable, "-m", "eaglewatch"]


# --- how a file is spoiled ------------------------------------------------------------------------------------

def fifo(path: Path) -> None:
    path.unlink(missing_ok=True)
    os.mkfifo(path)  # nobody ever writes it: an open or a read that waits for a writer waits forever


def dev_zero(path: Path) -> None:
    path.unlink(missing_ok=True)
    path.symlink_to("/dev/zero")  # a read never ends


def folder(path: Path) -> None:
    path.unlink(missing_ok=True)
    path.mkdir()


def huge(path: Path) -> None:
    """Valid JSON's start, then a sparse GiB of NULs: whole, it would take seconds and a GiB to read."""
    path.write_bytes(b'{"code": 0, "pad": "')
    with open(path, "r+b") as fh:
        fh.truncate(1 << 30)


def truncated(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def invalid_utf8(path: Path) -> None:
    path.write_bytes(b'{"name": "\xff\xfe\xc3", "argv": ["sh"], "started_at": 1}\n')


NOT_READ = "run {run}'s {file} is not a regular file ({kind}); not reading it"
REFUSED = "eaglewatch attach: error: " + NOT_READ
NOTED = "[eaglewatch] " + NOT_READ

# file, how it is spoiled, attach's extra words, attach's exit status, the one line it says (None: nothing).
CASES: list[tuple[str, Callable[[Path], None], tuple[str, ...], int, str | None]] = [
    ("log", fifo, (), 2, REFUSED.format(run="{run}", file="log", kind="a FIFO")),
    ("log", fifo, ("--from-end", "--decoded"), 2, REFUSED.format(run="{run}", file="log", kind="a FIFO")),
    ("log", dev_zero, (), 2, REFUSED.format(run="{run}", file="log", kind="a character device")),
    ("log", folder, (), 2, REFUSED.format(run="{run}", file="log", kind="a directory")),
    ("events.jsonl", fifo, (), 0, NOTED.format(run="{run}", file="events.jsonl", kind="a FIFO")),
    ("events.jsonl", dev_zero, ("--events",), 2,
     REFUSED.format(run="{run}", file="events.jsonl", kind="a character device")),
    ("exit.json", huge, (), 1, None),  # an exit record that cannot be read: the run "ended", its status unknown
    ("exit.json", fifo, (), 1, None),
    ("exit.json", dev_zero, (), 1, None),
    ("cmd.json", truncated, (), 0, None),
    ("cmd.json", invalid_utf8, (), 0, None),
    ("cmd.json", fifo, (), 0, None),
    ("pid", fifo, (), 0, None),
    ("pgid", dev_zero, (), 0, None),
    ("supervisor.pid", fifo, (), 0, None),
]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real run, ended with exit code 0, with a log line and an event: the template every case copies."""
    root = tmp_path_factory.mktemp("template") / "runs"
    script = ("import json, os\nprint('a line of the log')\n"
              "with open(os.environ['EAGLEWATCH_EVENTS_FILE'], 'a') as f:\n"
              "    f.write(json.dumps({'v': 1, 'kind': 'phase', 'phase': 'loading'}) + '\\n')\n")
    with Connection("local", run_root=str(root)) as connection:
        run = connection.launch([PYTHON, "-c", script], name="bounded")["run"]
        wait_for(lambda: connection.status(run)["state"] == "exited", what="the run's end")
    return root / run


def spoiled_copy(template: Path, root: Path, name: str, spoil: Callable[[Path], None]) -> Path:
    folder_ = root / template.name
    shutil.copytree(template, folder_, symlinks=True)
    spoil(folder_ / name)
    return folder_


def snapshot(folder_: Path) -> dict[str, tuple]:
    """What the run directory holds: each entry's kind, size, modification time and link target."""
    found: dict[str, tuple] = {}
    for entry in sorted(folder_.iterdir()):
        st = entry.lstat()
        link = os.readlink(entry) if stat.S_ISLNK(st.st_mode) else None
        found[entry.name] = (stat.S_IFMT(st.st_mode), st.st_size, st.st_mtime_ns, link)
    return found


def bounded(*words: object, home: Path) -> subprocess.CompletedProcess[str]:
    """The real command, with HOME elsewhere (no config file of this machine's user); a hang fails the test."""
    env = {**os.environ, "HOME": str(home), "EAGLEWATCH_CONFIG": ""}
    return subprocess.run([*EAGLEWATCH, *map(str, words)], capture_output=True, text=True, timeout=BOUND_S,
                          env=env, errors="replace")


def said_lines(stderr: str, run: str) -> list[str]:
    """stderr less attach's usual last line (``[eaglewatch] run RUN exit code 0``)."""
    return [line for line in stderr.splitlines() if not line.startswith(f"[eaglewatch] run {run} ")]


@pytest.mark.parametrize(("name", "spoil", "words", "status", "says"), CASES,
                         ids=[f"{name}-{spoil.__name__}{'-' + '-'.join(w.strip('-') for w in words) if words else ''}"
                              for name, spoil, words, _, _ in CASES])
def test_a_spoiled_run_file_ends_in_at_most_one_clear_line(finished_run: Path, tmp_path: Path, name: str,
                                                            spoil: Callable[[Path], None], words: tuple[str, ...],
                                                            status: int, says: str | None):
    root = tmp_path / "runs"
    folder_ = spoiled_copy(finished_run, root, name, spoil)
    run = folder_.name
    before = snapshot(folder_)

    attach = bounded("attach", "local", run, "--run-root", root, *words, home=tmp_path)
    assert attach.returncode == status, (attach.returncode, attach.stdout[-2000:], attach.stderr[-2000:])
    assert "Traceback" not in attach.stderr, attach.stderr
    assert said_lines(attach.stderr, run) == ([says.format(run=run)] if says else []), attach.stderr
    if status != 2:
        assert "a line of the log" in attach.stdout  # the log itself still streams

    for command in (("runs", "local", "--run-root", root), ("agent", "runs", "--run-root", root)):
        listed = bounded(*command, home=tmp_path)
        assert listed.returncode == 0, (command, listed.stderr)
        assert "Traceback" not in listed.stderr and not listed.stderr.strip(), (command, listed.stderr)
        assert run in listed.stdout, (command, listed.stdout)

    assert snapshot(folder_) == before


@pytest.mark.ssh
def test_attach_over_ssh_refuses_a_log_that_is_a_fifo(finished_run: Path, tmp_path: Path):
    pytest.importorskip("paramiko")
    from sshd import Sshd, require_sshd

    require_sshd()
    server = Sshd(tmp_path / "sshd")
    server.start()
    try:
        root = tmp_path / "runs"
        folder_ = spoiled_copy(finished_run, root, "log", fifo)
        before = snapshot(folder_)
        attach = bounded("attach", "testhost", folder_.name, "--run-root", root, "--ssh-config", server.ssh_config,
                         "--known-hosts", server.known_hosts, "--no-ssh-agent", "--python", PYTHON, home=tmp_path)
    finally:
        server.stop()
    assert attach.returncode == 2, (attach.returncode, attach.stderr[-2000:])
    assert attach.stderr.splitlines() == [REFUSED.format(run=folder_.name, file="log", kind="a FIFO")], attach.stderr
    assert snapshot(folder_) == before


# --- the helper itself ------------------------------------------------------------------------------------------

@pytest.mark.timeout(BOUND_S)
@pytest.mark.parametrize(("spoil", "kind"), [(fifo, "a FIFO"), (dev_zero, "a character device"),
                                              (folder, "a directory")])
def test_open_run_file_refuses_what_is_not_a_regular_file(tmp_path: Path, spoil: Callable[[Path], None],
                                                          kind: str, monkeypatch: pytest.MonkeyPatch):
    path = tmp_path / "log"
    spoil(path)
    assert rundir.not_regular(path) == kind
    with pytest.raises(rundir.NotRegularFile) as refused:
        rundir.read_run_file(path, 10)
    assert refused.value.kind == kind
    # Swapped in between the stat and the open: O_NONBLOCK keeps the open from waiting, fstat catches it.
    monkeypatch.setattr(rundir, "not_regular", lambda _path: None)
    with pytest.raises(rundir.NotRegularFile) as caught:
        rundir.read_run_file(path, 10)
    assert caught.value.kind == kind


def test_reads_are_bounded(tmp_path: Path):
    path = tmp_path / "exit.json"
    huge(path)
    assert rundir.read_run_file(path, 20, offset=2) == b'code": 0, "pad": "\0\0'
    with pytest.raises(OSError) as too_big:
        rundir.read_run_record(path)
    assert too_big.value.errno == errno.EFBIG
    assert rundir.RunDir(tmp_path).exit_info() is None
    (tmp_path / "pid").write_bytes(b"12" + b" " * rundir.PID_LIMIT)
    assert rundir.RunDir(tmp_path).pid() is None
    (tmp_path / "pid").write_bytes(b"1234\n")
    assert rundir.RunDir(tmp_path).pid() == 1234
    assert rundir.not_regular(tmp_path / "missing") is None and rundir.not_regular(path) is None


@pytest.mark.timeout(BOUND_S)
def test_gpu_history_that_is_a_fifo_is_not_read(finished_run: Path, tmp_path: Path):
    """The dashboard's gpu_history command runs on the agent's command thread: a FIFO there would stall every
    command after it."""
    import io

    from eaglewatch.pipeline.agent.server import Server
    from eaglewatch.pipeline.telemetry.history import HISTORY_FILE

    root = tmp_path / "runs"
    folder_ = spoiled_copy(finished_run, root, HISTORY_FILE, fifo)
    server = Server(root, io.BytesIO(), io.BytesIO())
    try:
        assert server.op_gpu_history({"run": folder_.name}) == {"samples": []}
    finally:
        server.streamer.watcher.close()
