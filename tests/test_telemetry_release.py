"""wait_for_gpu_release: with real processes on this machine (no GPU: NVML is really absent here), and with the NVML
readings polled on a real H200 while its workers shut down (replayed)."""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from agent_support import wait_for
from eaglewatch.pipeline.telemetry import NvmlSource, TelemetrySampler, pid_state, wait_for_gpu_release
from telemetry_replay import ReplayNvml, load_jsonl, offset_pid, raw_readings


def sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])


def test_waits_for_real_processes_to_exit_without_a_gpu() -> None:
    procs = [sleeper(), sleeper()]
    pids = [p.pid for p in procs]
    polled = threading.Event()
    stopped_at: list[float] = []

    def stop_after_polls() -> None:
        # Only once the wait has seen them alive a few times: the wait must outlast them, whatever the timing.
        if not polled.wait(60):
            return
        stopped_at.append(time.monotonic())
        for proc in procs:
            proc.terminate()
            proc.wait()

    stopper = threading.Thread(target=stop_after_polls)
    stopper.start()
    reports: list[dict] = []

    def progress(report: dict) -> None:
        reports.append(report)
        if len(reports) == 3:
            polled.set()

    try:
        assert wait_for_gpu_release(pids, timeout_s=60, poll_s=0.05, progress_cb=progress) is True
        returned_at = time.monotonic()
    finally:
        polled.set()
        stopper.join()
    assert stopped_at and returned_at >= stopped_at[0]
    assert all(r["alive"] == sorted(pids) and r["released"] is False for r in reports[:3])
    assert reports[-1]["alive"] == [] and reports[-1]["released"] is True
    assert all(r["nvml"] and r["gpu"] == [] and r["held_bytes"] == 0 for r in reports)
    # It polled, it did not spin: about one report per poll interval.
    assert len(reports) <= (reports[-1]["elapsed_s"] / 0.05) + 3


def test_times_out_while_a_process_lives() -> None:
    proc = sleeper()
    try:
        reports: list[dict] = []
        started = time.monotonic()
        assert wait_for_gpu_release([proc.pid], timeout_s=0.3, poll_s=0.05, progress_cb=reports.append) is False
        assert time.monotonic() - started >= 0.3
        assert reports[-1]["alive"] == [proc.pid] and reports[-1]["released"] is False
    finally:
        proc.kill()
        proc.wait()


def test_an_exited_unreaped_process_counts_as_gone() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    wait_for(lambda: pid_state(proc.pid) == "zombie", what="the child exited, unreaped")
    reports: list[dict] = []
    assert wait_for_gpu_release([proc.pid], timeout_s=60, progress_cb=reports.append) is True
    assert reports[-1]["zombies"] == [proc.pid]
    proc.wait()


def release_meta(name: str) -> dict:
    return next(r for r in load_jsonl(f"{name}_release.jsonl") if r["kind"] == "meta")


@pytest.mark.parametrize("name", ["h200", "h200x2"])
def test_replayed_shutdown_waits_until_nvml_drops_the_workers(name: str) -> None:
    info = release_meta(name)
    readings = raw_readings(f"{name}_release.jsonl")
    replay = ReplayNvml(readings)
    targets = [offset_pid(pid) for pid in info["worker_pids"]]  # exited: no such pids here
    reports: list[dict] = []
    assert wait_for_gpu_release(targets, timeout_s=30, poll_s=0.01, progress_cb=reports.append,
                                nvml=NvmlSource(module=replay)) is True
    # One poll per reading the GPU gave while the workers shut down, memory still listed until the last.
    assert len(reports) == len(readings)
    for report, reading in zip(reports, readings):
        held = {p["pid"]: p["used_mem"] for g in reading for p in g["processes"] if p["pid"] in info["worker_pids"]}
        assert report["held_bytes"] == sum(held.values())
        assert {entry["pid"] for entry in report["gpu"]} == {offset_pid(pid) for pid in held}
        assert report["released"] is (not held)
        assert report["pid_namespace_mismatch"] is False
    assert reports[0]["held_bytes"] > 1 << 30  # the worker's GPU memory outlived the process by a poll or more


@pytest.mark.parametrize("name", ["h200", "h200x2"])
def test_replayed_workers_that_keep_their_memory_time_out(name: str) -> None:
    info = release_meta(name)
    records = load_jsonl(f"{name}_raw.jsonl")
    before_stop = [r["gpus"] for r in records if r["t"] < info["kill_t"]][-1]
    workers = set(info["worker_pids"])
    expected = sum(p["used_mem"] for g in before_stop for p in g["processes"] if p["pid"] in workers)
    reports: list[dict] = []
    assert wait_for_gpu_release([offset_pid(pid) for pid in workers], timeout_s=0.2, poll_s=0.05,
                                progress_cb=reports.append, nvml=NvmlSource(module=ReplayNvml([before_stop]))) is False
    assert reports[-1]["held_bytes"] == expected > 4 << 30
    assert reports[-1]["alive"] == []


def test_in_another_pid_namespace_the_unmatched_gpu_processes_are_waited_for() -> None:
    info = release_meta("h200")
    readings = raw_readings("h200_release.jsonl")
    mine = subprocess.Popen([sys.executable, "-c", "pass"])
    mine.wait()  # our view of the job: already gone; NVML knows it only by a host pid we cannot match
    # With an outsider still on the GPU, its memory cannot be told from ours: wait, flagging why, until timeout.
    reports: list[dict] = []
    assert wait_for_gpu_release([mine.pid], timeout_s=0.3, poll_s=0.02, progress_cb=reports.append,
                                nvml=NvmlSource(module=ReplayNvml(readings))) is False
    assert reports[-1]["pid_namespace_mismatch"] is True
    assert {e["pid"] for e in reports[-1]["gpu"]} == {offset_pid(info["stranger_pid"])}
    # Without the outsider, the wait ends when the unmatched entries are gone.
    alone = copy.deepcopy(readings)
    for reading in alone:
        for gpu in reading:
            gpu["processes"] = [p for p in gpu["processes"] if p["pid"] != info["stranger_pid"]]
    reports.clear()
    assert wait_for_gpu_release([mine.pid], timeout_s=10, poll_s=0.01, progress_cb=reports.append,
                                nvml=NvmlSource(module=ReplayNvml(alone))) is True
    assert reports[0]["pid_namespace_mismatch"] is True and reports[0]["held_bytes"] > 0


def test_reuses_the_samplers_nvml_without_initialising_again() -> None:
    info = release_meta("h200")
    # The outsider on the GPU is a process this test can see (as it is outside a container).
    replay = ReplayNvml(raw_readings("h200_release.jsonl"), pid_map={info["stranger_pid"]: os.getpid()})
    sampler = TelemetrySampler(nvml=NvmlSource(module=replay))
    sampler.sample()
    workers = [offset_pid(pid) for pid in info["worker_pids"]]
    assert wait_for_gpu_release(workers, timeout_s=60, poll_s=0.01, nvml=sampler.nvml) is True
    assert replay.initialised == 1
    sampler.sample()  # still usable: the wait did not shut NVML down


def test_rejects_a_negative_timeout() -> None:
    with pytest.raises(ValueError):
        wait_for_gpu_release([os.getpid()], timeout_s=-1)


def test_stop_signal_then_release_of_a_real_process_group() -> None:
    group = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys, time\n"
         "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
         "time.sleep(120)\n"],
        start_new_session=True,
    )
    import psutil

    wait_for(lambda: psutil.Process(group.pid).children(), what="the group's child started")
    pids = [group.pid] + [c.pid for c in psutil.Process(group.pid).children(recursive=True)]
    os.killpg(group.pid, signal.SIGTERM)
    assert wait_for_gpu_release(pids, timeout_s=60, poll_s=0.05) is True
    group.wait()
