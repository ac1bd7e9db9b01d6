"""Over SSH: hostile runs listed through the real test sshd, host output quoted in errors, a server that never
speaks SSH, and the agent file on the host checked by its SHA-256 before it is run."""

from __future__ import annotations

import hashlib
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("paramiko")

from agent_support import PYTHON, run_root, wait_for  # noqa: F401  (run_root: fixture)
from hostile_support import HOSTILE, OSC0_TITLE, OSC52_CLIPBOARD, SHOWN, assert_safe
from sshd import Sshd, require_sshd, sshd_server  # noqa: F401  (sshd_server: fixture)

from eaglewatch.tui.connection import Connection, ConnectionFailed, SSHOptions, bundle
from eaglewatch.tui.connection.links import _SHA256_OF_FILE, _SHELL_INSTALL


def cli(server: Sshd, root: Path, *words: str, python: str = PYTHON, timeout: float = 120):
    """The real command, pointed at the test server's files only: HOST (first word after the command) first."""
    command, host, rest = words[0], words[1], list(words[2:])
    options = ["--run-root", str(root), "--ssh-config", str(server.ssh_config), "--known-hosts",
               str(server.known_hosts), "--no-ssh-agent", "--python", python]
    return subprocess.run([sys.executable, "-m", "eaglewatch", command, host, *options, *rest],
                          capture_output=True, timeout=timeout)


@pytest.mark.ssh
def test_runs_over_ssh_shows_hostile_names_and_arguments_visibly(sshd_server: Sshd, run_root: Path):
    with Connection("local", run_root=str(run_root)) as connection:
        for hostile in HOSTILE:
            connection.launch(["sh", "-c", "exit 0", hostile], name=hostile)
    proc = cli(sshd_server, run_root, "runs", "testhost")
    assert proc.returncode == 0, proc.stderr
    assert_safe(proc.stdout, what="runs over ssh")
    assert_safe(proc.stderr, what="runs over ssh, stderr")
    text = proc.stdout.decode()
    for hostile in HOSTILE:
        assert f"'{SHOWN[hostile]}'" in text and SHOWN[hostile] in text.replace(f"'{SHOWN[hostile]}'", ""), hostile
    as_json = cli(sshd_server, run_root, "runs", "testhost", "--json")
    assert as_json.returncode == 0, as_json.stderr
    as_json.stdout.decode("ascii")


@pytest.mark.ssh
def test_attach_over_ssh_filters_the_log(sshd_server: Sshd, run_root: Path):
    log = f"ok\n{OSC52_CLIPBOARD}\x1b[1mbold\x1b[0m\n".encode()
    with Connection("local", run_root=str(run_root)) as connection:
        run = connection.launch([PYTHON, "-c", f"import sys; sys.stdout.buffer.write({log!r})"])["run"]
        wait_for(lambda: connection.status(run)["state"] == "exited", what="the run's end")
    proc = cli(sshd_server, run_root, "attach", "testhost", run)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"ok\n{SHOWN[OSC52_CLIPBOARD]}\x1b[1mbold\x1b[0m\n".encode()


@pytest.mark.ssh
def test_the_hosts_own_error_output_is_quoted_safely(sshd_server: Sshd, run_root: Path, tmp_path: Path):
    # A remote "python" that fails with hostile bytes on stderr: the error quotes them, visibly.
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\nprintf '\\033]0;PW\\007\\033[2J\\302\\233 no python here\\n' >&2\nexit 1\n")
    fake.chmod(0o755)
    proc = cli(sshd_server, run_root, "runs", "testhost", python=str(fake))
    assert proc.returncode == 2, proc.stderr
    assert_safe(proc.stderr, what="the error")
    err = proc.stderr.decode()
    assert f"{SHOWN[OSC0_TITLE]}␛[2J\\x9b no python here" in err and "Traceback" not in err


def silent_server() -> socket.socket:
    """A real listening socket that completes the TCP handshake (the kernel does, from the backlog) and never
    writes a byte."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    return server


def test_a_server_that_never_speaks_fails_at_the_banner_timeout_not_the_connect_timeout(tmp_path: Path):
    server = silent_server()
    port = server.getsockname()[1]
    options = SSHOptions(config_path=None, known_hosts=(str(tmp_path / "known_hosts"),), use_ssh_agent=False,
                         connect_timeout_s=120.0, banner_timeout_s=2.0)
    try:
        connection = Connection(f"user@127.0.0.1:{port}", ssh_options=options, reconnect=False)
        started = time.monotonic()
        with pytest.raises(ConnectionFailed) as caught:
            connection.connect()
        elapsed = time.monotonic() - started
    finally:
        server.close()
    assert str(caught.value) == (f"127.0.0.1:{port} accepted the connection but sent no SSH banner within 2 s: is "
                                 "an SSH server listening on that port?")
    assert elapsed < 60  # the banner timeout ended it, far inside the 120 s connect timeout


def test_the_cli_says_which_server_sent_no_banner(tmp_path: Path):
    server = silent_server()
    port = server.getsockname()[1]
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "eaglewatch", "runs", f"user@127.0.0.1:{port}", "--ssh-config",
             str(tmp_path / "none"), "--known-hosts", str(tmp_path / "known_hosts"), "--no-ssh-agent"],
            capture_output=True, text=True, timeout=120)
    finally:
        server.close()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == (f"eaglewatch runs: error: 127.0.0.1:{port} accepted the connection but sent no "
                                   "SSH banner within 5 s: is an SSH server listening on that port?")


def test_a_server_that_answers_hostile_bytes_instead_of_ssh_is_quoted_safely(tmp_path: Path):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    port = server.getsockname()[1]

    def answer() -> None:
        for _ in range(2):
            try:
                peer, _ = server.accept()
            except OSError:
                return
            with peer:
                peer.sendall(b"".join(f"{OSC0_TITLE} hello {i}\r\n".encode() for i in range(120)))

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    options = SSHOptions(config_path=None, known_hosts=(str(tmp_path / "known_hosts"),), use_ssh_agent=False,
                         connect_timeout_s=30.0, banner_timeout_s=5.0)
    try:
        with pytest.raises(ConnectionFailed) as caught:
            Connection(f"user@127.0.0.1:{port}", ssh_options=options, reconnect=False).connect()
    finally:
        server.close()
    message = str(caught.value)
    assert_safe(message)
    assert message.startswith(f"127.0.0.1:{port} ") and "SSH banner" in message


# --- the agent file on the host ---------------------------------------------------------------------------------

def agent_path(options: SSHOptions) -> Path:
    return Path(options.agent_dir) / bundle.file_name()


@pytest.mark.ssh
def test_an_agent_file_of_the_right_size_but_other_content_is_replaced(sshd_server: Sshd, run_root: Path,
                                                                        tmp_path: Path):
    options = sshd_server.options(agent_dir=str(tmp_path / "agent-dir"))
    data, digest = bundle.build()
    target = agent_path(options)
    target.parent.mkdir(parents=True)
    # Same size, other bytes: what a cut-and-retried or tampered upload can leave. Were it run, it would say so.
    impostor = b"import sys; sys.stderr.write('IMPOSTOR RAN'); sys.exit(9)\n#"
    target.write_bytes(impostor + b"#" * (len(data) - len(impostor)))
    assert target.stat().st_size == len(data)
    with Connection(sshd_server.spec, run_root=str(run_root), ssh_options=options) as connection:
        assert connection.ping()["t"] > 0
    assert hashlib.sha256(target.read_bytes()).hexdigest() == digest
    assert sorted(path.name for path in target.parent.iterdir()) == [target.name]  # no partial left
    # The right file is kept as it is: the next connection renames nothing over it.
    inode = target.stat().st_ino
    with Connection(sshd_server.spec, run_root=str(run_root), ssh_options=options) as connection:
        connection.ping()
    assert target.stat().st_ino == inode


@pytest.mark.ssh
def test_an_upload_that_does_not_match_its_hash_is_never_put_in_place(sshd_server: Sshd, run_root: Path,
                                                                       tmp_path: Path, monkeypatch):
    data, _ = bundle.build()
    # The bytes that arrive differ from what the name promises (a cut or altered upload, as seen from here).
    monkeypatch.setattr(bundle, "build", lambda: (data, "0" * 64))
    options = sshd_server.options(agent_dir=str(tmp_path / "agent-dir"))
    connection = Connection(sshd_server.spec, run_root=str(run_root), ssh_options=options, reconnect=False)
    with pytest.raises(ConnectionFailed, match="does not match the agent's SHA-256"):
        connection.connect()
    assert list((tmp_path / "agent-dir").iterdir()) == []  # neither the final name nor a partial


def test_the_shell_install_checks_the_hash_before_the_rename(tmp_path: Path):
    data, digest = bundle.build()
    folder = tmp_path / "agent dir $HOME 'q'"

    def install(expected: str) -> subprocess.CompletedProcess:
        return subprocess.run(["sh", "-c", _SHELL_INSTALL, "sh", str(folder), "agent.part-1", "agent.pyz", expected,
                               PYTHON, _SHA256_OF_FILE], input=data, capture_output=True, timeout=60)

    refused = install("0" * 64)
    assert refused.returncode == 3 and b"does not match its SHA-256" in refused.stderr
    assert list(folder.iterdir()) == []
    done = install(digest)
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode().strip() == str(folder)
    assert [path.name for path in folder.iterdir()] == ["agent.pyz"]
    assert (folder / "agent.pyz").read_bytes() == data


@pytest.mark.ssh
def test_a_host_without_sftp_replaces_a_wrong_agent_file_too(tmp_path: Path, run_root: Path):
    require_sshd()
    server = Sshd(tmp_path / "sshd-no-sftp", sftp=False)
    server.start()
    options = server.options(agent_dir=str(tmp_path / "agent-dir"))
    data, digest = bundle.build()
    target = agent_path(options)
    target.parent.mkdir(parents=True)
    target.write_bytes(b"#" * len(data))
    try:
        with Connection(server.spec, run_root=str(run_root), ssh_options=options) as connection:
            assert connection.ping()["t"] > 0
    finally:
        server.stop()
    assert hashlib.sha256(target.read_bytes()).hexdigest() == digest
    assert sorted(path.name for path in target.parent.iterdir()) == [target.name]
