"""A snapshot of the fleet view: a fixed Slurm job of four ranks (one extracting, one failed with the real crash log's
root cause, one done, one pending), ranks' models from real logs and real H200 telemetry, fixed clocks.

Update after an intended change of the look: pytest tests/test_fleet_snapshots.py --snapshot-update
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("textual")
pytest.importorskip("pytest_textual_snapshot")

from app_support import H200_STREAM, crashed_model, extracting_model, wait_until

from eaglewatch.tui.app.app import DashboardApp
from eaglewatch.tui.app.screens.fleet import FleetScreen
from eaglewatch.tui.runstate.fleet import FleetModel, FleetThresholds


def fixed_fleet() -> FleetModel:
    extracting, crashed = extracting_model(), crashed_model()

    def rank(r, node, run, state, summary=None, **fields):
        return {"rank": r, "host": None, "run": run, "run_dir": None, "node": node, "sched_state": state,
                "sched_reason": None, "pending_s": None, "elapsed_s": None, "exit_code": None, "summary": summary,
                **fields}

    done = {"run": "20251130-040905-9c01aa-llama-rank2", "state": "exited", "started_at": 900.0,
            "exit": {"code": 0, "ended_at": 1_010.0}}
    fleet = FleetModel(FleetThresholds(pending_after_s=600))
    fleet.set_snapshot({
        "job": "20251130-040900-77e1b2-llama", "name": "llama-70b", "scheduler": "slurm", "target": "login1",
        "created_at": 900.0, "world_size": 4, "output_dir": "/shared/out/llama", "scheduler_job_id": "48213",
        "ranks": [
            rank(0, "gpu-node-01", extracting.snapshot().run, "RUNNING", {"run": extracting.snapshot().run}),
            rank(1, "gpu-node-02", crashed.snapshot().run, "FAILED", {"run": crashed.snapshot().run}, exit_code=1),
            rank(2, "gpu-node-03", done["run"], "COMPLETED", done, exit_code=0),
            rank(3, None, None, "PENDING", sched_reason="Resources", pending_s=905.0),
        ],
    })
    fleet.set_rank_model(0, extracting)
    fleet.set_rank_model(1, crashed)
    sample = json.loads(H200_STREAM.read_text().splitlines()[29])
    fleet.feed_node_gpus("gpu-node-01", sample["gpus"])
    return fleet


@pytest.mark.parametrize("size", [(80, 24), (120, 36)], ids=["80x24", "120x36"])
def test_fleet_view(snap_compare, size):
    fleet = fixed_fleet()
    app = DashboardApp("login1", fleet=fleet)

    async def settle(pilot):
        # The first redraw rings the job's alerts (rank 1 failed, rank 3 pending) as toasts: cleared for the picture.
        await wait_until(pilot, lambda: isinstance(app.screen, FleetScreen) and app.screen.redraws > 0
                         and len(app._notifications) >= len(fleet.alerts_since(0)) == 2, 30,
                         what="the fleet view's first redraw and its alerts")
        app.clear_notifications()
        await wait_until(pilot, lambda: not app.screen.query("Toast"), 30, what="the toasts gone")

    assert snap_compare(app, terminal_size=size, run_before=settle)
