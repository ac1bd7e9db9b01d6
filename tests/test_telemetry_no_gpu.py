"""The path without a GPU, run for real on this machine: no NVIDIA driver here, and (in subprocesses) no pynvml or
psutil at all. GPU telemetry is reported unavailable once, host samples keep coming, nothing crashes or spins."""

from __future__ import annotations

import ctypes.util
import json
import logging
import os
import resource
import subprocess
import sys
import time

import pytest

from eaglewatch import protocol
from eaglewatch.pipeline.telemetry import NvmlSource, TelemetrySampler, render_lines

pytestmark = pytest.mark.skipif(
    ctypes.util.find_library("nvidia-ml") is not None, reason="this machine has an NVIDIA driver"
)

# Run a snippet with some modules made unimportable, the way a host without them behaves.
BLOCK = "import sys\nfor name in {names!r}: sys.modules[name] = None\n"


def run_python(code: str, *args: str, block: tuple[str, ...] = (), timeout: float = 60) -> subprocess.CompletedProcess:
    prelude = BLOCK.format(names=block) if block else ""
    return subprocess.run(
        [sys.executable, "-c", prelude + code, *args], capture_output=True, text=True, timeout=timeout
    )


def test_real_nvml_reports_missing_driver_in_one_line() -> None:
    source = NvmlSource()
    assert source.available is False
    assert source.reason is not None and "\n" not in source.reason
    assert "libnvidia-ml.so.1" in source.reason
    assert source.read() == [] and source.read_processes() == []


def test_nvml_init_is_attempted_once(monkeypatch: pytest.MonkeyPatch) -> None:
    import pynvml

    calls = []
    real_init = pynvml.nvmlInit

    def counting_init() -> None:
        calls.append(1)
        real_init()  # fails for real: no driver here

    monkeypatch.setattr(pynvml, "nvmlInit", counting_init)
    sampler = TelemetrySampler(interval_s=0.01)
    for _ in range(5):
        sampler.sample()
    assert len(calls) == 1


def test_sampler_keeps_host_samples_and_reports_once(caplog: pytest.LogCaptureFixture, tmp_path) -> None:
    caplog.set_level(logging.WARNING, logger="eaglewatch.telemetry")
    sampler = TelemetrySampler(interval_s=0.05, output_dir=str(tmp_path), job_pids_fn=lambda: [os.getpid()])
    messages = [protocol.decode(sampler.sample_line()) for _ in range(3)]
    for message in messages:
        assert message["type"] == protocol.MSG_TELEMETRY
        assert message["v"] == protocol.PROTOCOL_VERSION
        assert message["gpus"] == []
        assert message["nvml"] == sampler.nvml_reason
        assert message["pid_namespace_mismatch"] is False
        host = message["host"]
        assert host["ram_total"] > 0 and 0 < host["ram_used"] <= host["ram_total"]
        assert any(proc["pid"] == os.getpid() for proc in host["procs"])
        assert host["disk"]["fs_path"] == str(tmp_path) and host["disk"]["free"] > 0
    assert len([r for r in caplog.records if "GPU telemetry is off" in r.getMessage()]) == 1
    # What an operator sees: the reason, once per sample view, and a host line.
    lines = render_lines(messages[-1])
    assert lines[0].startswith("GPU telemetry unavailable:") and any(line.startswith("host ") for line in lines)


def test_cli_without_pynvml_streams_host_samples(tmp_path) -> None:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    result = run_python(
        "from eaglewatch.pipeline.telemetry.__main__ import main; raise SystemExit(main())",
        "--count", "5", "--interval", "0.4", "--output-dir", str(tmp_path),
        block=("pynvml",),
    )
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert result.returncode == 0, result.stderr
    messages = [protocol.decode(line) for line in result.stdout.splitlines()]
    assert len(messages) == 5
    # Without the Python bindings the driver's own library is what is looked for (telemetry/nvml_driver.py): the
    # reason is the missing driver, not a missing package.
    assert all("libnvidia-ml.so.1" in m["nvml"] and "nvidia-ml-py" not in m["nvml"] and m["gpus"] == []
               and m["host"]["ram_total"] for m in messages)
    # Reported once, not once a sample.
    assert result.stderr.count("GPU telemetry is off") == 1
    # It waited between samples instead of retrying NVML in a loop: most of the wall time was spent asleep.
    assert wall >= 4 * 0.4
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    assert cpu < 0.5 * wall


def test_without_psutil_the_host_part_says_what_is_missing(tmp_path) -> None:
    code = (
        "import json, os\n"
        "from eaglewatch.pipeline.telemetry import TelemetrySampler\n"
        f"s = TelemetrySampler(output_dir={str(tmp_path)!r}, job_pids_fn=lambda: [os.getpid()])\n"
        "import time\n"
        "busy_until = time.process_time() + 0.2\n"
        "while time.process_time() < busy_until: pass\n"
        "print(json.dumps(s.sample()))\n"
        "print(json.dumps(sorted(s.host.sample([os.getppid()])[1])))\n"
    )
    result = run_python(code, block=("psutil", "pynvml"))
    assert result.returncode == 0, result.stderr
    first, second = result.stdout.splitlines()
    message = json.loads(first)
    host = message["host"]
    assert "psutil" in host["psutil"] and "CPU" not in host["psutil"]
    assert host["procs"] is None
    # The host's CPU use still comes, from /proc/stat's counters since the sampler started.
    assert isinstance(host["cpu_percent"], float) and 0 < host["cpu_percent"] <= 100
    # What the standard library gives is still there.
    assert host["ram_total"] > 0 and host["load1"] is not None and host["disk"]["free"] > 0
    assert "n/a" in "\n".join(render_lines(message))
    # The job's tree (here: the test runner and its children) is still found, through /proc.
    assert os.getpid() in json.loads(second)
