"""NVML from the driver's own library (telemetry/nvml_driver.py), for a host whose Python has no pynvml: its
structures are NVML's (checked against pynvml's, which mirror nvml.h), and it fails the way pynvml does where there is
no driver. It is run against a real driver on the H200 (BENCHMARKS.md, "GPU telemetry without pynvml")."""

from __future__ import annotations

import ctypes

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
