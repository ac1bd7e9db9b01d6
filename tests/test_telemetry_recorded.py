"""Shaping, rank mapping, PID-namespace checks and rendering, fed by what was recorded on real H200s.

Fixtures (tests/fixtures/telemetry/, recorded with bench/telemetry_gpu_run.sh): ``h200_*`` on one H200, ``h200x2_*`` on
two. Each has the raw NVML readings and the process context they were shaped with (``raw``: the job's process tree,
the pids visible in the sampler's PID namespace, the rank labels), the protocol lines the sampler sent then
(``stream``), the workload's log, the release wait after stopping it, and nvidia-smi's view (``console``).

The GPU figures the tests check are made again here, by today's code (:func:`reshaped`: ``NvmlSource`` reading the
recorded NVML answers, then ``shape_gpus``), so a change to the reading or the shaping shows; the recorded stream is
only compared with that (:func:`test_reshaping_the_recorded_readings_reproduces_the_stream`). What no code here can
make again is taken as recorded, and said so where it is checked: the sample times and interval (the sampler's clock
on the GPU machine) and the host part (psutil there).
"""

from __future__ import annotations

import copy
import functools
import json
import re
import statistics
from pathlib import Path
from typing import Any

import pytest

from eaglewatch import protocol
from eaglewatch.pipeline.telemetry import NvmlSource, ranks_from_log, render_lines, shape_gpus, throttle_reason
from telemetry_replay import ReplayNvml

FIXTURES = Path(__file__).parent / "fixtures" / "telemetry"
RECORDINGS = ("h200", "h200x2")
MIB = 1 << 20


def stream(name: str) -> list[dict[str, Any]]:
    return [protocol.decode(line) for line in (FIXTURES / f"{name}_stream.jsonl").read_bytes().splitlines()]


def raw(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (FIXTURES / f"{name}_raw.jsonl").read_text().splitlines()]


def recorded_ranks(record: dict[str, Any]) -> dict[int, str]:
    return {int(pid): label for pid, label in record["ranks"].items()}


@functools.lru_cache(maxsize=None)
def _reshaped(name: str) -> tuple[str, ...]:
    records = raw(name)
    recorded = stream(name)
    # NVML's pids as recorded (no offset): the recorded visibility below says which of them existed there.
    pids = {proc["pid"] for record in records for gpu in record["gpus"] for proc in gpu["processes"] or []}
    source = NvmlSource(module=ReplayNvml([record["gpus"] for record in records], pid_map={pid: pid for pid in pids}))
    lines = []
    for record, sent in zip(records, recorded, strict=True):
        gpus, mismatch, note = shape_gpus(source.read(), job_pids=set(record["job_pids"]),
                                          ranks=recorded_ranks(record), visible_pids=record["visible_pids"])
        message = {
            "type": protocol.MSG_TELEMETRY,
            "t": record["t"],  # as recorded: the GPU machine's clock
            "interval_s": sent["interval_s"],  # as recorded: the sampler's setting there
            "driver": source.driver,
            "nvml": source.reason,
            "gpus": gpus,
            "host": sent["host"],  # as recorded: psutil on the GPU machine
            "pid_namespace_mismatch": mismatch,
            "pid_namespace_note": note,
        }
        lines.append(protocol.encode(message).decode())
    return tuple(lines)


def reshaped(name: str) -> list[dict[str, Any]]:
    """The recording's messages as today's code makes them from its raw readings (see the module's docstring)."""
    return [protocol.decode(line) for line in _reshaped(name)]


def meta(name: str) -> dict[str, Any]:
    lines = (FIXTURES / f"{name}_release.jsonl").read_text().splitlines()
    return next(record for record in map(json.loads, lines) if record["kind"] == "meta")


def workload_log(name: str) -> bytes:
    return (FIXTURES / f"{name}_workload.log").read_bytes()


def rows(message: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    return [(gpu["index"], proc) for gpu in message["gpus"] for proc in gpu["processes"]]


@pytest.mark.parametrize("name", RECORDINGS)
def test_one_protocol_message_per_sample_holding_every_gpu(name: str) -> None:
    messages = reshaped(name)
    assert len(messages) >= 60
    gpu_count = len(raw(name)[0]["gpus"])
    assert gpu_count == (2 if name == "h200x2" else 1)
    for message in messages:
        assert message["type"] == protocol.MSG_TELEMETRY and message["v"] == protocol.PROTOCOL_VERSION
        assert message["nvml"] is None and message["driver"]
        assert [gpu["index"] for gpu in message["gpus"]] == list(range(gpu_count))
        assert all(gpu["name"] == "NVIDIA H200" and gpu["uuid"].startswith("GPU-") for gpu in message["gpus"])
    # Only the recording: the sampler kept its interval on the GPU machine (times and interval as recorded).
    gaps = [b["t"] - a["t"] for a, b in zip(messages, messages[1:])]
    assert statistics.median(gaps) == pytest.approx(messages[0]["interval_s"], abs=0.05)


@pytest.mark.parametrize("name", RECORDINGS)
def test_reshaping_the_recorded_readings_reproduces_the_stream(name: str) -> None:
    # Today's reading and shaping of the raw readings give what the sampler sent on the GPU machine. When a change
    # to the shaping is meant, this is the one test that needs the recording made again.
    for index, (ours, sent) in enumerate(zip(reshaped(name), stream(name), strict=True)):
        for key in ("gpus", "driver", "nvml", "pid_namespace_mismatch", "pid_namespace_note"):
            assert ours[key] == sent[key], f"sample {index}: {key}"


@pytest.mark.parametrize("name", RECORDINGS)
def test_workers_carry_their_rank_and_the_outsider_does_not(name: str) -> None:
    info = meta(name)
    ranks = ranks_from_log(workload_log(name))
    workers, stranger = set(info["worker_pids"]), info["stranger_pid"]
    both_labelled = 0
    for message in reshaped(name):
        labelled = set()
        for _, proc in rows(message):
            if proc["pid"] == stranger:
                assert proc["rank"] is None and proc["in_job"] is False
            elif proc["pid"] in workers:
                assert proc["in_job"] is True
                # None only before the worker's first log line; never someone else's rank.
                assert proc["rank"] in (None, ranks[proc["pid"]])
                if proc["rank"]:
                    labelled.add(proc["rank"])
        both_labelled += labelled == {"Worker_TP0", "Worker_TP1"}
    assert both_labelled >= 40


def test_on_two_gpus_each_rank_sits_on_its_own_gpu() -> None:
    ranks = ranks_from_log(workload_log("h200x2"))
    stranger = meta("h200x2")["stranger_pid"]
    for message in reshaped("h200x2"):
        for index, proc in rows(message):
            if proc["rank"] == "Worker_TP0" or proc["pid"] == stranger:
                assert index == 0
            elif proc["rank"] == "Worker_TP1":
                assert index == 1
    assert "Worker_TP1" in ranks.values()


def torch_reserved(log: bytes, rank: str, step: str) -> int:
    pattern = rb"\(%s pid=\d+\) INFO .*%s.*reserved=(\d+)" % (rank.encode(), step.encode())
    return int(re.search(pattern, log).group(1))


@pytest.mark.parametrize("name", RECORDINGS)
def test_per_rank_gpu_memory_follows_the_allocations_in_the_log(name: str) -> None:
    log = workload_log(name)
    peak: dict[str, int] = {}
    for message in reshaped(name):
        for _, proc in rows(message):
            if proc["rank"]:
                peak[proc["rank"]] = max(peak.get(proc["rank"], 0), proc["used_mem"])
    reserved = {rank: torch_reserved(log, rank, "allocated step 2") for rank in ("Worker_TP0", "Worker_TP1")}
    # TP0 allocated twice TP1's steps: NVML's per-process figures differ by exactly what torch reserved.
    assert peak["Worker_TP0"] - peak["Worker_TP1"] == pytest.approx(
        reserved["Worker_TP0"] - reserved["Worker_TP1"], abs=16 * MIB
    )
    for rank in reserved:
        overhead = peak[rank] - reserved[rank]  # CUDA context and library workspaces, outside torch's pool
        assert 256 * MIB < overhead < 2048 * MIB


@pytest.mark.parametrize("name", RECORDINGS)
def test_gpu_readings_are_consistent(name: str) -> None:
    for message in reshaped(name):
        for gpu in message["gpus"]:
            assert 0 <= gpu["mem_used"] <= gpu["mem_total"]
            assert sum(p["used_mem"] for p in gpu["processes"]) <= gpu["mem_used"] + 64 * MIB
            assert 0 <= gpu["util_gpu"] <= 100 and 0 <= gpu["util_mem"] <= 100
            assert 0 < gpu["power_w"] <= gpu["power_limit_w"] * 1.05
            assert 20 <= gpu["temp_c"] <= 95 and gpu["sm_clock_mhz"] > 0
            if gpu["util_gpu"] == 0 and not gpu["processes"]:
                assert gpu["throttle"] is None
    loaded = [g for m in reshaped(name) for g in m["gpus"] if g["util_gpu"] >= 90]
    # Flat out, an H200 sits at its power limit: the clocks are held back by the software power cap.
    assert loaded and sum("sw_power_cap" in (g["throttle"] or "") for g in loaded) >= 0.9 * len(loaded)


@pytest.mark.parametrize("name", RECORDINGS)
def test_stopped_workers_leave_the_stream(name: str) -> None:
    info = meta(name)
    workers = set(info["worker_pids"])
    after = [m for m in reshaped(name) if m["t"] > info["kill_t"] + 1.0]
    assert after and all(not workers & {proc["pid"] for _, proc in rows(m)} for m in after)
    # Only the recording (the host part is psutil's on the GPU machine): the job's process tree is empty too.
    assert all(not m["host"]["procs"] for m in after[1:])
    assert info["released"] is True


def test_nvidia_smi_saw_the_same_per_process_memory() -> None:
    for name in RECORDINGS:
        console = (FIXTURES / f"{name}_console.txt").read_text()
        smi = {(int(pid), int(mib)) for pid, mib in re.findall(r"^(\d+), (\d+) MiB$", console, re.M)}
        ours = {(proc["pid"], proc["used_mem"] // MIB) for m in reshaped(name) for _, proc in rows(m)}
        assert len(smi) >= 5 and smi <= ours


@pytest.mark.parametrize("name", RECORDINGS)
def test_host_pids_in_another_namespace_are_flagged_not_mislabelled(name: str) -> None:
    checked = 0
    for record in raw(name):
        reported = {p["pid"] for g in record["gpus"] for p in g["processes"] or []}
        if not reported:
            continue
        ranks = {int(pid): label for pid, label in record["ranks"].items()}
        # In a container, none of NVML's (host) pids exists here.
        gpus, mismatch, note = shape_gpus(
            record["gpus"], job_pids=set(record["job_pids"]), ranks=ranks, visible_pids=[]
        )
        assert mismatch is True and "namespace" in note
        assert all(p["rank"] is None and p["in_job"] is False for g in gpus for p in g["processes"])
        # Some of them exist here by coincidence, but none is in the job's tree (which is not empty).
        some = sorted(reported)[:1]
        job = {4_000_000}
        if len(reported) > 1:
            _, mismatch, _ = shape_gpus(record["gpus"], job_pids=job, ranks=ranks, visible_pids=some)
            assert mismatch is True
        # As recorded, in one namespace: no flag, and the rows are labelled.
        _, mismatch, _ = shape_gpus(
            record["gpus"], job_pids=set(record["job_pids"]), ranks=ranks, visible_pids=reported
        )
        assert mismatch is False
        checked += 1
    assert checked >= 60


@pytest.mark.parametrize("name", RECORDINGS)
def test_recorded_messages_render(name: str) -> None:
    messages = reshaped(name)
    for message in messages:
        lines = render_lines(message)
        gpu_lines = [line for line in lines if line.startswith("GPU")]
        assert len(gpu_lines) == len(message["gpus"])
        assert all("NVIDIA H200" in line and "n/a" not in line for line in gpu_lines)
        assert any(line.startswith("host cpu") for line in lines)
        for _, proc in rows(message):
            assert any(f"pid {proc['pid']}  {proc['rank'] or ('job' if proc['in_job'] else 'other')}" in line
                       for line in lines)
    # Readings a GPU cannot give render as n/a.
    message = copy.deepcopy(messages[len(messages) // 2])
    gpu = message["gpus"][0]
    for field in ("power_w", "power_limit_w", "temp_c", "util_gpu", "sm_clock_mhz"):
        gpu[field] = None
    for proc in gpu["processes"]:
        proc["used_mem"] = None
    lines = render_lines(message)
    gpu_line = next(line for line in lines if line.startswith("GPU0"))
    for shown in ("util n/a", "  n/a  ", "n/a/n/a", "sm n/a"):
        assert shown in gpu_line
    for proc in gpu["processes"]:
        row = next(line for line in lines if line.startswith(f"    pid {proc['pid']}  ") and "ppid" not in line)
        assert row.endswith("  n/a")


def test_throttle_reason_names() -> None:
    assert throttle_reason(None) is None and throttle_reason(0) is None
    assert throttle_reason(0x1) is None  # idle is not a throttle
    assert throttle_reason(0x5) == "sw_power_cap"
    assert throttle_reason(0x4 | 0x40) == "sw_power_cap,hw_thermal"
    assert throttle_reason(0x4 | 0x10000) == "sw_power_cap,other(0x10000)"
