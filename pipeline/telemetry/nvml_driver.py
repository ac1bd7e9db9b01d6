"""NVML straight from the driver's ``libnvidia-ml.so.1``, through ``ctypes``: GPU telemetry on a host whose Python has
no ``nvidia-ml-py``.

Every NVIDIA host has the driver's NVML library; not every Python on it has the ``pynvml`` bindings (the agent runs
under whatever ``python3`` the host has). :class:`DriverNvml` offers the calls :class:`.nvml.NvmlSource` makes, with
pynvml's names and results (structures with the same field names, ``bytes`` for strings, an :class:`NVMLError` whose
``value`` is NVML's return code), so the source reads either the same way. Only the calls the source makes are here,
each a row of ``_SIGNATURES``: the C function, its argument types, and the newer versions to try first.

Standard library only (the agent carries it to the host).
"""

from __future__ import annotations

import ctypes
from typing import Any

LIBRARY = "libnvidia-ml.so.1"

SUCCESS = 0
ERROR_INSUFFICIENT_SIZE = 7
ERROR_LIBRARY_NOT_FOUND = 12
ERROR_FUNCTION_NOT_FOUND = 13
VALUE_NOT_AVAILABLE = 2**64 - 1  # NVML_VALUE_NOT_AVAILABLE as an unsigned long long: a process's memory unknown
_STRING_BUFFER = 96  # NVML_DEVICE_NAME_V2_BUFFER_SIZE and the UUID/driver version buffers all fit in this


class NVMLError(Exception):
    """An NVML call that did not return NVML_SUCCESS; ``value`` is its return code (nvml.h)."""

    def __init__(self, value: int, message: str = "") -> None:
        super().__init__(message or f"NVML error {value}")
        self.value = value


class Memory(ctypes.Structure):  # nvmlMemory_t
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class MemoryV2(ctypes.Structure):  # nvmlMemory_v2_t
    _fields_ = [("version", ctypes.c_uint), ("total", ctypes.c_ulonglong), ("reserved", ctypes.c_ulonglong),
                ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class Utilization(ctypes.Structure):  # nvmlUtilization_t
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class ProcessInfo(ctypes.Structure):  # nvmlProcessInfo_t (the _v2 and _v3 calls)
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong), ("gpuInstanceId", ctypes.c_uint),
                ("computeInstanceId", ctypes.c_uint)]


class ProcessInfoV1(ctypes.Structure):  # nvmlProcessInfo_v1_t (the unversioned call of older drivers)
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


_HANDLE = ctypes.c_void_p
_P = ctypes.POINTER
# name -> (the C functions to try, newest first; their argument types). Each returns nvmlReturn_t.
_SIGNATURES: dict[str, tuple[tuple[str, ...], tuple[Any, ...]]] = {
    "init": (("nvmlInit_v2", "nvmlInit"), ()),
    "shutdown": (("nvmlShutdown",), ()),
    "driver_version": (("nvmlSystemGetDriverVersion",), (ctypes.c_char_p, ctypes.c_uint)),
    "count": (("nvmlDeviceGetCount_v2", "nvmlDeviceGetCount"), (_P(ctypes.c_uint),)),
    "handle": (("nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex"), (ctypes.c_uint, _P(_HANDLE))),
    "name": (("nvmlDeviceGetName",), (_HANDLE, ctypes.c_char_p, ctypes.c_uint)),
    "uuid": (("nvmlDeviceGetUUID",), (_HANDLE, ctypes.c_char_p, ctypes.c_uint)),
    "memory": (("nvmlDeviceGetMemoryInfo",), (_HANDLE, _P(Memory))),
    "memory_v2": (("nvmlDeviceGetMemoryInfo_v2",), (_HANDLE, _P(MemoryV2))),
    "utilization": (("nvmlDeviceGetUtilizationRates",), (_HANDLE, _P(Utilization))),
    "temperature": (("nvmlDeviceGetTemperature",), (_HANDLE, ctypes.c_int, _P(ctypes.c_uint))),
    "power": (("nvmlDeviceGetPowerUsage",), (_HANDLE, _P(ctypes.c_uint))),
    "power_limit": (("nvmlDeviceGetEnforcedPowerLimit",), (_HANDLE, _P(ctypes.c_uint))),
    "clock": (("nvmlDeviceGetClockInfo",), (_HANDLE, ctypes.c_int, _P(ctypes.c_uint))),
    "event_reasons": (("nvmlDeviceGetCurrentClocksEventReasons",), (_HANDLE, _P(ctypes.c_ulonglong))),
    "throttle_reasons": (("nvmlDeviceGetCurrentClocksThrottleReasons",), (_HANDLE, _P(ctypes.c_ulonglong))),
    "processes": (("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2"),
                  (_HANDLE, _P(ctypes.c_uint), _P(ProcessInfo))),
    "processes_v1": (("nvmlDeviceGetComputeRunningProcesses",), (_HANDLE, _P(ctypes.c_uint), _P(ProcessInfoV1))),
}


class DriverNvml:
    """The driver's NVML library, loaded at :meth:`nvmlInit`, with pynvml's names for the calls NvmlSource makes."""

    def __init__(self, library: str = LIBRARY) -> None:
        self._library_name = library
        self._lib: Any = None
        self._functions: dict[str, Any] = {}

    # -- plumbing ----------------------------------------------------------------------------------
    def _function(self, name: str) -> Any:
        found = self._functions.get(name)
        if found is None:
            if self._lib is None:
                raise NVMLError(ERROR_LIBRARY_NOT_FOUND, "NVML is not initialised")
            symbols, argtypes = _SIGNATURES[name]
            for symbol in symbols:
                found = getattr(self._lib, symbol, None)
                if found is not None:
                    found.argtypes, found.restype = list(argtypes), ctypes.c_int
                    break
            else:
                raise NVMLError(ERROR_FUNCTION_NOT_FOUND, f"Function Not Found ({symbols[0]})")
            self._functions[name] = found
        return found

    def _call(self, name: str, *args: Any) -> None:
        code = self._function(name)(*args)
        if code != SUCCESS:
            raise NVMLError(code, self._error_string(code))

    def _error_string(self, code: int) -> str:
        describe = getattr(self._lib, "nvmlErrorString", None)
        if describe is None:
            return f"NVML error {code}"
        describe.argtypes, describe.restype = [ctypes.c_int], ctypes.c_char_p
        text = describe(code)
        return text.decode("utf-8", "replace") if text else f"NVML error {code}"

    def _string(self, name: str, *args: Any) -> bytes:
        buffer = ctypes.create_string_buffer(_STRING_BUFFER)
        self._call(name, *args, buffer, ctypes.c_uint(_STRING_BUFFER))
        return buffer.value

    def _uint(self, name: str, *args: Any) -> int:
        value = ctypes.c_uint(0)
        self._call(name, *args, ctypes.byref(value))
        return value.value

    # -- the calls, as pynvml names them -----------------------------------------------------------
    def nvmlInit(self) -> None:
        try:
            self._lib = ctypes.CDLL(self._library_name)
        except OSError as exc:
            raise NVMLError(ERROR_LIBRARY_NOT_FOUND, f"{self._library_name} not found ({exc})") from None
        self._functions.clear()
        self._call("init")

    def nvmlShutdown(self) -> None:
        self._call("shutdown")

    def nvmlSystemGetDriverVersion(self) -> bytes:
        return self._string("driver_version")

    def nvmlDeviceGetCount(self) -> int:
        return self._uint("count")

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        handle = _HANDLE()
        self._call("handle", ctypes.c_uint(index), ctypes.byref(handle))
        return handle

    def nvmlDeviceGetName(self, handle: Any) -> bytes:
        return self._string("name", handle)

    def nvmlDeviceGetUUID(self, handle: Any) -> bytes:
        return self._string("uuid", handle)

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        if version is not None:
            memory_v2 = MemoryV2(version=version)
            self._call("memory_v2", handle, ctypes.byref(memory_v2))
            return memory_v2
        memory = Memory()
        self._call("memory", handle, ctypes.byref(memory))
        return memory

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Utilization:
        utilization = Utilization()
        self._call("utilization", handle, ctypes.byref(utilization))
        return utilization

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        return self._uint("temperature", handle, ctypes.c_int(sensor))

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return self._uint("power", handle)

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        return self._uint("power_limit", handle)

    def nvmlDeviceGetClockInfo(self, handle: Any, clock: int) -> int:
        return self._uint("clock", handle, ctypes.c_int(clock))

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        mask = ctypes.c_ulonglong(0)
        self._call("event_reasons", handle, ctypes.byref(mask))
        return mask.value

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        mask = ctypes.c_ulonglong(0)
        self._call("throttle_reasons", handle, ctypes.byref(mask))
        return mask.value

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        """The processes using the GPU, each with ``pid`` and ``usedGpuMemory`` (None where NVML does not know)."""
        name, struct = "processes", ProcessInfo
        try:
            self._function(name)
        except NVMLError as exc:
            if exc.value != ERROR_FUNCTION_NOT_FOUND:
                raise
            name, struct = "processes_v1", ProcessInfoV1  # type: ignore[assignment]  # same fields read
        # Asked with room for a few more than last counted: processes come and go between the two calls.
        count = ctypes.c_uint(0)
        code = self._function(name)(handle, ctypes.byref(count), None)
        if code == SUCCESS:
            return []
        if code != ERROR_INSUFFICIENT_SIZE:
            raise NVMLError(code, self._error_string(code))
        count.value += 8
        table = (struct * count.value)()
        self._call(name, handle, ctypes.byref(count), table)
        out = []
        for info in table[: count.value]:
            used = None if info.usedGpuMemory == VALUE_NOT_AVAILABLE else int(info.usedGpuMemory)
            out.append(_Process(int(info.pid), used))
        return out


class _Process:
    """A running process as pynvml gives it: ``pid`` and ``usedGpuMemory``."""

    def __init__(self, pid: int, used: int | None) -> None:
        self.pid = pid
        self.usedGpuMemory = used


__all__ = ["DriverNvml", "NVMLError"]
