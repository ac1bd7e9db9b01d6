"""NVML IO: read raw per-GPU readings through ``pynvml`` (the ``nvidia-ml-py`` distribution) where the Python has
it, else straight from the driver's ``libnvidia-ml.so.1`` (:mod:`.nvml_driver`, ctypes).

This module only talks to NVML and turns its ctypes structures into plain, JSON-ready dicts ("raw readings").
What those readings mean for the operator (units, throttle names, which process is which rank) is decided in
:mod:`.shape`, so that the shaping can be tested with readings recorded on a real GPU.

Every query degrades on its own: a query that fails gives ``None`` and an entry in the reading's ``errors``. A
query that the GPU or driver does not support at all is not asked again for that GPU. ``pynvml`` is imported
lazily, and initialisation is tried once: when it fails, :attr:`NvmlSource.reason` says why in one line and every
later read returns nothing, without touching NVML again.

A raw reading of one GPU::

    {"index": 0, "name": "NVIDIA H200", "uuid": "GPU-…",
     "memory": {"total": B, "used": B, "free": B, "reserved": B|None} | None,
     "utilization": {"gpu": %, "memory": %} | None,
     "temperature_c": int|None, "power_mw": int|None, "power_limit_mw": int|None, "sm_clock_mhz": int|None,
     "clock_event_mask": int|None,
     "processes": [{"pid": int, "used_mem": B|None}, …] | None,
     "errors": {field: {"code": NVML error code|None, "message": str}}}
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

log = logging.getLogger("eaglewatch.telemetry")

# NVML return codes (nvml.h); kept here so that reasons can be worded without the library loaded.
ERROR_NOT_SUPPORTED = 3
ERROR_NO_PERMISSION = 4
ERROR_DRIVER_NOT_LOADED = 9
ERROR_LIBRARY_NOT_FOUND = 12
ERROR_FUNCTION_NOT_FOUND = 13
ERROR_GPU_IS_LOST = 15
ERROR_ARGUMENT_VERSION_MISMATCH = 25

# A query failing with one of these will fail the same way every time: stop asking.
_PERMANENT_ERRORS = frozenset({ERROR_NOT_SUPPORTED, ERROR_NO_PERMISSION, ERROR_FUNCTION_NOT_FOUND})

_V2_MISSING = frozenset({ERROR_NOT_SUPPORTED, ERROR_FUNCTION_NOT_FOUND, ERROR_ARGUMENT_VERSION_MISMATCH})

TEMPERATURE_GPU = 0  # NVML_TEMPERATURE_GPU
CLOCK_SM = 1  # NVML_CLOCK_SM
MEMORY_V2 = 0x02000028  # nvmlMemory_v2: sizeof(nvmlMemory_v2_t) | 2 << 24

# Fields of a raw reading that are queried every sample (name, uuid are read once).
DYNAMIC_FIELDS = (
    "memory",
    "utilization",
    "temperature_c",
    "power_mw",
    "power_limit_mw",
    "sm_clock_mhz",
    "clock_event_mask",
    "processes",
)


@dataclass
class Device:
    index: int
    handle: Any
    name: str | None
    uuid: str | None


class QueryFailed(Exception):
    def __init__(self, code: int | None, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def error_code(exc: BaseException) -> int | None:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def error_message(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:  # pynvml's __str__ may call into a library that is not there
        text = ""
    return text or type(exc).__name__


def init_failure_reason(exc: BaseException) -> str:
    """One line for the operator: why there is no GPU telemetry on this host."""
    code = error_code(exc)
    if code == ERROR_LIBRARY_NOT_FOUND:
        return "no NVIDIA driver: libnvidia-ml.so.1 not found, so GPU telemetry is off (host samples continue)"
    if code == ERROR_DRIVER_NOT_LOADED:
        return "NVIDIA driver not loaded (NVML init failed), so GPU telemetry is off (host samples continue)"
    if code == ERROR_NO_PERMISSION:
        return "no permission to use NVML, so GPU telemetry is off (host samples continue)"
    return f"NVML init failed ({error_message(exc)}), so GPU telemetry is off (host samples continue)"


class NvmlSource:
    """Raw NVML readings for every GPU, or a one-line :attr:`reason` why there are none.

    ``module`` replaces the ``pynvml`` import (a recorded-data replay in tests). Nothing touches NVML until
    :meth:`start` (called by the first read), and initialisation is attempted once only.
    """

    def __init__(self, module: Any = None) -> None:
        self._module = module
        self._nv: Any = None
        self._started = False
        self._closed = False
        self.reason: str | None = None
        self.driver: str | None = None
        self.devices: list[Device] = []
        self._skip: set[tuple[int, str]] = set()
        self._memory_v2 = True
        self._event_reasons = True

    # -- lifecycle ---------------------------------------------------------------------------------
    @property
    def available(self) -> bool:
        return self.start()

    def start(self) -> bool:
        if self._started:
            return self.reason is None
        self._started = True
        nv = self._module
        if nv is None:
            try:
                import pynvml  # noqa: PLC0415 - optional, heavy-ish, GPU hosts only

                nv = pynvml
            except ImportError:
                # The host's Python has no bindings: the driver's own library, through ctypes, gives the same.
                from .nvml_driver import DriverNvml  # noqa: PLC0415

                nv = DriverNvml()
        self._nv = nv
        try:
            nv.nvmlInit()
        except Exception as exc:  # NVMLError, OSError from ctypes, anything a broken install raises
            self.reason = init_failure_reason(exc)
            log.warning("telemetry: %s", self.reason)
            return False
        try:
            self.driver = _text(nv.nvmlSystemGetDriverVersion())
        except Exception:
            self.driver = None
        try:
            count = int(nv.nvmlDeviceGetCount())
        except Exception as exc:
            self.reason = f"NVML could not count the GPUs ({error_message(exc)}), so GPU telemetry is off"
            log.warning("telemetry: %s", self.reason)
            self._shutdown()
            return False
        for index in range(count):
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(index)
            except Exception as exc:
                # A GPU that cannot be opened (lost, no permission) still shows up, with every reading n/a.
                log.warning("telemetry: GPU %d cannot be opened: %s", index, error_message(exc))
                self.devices.append(Device(index, None, None, None))
                continue
            name = self._static(nv.nvmlDeviceGetName, handle)
            uuid = self._static(nv.nvmlDeviceGetUUID, handle)
            self.devices.append(Device(index, handle, name, uuid))
        if not self.devices:
            self.reason = "NVML found no NVIDIA GPU on this host, so there is no GPU telemetry"
            log.warning("telemetry: %s", self.reason)
            self._shutdown()
            return False
        return True

    def close(self) -> None:
        if self._started and self.reason is None and not self._closed:
            self._shutdown()
        self._closed = True

    def _shutdown(self) -> None:
        try:
            self._nv.nvmlShutdown()
        except Exception:
            pass

    @staticmethod
    def _static(fn: Callable[..., Any], handle: Any) -> str | None:
        try:
            return _text(fn(handle))
        except Exception:
            return None

    # -- queries -----------------------------------------------------------------------------------
    def _query(self, device: Device, field: str, fn: Callable[[], Any]) -> Any:
        if device.handle is None:
            raise QueryFailed(None, "GPU could not be opened")
        key = (device.index, field)
        if key in self._skip:
            raise QueryFailed(ERROR_NOT_SUPPORTED, "Not Supported")
        try:
            return fn()
        except Exception as exc:
            code = error_code(exc)
            if code in _PERMANENT_ERRORS:
                self._skip.add(key)
            raise QueryFailed(code, error_message(exc)) from None

    def _memory(self, handle: Any) -> dict[str, Any]:
        nv = self._nv
        if self._memory_v2:
            try:
                mem = nv.nvmlDeviceGetMemoryInfo(handle, version=MEMORY_V2)
                return {
                    "total": int(mem.total),
                    "used": int(mem.used),
                    "free": int(mem.free),
                    "reserved": int(mem.reserved),
                }
            except Exception as exc:
                # Older drivers or bindings lack the v2 call (the v1 struct counts reserved memory as used); any
                # other failure (a lost GPU, say) is the reading's, not the call version's.
                if not isinstance(exc, (TypeError, AttributeError)) and error_code(exc) not in _V2_MISSING:
                    raise
                self._memory_v2 = False
        mem = nv.nvmlDeviceGetMemoryInfo(handle)
        return {"total": int(mem.total), "used": int(mem.used), "free": int(mem.free), "reserved": None}

    def _clock_event_mask(self, handle: Any) -> int:
        nv = self._nv
        if self._event_reasons:
            fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
            if fn is not None:
                try:
                    return int(fn(handle))
                except Exception as exc:
                    if error_code(exc) != ERROR_FUNCTION_NOT_FOUND:
                        raise
            self._event_reasons = False
        return int(nv.nvmlDeviceGetCurrentClocksThrottleReasons(handle))

    def _processes(self, handle: Any) -> list[dict[str, Any]]:
        procs = self._nv.nvmlDeviceGetComputeRunningProcesses(handle)
        out = []
        for proc in procs:
            used = getattr(proc, "usedGpuMemory", None)
            out.append({"pid": int(proc.pid), "used_mem": None if used is None else int(used)})
        return out

    def _fields(self, device: Device) -> dict[str, Callable[[], Any]]:
        nv, h = self._nv, device.handle
        return {
            "memory": lambda: self._memory(h),
            "utilization": lambda: _utilization(nv.nvmlDeviceGetUtilizationRates(h)),
            "temperature_c": lambda: int(nv.nvmlDeviceGetTemperature(h, TEMPERATURE_GPU)),
            "power_mw": lambda: int(nv.nvmlDeviceGetPowerUsage(h)),
            "power_limit_mw": lambda: int(nv.nvmlDeviceGetEnforcedPowerLimit(h)),
            "sm_clock_mhz": lambda: int(nv.nvmlDeviceGetClockInfo(h, CLOCK_SM)),
            "clock_event_mask": lambda: self._clock_event_mask(h),
            "processes": lambda: self._processes(h),
        }

    def read(self, fields: tuple[str, ...] = DYNAMIC_FIELDS) -> list[dict[str, Any]]:
        """One raw reading per GPU; an empty list when NVML is unavailable."""
        if not self.start():
            return []
        readings = []
        for device in self.devices:
            reading: dict[str, Any] = {"index": device.index, "name": device.name, "uuid": device.uuid}
            errors: dict[str, dict[str, Any]] = {}
            queries = self._fields(device)
            for field in fields:
                try:
                    reading[field] = self._query(device, field, queries[field])
                except QueryFailed as exc:
                    reading[field] = None
                    errors[field] = {"code": exc.code, "message": exc.message}
            reading["errors"] = errors
            readings.append(reading)
        return readings

    def read_processes(self) -> list[dict[str, Any]]:
        """Only the per-process memory of every GPU (what a release wait polls)."""
        return self.read(fields=("processes",))


def _utilization(util: Any) -> dict[str, int]:
    return {"gpu": int(util.gpu), "memory": int(util.memory)}
