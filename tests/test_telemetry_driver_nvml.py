"""NVML from the driver's own library (telemetry/nvml_driver.py), for a host whose Python has no pynvml: its
structures are NVML's (checked against pynvml's, which mirror nvml.h), and it fails the way pynvml does where there is
no driver. It is run against a real driver on the H200 (BENCHMARKS.md, "GPU telemetry without pynvml")."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

from eaglewatch.pipeline.telemetry import nvml_driver
from eaglewatch.pipeline.telemetry.host import _proc_stat_cpu

# ours -> pynvml's mirror of the same nvml.h structure
LAYOUTS = [(nvml_driver.Memory, "c_nvmlMemory_t"), (nvml_driver.MemoryV2, "c_nvmlMemory_v2_t"),
           (nvml_driver.Utilization, "c_nvmlUtilization_t"), (nvml_driver.ProcessInfo, "c_nvmlProcessInfo_t")]


@pytest.mark.parametrize(("ours", "theirs"), LAYOUTS, ids=[t for _, t in LAYOUTS])
def test_the_structures_are_nvmls(ours, theirs):
    pynvml = pytest.importorskip("pynvml")
    reference = getattr(pynvml, theirs)
    assert [(n, t) for n, t in ours._fields_] == [(f[0], f[1]) for f in reference._fields_]
    assert ctypes.sizeof(ours) == ctypes.sizeof(reference)


def test_without_the_library_init_fails_as_pynvml_does():
    nv = nvml_driver.DriverNvml(library="libnvidia-ml-that-is-not-here.so.1")
    with pytest.raises(nvml_driver.NVMLError) as info:
        nv.nvmlInit()
    assert info.value.value == nvml_driver.ERROR_LIBRARY_NOT_FOUND
    with pytest.raises(nvml_driver.NVMLError):
        nv.nvmlDeviceGetCount()  # nothing is called on a library that is not loaded


def test_the_hosts_cpu_counters_come_from_proc_stat(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 5 50 800 20 3 2 0 0 0\ncpu0 50 2 25 400 10 1 1 0 0 0\n")
    assert _proc_stat_cpu(str(stat)) == (160, 980)
    stat.write_text("intr 1 2 3\n")
    assert _proc_stat_cpu(str(stat)) is None
    assert _proc_stat_cpu(str(tmp_path / "missing")) is None


H200_WITHOUT_PYNVML = Path(__file__).parent / "fixtures" / "gpu" / "h200_nvml_driver_1203"


def test_on_the_h200_a_python_without_pynvml_gives_the_dashboard_memory_and_use():
    """Recorded on an H200 by bench/gpu_nvml_without_pynvml.sh: ``python3 -S`` (no site packages: no pynvml, no
    psutil) sampling beside a job that holds 20 GiB and keeps the GPU busy."""
    import json

    from eaglewatch.tui.runstate import RunModel

    assert "pynvml None psutil None" in (H200_WITHOUT_PYNVML / "pythons.txt").read_text()
    model = RunModel("h200", {"run": "r", "name": "x", "argv": [], "started_at": 0.0, "state": "running"})
    for line in (H200_WITHOUT_PYNVML / "no-pynvml.jsonl").read_text().splitlines():
        model.feed_telemetry(json.loads(line))
    view = model.snapshot()
    assert view.gpu_note is None and len(view.gpus) == 1
    gpu = view.gpus[0]
    assert gpu.mem_total and gpu.mem_total / 2**30 > 139 and gpu.mem_used / 2**30 > 20  # the job's 20 GiB
    assert gpu.util == 100 and gpu.power_w and gpu.temp_c
    assert [proc.pid for proc in gpu.processes] == [490]
    assert view.host_info.cpu_percent is not None  # from /proc/stat: no psutil
