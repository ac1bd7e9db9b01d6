"""A ``pynvml`` stand-in that replays NVML readings recorded on a real GPU (tests/fixtures/telemetry/*_raw.jsonl).

There is no GPU on the machine the tests run on, so :class:`~eaglewatch.pipeline.telemetry.NvmlSource` is given this
module-like object instead of ``pynvml``. It answers each NVML query with the value that query returned on the GPU,
in the order it was recorded: each (query, GPU) pair has its own cursor, so a read that asks for every field, or only
for processes, walks through the recording one reading at a time, and the last reading repeats once it runs out. A
query that failed on the GPU fails here with the recorded NVML error code.

Recorded pids name processes of the recording machine. They are rewritten: through ``pid_map`` onto real local
processes, otherwise shifted past Linux's largest possible pid, so that they cannot collide with a live process here.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterable, Mapping

import pynvml

FIXTURES = Path(__file__).parent / "fixtures" / "telemetry"
PID_MAX_LIMIT = 4_194_304  # Linux's ceiling for pid_max: no live pid is this large


def offset_pid(pid: int) -> int:
    return pid + PID_MAX_LIMIT


def load_jsonl(name: str) -> list[dict[str, Any]]:
    with open(FIXTURES / name) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def raw_readings(name: str) -> list[list[dict[str, Any]]]:
    """Every recorded reading (one list of GPUs a sample) of a ``*_raw.jsonl`` or ``*_release.jsonl`` file."""
    return [record["gpus"] for record in load_jsonl(name) if record.get("kind", "raw") == "raw" and "gpus" in record]


class Handle:
    def __init__(self, index: int) -> None:
        self.index = index


class ReplayNvml:
    NVMLError = pynvml.NVMLError
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
    NVML_CLOCK_SM = pynvml.NVML_CLOCK_SM
    nvmlMemory_v2 = pynvml.nvmlMemory_v2

    def __init__(
        self,
        readings: list[list[Mapping[str, Any]]],
        *,
        driver: str | None = "580.159.04",
        pid_map: Mapping[int, int] | None = None,
        unsupported: Iterable[str] = (),
    ) -> None:
        if not readings or not readings[0]:
            raise ValueError("nothing to replay")
        self.readings = readings
        self.driver = driver
        self.pid_map = dict(pid_map or {})
        self.unsupported = set(unsupported)
        self.cursor: defaultdict[tuple[str, int], int] = defaultdict(int)
        self.calls: Counter[str] = Counter()
        self.initialised = 0

    # -- helpers ---------------------------------------------------------------------------------------
    def pid(self, recorded: int) -> int:
        return self.pid_map.get(recorded, offset_pid(recorded))

    def _reading(self, query: str, handle: Handle) -> Mapping[str, Any]:
        self.calls[query] += 1
        if query in self.unsupported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        position = self.cursor[(query, handle.index)]
        self.cursor[(query, handle.index)] = position + 1
        return self.readings[min(position, len(self.readings) - 1)][handle.index]

    def _field(self, query: str, handle: Handle, field: str) -> Any:
        reading = self._reading(query, handle)
        value = reading.get(field)
        if value is None:
            error = (reading.get("errors") or {}).get(field) or {}
            raise pynvml.NVMLError(error.get("code") or pynvml.NVML_ERROR_UNKNOWN)
        return value

    # -- the pynvml functions NvmlSource calls ---------------------------------------------------------------
    def nvmlInit(self) -> None:
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        pass

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver or ""

    def nvmlDeviceGetCount(self) -> int:
        return len(self.readings[0])

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:
        return Handle(index)

    def nvmlDeviceGetName(self, handle: Handle) -> str:
        return self.readings[0][handle.index]["name"]

    def nvmlDeviceGetUUID(self, handle: Handle) -> str:
        return self.readings[0][handle.index]["uuid"]

    def nvmlDeviceGetMemoryInfo(self, handle: Handle, version: int | None = None) -> SimpleNamespace:
        memory = self._field("nvmlDeviceGetMemoryInfo", handle, "memory")
        return SimpleNamespace(**memory)

    def nvmlDeviceGetUtilizationRates(self, handle: Handle) -> SimpleNamespace:
        return SimpleNamespace(**self._field("nvmlDeviceGetUtilizationRates", handle, "utilization"))

    def nvmlDeviceGetTemperature(self, handle: Handle, sensor: int) -> int:
        return self._field("nvmlDeviceGetTemperature", handle, "temperature_c")

    def nvmlDeviceGetPowerUsage(self, handle: Handle) -> int:
        return self._field("nvmlDeviceGetPowerUsage", handle, "power_mw")

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Handle) -> int:
        return self._field("nvmlDeviceGetEnforcedPowerLimit", handle, "power_limit_mw")

    def nvmlDeviceGetClockInfo(self, handle: Handle, clock: int) -> int:
        return self._field("nvmlDeviceGetClockInfo", handle, "sm_clock_mhz")

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Handle) -> int:
        return self._field("nvmlDeviceGetCurrentClocksEventReasons", handle, "clock_event_mask")

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Handle) -> list[SimpleNamespace]:
        procs = self._field("nvmlDeviceGetComputeRunningProcesses", handle, "processes")
        return [SimpleNamespace(pid=self.pid(p["pid"]), usedGpuMemory=p["used_mem"]) for p in procs]
