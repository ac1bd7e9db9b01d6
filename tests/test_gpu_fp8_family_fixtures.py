"""FP8 storage, the speculators format and stream feeding on a real H200 (tests/fixtures/gpu/h200_fp8_family/,
BENCHMARKS.md "FP8 storage and the speculators format on an H200"), re-derived from the raw readings.

- fp8/: `bench/gpu_speculators_run.sh fp8` on a random 1.0 B Llama: the same 1,024 samples extracted through vLLM
  0.26 in bf16 (native layout) and with `--format speculators --storage fp8` (preflight on), `verify` on both, then
  the unpatched `speculators train --hidden-states-backend fp8` on the fp8 folder.
- bf16-speculators-fp8/ and int4/: `bench/gpu_family_run.sh` with today's stream feeding: the Kimi-K2.5 miniature,
  a DeepSeek-V3 MoE (MLA) and a Qwen3 MoE; the bf16 half with `EXTRACT_ARGS="--format speculators --storage fp8
  --draft-vocab-size 512"`, the INT4 half with default flags.

Bytes per token and tokens/s are recomputed from `du` and the runs' own lines, not read from a table.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from eaglewatch.decode import decode_bytes

ROOT = Path(__file__).resolve().parent.parent
H200 = ROOT / "tests" / "fixtures" / "gpu" / "h200_fp8_family"
FP8 = H200 / "fp8"
sys.path.insert(0, str(ROOT / "bench"))

from speculators_loss import loss_curve  # noqa: E402

LAYERS = [2, 8, 13, 16]


def _tokens() -> int:
    found = re.search(r"data: 1024 samples, (\d+) tokens", (FP8 / "console.txt").read_text())
    assert found
    return int(found.group(1))


def _rate(log: str) -> float:
    found = re.search(r"phase: done \(1024 samples, (\d+) tokens/s\)", (FP8 / log).read_text())
    assert found, log
    return float(found.group(1))


def _bytes() -> dict[str, int]:
    sizes = {}
    for line in (FP8 / "fp8-du.txt").read_text().splitlines():
        size, folder = line.split("\t")
        sizes[folder.rsplit("-", 1)[1]] = int(size)
    return sizes


def test_fp8_files_take_half_the_bytes_per_token_of_bf16() -> None:
    tokens, sizes = _tokens(), _bytes()
    per_token = {kind: size / tokens for kind, size in sizes.items()}
    hidden = 2048
    # bf16: 2 bytes per value; fp8: 1 byte per value plus a float32 scale per token; ids, masks and headers on top.
    assert len(LAYERS) * hidden * 2 <= per_token["bf16"] < len(LAYERS) * hidden * 2 * 1.01
    assert len(LAYERS) * hidden + 4 <= per_token["fp8"] < (len(LAYERS) * hidden + 4) * 1.01
    assert 0.49 < per_token["fp8"] / per_token["bf16"] < 0.51


def test_both_storages_ran_through_the_vllm_connector_and_fp8_is_slower_on_this_host() -> None:
    bf16, fp8 = _rate("fp8-extract-bf16.log"), _rate("fp8-extract.log")
    for log in ("fp8-extract-bf16.log", "fp8-extract.log"):
        text = (FP8 / log).read_text()
        assert "kv_connector='EaglewatchHiddenStatesConnector'" in text and "streamed)" in text
    assert "'storage': 'fp8'" in (FP8 / "fp8-extract.log").read_text()
    # The figure BENCHMARKS.md states: the host's rounding costs fp8 about a third of bf16's speed here.
    assert 0.5 < fp8 / bf16 < 0.8, (fp8, bf16)


def test_fp8_output_passes_verify_with_its_rounding_error_per_layer() -> None:
    report = json.loads((FP8 / "fp8-verify-fp8.json").read_text())
    assert report["passed"] and report["ok"] == report["files"] == 1024 and not report["problems"]
    fp8 = report["fp8"]
    assert fp8["files"] == 1024 and fp8["files_without_record"] == 0
    assert [layer["layer_id"] for layer in fp8["layers"]] == LAYERS
    for layer in fp8["layers"]:
        assert 0.02 < layer["mean_error"] < 0.03 and layer["mean_error"] <= layer["max_error"] < 0.035
    assert report["view"] == {"rows": 1024, "target_layer_ids": [2, 8, 13], "final_layer_id": 16,
                              "hidden_states_backend": "fp8"}
    text = (FP8 / "fp8-verify-fp8.log").read_text()
    assert "stored as fp8" in text and text.rstrip().endswith("verify exit 0")
    rows = re.findall(r"^\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+[\d.]+\s+([\d.]+).*\bpass$", text, re.M)
    assert [int(r[0]) for r in rows] == LAYERS
    for _, engine, floor, limit in rows:  # against HF: the engine's error is the floor's, the rounding included
        assert float(engine) <= float(limit) and abs(float(engine) / float(floor) - 1) < 0.05


def test_the_extraction_printed_the_train_command_with_the_fp8_backend() -> None:
    text = (FP8 / "fp8-extract.log").read_text()
    assert "[ok  ] format        speculators" in text and "preflight: passed" in text
    assert ("--target-layer-ids 2 8 13 --draft-vocab-size 512 --hidden-states-backend fp8" in text)
    record = json.loads((FP8 / "fp8-speculators.json").read_text())
    assert record["hidden_states_backend"] == "fp8" and record["rows"] == len(record["sample_ids"]) == 1024
    assert record["tokens"] == _tokens()


def test_speculators_trained_on_the_fp8_folder_and_its_loss_fell() -> None:
    text = (FP8 / "fp8-train.log").read_text(errors="replace")
    assert "hidden_states_backend='fp8'" in text and "data_path='/tmp/gs/out-fp8'" in text
    curve = loss_curve(text)
    steps = [step for step, _ in curve]
    assert steps[0] == 0 and max(steps) >= 250 and steps == sorted(steps)
    assert curve[-1][1] < 0.5 * curve[0][1]
    # The call's time limit ended it after step 250 (`timeout` sends SIGTERM): the decoder names that, not the
    # logging error rich printed earlier on the way.
    _events, state = decode_bytes((FP8 / "fp8-train.log").read_bytes())
    root = state.failures_ranked()[0]
    assert root.exc_type == "RuntimeError" and "killed by signal: Terminated" in root.message


def _json_report(text: str) -> dict:
    """The JSON report of `verify --json`, after the model loader's progress bars (stderr went to the same file)."""
    return json.loads(text[text.index("\n{") + 1:])


FAMILY = {
    "bf16-speculators-fp8": ["deepseek-v3-bf16"],
    "int4": ["deepseek-v3-int4", "qwen3-moe-int4"],
}


@pytest.mark.parametrize("half,name", [(h, n) for h, names in FAMILY.items() for n in names])
def test_the_family_extracts_with_stream_feeding_and_verifies(half: str, name: str) -> None:
    folder = H200 / half
    text = (folder / f"{name}-extract.log").read_text()
    assert "[ok  ] miniature" in text and "streamed)" in text and "phase: done (64 samples" in text
    _events, state = decode_bytes((folder / f"{name}-extract.log").read_bytes())
    assert state.failures_ranked() == []
    report = _json_report((folder / f"{name}-verify.json").read_text())
    assert report["passed"] and report["ok"] == 64
    against = report["against_hf"]
    assert against["passed"] and all(layer["passed"] for layer in against["layers"])
    if half == "bf16-speculators-fp8":
        assert against["floor_model"]["storage"] == "fp8"
        assert "hidden-states-backend fp8" in text and "fp8 rounding error per layer" in text


@pytest.mark.parametrize("half", ["bf16", "int4"])
def test_the_kimi_miniature_passes_with_todays_code(half: str) -> None:
    folder = H200 / ("bf16-speculators-fp8" if half == "bf16" else "int4")
    text = (folder / f"kimi-{half}-preflight.log").read_text()
    assert "preflight: passed (0 failed" in text and "kept MLA 128/64/128 kv_lora_rank 512" in text
    steps = dict(line.split("\t")[:2] for line in (folder / "steps.tsv").read_text().splitlines())
    assert steps[f"kimi-{half}-preflight"] == "0"
