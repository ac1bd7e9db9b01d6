"""The agent, driven through the local connection (a real agent subprocess, real jobs, real signals)."""

from __future__ import annotations

import json
import os
import queue
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
    collect,
    descendants,
    inet_socket_inodes,
    run_root,
    socket_inodes,
    wait_for,
)
from eaglewatch import protocol
from eaglewatch.pipeline.agent import jobs, procs
from eaglewatch.pipeline.agent.rundir import RunDir
from eaglewatch.tui.connection import AgentError, AgentStartError, Connection, LinkState
from eaglewatch.tui.connection.session import AgentSession


@pytest.fixture
def local(run_root: Path):
    connection = Connection("local", run_root=str(run_root), backoff_initial_s=0.02)
    connection.connect()
    yield connection
    connection.close()


def test_launch_streams_log_and_events_and_reports_the_exit(local: Connection, run_root: Path, tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import json, os, sys
        print("starting", flush=True)
        with open(os.environ["EAGLEWATCH_EVENTS_FILE"], "a") as fh:
            fh.write(json.dumps({"v": 1, "kind": "phase", "phase": "loading"}) + "\\n")
        sys.stderr.write("to stderr\\n")
        print(os.environ["GREETING"], os.getcwd(), flush=True)
        sys.exit(3)
        """
    )
    summary = local.launch([PYTHON, "-c", script], cwd=str(tmp_path), env={"GREETING": "hello"}, name="first")
    watch = local.watch(summary["run"])
    got = collect(watch)
    run = RunDir(run_root / summary["run"])
    assert bytes(got.log) == run.log_path.read_bytes()
    assert bytes(got.log).splitlines() == [b"starting", b"to stderr", f"hello {tmp_path}".encode()]
    assert [event.event["phase"] for event in got.events] == ["loading"]
    assert got.states[-1].state == "exited" and got.states[-1].exit["code"] == 3
    cmd = json.loads(run.cmd_path.read_text())
    assert cmd["argv"][0] == PYTHON and cmd["env"] == {"GREETING": "hello"} and cmd["cwd"] == str(tmp_path)
    assert cmd["name"] == "first" and cmd["restart_of"] is None and cmd["eaglewatch_version"]
    assert run.pid() == run.pgid() and run.exit_info()["code"] == 3
    listed = {entry["run"]: entry for entry in local.runs()}
    assert listed[summary["run"]]["state"] == "exited"
    assert local.status("first")["run"] == summary["run"]


def test_a_missing_command_is_an_exit_not_a_hang(local: Connection) -> None:
    summary = local.launch(["/nonexistent/eaglewatch-test-binary"])
    got = collect(local.watch(summary["run"]))
    assert got.states[-1].exit["code"] == 127
    assert b"cannot start" in got.log
    with pytest.raises(AgentError, match="does not exist"):
        local.launch(["true"], cwd="/nonexistent/dir")
    with pytest.raises(AgentError) as refused:
        local.status("no-such-run")
    assert refused.value.code == protocol.ERR_NOT_FOUND


def test_stop_kills_the_whole_process_group_including_children(local: Connection, run_root: Path) -> None:
    script = textwrap.dedent(
        """
        import os, subprocess, sys, time
        kids = [subprocess.Popen(["sleep", "300"]) for _ in range(2)]
        grandchild = subprocess.Popen(["sh", "-c", "sleep 300 & echo $!; wait"], stdout=subprocess.PIPE)
        grandchild.stdout.readline()  # the grandchild sleep exists once sh printed its pid
        print(" ".join(str(k.pid) for k in kids + [grandchild]), flush=True)
        time.sleep(300)
        """
    )
    summary = local.launch([PYTHON, "-c", script])
    run = RunDir(run_root / summary["run"])
    wait_for(lambda: run.log_path.read_bytes().endswith(b"\n"))
    group = procs.group_members(run.pgid())
    assert len(group) >= 5  # python, two sleeps, sh and its sleep
    stopped = local.stop(summary["run"], grace_s=5)
    assert stopped["state"] == "exited" and stopped["exit"]["signal_name"] == "SIGTERM"
    assert not [pid for pid in group if procs.pid_alive(pid)]


def test_stop_escalates_to_sigkill_after_the_grace_period(local: Connection, run_root: Path) -> None:
    summary = local.launch(["sh", "-c", "trap '' TERM; echo ready; while :; do sleep 0.05; done"])
    run = RunDir(run_root / summary["run"])
    wait_for(lambda: b"ready" in run.log_path.read_bytes())
    started = time.monotonic()
    stopped = local.stop(summary["run"], grace_s=0.5)
    assert time.monotonic() - started >= 0.5
    assert stopped["exit"]["signal_name"] == "SIGKILL"
    assert not procs.run_processes(run.run_id, run.pgid())


def test_stop_refuses_a_pid_that_no_longer_belongs_to_the_run(local: Connection, run_root: Path) -> None:
    summary = local.launch(["sleep", "300"])
    run = RunDir(run_root / summary["run"])
    local.stop(summary["run"], grace_s=1)
    stranger = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        # The folder now says the run is that stranger (as after a pid reuse), and that it never ended.
        (run.path / "pid").write_text(f"{stranger.pid}\n")
        (run.path / "pgid").write_text(f"{stranger.pid}\n")
        run.exit_path.unlink()
        with pytest.raises(AgentError) as refused:
            local.stop(summary["run"], grace_s=0.2)
        assert refused.value.code == protocol.ERR_REFUSED
        assert "nothing was signalled" in str(refused.value)
        # A signal sent before the refusal came back would show now: the stranger dead, or the signal pending.
        assert untouched(stranger)
    finally:
        stranger.kill()
        stranger.wait()


def untouched(proc: subprocess.Popen) -> bool:
    """Alive, and no signal pending for it. kill() marks the signal pending before it returns, and it stays so until
    the process runs and dies of it: unlike a look some time later, this cannot miss a signal that is on its way."""
    if proc.poll() is not None:
        return False
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines())
    return (fields["State"].split()[0] not in ("Z", "X")
            and int(fields["SigPnd"], 16) == 0 and int(fields["ShdPnd"], 16) == 0)


def test_restart_gives_a_new_run_linked_to_the_old(local: Connection, run_root: Path) -> None:
    summary = local.launch(["sh", "-c", "echo one; sleep 300"], name="worker", env={"K": "v"})
    wait_for(lambda: b"one" in RunDir(run_root / summary["run"]).log_path.read_bytes())
    result = local.restart("worker", grace_s=2)
    old, new = result["old"], result["new"]
    assert old["run"] == summary["run"] and old["state"] == "exited"
    assert new["run"] != old["run"] and new["restart_of"] == old["run"]
    new_cmd = json.loads((run_root / new["run"] / "cmd.json").read_text())
    assert new_cmd["restart_of"] == old["run"] and new_cmd["argv"] == old["argv"] and new_cmd["env"] == {"K": "v"}
    assert local.status("worker")["run"] == new["run"]  # the name now means the newest run
    edited = local.restart(new["run"], argv=["sh", "-c", "echo two"], grace_s=2)["new"]
    got = collect(local.watch(edited["run"]))
    assert bytes(got.log) == b"two\n" and edited["restart_of"] == new["run"]


LEAVE_A_CHILD = textwrap.dedent(
    """
    import subprocess, sys
    child = subprocess.Popen(["sh", "-c", sys.argv[1]])
    print(child.pid, flush=True)
    sys.exit(1)
    """
)


def leftover_run(local: Connection, run_root: Path, child_sh: str, grace_s: str) -> tuple[RunDir, int]:
    summary = local.launch([PYTHON, "-c", LEAVE_A_CHILD, child_sh], env={"EAGLEWATCH_LEFTOVER_GRACE_S": grace_s})
    run = RunDir(run_root / summary["run"])
    wait_for(lambda: run.exit_info(), timeout_s=10)
    return run, int(run.log_path.read_bytes().split()[0])


def test_processes_that_outlive_the_main_process_are_ended_after_a_grace(local: Connection, run_root: Path) -> None:
    # A tensor-parallel worker stuck in a collective outlives the main process and keeps its GPU memory.
    run, child = leftover_run(local, run_root, "exec sleep 300", grace_s="1")
    assert run.exit_info()["code"] == 1 and procs.pid_alive(child)
    leftovers = wait_for(lambda: run.exit_info().get("leftovers"), timeout_s=15)
    assert leftovers["pids"] == [child] and leftovers["ended_by"] == "SIGTERM" and leftovers["alive"] == []
    assert not procs.pid_alive(child)
    log = run.log_path.read_text()
    assert f"[eaglewatch] 1 process(es) of the run outlived its main process (pids {child}); SIGTERM in 1 s" in log
    assert "[eaglewatch] the leftover processes ended after SIGTERM" in log
    warnings = [e for e in protocol.read_events(run.events_path.read_bytes().splitlines()) if e["kind"] == "warning"]
    assert [e["by"] for e in warnings] == ["supervisor", "supervisor"]


def test_a_leftover_that_ignores_sigterm_gets_sigkill(local: Connection, run_root: Path) -> None:
    run, child = leftover_run(local, run_root, "trap '' TERM; while :; do sleep 0.05; done", grace_s="0.5")
    leftovers = wait_for(lambda: run.exit_info().get("leftovers"), timeout_s=15)
    assert leftovers["ended_by"] == "SIGKILL" and not procs.pid_alive(child)


def test_a_helper_that_ends_soon_after_the_main_process_is_left_alone(local: Connection, run_root: Path) -> None:
    run, child = leftover_run(local, run_root, "sleep 0.3", grace_s="5")
    wait_for(lambda: not jobs.supervisor_alive(run), timeout_s=10)
    assert "leftovers" not in run.exit_info() and "[eaglewatch]" not in run.log_path.read_text()


def test_stop_ends_leftovers_of_a_run_that_has_exited(local: Connection, run_root: Path) -> None:
    run, child = leftover_run(local, run_root, "exec sleep 300", grace_s="600")
    started = time.monotonic()
    local.stop(run.run_id, grace_s=5)
    # Ended by the stop, not by the supervisor's own leftover rule, whose 600 s grace is far from over.
    assert not procs.pid_alive(child) and time.monotonic() - started < 300
    assert run.exit_info()["code"] == 1  # how the job ended stays what it was


def test_the_exit_is_recorded_when_the_agent_is_killed(local: Connection, run_root: Path) -> None:
    summary = local.launch(["sh", "-c", "sleep 0.5; echo done; exit 5"])
    os.kill(local.agent_pid, signal.SIGKILL)
    run = RunDir(run_root / summary["run"])
    wait_for(lambda: run.exit_info(), timeout_s=10)
    assert run.exit_info()["code"] == 5 and run.log_path.read_bytes() == b"done\n"


def test_a_run_whose_processes_all_vanished_is_lost(local: Connection, run_root: Path) -> None:
    summary = local.launch(["sleep", "300"])
    run = RunDir(run_root / summary["run"])
    os.kill(run.supervisor_pid(), signal.SIGKILL)
    os.killpg(run.pgid(), signal.SIGKILL)
    wait_for(lambda: local.status(summary["run"])["state"] == "lost")
    assert run.exit_info() is None


def test_streaming_resumes_without_loss_when_the_local_agent_dies(local: Connection, run_root: Path) -> None:
    script = "import time\nfor i in range(300):\n    print(f'line {i:04d}', flush=True)\n    time.sleep(0.005)\n"
    summary = local.launch([PYTHON, "-c", script])
    watch = local.watch(summary["run"])
    got = Collected()
    for _ in range(3):
        seen = len(got.log)
        collect(watch, until=lambda g, seen=seen: len(g.log) > seen, into=got)
        os.kill(local.agent_pid, signal.SIGKILL)
        collect(watch, until=lambda g: any(link.state == "connected" for link in g.links), into=got)
        got.links.clear()
    collect(watch, into=got)
    assert bytes(got.log) == (run_root / summary["run"] / "log").read_bytes()
    assert bytes(got.log).splitlines() == [f"line {i:04d}".encode() for i in range(300)]
    assert local.reconnects == 3


def test_the_agent_opens_no_port(local: Connection) -> None:
    local.launch(["sleep", "2"])
    inet = inet_socket_inodes()
    processes = [local.agent_pid] + descendants(local.agent_pid)
    assert all(not socket_inodes(pid) & inet for pid in processes)


def test_both_sides_refuse_a_protocol_version_they_do_not_know(tmp_path: Path) -> None:
    agent = subprocess.Popen([sys.executable, "-m", "eaglewatch.pipeline.agent", "serve", "--run-root", str(tmp_path)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert protocol.decode(agent.stdout.readline())["type"] == protocol.MSG_HELLO
        agent.stdin.write(json.dumps({"v": 99, "type": "command", "id": 7, "op": "runs"}).encode() + b"\n")
        agent.stdin.flush()
        while True:
            reply = protocol.decode(agent.stdout.readline())
            if reply["type"] == protocol.MSG_REPLY:
                break
        assert reply["id"] == 7 and not reply["ok"] and reply["error"]["code"] == protocol.ERR_VERSION
    finally:
        agent.stdin.close()
        agent.wait(timeout=10)

    class FutureAgent:
        """A process that greets with a protocol version from the future."""

        description = "agent from the future"

        def __init__(self) -> None:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", "print('{\"v\": 99, \"type\": \"hello\"}', flush=True)"],
                stdout=subprocess.PIPE,
            )

        def recv(self, timeout: float) -> bytes:
            return os.read(self.proc.stdout.fileno(), 65536)

        def send(self, data: bytes) -> None: ...

        def stderr_text(self) -> str:
            return ""

        def transport_alive(self) -> bool:
            return True

        def close(self) -> None:
            self.proc.wait()

    session = AgentSession(FutureAgent(), lambda *a: None, lambda *a: None, lambda *a: None)
    with pytest.raises(AgentStartError, match="protocol version 99 is not supported"):
        session.start(timeout_s=10)


def test_link_states_reach_watchers_and_close_is_clean(run_root: Path) -> None:
    connection = Connection("local", run_root=str(run_root))
    connection.connect()
    summary = connection.launch(["sleep", "300"])  # still running when looked at, however slow this is
    watch = connection.watch(summary["run"])
    connection.close()
    states = [item.state for batch in iter(lambda: watch.get(0.5), []) for item in batch if isinstance(item, LinkState)]
    assert states[-1] == "closed"
    assert jobs.run_state(RunDir(run_root / summary["run"])) == "running"  # closing the client does not stop a job


def test_telemetry_flows_through_the_agent_when_the_sampler_is_there(local: Connection) -> None:
    answer = local.telemetry(0.2)
    if not answer["available"]:
        pytest.skip(f"eaglewatch.pipeline.telemetry is not usable here: {answer.get('reason')}")
    from eaglewatch.tui.connection import Telemetry

    samples: list = []

    def got_a_sample() -> bool:
        try:
            samples.extend(item for item in local.host_items.get(timeout=0.5) if isinstance(item, Telemetry))
        except queue.Empty:
            pass
        return bool(samples)

    wait_for(got_a_sample, timeout_s=60, step_s=0, what="a telemetry sample")
    assert samples[0].sample["type"] == protocol.MSG_TELEMETRY and "host" in samples[0].sample
    assert local.telemetry(0)["running"] is False


def test_attach_prints_raw_bytes_or_the_decoded_view(run_root: Path) -> None:
    log = Path(__file__).parent / "fixtures" / "vllm-logs" / "crash_extract_pin_memory_runtime.log"
    base = [sys.executable, "-m", "eaglewatch"]
    launched = subprocess.run([*base, "launch", "local", "--run-root", str(run_root), "--", "sh", "-c",
                               'cat "$1"; exit 1', "sh", str(log)], capture_output=True, timeout=60)
    run_id = launched.stdout.decode().strip()
    raw = subprocess.run([*base, "attach", "local", run_id, "--run-root", str(run_root)], capture_output=True,
                         timeout=60)
    assert raw.returncode == 1 and raw.stdout == log.read_bytes() and b"exit code 1" in raw.stderr
    pytest.importorskip("eaglewatch.decode.decoder")
    decoded = subprocess.run([*base, "attach", "local", run_id, "--run-root", str(run_root), "--decoded"],
                             capture_output=True, text=True, timeout=60)
    assert decoded.returncode == 1
    assert "Root cause: RuntimeError: pin_memory=True" in decoded.stdout


def test_a_runs_recorded_gpu_history_is_served_and_none_is_recorded_without_nvml(local: Connection,
                                                                                 run_root: Path) -> None:
    from telemetry_replay import ReplayNvml, raw_readings

    from eaglewatch.pipeline.telemetry.history import HISTORY_FILE, HistoryRecorder
    from eaglewatch.pipeline.telemetry.nvml import NvmlSource

    summary = local.launch(["sh", "-c", "echo done"])
    run = RunDir(run_root / summary["run"])
    wait_for(lambda: run.exit_info(), timeout_s=10)
    wait_for(lambda: not jobs.supervisor_alive(run), timeout_s=10)
    # No NVIDIA driver on this machine: the supervisor records nothing, and the job is none the worse.
    assert not (run.path / HISTORY_FILE).exists() and run.exit_info()["code"] == 0
    assert local.gpu_history(summary["run"]) == []
    # What a supervisor on a GPU host leaves behind is served oldest first, at most `limit` samples.
    recorder = HistoryRecorder(run.path, source=NvmlSource(module=ReplayNvml(raw_readings("h200x2_raw.jsonl"))))
    for _ in range(5):
        recorder.record()
    served = local.gpu_history(summary["run"], limit=3)
    lines = [json.loads(line) for line in (run.path / HISTORY_FILE).read_text().splitlines()]
    assert served == lines[-3:]
