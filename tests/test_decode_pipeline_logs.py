"""The decoder on logs captured from this repo's own pipeline (vLLM CPU build, fault injected in the worker)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

LOGS = Path(__file__).parent / "fixtures" / "pipeline-logs"


def decode_json(name: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "eaglewatch", "decode", "--json", str(LOGS / name)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.parametrize("name", ["eaglewatch_vllm_worker_assert.log", "eaglewatch_vllm_inprocess_assert.log"])
def test_injected_worker_assert_is_the_root_cause(name):
    report = decode_json(name)
    root = report["failures"][0]
    assert root["exc_type"] == "AssertionError" and root["message"] == ""
    assert root["frame"]["function"] == "_submit"
    assert root["frame"]["source"] == "assert self._writes_submitted < self._fault_after"
    # vLLM's own re-raises (EngineDeadError, "Worker failed with error ''") rank after it.
    later = [f["exc_type"] for f in report["failures"][1:]]
    assert "AssertionError" not in later or later.index("AssertionError") > 0


def test_successful_run_has_no_failures_and_finished_bars():
    report = decode_json("eaglewatch_vllm_extract_ok.log")
    assert report["failures"] == []
    bars = {b["desc"]: b for b in report["progress"]}
    shards = bars["Loading safetensors checkpoint shards"]
    assert (shards["n"], shards["total"]) == (8, 8)
    extracting = bars["Extracting hidden states"]
    assert extracting["n"] == extracting["total"] == 64
