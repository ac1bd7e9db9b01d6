"""NvmlSource and TelemetrySampler driven by NVML readings recorded on a real H200 (replayed: no GPU here), with the
host side real: the job whose pids NVML reports is a real local process tree."""

from __future__ import annotations

import copy
import re
import subprocess
import sys

import psutil
import pytest

from eaglewatch import protocol
from eaglewatch.pipeline.telemetry import NvmlSource, RankMap, TelemetrySampler, render_lines
from eaglewatch.pipeline.telemetry.host import HostSampler
from telemetry_replay import FIXTURES, ReplayNvml, load_jsonl, offset_pid, raw_readings

ERROR_UNKNOWN = 999
ERROR_GPU_IS_LOST = 15
ERROR_DRIVER_NOT_LOADED = 9


def recorded_meta(name: str) -> dict:
    return next(r for r in load_jsonl(f"{name}_release.jsonl") if r["kind"] == "meta")


def with_offset_pids(reading: list[dict]) -> list[dict]:
    out = copy.deepcopy(reading)
    for gpu in out:
        for proc in gpu.get("processes") or []:
            proc["pid"] = offset_pid(proc["pid"])
    return out


@pytest.mark.parametrize("name", ["h200", "h200x2"])
def test_source_turns_the_recorded_queries_back_into_the_recorded_readings(name: str) -> None:
    readings = raw_readings(f"{name}_raw.jsonl")
    replay = ReplayNvml(readings)
    source = NvmlSource(module=replay)
    assert source.available and source.reason is None and source.driver == "580.159.04"
    assert [d.name for d in source.devices] == [g["name"] for g in readings[0]]
    for reading in readings:
        assert source.read() == with_offset_pids(reading)
    assert replay.initialised == 1


@pytest.fixture
def local_job():
    """A real process tree standing in for the recorded job: a launcher with two workers, plus an outsider."""
    launcher = subprocess.Popen(
        [sys.executable, "-c",
         "import subprocess, sys, time\n"
         "ws = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']) for _ in range(2)]\n"
         "print(*[w.pid for w in ws], flush=True)\n"
         "time.sleep(120)\n"],
        stdout=subprocess.PIPE, text=True,
    )
    workers = [int(tok) for tok in launcher.stdout.readline().split()]
    outsider = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield launcher.pid, workers, outsider.pid
    for pid in workers:
        psutil.Process(pid).kill()
    for proc in (launcher, outsider):
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("name", ["h200", "h200x2"])
def test_replayed_gpu_processes_map_onto_the_real_job(name: str, local_job) -> None:
    launcher, local_workers, outsider = local_job
    info = recorded_meta(name)
    pid_map = dict(zip(info["worker_pids"], local_workers))
    pid_map[info["job_pid"]] = launcher
    pid_map[info["stranger_pid"]] = outsider
    # The job's log as it would read here: the recorded lines, with the recorded pids rewritten.
    log = (FIXTURES / f"{name}_workload.log").read_bytes()
    log = re.sub(rb"pid=(\d+)", lambda m: b"pid=%d" % pid_map.get(int(m.group(1)), 0), log)
    ranks = RankMap()
    ranks.feed_log(log)
    expected_rank = {pid_map[int(pid)]: label for pid, label in recorded_ranks(name).items()}

    readings = raw_readings(f"{name}_raw.jsonl")
    sampler = TelemetrySampler(
        interval_s=1.0, job_pids_fn=lambda: [launcher], rank_map_fn=ranks,
        nvml=NvmlSource(module=ReplayNvml(readings, pid_map=pid_map)), host=HostSampler(),
    )
    seen_workers = 0
    for reading in readings:
        message = protocol.decode(sampler.sample_line())
        assert message["pid_namespace_mismatch"] is False
        assert len(message["gpus"]) == len(reading)
        for gpu, recorded in zip(message["gpus"], reading):
            assert gpu["mem_used"] == recorded["memory"]["used"]
            used = {pid_map[p["pid"]]: p["used_mem"] for p in recorded["processes"]}
            for proc in gpu["processes"]:
                assert proc["used_mem"] == used[proc["pid"]]
                if proc["pid"] == outsider:
                    assert proc["in_job"] is False and proc["rank"] is None
                else:
                    assert proc["in_job"] is True and proc["rank"] == expected_rank[proc["pid"]]
                    seen_workers += 1
        assert {p["pid"] for p in message["host"]["procs"]} == {launcher, *local_workers}
    assert seen_workers >= 60


def recorded_ranks(name: str) -> dict[str, str]:
    return recorded_meta(name)["ranks"]


def test_replayed_host_pids_from_another_namespace_are_flagged(local_job) -> None:
    launcher, _, _ = local_job
    readings = raw_readings("h200_raw.jsonl")
    # No pid_map: NVML's pids exist nowhere here, as inside a container.
    sampler = TelemetrySampler(job_pids_fn=lambda: [launcher], rank_map_fn=lambda: {offset_pid(485): "Worker_TP0"},
                               nvml=NvmlSource(module=ReplayNvml(readings)))
    flagged = 0
    for reading in readings:
        message = sampler.sample()
        if any(gpu["processes"] for gpu in reading):
            assert message["pid_namespace_mismatch"] is True and "container" in message["pid_namespace_note"]
            assert all(p["rank"] is None and not p["in_job"] for g in message["gpus"] for p in g["processes"])
            flagged += 1
        else:
            assert message["pid_namespace_mismatch"] is False
    assert flagged >= 60
    assert any(line.startswith("PID namespace mismatch") for line in render_lines(message))


def test_unsupported_queries_give_none_and_are_not_asked_again() -> None:
    readings = raw_readings("h200x2_raw.jsonl")
    replay = ReplayNvml(readings, unsupported={"nvmlDeviceGetPowerUsage", "nvmlDeviceGetCurrentClocksEventReasons"})
    sampler = TelemetrySampler(nvml=NvmlSource(module=replay))
    for _ in range(5):
        message = sampler.sample()
        for gpu in message["gpus"]:
            assert gpu["power_w"] is None and gpu["throttle"] is None
            assert gpu["power_limit_w"] == 700.0 and gpu["mem_total"] > 0 and gpu["temp_c"] is not None
    # Asked once per GPU, then never again; the other queries are asked every sample.
    assert replay.calls["nvmlDeviceGetPowerUsage"] == 2
    assert replay.calls["nvmlDeviceGetCurrentClocksEventReasons"] == 2
    assert replay.calls["nvmlDeviceGetUtilizationRates"] == 10
    assert all("n/a/700W" in line for line in render_lines(message) if line.startswith("GPU"))


def test_a_query_that_fails_once_is_asked_again() -> None:
    readings = copy.deepcopy(raw_readings("h200_raw.jsonl")[:3])
    first = readings[0][0]
    first["temperature_c"] = None
    first["errors"]["temperature_c"] = {"code": ERROR_UNKNOWN, "message": "Unknown Error"}
    sampler = TelemetrySampler(nvml=NvmlSource(module=ReplayNvml(readings)))
    assert sampler.sample()["gpus"][0]["temp_c"] is None
    assert sampler.sample()["gpus"][0]["temp_c"] == readings[1][0]["temperature_c"]


def test_a_lost_gpu_keeps_its_row_and_says_why() -> None:
    readings = copy.deepcopy(raw_readings("h200x2_raw.jsonl")[:2])
    lost = readings[0][1]
    for field in ("memory", "utilization", "temperature_c", "power_mw", "power_limit_mw", "sm_clock_mhz",
                  "clock_event_mask", "processes"):
        lost[field] = None
        lost["errors"][field] = {"code": ERROR_GPU_IS_LOST, "message": "GPU is lost"}
    message = TelemetrySampler(nvml=NvmlSource(module=ReplayNvml(readings))).sample()
    healthy, gone = message["gpus"]
    assert healthy["error"] is None and healthy["mem_total"] > 0
    assert gone["error"] == "GPU is lost" and gone["mem_used"] is None and gone["processes"] == []
    assert gone["name"] == "NVIDIA H200"
    assert next(line for line in render_lines(message) if line.startswith("GPU1")).endswith("(GPU is lost)")


class DriverNotLoaded(ReplayNvml):
    def nvmlInit(self) -> None:
        self.initialised += 1
        raise self.NVMLError(ERROR_DRIVER_NOT_LOADED)


class NoGpus(ReplayNvml):
    def nvmlDeviceGetCount(self) -> int:
        return 0


def test_init_failures_are_worded_for_the_operator() -> None:
    readings = raw_readings("h200_raw.jsonl")[:1]
    replay = DriverNotLoaded(readings)
    source = NvmlSource(module=replay)
    assert not source.available and "driver not loaded" in source.reason
    assert source.read() == [] and replay.initialised == 1
    source = NvmlSource(module=NoGpus(readings))
    assert not source.available and "no NVIDIA GPU" in source.reason


class OlderDriver(ReplayNvml):
    """A driver without the v2 memory call or the clock-event name (only the older throttle-reason one)."""

    def nvmlDeviceGetMemoryInfo(self, handle, version=None):
        if version is not None:
            raise self.NVMLError(13)  # NVML_ERROR_FUNCTION_NOT_FOUND
        memory = super().nvmlDeviceGetMemoryInfo(handle)
        return type(memory)(total=memory.total, used=memory.used + memory.reserved, free=memory.free)

    nvmlDeviceGetCurrentClocksThrottleReasons = ReplayNvml.nvmlDeviceGetCurrentClocksEventReasons

    def __getattribute__(self, name):
        if name == "nvmlDeviceGetCurrentClocksEventReasons":
            raise AttributeError(name)
        return super().__getattribute__(name)


def test_older_driver_calls_are_used_when_the_newer_ones_are_missing() -> None:
    readings = raw_readings("h200_raw.jsonl")
    loaded = next(i for i, r in enumerate(readings) if r[0]["clock_event_mask"] & 0x4)
    source = NvmlSource(module=OlderDriver(readings[loaded:]))
    gpu = TelemetrySampler(nvml=source).sample()["gpus"][0]
    recorded = readings[loaded][0]
    assert gpu["mem_reserved"] is None
    assert gpu["mem_used"] == recorded["memory"]["used"] + recorded["memory"]["reserved"]
    assert gpu["throttle"] == "sw_power_cap"
