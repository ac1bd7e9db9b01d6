"""The decoder and the telemetry shaping on logs and samples recorded on real H200s (bench/gpu_extract_run.sh).

Fixtures in tests/fixtures/gpu/ (vLLM 0.26.0, torch 2.11 + CUDA 13.0, a 1.0 B random Llama in bf16, 9 shards, 512
samples of 1,024 tokens, layers 2 8 13 16; install and job paths rewritten to /opt/venv and /srv/eagle):

* ``h200_eaglewatch_vllm026_extract.log``: ``eaglewatch extract --engine vllm`` on one H200. The engine core runs
  in-process (the default), so at TP=1 vLLM prints no process prefix: one lane;
* ``h200_bare_vllm026_extract.log``: bare vLLM with its stock hidden-states connector on the other GPU, engine core
  in its own process: an ``EngineCore`` lane;
* ``h200x2_eaglewatch_vllm026_tp2.log``: the same extraction at ``--tp-size 2`` on two H200s: ``Worker_TP0`` and
  ``Worker_TP1`` lanes. It ran to the end: vLLM #51016's page-size assertion did not appear on 0.26.0 here;
* ``h200_extract_telemetry.jsonl``: the telemetry sampler's stream during the first run (the first sample, then
  the last 40 s: model loaded, KV cache allocated, extraction under load, GPU memory released).

The logs are decoded by today's decoder. Of the telemetry, only the stream was kept, not the raw NVML readings it was
shaped from (tests/test_telemetry_recorded.py has a recording with both), so :func:`telemetry` rebuilds the readings
from it (its GPU fields carry NVML's values one for one, in other units) and shapes them again with today's code:
which process is the job's, its rank label, throttle names and the rendered lines are today's. What that cannot
make again is checked as recorded, and says so: the host part (the job's process list, the output disk) and the
namespace check's input (every NVML pid existed there).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from eaglewatch import protocol
from eaglewatch.pipeline.telemetry import ranks_from_log, render_lines, shape_gpus
from eaglewatch.decode import BarUpdate, DecodeState, decode_bytes

FIXTURES = Path(__file__).parent / "fixtures" / "gpu"
EAGLEWATCH_RUN = "h200_eaglewatch_vllm026_extract.log"
BARE_RUN = "h200_bare_vllm026_extract.log"
TP2_RUN = "h200x2_eaglewatch_vllm026_tp2.log"
SHARDS = "Loading safetensors checkpoint shards"
GIB = 1 << 30


def decode(name: str) -> tuple[list[Any], DecodeState]:
    return decode_bytes((FIXTURES / name).read_bytes())


def lane_names(state: DecodeState) -> list[str]:
    return sorted(lane.name for lane in state.lanes_list())


def shard_progress(events: list[Any], lane: str) -> list[tuple[float, float | None]]:
    return [(e.n, e.total) for e in events if isinstance(e, BarUpdate) and e.desc == SHARDS and e.lane == lane]


def bar(state: DecodeState, lane: str, desc: str):
    found = [b for b in state.bars_list() if b.lane == lane and b.desc == desc]
    assert len(found) == 1, [(b.lane, b.desc) for b in state.bars_list()]
    return found[0]


# ---------------------------------------------------------------------------------------------------- the logs


@pytest.mark.parametrize("name", [EAGLEWATCH_RUN, BARE_RUN, TP2_RUN])
def test_successful_gpu_runs_have_no_failures(name: str) -> None:
    _, state = decode(name)
    assert state.failures_ranked() == []
    assert state.root_cause() is None
    assert state.facts["vllm_version"] == "0.26.0"


@pytest.mark.parametrize("name", [EAGLEWATCH_RUN, BARE_RUN, TP2_RUN])
def test_cuda_and_flashinfer_start_up_lines_are_ordinary_lines(name: str) -> None:
    text = (FIXTURES / name).read_text()
    for line in ("Using FLASH_ATTN attention backend", "Using FlashAttention version 3",
                 "flashinfer.jit: [Autotuner]: Autotuning process starts", "Using FlashInfer for top-p & top-k"):
        assert line in text
    _, state = decode(name)
    assert not any("flash" in (g.exc_type or "").lower() for g in state.warnings_ranked())


def test_eaglewatch_run_in_process_engine_core_is_one_lane_with_both_bars() -> None:
    events, state = decode(EAGLEWATCH_RUN)
    # One lane for vLLM's output; torch's own exit warning, "[rank0]:[W1130 ...] destroy_process_group() was not
    # called", carries its distributed prefix and lands in a lane of that name.
    assert lane_names(state) == ["main", "rank0"]
    assert state.facts["tensor_parallel_size"] == 1
    progress = shard_progress(events, "main")
    assert (3, 9) in progress and (6, 9) in progress and progress[-1] == (9, 9)
    shards = bar(state, "main", SHARDS)
    assert (shards.last.n, shards.last.total, shards.last.percent) == (9, 9, 100)
    extracting = bar(state, "main", "Extracting hidden states")
    assert (extracting.last.n, extracting.last.total, extracting.last.unit) == (512, 512, "sample")


def test_bare_run_has_an_engine_core_lane_holding_the_shard_bar() -> None:
    events, state = decode(BARE_RUN)
    assert lane_names(state) == ["EngineCore", "main"]
    engine = state.lane_of("EngineCore")
    assert engine is not None and engine.kind == "engine" and engine.pid == 1923
    progress = shard_progress(events, "EngineCore")
    assert (3, 9) in progress and progress[-1] == (9, 9)
    assert bar(state, "main", "Processed prompts").last.n == 512


def test_tp2_run_has_one_lane_per_worker_rank() -> None:
    events, state = decode(TP2_RUN)
    assert lane_names(state) == ["Worker_TP0", "Worker_TP1", "main"]
    assert state.facts["tensor_parallel_size"] == 2
    for rank, pid in ((0, 2651), (1, 2652)):
        lane = state.lane_of(f"Worker_TP{rank}")
        assert lane is not None and lane.kind == "worker" and lane.pid == pid and lane.ranks == (("TP", rank),)
        # The worker printed a bare "(Worker pid=N)" before its rank was known: still the same lane.
        assert lane.aliases == ["Worker", f"Worker_TP{rank}"]
    progress = shard_progress(events, "Worker_TP0")
    assert (3, 9) in progress and progress[-1] == (9, 9)
    assert bar(state, "main", "Extracting hidden states").last.n == 512


def test_tp2_run_did_not_hit_the_page_size_assertion() -> None:
    text = (FIXTURES / TP2_RUN).read_text()
    assert "page_size_padded" not in text
    assert "phase: done (512 samples" in text
    _, state = decode(TP2_RUN)
    assert all(g.hint is None or g.hint.id != "vllm_51016_page_size" for g in state.failures_ranked())


def test_rank_labels_from_the_gpu_logs() -> None:
    assert ranks_from_log((FIXTURES / TP2_RUN).read_bytes()) == {2651: "Worker_TP0", 2652: "Worker_TP1"}
    assert ranks_from_log((FIXTURES / BARE_RUN).read_bytes()) == {1923: "EngineCore"}
    assert ranks_from_log((FIXTURES / EAGLEWATCH_RUN).read_bytes()) == {}


# ----------------------------------------------------------------------------------------------- the telemetry


def recorded_telemetry() -> list[dict[str, Any]]:
    return [protocol.decode(line) for line in (FIXTURES / "h200_extract_telemetry.jsonl").read_bytes().splitlines()]


# Clock event reasons by name, from nvml.h (the test's own copy: the names are what the shaping is checked for).
CLOCK_EVENT_BITS = {"sw_power_cap": 0x4, "hw_slowdown": 0x8, "sync_boost": 0x10, "sw_thermal": 0x20,
                    "hw_thermal": 0x40, "hw_power_brake": 0x80}


def raw_reading(gpu: dict[str, Any]) -> dict[str, Any]:
    """A shaped GPU of the stream turned back into the raw NVML reading it came from."""
    assert gpu["error"] is None  # every query answered in this run: no errors to rebuild
    return {
        "index": gpu["index"], "name": gpu["name"], "uuid": gpu["uuid"],
        "memory": {"total": gpu["mem_total"], "used": gpu["mem_used"], "reserved": gpu["mem_reserved"],
                   "free": gpu["mem_total"] - gpu["mem_used"] - gpu["mem_reserved"]},
        "utilization": {"gpu": gpu["util_gpu"], "memory": gpu["util_mem"]},
        "temperature_c": gpu["temp_c"],
        "power_mw": round(gpu["power_w"] * 1000),
        "power_limit_mw": round(gpu["power_limit_w"] * 1000),
        "sm_clock_mhz": gpu["sm_clock_mhz"],
        "clock_event_mask": sum(CLOCK_EVENT_BITS[name] for name in (gpu["throttle"] or "").split(",") if name),
        "processes": [{"pid": proc["pid"], "used_mem": proc["used_mem"]} for proc in gpu["processes"]],
        "errors": {},
    }


def telemetry() -> list[dict[str, Any]]:
    """The run's stream with its GPU part made again by today's shaping (see the module's docstring)."""
    ranks = ranks_from_log((FIXTURES / EAGLEWATCH_RUN).read_bytes())
    messages = []
    for message in recorded_telemetry():
        readings = [raw_reading(gpu) for gpu in message["gpus"]]
        reported = {proc["pid"] for gpu in readings for proc in gpu["processes"]}
        job_tree = {proc["pid"] for proc in message["host"]["procs"]}  # as the host sampler saw it
        gpus, mismatch, note = shape_gpus(readings, job_pids=job_tree, ranks=ranks, visible_pids=reported)
        messages.append({**message, "gpus": gpus, "pid_namespace_mismatch": mismatch, "pid_namespace_note": note})
    return messages


def job_root(message: dict[str, Any]) -> int | None:
    procs = message["host"]["procs"]
    return procs[0]["pid"] if procs else None


def test_telemetry_is_protocol_messages_for_both_gpus() -> None:
    recorded = recorded_telemetry()
    assert len(recorded) == 41
    for message, ours in zip(recorded, telemetry(), strict=True):
        assert message["type"] == protocol.MSG_TELEMETRY and message["nvml"] is None
        assert [g["name"] for g in message["gpus"]] == ["NVIDIA H200", "NVIDIA H200"]
        # Shaped again today, the rebuilt readings give what the sampler sent.
        assert ours["gpus"] == message["gpus"]
        assert ours["pid_namespace_mismatch"] is message["pid_namespace_mismatch"] is False


def test_per_process_gpu_memory_is_mapped_to_the_job() -> None:
    loaded = [m for m in telemetry() if m["gpus"][0]["processes"]]
    assert len(loaded) >= 30
    for message in loaded:
        gpu0, gpu1 = message["gpus"]
        (proc,) = gpu0["processes"]
        # The extraction process itself holds the GPU (in-process engine core), and it is the job's root (the
        # process list is the recording's; that it makes the row the job's is today's shaping).
        assert proc["in_job"] is True and proc["pid"] == job_root(message) == 1296
        # No vLLM prefix at TP=1 in-process, so no rank label.
        assert proc["rank"] is None
        # Only the recording: the process is all of the GPU's used memory, to within the driver's bookkeeping.
        assert abs(gpu0["mem_used"] - proc["used_mem"]) < 64 << 20
        # The bare vLLM run on GPU 1 is another process tree: shown, not attributed to the job.
        for other in gpu1["processes"]:
            assert other["in_job"] is False and other["pid"] == 1923
    peak = max(m["gpus"][0]["processes"][0]["used_mem"] for m in loaded)
    assert 120 * GIB < peak < 130 * GIB  # only the recording: weights + 0.9 of the card as KV cache
    assert any("pid 1296  job" in line for line in render_lines(loaded[-1]))


def test_telemetry_under_load_then_released() -> None:
    messages = telemetry()
    busy = [m for m in messages if (m["gpus"][0]["util_gpu"] or 0) >= 70]
    assert busy and all(m["gpus"][0]["processes"] for m in busy)
    assert max(m["gpus"][0]["power_w"] for m in busy) > 300
    assert any("sw_power_cap" in (m["gpus"][0]["throttle"] or "") for m in busy)
    # Only the recording (the host part): the output folder fills while the job runs, 512 files of 16.8 MB, plus
    # manifest and events; at the end the job's process tree is empty.
    assert max(m["host"]["disk"]["output_files"] for m in messages) >= 286
    last = messages[-1]
    assert last["gpus"][0]["processes"] == [] and last["gpus"][0]["mem_used"] == 0
    assert last["host"]["procs"] == []
    # The other job still holds its GPU, and is not taken for ours.
    assert [(p["pid"], p["in_job"]) for p in last["gpus"][1]["processes"]] == [(1923, False)]
