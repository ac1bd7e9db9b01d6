"""`eaglewatch decode` on every fixture: the right root cause first, and the JSON fields tools rely on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import pytest

from eaglewatch.cli import main

FIXTURES = Path(__file__).parent / "fixtures"

# fixture -> what the first failure must be: (exc_type, lanes, innermost function, hint id) or None (no failure)
EXPECTED: dict[str, Optional[tuple[str, list[str], Optional[str], Optional[str]]]] = {
    # real vLLM 0.32 / 0.26 captures
    "vllm-logs/crash_extract_pin_memory_runtime.log": (
        "RuntimeError", ["VllmWorker-0"], "_submit_async_write", "pin_memory_without_gpu"),
    "vllm-logs/crash_weight_load_shape_mismatch.log": (
        "AssertionError", ["VllmWorker-0"], "load_row_parallel_weight", "weight_shape_mismatch"),
    "vllm-logs/crash_cpu_mem_util.log": ("ValueError", ["VllmWorker-0"], "__init__", "startup_memory_check"),
    "vllm-logs/crash_spawn_no_main_guard.log": ("RuntimeError", ["main"], "_check_not_importing_main",
                                                "spawn_main_guard"),
    "vllm-logs/llama_extract.log": None,
    "vllm-logs/qwen3_extract.log": None,
    "vllm-logs/llama_extract_tp2.log": None,
    "vllm-logs/llama_extract_tty_pty.log": None,
    "vllm-logs/gpu_h200_vllm026_extract.log": None,
    # forms the captures do not have
    "decode/dp_tp_cuda_oom.log": ("torch.OutOfMemoryError", ["Worker_DP0_TP0", "Worker_DP0_TP1"], "forward_cuda",
                                  "cuda_oom"),
    "decode/vllmworker_rank_nccl.log": ("RuntimeError", ["VllmWorker rank=3"], "NCCL_CHECK", "collective_comm"),
    "decode/exception_group.log": ("ExceptionGroup", ["main"], "__aexit__", "disk_full"),
    "decode/faulthandler_segfault.log": ("Fatal Python error", ["main"], "apply_gptq_marlin_linear",
                                         "killed_signal"),
    "decode/logged_header_every_line.log": ("RuntimeError", ["main"], "load_checkpoint", "safetensors_shard"),
    "decode/block_hashes_assertion.log": ("AssertionError", ["EngineCore"], "build_connector_meta",
                                          "block_hashes_assertion"),
    "decode/worker_killed_sigkill.log": ("ProcessDied", ["VllmWorker-1"], None, "killed_sigkill"),
    "decode/worker_died_silently.log": ("Exception", ["EngineCore"], "wait_for_ready", "died_without_traceback"),
    "decode/page_size_padded_tp2.log": ("AssertionError", ["EngineCore_DP0"], "page_size_bytes",
                                        "vllm_51016_page_size"),
    "decode/api_mismatch_typeerror.log": ("TypeError", ["main"], "__init__", "vllm_api_mismatch"),
    "decode/warning_traceback_survived.log": None,
    "decode/cpp_abort_nccl.log": ("c10::DistBackendError", ["rank1"], "checkTimeout", "collective_comm"),
    "decode/collector_prefixed.log": ("safetensors_rust.SafetensorError", ["main"], "safetensors_weights_iterator",
                                      "safetensors_shard"),
}


def decode_json(path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main(["decode", str(path), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_every_fixture_has_an_expectation() -> None:
    present = {str(p.relative_to(FIXTURES)) for p in FIXTURES.glob("*/*.log")
               if p.parent.name in ("vllm-logs", "decode")}
    assert present == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_root_cause_first(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    doc = decode_json(FIXTURES / name, capsys)
    expected = EXPECTED[name]
    if expected is None:
        assert doc["failures"] == []
        return
    exc_type, lanes, function, hint = expected
    first = doc["failures"][0]
    assert first["exc_type"] == exc_type
    assert first["lanes"] == lanes
    assert (first["frame"] or {}).get("function") == function
    assert (first["hint"] or {}).get("id") == hint
    # Whatever the main process said last is never ranked first.
    for later in doc["failures"][1:]:
        assert later["position"] > first["position"]
    assert "Engine core initialization failed" not in first["message"]
    assert first["exc_type"].rsplit(".", 1)[-1] != "EngineDeadError"


def test_json_document_fields(capsys: pytest.CaptureFixture[str]) -> None:
    doc = decode_json(FIXTURES / "vllm-logs" / "crash_weight_load_shape_mismatch.log", capsys)
    assert doc["schema"] == "eaglewatch.decode/1"
    first = doc["failures"][0]
    for key in ("exc_type", "message", "lanes", "count", "frame", "hint", "traceback"):
        assert key in first
    assert first["frame"] == {
        "file": "/opt/venv/lib/python3.11/site-packages/vllm/model_executor/parameter.py",
        "line": 225,
        "function": "load_row_parallel_weight",
        "source": "assert self.data.shape == loaded_weight.shape",
        "kind": "library",
    }
    assert first["message"] == "" and first["count"] == 1
    assert first["traceback"].splitlines()[-1] == "AssertionError"
    assert [f["exc_type"] for f in doc["failures"]] == ["AssertionError", "Exception", "RuntimeError"]
    assert doc["failures"][1]["count"] == 2  # the EngineCore's logger and its process bootstrap
    (bar,) = doc["progress"]
    assert {k: bar[k] for k in ("lane", "desc", "n", "total", "rate")} == {
        "lane": "main", "desc": "Loading safetensors checkpoint shards", "n": 4, "total": 8, "rate": 221.4}
    assert bar["eta_s"] == pytest.approx(4 / 221.4, abs=0.01)
    lanes = {lane["name"]: lane for lane in doc["lanes"]}
    assert set(lanes) == {"main", "MainProcess", "EngineCore", "VllmWorker-0"}
    assert lanes["VllmWorker-0"]["pid"] == 803 and lanes["VllmWorker-0"]["lines"] == 81
    assert doc["facts"]["vllm_version"] == "0.32.0" and doc["facts"]["exit_status"] == 1


def test_warnings_are_not_failures(capsys: pytest.CaptureFixture[str]) -> None:
    doc = decode_json(FIXTURES / "decode" / "warning_traceback_survived.log", capsys)
    assert doc["failures"] == []
    (warning,) = doc["warnings"]
    assert warning["exc_type"] == "ValueError" and warning["lanes"] == ["APIServer"] and warning["level"] == "WARNING"
    assert doc["progress"][0]["n"] == 10 and doc["progress"][0]["eta_s"] == 0


def test_tp_workers_with_the_same_name_stay_apart(capsys: pytest.CaptureFixture[str]) -> None:
    doc = decode_json(FIXTURES / "vllm-logs" / "llama_extract_tp2.log", capsys)
    names = [lane["name"] for lane in doc["lanes"]]
    assert "Worker_TP0" in names and "Worker_TP1" in names and "Worker" not in names
    bars = {bar["desc"]: bar for bar in doc["progress"]}
    assert bars["Loading safetensors checkpoint shards"]["n"] == 8
    assert bars["Processed prompts"]["n"] == 3 and bars["Processed prompts"]["done"]


def test_gpu_log_bars_per_lane(capsys: pytest.CaptureFixture[str]) -> None:
    doc = decode_json(FIXTURES / "vllm-logs" / "gpu_h200_vllm026_extract.log", capsys)
    shards = [bar for bar in doc["progress"] if bar["desc"] == "Loading safetensors checkpoint shards"]
    assert [(bar["lane"], bar["n"], bar["total"]) for bar in shards] == [("EngineCore", 9, 9)]
    assert all(bar["done"] for bar in doc["progress"])


def test_text_output_names_the_root_cause_and_hint(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["decode", str(FIXTURES / "decode" / "dp_tp_cuda_oom.log")]) == 0
    out = capsys.readouterr().out
    assert "Root cause: torch.OutOfMemoryError: CUDA out of memory." in out
    assert "\u00d72 ranks: Worker_DP0_TP0\u20131" in out
    assert "hint: GPU out of memory" in out and "requested=3.50 GiB" in out
    assert out.index("torch.OutOfMemoryError") < out.index("[re-raised]") < out.index("[final report]")


def test_missing_file_is_a_user_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["decode", str(tmp_path / "nope.log")]) == 2
    assert "no such file" in capsys.readouterr().err
