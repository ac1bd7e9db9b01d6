"""speculators' own data-generation pipeline as a watched job: `vllm serve` set up for hidden-state extraction with
vLLM's stock connector, then `speculators generate-offline-data` against it, recorded on this project's CPU machine
(tests/fixtures/speculators-datagen/README.md says how). Its progress is the client's sample bar, its failures the
server's; both must reach the run model and the painted screen.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from eaglewatch.decode import BarUpdate, Decoder
from eaglewatch.tui.runstate import RunModel
from eaglewatch.tui.runstate.jobkind import SPECULATORS_DATAGEN, kind_of_command, sample_counts

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "speculators-datagen"
CPU_RUN = FIXTURES / "cpu-vllm032-stock-connector-pin-memory.log"
CPU_RUN_EXIT = json.loads((FIXTURES / "cpu-vllm032-stock-connector-pin-memory.exit.json").read_text())


def last_sample_bar(data: bytes) -> BarUpdate:
    decoder = Decoder()
    bars = [e for e in decoder.feed(data) + decoder.finish() if isinstance(e, BarUpdate) and sample_counts(e)]
    assert bars, "no sample bar decoded"
    return bars[-1]


def test_the_sample_bar_is_read_with_its_outcomes() -> None:
    counts = sample_counts(last_sample_bar(CPU_RUN.read_bytes()))
    assert counts is not None
    assert counts.total == 24 and counts.n == 10  # where the client hung, its server gone
    assert counts.ok == 0 and counts.err == 10  # the server wrote nothing
    # Other bars of the same log are not sample bars: the server's shard loader is progress of another kind.
    decoder = Decoder()
    others = [e for e in decoder.feed(CPU_RUN.read_bytes()) if isinstance(e, BarUpdate) and not sample_counts(e)]
    assert any("Loading safetensors" in e.desc for e in others)


def test_the_command_names_the_kind() -> None:
    assert kind_of_command(["speculators", "generate-offline-data", "--endpoint", "x"]) == SPECULATORS_DATAGEN
    assert kind_of_command(["python", "scripts/data_generation_offline.py"]) == SPECULATORS_DATAGEN
    assert kind_of_command(["eaglewatch", "extract", "--model-path", "m"]) is None


def test_the_run_model_shows_progress_and_the_servers_root_cause() -> None:
    model = RunModel("cpu-box", {"run": "20261201-165935-c3d28e-speculators-datagen", "name": "speculators-datagen",
                                 "argv": ["bash", "job.sh"], "started_at": 1_000.0, "state": "running"},
                     clock=lambda: 0.0, wall=lambda: 1_100.0)
    data = CPU_RUN.read_bytes()
    cut = data.index(b"ok=0, err=10")  # part-way: the job is still going through its samples
    model.feed_log(data[:cut + 200])
    view = model.snapshot()
    assert view.job_kind == SPECULATORS_DATAGEN
    assert view.phase == "extracting"
    assert view.extraction.total == 24 and 9 <= (view.extraction.done or 0) < 24
    assert view.extraction.failed_samples == view.extraction.done
    assert all("(no description)" not in bar.desc and bar.desc for bar in view.load)  # the sample bar is not a load bar
    model.feed_log(data[cut + 200:])
    model.feed_job("exited", CPU_RUN_EXIT, {})
    view = model.snapshot()
    assert view.extraction.done == 10 and view.extraction.failed_samples == 10
    # The operator stopped it once it hung, but this exit.json was recorded before a stop left stop.json for the
    # supervisor: without ``stopped`` a SIGTERM is a kill like any other.
    assert view.exit_text == "killed by SIGTERM" and view.phase == "failed"
    stopped = RunModel("cpu-box", {"run": "r", "state": "running"})
    stopped.feed_job("exited", {**CPU_RUN_EXIT, "stopped": True}, {})
    assert (stopped.snapshot().exit_text, stopped.snapshot().phase) == ("stopped by the operator (SIGTERM)", "stopped")
    assert view.failures, "the server's failure"
    root = view.failures[0]
    assert "pin_memory=True requires a CUDA or other accelerator backend" in root.summary


PUBLIC_CASES = json.loads((FIXTURES / "cases.json").read_text())


@pytest.mark.parametrize("case", [c for c in PUBLIC_CASES if c.get("root_cause")], ids=lambda c: c["slug"])
def test_what_users_posted_of_this_pipeline_decodes_to_its_root_cause(case: dict) -> None:
    """Logs of speculators' data generation (and its extraction server) that users posted, kept verbatim."""
    from test_decode_real_logs import decode_bytes, is_type

    _, state = decode_bytes((FIXTURES / f"{case['slug']}.log").read_bytes())
    failures = state.failures_ranked()
    want = case["root_cause"]
    assert failures, f"{case['slug']}: no failure decoded"
    root = failures[0]
    text = "\n".join((root.message, f"{root.exc_type}: {root.message}", root.first.text))
    assert is_type(root, want["exc_type"]) and want["message_contains"] in text, (case["slug"], root.exc_type,
                                                                                   root.message)


# The recorded log written again by a real job, then the end the real one had (stopped with SIGTERM).
REPLAY = """\
import os, signal, sys
data = open(sys.argv[1], "rb").read()
step = 4096
for i in range(0, len(data), step):
    os.write(1, data[i:i + step])
os.kill(os.getpid(), signal.SIGTERM)
"""


@pytest.mark.slow
def test_the_dashboard_paints_a_speculators_job_from_its_real_log(run_root, tmp_path) -> None:
    pytest.importorskip("textual")
    from app_support import screen_text, wait_until
    from test_app_local import run_screen

    from eaglewatch.tui.app.app import DashboardApp, LaunchRequest

    argv = [sys.executable, "-c", REPLAY, str(CPU_RUN)]
    app = DashboardApp("local", launch=LaunchRequest(argv, name="speculators-datagen"),
                       connect_kwargs={"run_root": str(run_root)})

    async def scenario():
        async with app.run_test(size=(120, 40), notifications=True) as pilot:
            screen = await wait_until(pilot, lambda: run_screen(app), 60, what="run screen")
            await wait_until(pilot, lambda: screen.model.snapshot().exit_text, 120, what="the job's end")
            await wait_until(pilot, lambda: "speculators data generation" in screen_text(app), 30,
                             what="the job kind painted")
            text = await wait_until(pilot, lambda: "10/24" in screen_text(app) and screen_text(app), 30,
                                    what="the samples painted")
            assert "failed 10" in text
            await wait_until(pilot, lambda: "pin_memory=True requires" in screen_text(app), 30,
                             what="the server's root cause painted")

    asyncio.run(scenario())


from agent_support import run_root  # noqa: E402,F401  (fixture)
