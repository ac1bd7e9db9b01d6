"""An operator's stop is recorded as a stop, not a crash: the agent leaves ``stop.json`` in the run directory before
the first signal, and the supervisor, when the job ends, adds ``stopped: true`` to exit.json (the signal or code
stays as it was). A signal nobody asked for (``kill -TERM`` from outside) is still a kill, and a failure. Real local
agents, supervisors and jobs."""

from __future__ import annotations

import json
import os
import signal
import textwrap
from pathlib import Path

import pytest

from agent_support import PYTHON, run_root, wait_for  # noqa: F401  (run_root: fixture)
from eaglewatch.pipeline.agent import procs
from eaglewatch.pipeline.agent.rundir import RunDir
from eaglewatch.tui.commands import _common
from eaglewatch.tui.connection import Connection
from eaglewatch.tui.runend import run_end

# A job that, on SIGTERM, copies what stop.json holds at that moment into its log, then dies of the signal: what
# it wrote proves the request was whole and in place before the signal came.
WITNESS = textwrap.dedent(
    """
    import os, signal, sys, time
    def term(signum, frame):
        path = os.path.join(os.environ["EAGLEWATCH_RUN_DIR"], "stop.json")
        try:
            seen = open(path).read()
        except OSError as exc:
            seen = f"no stop.json: {exc}"
        sys.stdout.write("AT SIGTERM " + " ".join(seen.split()) + "\\n")
        sys.stdout.flush()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
    signal.signal(signal.SIGTERM, term)
    print("ready", flush=True)
    while True:
        time.sleep(0.05)
    """
)


@pytest.fixture
def local(run_root: Path):
    connection = Connection("local", run_root=str(run_root), backoff_initial_s=0.02)
    connection.connect()
    yield connection
    connection.close()


def ready(local: Connection, run_root: Path, argv: list[str]) -> RunDir:
    run = RunDir(run_root / local.launch(argv)["run"])
    wait_for(lambda: b"ready" in run.log_path.read_bytes(), what="the job ready")
    return run


def logged_request(run: RunDir) -> dict:
    line = next(line for line in run.log_path.read_text().splitlines() if line.startswith("AT SIGTERM "))
    return json.loads(line[len("AT SIGTERM "):])


def test_an_operator_stop_is_recorded_as_a_stop_and_is_no_failure(local: Connection, run_root: Path) -> None:
    run = ready(local, run_root, [PYTHON, "-u", "-c", WITNESS])
    summary = local.stop(run.run_id, grace_s=10)
    exit_info = summary["exit"]
    assert exit_info["signal_name"] == "SIGTERM" and exit_info["signal"] == signal.SIGTERM  # kept as it was
    assert exit_info["code"] is None and exit_info["recorded_by"] == "supervisor"
    assert exit_info["stopped"] is True
    request = json.loads((run.path / "stop.json").read_text())
    assert request["by"] == "operator" and request["via"] == "stop" and request["at"] <= exit_info["ended_at"]
    # Who asked, how and when, copied into the exit record (a user the host could not name is left out).
    assert exit_info["stop"] == {key: value for key, value in request.items() if value is not None}
    # The job found the whole request in place when the signal came.
    assert logged_request(run) == request
    end = run_end(summary["state"], exit_info)
    assert end is not None and (end.text, end.code, end.failed, end.stopped) == (
        "stopped by the operator (SIGTERM)", 128 + signal.SIGTERM, False, True)
    assert _common.describe_exit(summary) == "stopped by the operator (SIGTERM)"
    assert _common.exit_status(summary) == 143  # the shell's convention: it did not complete


def test_a_kill_from_outside_is_still_a_kill_and_a_failure(local: Connection, run_root: Path) -> None:
    run = ready(local, run_root, [PYTHON, "-u", "-c", WITNESS])
    os.killpg(run.pgid(), signal.SIGTERM)  # kill -TERM by hand, nobody asked the agent
    wait_for(lambda: run.exit_info(), what="the supervisor's record")
    summary = local.status(run.run_id)
    assert "stopped" not in summary["exit"] and summary["exit"]["signal_name"] == "SIGTERM"
    assert not (run.path / "stop.json").exists() and "no stop.json" in run.log_path.read_text()
    end = run_end(summary["state"], summary["exit"])
    assert end is not None and (end.text, end.failed, end.stopped) == ("killed by SIGTERM", True, False)


def test_a_job_that_ends_itself_on_sigterm_was_still_stopped(local: Connection, run_root: Path) -> None:
    run = ready(local, run_root, ["sh", "-c", "trap 'echo bye; exit 0' TERM; echo ready; while :; do sleep 0.05; done"])
    summary = local.stop(run.run_id, grace_s=10)
    assert summary["exit"]["code"] == 0 and summary["exit"]["stopped"] is True
    assert _common.describe_exit(summary) == "stopped by the operator (exit code 0)"


def test_the_request_is_written_beside_and_renamed_in(local: Connection, run_root: Path, tmp_path: Path) -> None:
    run = ready(local, run_root, [PYTHON, "-u", "-c", WITNESS])
    # Something already at the name: a link to another file. Written in place, the request would land in that
    # file; renamed in, it replaces the link and the file is untouched.
    victim = tmp_path / "victim"
    victim.write_text("not yours\n")
    (run.path / "stop.json").symlink_to(victim)
    summary = local.stop(run.run_id, grace_s=10)
    assert victim.read_text() == "not yours\n"
    marker = run.path / "stop.json"
    assert not marker.is_symlink() and marker.is_file()
    assert json.loads(marker.read_text())["via"] == "stop" and summary["exit"]["stopped"] is True
    assert logged_request(run)["via"] == "stop"  # whole, in place before the signal
    assert not [p.name for p in run.path.iterdir() if p.name.startswith(".stop.json")]  # nothing left beside


def test_a_restart_stops_the_old_run_as_the_operators(local: Connection, run_root: Path) -> None:
    run = ready(local, run_root, [PYTHON, "-u", "-c", WITNESS])
    restarted = local.restart(run.run_id, grace_s=10, gpu_timeout_s=10)
    old, new = restarted["old"], restarted["new"]
    assert old["exit"]["stopped"] is True and old["exit"]["stop"]["via"] == "restart"
    assert _common.describe_exit(old) == "stopped by the operator (SIGTERM)"
    local.stop(new["run"], grace_s=1)


def test_stopping_a_run_that_already_ended_leaves_its_end_alone(local: Connection, run_root: Path) -> None:
    run = RunDir(run_root / local.launch(["sh", "-c", "exit 4"])["run"])
    wait_for(lambda: run.exit_info(), what="the run's end")
    summary = local.stop(run.run_id, grace_s=1)
    assert summary["exit"]["code"] == 4 and "stopped" not in summary["exit"]
    assert not (run.path / "stop.json").exists()
    assert _common.describe_exit(summary) == "exit code 4"


def test_the_agent_records_the_stop_when_the_supervisor_is_gone(local: Connection, run_root: Path) -> None:
    run = ready(local, run_root, ["sh", "-c", "echo ready; exec sleep 300"])
    os.kill(run.supervisor_pid(), signal.SIGKILL)
    wait_for(lambda: not procs.pid_alive(run.supervisor_pid()), what="the supervisor gone")
    summary = local.stop(run.run_id, grace_s=5)
    assert summary["exit"]["recorded_by"] == "agent" and summary["exit"]["signal_name"] == "SIGTERM"
    assert summary["exit"]["stopped"] is True and summary["exit"]["stop"]["via"] == "stop"
    assert _common.describe_exit(summary) == "stopped by the operator (SIGTERM)"
