"""What the H200 showed (tests/fixtures/gpu/h200_wave2/, BENCHMARKS.md "Feeding and the disk on an H200" and
"speculators train on an H200"), re-derived from the raw readings with today's code.

The ratios are recomputed from each run's tokens and seconds, not read from the printed tables; the loss curve is
parsed from the trainer's own log; the trainer's crash with its fused loss kernel goes through today's decoder.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from test_decode_real_logs import decode_bytes

ROOT = Path(__file__).resolve().parent.parent
H200 = ROOT / "tests" / "fixtures" / "gpu" / "h200_wave2"
sys.path.insert(0, str(ROOT / "bench"))

from speculators_loss import loss_curve, validation_losses  # noqa: E402


def _rate(run: dict) -> float:
    return run["tokens"] / run["extract_s"]


def test_default_flags_reach_the_bare_engine_on_both_length_shapes_in_one_run() -> None:
    figures = json.loads((H200 / "feeding.json").read_text())
    results = figures["results"]
    assert set(results) == {"uniform", "lognormal"}
    for kind, runs in results.items():
        bare, default = runs["bare"][0], runs["default"][0]
        assert bare["tokens"] == default["tokens"] == figures["totals"][kind][1]
        assert bare["connector"] == "stock"
        ratio = _rate(default) / _rate(bare)
        assert ratio >= 0.95, f"{kind}: eaglewatch at {ratio:.2f}x bare vLLM"


def test_the_disk_bound_run_keeps_up_with_dd_with_the_same_durability() -> None:
    disk = json.loads((H200 / "disk.json").read_text())
    assert disk["dirty_limits"].startswith("set:"), "the disk was not made the limit"
    for ew, dd in zip(disk["eaglewatch"], disk["dd"]):
        assert abs(ew["bytes"] - dd["bytes"]) / dd["bytes"] < 0.01  # the same bytes both ways
        ew_rate = ew["bytes"] / (ew["extract_s"] + ew["sync_s"])  # durable at the end: the closing sync counts
        dd_rate = dd["bytes"] / dd["seconds"]
        assert ew_rate / dd_rate >= 0.9
        # Disk-bound indeed: far below the engine's own speed on the same GPU (about 200k tokens/s).
        assert ew["tokens"] / ew["extract_s"] < 100_000


def test_speculators_train_on_our_output_ran_its_steps_and_the_loss_fell() -> None:
    text = (H200 / "speculators-train.log").read_text(errors="replace")
    curve = loss_curve(text)
    steps = [step for step, _ in curve]
    assert steps[0] == 0 and max(steps) >= 300 and steps == sorted(steps)
    first, last = curve[0][1], min(loss for step, loss in curve if step >= 250)
    assert last < 0.5 * first, (first, last)
    assert validation_losses(text)
    assert "error_records" not in text or "error_records=0" in text
    record = json.loads((H200 / "speculators.json").read_text())
    assert record["target_layer_ids"] == [2, 8, 13] and record["final_layer_id"] == 16


def test_the_trainers_fused_loss_crash_decodes_to_its_dynamo_assertion() -> None:
    _, state = decode_bytes((H200 / "speculators-train-fused-loss.log").read_bytes())
    root = state.failures_ranked()[0]
    assert root.exc_type == "AssertionError"
    assert "is already tracked for mutation" in root.message
