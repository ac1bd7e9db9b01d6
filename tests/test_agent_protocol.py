"""The protocol and the pure parts of both sides: versions, log assembly across reconnects, quoting, targets."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eaglewatch import protocol
from eaglewatch.pipeline.agent.rundir import is_run_id, new_run_id
from eaglewatch.tui.connection import bundle
from eaglewatch.tui.connection.links import agent_argv, remote_command
from eaglewatch.tui.connection.stream import PARTIAL_HOLD_S, LogAssembler, RunWatch, StreamGap
from eaglewatch.tui.connection.target import resolve


def test_messages_carry_the_version_and_unknown_versions_are_refused() -> None:
    line = protocol.encode(protocol.log_message("r", 5, b"\x00\xffabc\n"))
    message = protocol.decode(line)
    assert message["v"] == protocol.PROTOCOL_VERSION
    assert protocol.log_payload(message) == b"\x00\xffabc\n"
    with pytest.raises(protocol.ProtocolVersionError, match="protocol version 99 is not supported"):
        protocol.decode(json.dumps({"v": 99, "type": "hello"}))
    with pytest.raises(protocol.ProtocolError):
        protocol.decode(b"Welcome to the host!\n")


def test_event_lines_that_are_not_json_travel_as_raw_text() -> None:
    good = protocol.event_message("r", 0, 10, b'{"kind":"phase","phase":"loading"}')
    bad = protocol.event_message("r", 10, 20, b"not json")
    assert good["event"]["phase"] == "loading" and "raw" not in good
    assert bad["raw"] == "not json" and "event" not in bad


def test_assembler_delivers_whole_lines_and_resumes_on_a_line_end() -> None:
    log = LogAssembler()
    assert log.feed(0, b"alpha\nbe", now=0.0) == b"alpha\n"
    assert log.delivered == 6 and log.received == 8
    # The link drops: the partial "be" is forgotten and asked for again from offset 6.
    log.drop_pending()
    assert log.feed(6, b"beta\r", now=1.0) == b"beta\r"
    # A resend of bytes already delivered is trimmed, never delivered twice.
    assert log.feed(0, b"alpha\nbeta\rgamma\n", now=1.0) == b"gamma\n"
    assert log.delivered == len(b"alpha\nbeta\rgamma\n")


def test_assembler_refuses_a_gap_and_flushes_a_stale_partial_line() -> None:
    log = LogAssembler(10)
    with pytest.raises(StreamGap):
        log.feed(12, b"x")
    assert log.feed(10, b"Continue? [y/N] ", now=0.0) == b""
    assert log.flush(now=PARTIAL_HOLD_S / 2) == b""
    assert log.flush(now=PARTIAL_HOLD_S + 0.01) == b"Continue? [y/N] "
    assert log.delivered == 26


@given(st.lists(st.binary(max_size=40), max_size=30), st.data())
@settings(max_examples=200, deadline=None)
def test_assembler_output_equals_input_whatever_the_chunking(chunks: list[bytes], data: st.DataObject) -> None:
    stream = b"".join(chunks)
    log = LogAssembler()
    out = bytearray()
    offset = 0
    for chunk in chunks:
        if data.draw(st.booleans()):  # a reconnect: resend from the resume offset
            log.drop_pending()
            offset = log.delivered
            resend = stream[offset : offset + len(chunk)]
            out += log.feed(offset, resend, now=0.0)
            offset += len(resend)
        out += log.feed(offset, stream[offset : offset + len(chunk)], now=0.0)
        offset += len(stream[offset : offset + len(chunk)])
    out += log.feed(offset, stream[offset:], now=0.0)
    out += log.flush(force=True)
    assert bytes(out) == stream


@given(st.lists(st.text(alphabet=st.characters(blacklist_characters="\0", blacklist_categories=("Cs",))),
                min_size=1, max_size=6))
@settings(max_examples=200, deadline=None)
def test_remote_command_is_argv_quoted_word_by_word(argv: list[str]) -> None:
    assert shlex.split(remote_command(argv)) == argv


def test_agent_command_line_is_built_from_a_list() -> None:
    argv = agent_argv("/usr/bin/python3", ["/home/a b/agent.pyz"], "/runs/$(x)", 60)
    assert argv[:3] == ["/usr/bin/python3", "/home/a b/agent.pyz", "serve"]
    assert shlex.split(remote_command(argv))[-3:] == ["/runs/$(x)", "--idle-exit", "60"]


def test_run_ids_are_safe_file_names_whatever_the_name() -> None:
    run_id = new_run_id("a/b; rm -rf ~ $(x)\n'q'")
    assert is_run_id(run_id) and "/" not in run_id and " " not in run_id
    assert is_run_id(new_run_id(None))
    assert is_run_id(new_run_id("../.."))


def test_targets_follow_ssh_config(tmp_path) -> None:
    config = tmp_path / "config"
    config.write_text(
        "Host gpu\n  HostName 10.1.2.3\n  User alice\n  Port 2222\n  IdentityFile ~/.ssh/gpu_key\n"
        "  ProxyJump bastion\n\nHost bastion\n  HostName bastion.example\n  User bob\n"
    )
    gpu = resolve("gpu", str(config))
    assert (gpu.hostname, gpu.user, gpu.port, gpu.host_id) == ("10.1.2.3", "alice", 2222, "[10.1.2.3]:2222")
    assert gpu.identity_files[0].endswith("/.ssh/gpu_key") and "~" not in gpu.identity_files[0]
    assert [(hop.hostname, hop.user, hop.port) for hop in gpu.jumps] == [("bastion.example", "bob", 22)]
    direct = resolve("carol@192.0.2.9:2200", str(config))
    assert (direct.user, direct.hostname, direct.port, direct.jumps) == ("carol", "192.0.2.9", 2200, ())
    assert resolve("root@gpu", str(config)).user == "root"
    with pytest.raises(ValueError):
        resolve("a b", str(config))
    config.write_text("Host gpu\n  HostName 10.1.2.3\n  Port 2222\n  UserKnownHostsFile ~/kh /etc/kh2\n"
                      "  HostKeyAlias gpu-box\n  ProxyJump bastion\n\nHost bastion\n  GlobalKnownHostsFile /etc/g\n")
    gpu = resolve("gpu", str(config))
    assert gpu.known_hosts == ("~/kh", "/etc/kh2", "/etc/ssh/ssh_known_hosts") and gpu.host_id == "gpu-box"
    assert gpu.jumps[0].known_hosts == ("~/.ssh/known_hosts", "/etc/g") and gpu.jumps[0].host_id == "bastion"
    assert resolve("192.0.2.9", str(config)).known_hosts == ()  # the defaults then


def test_the_uploaded_agent_refuses_an_unknown_protocol_version(tmp_path) -> None:
    data, digest = bundle.build()
    assert bundle.build() == (data, digest)  # deterministic: same sources, same file name on the host
    path = bundle.write(tmp_path / bundle.file_name())
    done = subprocess.run([sys.executable, str(path), "serve", "--protocol", "99"], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 3
    assert "protocol 99" in done.stderr and "same eaglewatch version" in done.stderr


def test_a_consumer_callback_that_raises_stops_its_watch_not_the_link() -> None:
    def broken(batch: list) -> None:
        raise RuntimeError("consumer bug")

    watch = RunWatch("r", callback=broken)
    watch.on_log(0, b"line\n")
    watch.deliver()  # must not raise into the connection's reader thread
    assert isinstance(watch.error, RuntimeError) and watch.cancelled.is_set() and watch.finished.is_set()


FAKE_AGENT = """#!/bin/sh
printf '{"v":1,"type":"hello"}\\n'
sleep 30 2>/dev/null &
echo $! > "$(dirname "$0")/sleeper.pid"
cat > /dev/null
"""


def test_a_closed_local_link_cannot_read_the_next_pipe_that_takes_its_fd_number(tmp_path) -> None:
    # recv waits in select() on the raw fd. If close freed that number while a reader sat there, the next pipe
    # opened in this process (the next local agent's) could get it, and the stale reader would steal its greeting.
    # The fake agent leaves a sleeper holding its stdout, so no end-of-file wakes the reader first.
    import signal
    import threading

    from agent_support import blocked_in, wait_for
    from eaglewatch.tui.connection.links import TIMEOUT, LocalLink

    fake = tmp_path / "fake-agent"
    fake.write_text(FAKE_AGENT)
    fake.chmod(0o755)
    link = LocalLink(str(tmp_path / "runs"), python=str(fake))
    pipes: list[int] = []
    try:
        assert b"hello" in link.recv(10.0)
        old_fd = link._proc.stdout.fileno()
        stolen: list[bytes] = []

        def reader() -> None:
            while True:
                data = link.recv(1.0)
                if data == b"":
                    return
                if data is not TIMEOUT:
                    stolen.append(data)

        thread = threading.Thread(target=reader, daemon=True)
        thread.start()
        # The race needs the reader inside recv's select() on the old fd when close runs: holding the link's recv
        # lock and asleep in the kernel in a select call (the fake agent sends nothing more, so it stays there).
        wait_for(lambda: link._recv_lock.locked() and blocked_in("select", os.getpid(), thread.native_id),
                 what="the reader waiting in select()")
        link.close()
        for _ in range(10):  # a new pipe whose read end has the old number
            read_end, write_end = os.pipe()
            pipes += [read_end, write_end]
            if read_end == old_fd:
                break
        assert read_end == old_fd, "the old number was not reused; the test cannot tell"
        os.write(write_end, b"the next agent's greeting\n")
        thread.join(30.0)  # its recv in progress times out within 1 s, then it sees the link closed
        assert not thread.is_alive() and stolen == []
        assert os.read(read_end, 100) == b"the next agent's greeting\n"
    finally:
        for fd in pipes:
            os.close(fd)
        sleeper = tmp_path / "sleeper.pid"
        if sleeper.exists():
            try:
                os.kill(int(sleeper.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass
