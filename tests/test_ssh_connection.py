"""Remote supervision against a real OpenSSH sshd on 127.0.0.1 (started by the sshd_server fixture)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from agent_support import (  # noqa: F401  (run_root: fixture)
    PYTHON,
    Collected,
    ancestors,
    collect,
    inet_socket_inodes,
    run_root,
    socket_inodes,
    wait_for,
)
from eaglewatch.pipeline.agent import procs
from eaglewatch.pipeline.agent.rundir import RunDir
from eaglewatch.tui.connection import bundle
from eaglewatch.tui.connection import (
    AgentStartError,
    AuthenticationFailed,
    Connection,
    HostKeyChangedError,
    UnknownHostKeyError,
)
from sshd import Sshd, keygen, require_sshd, sshd_server  # noqa: F401  (sshd_server: fixture)

pytestmark = pytest.mark.ssh


def connect(server: Sshd, root: Path, host: str | None = None, **options) -> Connection:
    connection = Connection(host or server.spec, run_root=str(root), ssh_options=server.options(**options),
                            backoff_initial_s=0.05, backoff_max_s=0.5)
    connection.connect()
    return connection


def cli_argv(server: Sshd, root: Path, *words: str) -> list[str]:
    """The real eaglewatch command, pointed at the test server's files only."""
    command, rest = words[0], list(words[1:])
    options = ["--run-root", str(root), "--ssh-config", str(server.ssh_config), "--known-hosts",
               str(server.known_hosts), "--no-ssh-agent", "--python", PYTHON]
    return [sys.executable, "-m", "eaglewatch", command, *options, *rest]


def cli(server: Sshd, root: Path, *words: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(cli_argv(server, root, *words), capture_output=True, timeout=timeout)


COUNTER = textwrap.dedent(
    """
    import os, sys, time
    stop_file, count, pause = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    i = 0
    while i < count and not os.path.exists(stop_file):
        text = f"line {i:06d} " + "x" * (i % 50) + "\\n"
        half = len(text) // 2
        os.write(1, text[:half].encode())  # a line arrives in two writes: torn lines must be handled
        os.write(1, text[half:].encode())
        i += 1
        time.sleep(pause)
    print(f"wrote {i}", flush=True)
    sys.exit(7)
    """
)


def expected_lines(log: bytes) -> list[bytes]:
    lines = log.splitlines()
    count = int(lines[-1].split()[1])
    assert lines[:-1] == [f"line {i:06d} ".encode() + b"x" * (i % 50) for i in range(count)]
    return lines


def test_launch_stream_and_exit_status_over_ssh(sshd_server: Sshd, run_root: Path) -> None:
    with connect(sshd_server, run_root) as conn:
        assert conn.hello["user"] and conn.hello["protocols"] == [1]
        summary = conn.launch([PYTHON, "-c", COUNTER, "/nonexistent", "50", "0.001"], name="count")
        got = collect(conn.watch("count"))
        assert got.states[-1].state == "exited" and got.states[-1].exit["code"] == 7
        assert bytes(got.log) == (run_root / summary["run"] / "log").read_bytes()
        assert len(expected_lines(bytes(got.log))) == 51


def test_an_unknown_host_key_is_rejected_until_the_operator_accepts_it(sshd_server: Sshd, run_root: Path,
                                                                       tmp_path: Path) -> None:
    known_hosts = tmp_path / "ssh" / "known_hosts"
    conn = Connection(sshd_server.spec, run_root=str(run_root),
                      ssh_options=sshd_server.options(known_hosts=(str(known_hosts),)))
    with pytest.raises(UnknownHostKeyError) as unknown:
        conn.connect()
    assert unknown.value.fingerprint == sshd_server.host_fingerprint()
    assert unknown.value.fingerprint in str(unknown.value) and "[127.0.0.1]" in str(unknown.value)
    assert not known_hosts.exists()
    written = conn.accept_host_key(unknown.value)
    assert Path(written) == known_hosts
    assert known_hosts.read_text() == sshd_server.known_hosts_line()
    conn.connect()
    conn.close()


def test_the_cli_accepts_a_host_key_only_with_its_exact_fingerprint(sshd_server: Sshd, run_root: Path,
                                                                   tmp_path: Path) -> None:
    known_hosts = tmp_path / "known_hosts"
    base = [sys.executable, "-m", "eaglewatch", "runs", sshd_server.spec, "--run-root", str(run_root),
            "--known-hosts", str(known_hosts), "-i", str(sshd_server.client_key), "--no-ssh-agent",
            "--python", PYTHON, "--ssh-config", str(sshd_server.ssh_config)]
    refused = subprocess.run(base, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2
    assert sshd_server.host_fingerprint() in refused.stderr and "--accept-host-key" in refused.stderr
    wrong = subprocess.run(base + ["--accept-host-key", "SHA256:not-the-key"], capture_output=True, text=True,
                           timeout=60)
    assert wrong.returncode == 2 and not known_hosts.exists()
    accepted = subprocess.run(base + ["--accept-host-key", sshd_server.host_fingerprint()], capture_output=True,
                              text=True, timeout=60)
    assert accepted.returncode == 0, accepted.stderr
    assert known_hosts.read_text() == sshd_server.known_hosts_line()


def test_a_changed_host_key_is_rejected(sshd_server: Sshd, run_root: Path, tmp_path: Path) -> None:
    other = keygen(tmp_path / "other_host_key")
    key_type, blob = Path(f"{other}.pub").read_text().split()[:2]
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{sshd_server.port} {key_type} {blob}\n")
    conn = Connection(sshd_server.spec, run_root=str(run_root),
                      ssh_options=sshd_server.options(known_hosts=(str(known_hosts),)))
    with pytest.raises(HostKeyChangedError) as changed:
        conn.connect()
    assert changed.value.fingerprint == sshd_server.host_fingerprint()
    assert "CHANGED" in str(changed.value) and "ssh-keygen -R" in str(changed.value)
    assert not isinstance(changed.value, UnknownHostKeyError)  # nothing offers to accept it
    assert known_hosts.read_text().split()[2] == blob


def test_the_ssh_configs_known_hosts_files_and_host_key_alias_are_used(sshd_server: Sshd, run_root: Path,
                                                                       tmp_path: Path) -> None:
    key_type, blob = sshd_server.known_hosts_line().split()[1:3]
    user_file, global_file = tmp_path / "kh" / "user", tmp_path / "kh" / "global"
    host = (f"  HostName 127.0.0.1\n  Port {sshd_server.port}\n  User {sshd_server.user}\n"
            f"  IdentityFile {sshd_server.client_key}\n  UserKnownHostsFile {user_file}\n")
    config = tmp_path / "ssh_config"
    config.write_text(f"Host cfgbox\n{host}  StrictHostKeyChecking no\n\n"
                      f"Host aliased\n{host}  GlobalKnownHostsFile {global_file}\n  HostKeyAlias gpu-box.example\n")
    options = sshd_server.options(known_hosts=None, config_path=str(config))
    # StrictHostKeyChecking=no lets nothing in unasked; the accepted key goes to the config's UserKnownHostsFile.
    conn = Connection("cfgbox", run_root=str(run_root), ssh_options=options)
    with pytest.raises(UnknownHostKeyError) as unknown:
        conn.connect()
    assert unknown.value.known_hosts_path == str(user_file)
    conn.accept_host_key(unknown.value)
    assert user_file.read_text() == sshd_server.known_hosts_line()
    conn.connect()
    conn.close()
    # HostKeyAlias: the key is known under the alias, with no port; the global file counts too.
    aliased = Connection("aliased", run_root=str(run_root), ssh_options=options)
    with pytest.raises(UnknownHostKeyError) as unknown:
        aliased.connect()
    assert unknown.value.host_id == "gpu-box.example"
    global_file.write_text(f"gpu-box.example {key_type} {blob}\n")
    aliased.connect()
    assert aliased.ping()["t"] > 0
    aliased.close()
    # --known-hosts given explicitly wins over the config.
    explicit = Connection("cfgbox", run_root=str(run_root),
                          ssh_options=sshd_server.options(known_hosts=(str(tmp_path / "none"),),
                                                          config_path=str(config)))
    with pytest.raises(UnknownHostKeyError):
        explicit.connect()


def test_a_wrong_client_key_gives_a_clear_error(sshd_server: Sshd, run_root: Path, tmp_path: Path) -> None:
    stranger = keygen(tmp_path / "stranger_key")
    conn = Connection(sshd_server.spec, run_root=str(run_root),
                      ssh_options=sshd_server.options(identity_files=(str(stranger),)))
    with pytest.raises(AuthenticationFailed) as failed:
        conn.connect()
    message = str(failed.value)
    assert f"127.0.0.1:{sshd_server.port}" in message and str(stranger) in message
    assert "authorized_keys" in message and "password" not in message.lower()


def test_a_missing_python_on_the_host_is_a_clear_error(sshd_server: Sshd, run_root: Path) -> None:
    conn = Connection(sshd_server.spec, run_root=str(run_root),
                      ssh_options=sshd_server.options(python="/nonexistent/python3"))
    with pytest.raises(AgentStartError) as failed:
        conn.connect()
    assert "/nonexistent/python3" in str(failed.value) and "exited before it greeted" in str(failed.value)


def test_ssh_config_alias_and_proxyjump(sshd_server: Sshd, run_root: Path) -> None:
    for alias in ("testhost", "jumped"):  # jumped: ProxyJump testhost, through a direct-tcpip channel
        with connect(sshd_server, run_root, host=alias, identity_files=()) as conn:
            assert conn.endpoint is not None and conn.endpoint.port == sshd_server.port
            assert conn.ping()["t"] > 0
            if alias == "jumped":
                assert [hop.alias for hop in conn.endpoint.jumps] == ["testhost"]


def test_the_job_survives_disconnect_and_sshd_death_and_attach_picks_it_up(sshd_server: Sshd, run_root: Path,
                                                                           tmp_path: Path) -> None:
    stop_file = tmp_path / "stop"  # the job runs until told to stop, however slow this machine is
    conn = connect(sshd_server, run_root)
    try:
        summary = conn.launch([PYTHON, "-c", COUNTER, str(stop_file), "1000000", "0.05"], name="survivor")
        run = RunDir(run_root / summary["run"])
        link_side = [conn.agent_pid, *sshd_server.session_pids()]
        conn.close()
        assert procs.pid_alive(run.pid())
        assert sshd_server.kill_all() >= 1
        # Look at the job only once everything that could take it down with it is gone: the agent at the end of
        # the link and every sshd process.
        wait_for(lambda: not [pid for pid in link_side if procs.pid_alive(pid)], timeout_s=60,
                 what="the agent and sshd processes gone")
        assert procs.pid_alive(run.pid()) and not run.exit_path.exists()
        sshd_server.start()
        attach = subprocess.Popen(cli_argv(sshd_server, run_root, "attach", "testhost", "survivor"),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            # The first streamed byte: attached while the job still runs. Then let the job end.
            first = os.read(attach.stdout.fileno(), 1)
            stop_file.touch()
            rest, err = attach.communicate(timeout=120)
        finally:
            if attach.poll() is None:
                attach.kill()
                attach.wait()
    finally:
        stop_file.touch()
    assert attach.returncode == 7, err
    assert first + rest == run.log_path.read_bytes()
    assert len(expected_lines(first + rest)) >= 2
    assert b"exit code 7" in err


def test_killing_every_sshd_process_20_times_loses_and_duplicates_nothing(sshd_server: Sshd,
                                                                         run_root: Path, tmp_path: Path) -> None:
    stop_file = tmp_path / "stop"
    conn = connect(sshd_server, run_root)
    try:
        summary = conn.launch([PYTHON, "-c", COUNTER, str(stop_file), "1000000", "0.002"])
        watch = conn.watch(summary["run"])
        got = Collected()
        for cycle in range(20):
            seen = len(got.log)
            # Streaming is live on a link made after the last kill: new bytes, and the reconnect counted.
            collect(watch, until=lambda g, seen=seen, cycle=cycle: len(g.log) > seen + 200 and conn.reconnects >= cycle,
                    into=got,
                    timeout_s=60)
            sshd_server.kill_all()
            sshd_server.start()
        collect(watch, until=lambda g: conn.reconnects >= 20, into=got, timeout_s=60)
        stop_file.touch()
        collect(watch, into=got, timeout_s=60)
    finally:
        stop_file.touch()
        conn.close()
    log = (run_root / summary["run"] / "log").read_bytes()
    assert bytes(got.log) == log
    lines = expected_lines(bytes(got.log))
    assert len(lines) > 500
    assert conn.reconnects >= 20
    assert sum(1 for link in got.links if link.state == "lost") >= 20


def test_a_hung_peer_is_detected_by_its_silence(sshd_server: Sshd, run_root: Path) -> None:
    # How fast (DEAD_AFTER_S, 3 s, plus a check's delay) is a figure for a quiet machine; here only that the
    # silence rule, and nothing else, finds the hang: the stopped sshd keeps the TCP connection open, so no error
    # or end of stream can tell the client.
    conn = connect(sshd_server, run_root)
    stopped: list[int] = []
    try:
        summary = conn.launch(["sh", "-c", "i=0; while [ $i -lt 120 ]; do echo tick $i; i=$((i+1)); sleep 0.05; done"])
        watch = conn.watch(summary["run"])
        got = collect(watch, until=lambda g: len(g.log) > 20, timeout_s=60)
        stopped = sshd_server.signal_sessions(signal.SIGSTOP)
        assert stopped
        hung_at = time.monotonic()
        collect(watch, until=lambda g: any(link.state == "lost" for link in g.links), into=got, timeout_s=60)
        detected_after = time.monotonic() - hung_at
        lost = [link for link in got.links if link.state == "lost"][0]
        assert f"nothing from the agent for {conn.dead_after_s:g} s" in lost.detail, (lost.detail, detected_after)
        # The listener was not stopped: the connection comes back on a fresh session and streaming goes on.
        collect(watch, into=got, timeout_s=60)
        assert bytes(got.log) == (run_root / summary["run"] / "log").read_bytes()
    finally:
        for pid in stopped:
            for signum in (signal.SIGKILL, signal.SIGCONT):
                try:
                    os.kill(pid, signum)
                except ProcessLookupError:
                    pass
        conn.close()


def test_the_agent_listens_on_no_port(sshd_server: Sshd, run_root: Path) -> None:
    with connect(sshd_server, run_root) as conn:
        summary = conn.launch(["sleep", "3"])
        agent = conn.agent_pid
        assert set(ancestors(agent)) & set(sshd_server.session_pids())  # it is the agent at the end of the SSH link
        supervisor = RunDir(run_root / summary["run"]).supervisor_pid()
        inet = inet_socket_inodes()
        assert inet  # sshd's own sockets at least: the check can see sockets
        for pid in (agent, supervisor):
            assert not socket_inodes(pid) & inet


def test_cli_launch_runs_stop_restart_over_ssh(sshd_server: Sshd, run_root: Path) -> None:
    launched = cli(sshd_server, run_root, "launch", "testhost", "--name", "cli job", "-e", "WHO=ops", "--",
                   "sh", "-c", "echo $WHO; sleep 300 & sleep 300 & wait")
    assert launched.returncode == 0, launched.stderr
    run_id = launched.stdout.decode().strip()
    run = RunDir(run_root / run_id)
    wait_for(lambda: run.log_path.read_bytes() == b"ops\n" and len(procs.group_members(run.pgid())) == 3)
    members = procs.group_members(run.pgid())
    listed = cli(sshd_server, run_root, "runs", "testhost")
    assert run_id in listed.stdout.decode() and "running" in listed.stdout.decode()
    restarted = cli(sshd_server, run_root, "restart", "testhost", "cli job", "--grace", "2", "--",
                    "sh", "-c", "echo again")
    assert restarted.returncode == 0, restarted.stderr
    new_id = restarted.stdout.decode().strip()
    assert not [pid for pid in members if procs.pid_alive(pid)]
    assert RunDir(run_root / new_id).cmd()["restart_of"] == run_id
    assert run.exit_info()["signal_name"] == "SIGTERM"
    stopped = cli(sshd_server, run_root, "stop", "testhost", new_id)
    assert stopped.returncode == 0 and new_id.encode() in stopped.stdout
    missing = cli(sshd_server, run_root, "stop", "testhost", "no such run")
    assert missing.returncode == 2 and b"no run 'no such run'" in missing.stderr


def test_a_host_without_sftp_gets_the_agent_through_the_shell(tmp_path: Path, run_root: Path) -> None:
    require_sshd()
    server = Sshd(tmp_path / "sshd-no-sftp", sftp=False)
    server.start()
    agent_dir = tmp_path / "agent dir" / "with 'quotes' $HOME"
    try:
        with connect(server, run_root, agent_dir=str(agent_dir)) as conn:
            summary = conn.launch(["sh", "-c", "echo over the shell"])
            got = collect(conn.watch(summary["run"]))
            assert bytes(got.log) == b"over the shell\n"
    finally:
        server.stop()
    installed = list(agent_dir.iterdir())
    assert [path.name for path in installed] == [bundle.file_name()]  # renamed into place, no partial left
    assert installed[0].read_bytes() == bundle.build()[0]
    assert "subsystem request for sftp" in server.log.read_text().lower()
