"""NVML through ctypes on libnvidia-ml.so.1 (part of the driver wherever an NVIDIA GPU is): the
few calls the probe reads a GPU with, each one C function as nvml.h declares it.

Runs ON the box. Standard library only, Python >= 3.8.

Every method returns plain Python values or raises NvmlError with NVML's return code; what to
make of an error (null for that field) is gpus.py's business. nvml_replay.py answers the same
methods from a recorded reading, so everything above this boundary runs without a GPU.
"""

from __future__ import annotations

import ctypes
from typing import Any, Sequence

LIBRARY = "libnvidia-ml.so.1"

# nvmlReturn_t values (nvml.h) the reading tells apart; any other is named by nvmlErrorString.
SUCCESS = 0
ERROR_UNINITIALIZED = 1
ERROR_NOT_SUPPORTED = 3
ERROR_NO_PERMISSION = 4
ERROR_INSUFFICIENT_SIZE = 7
ERROR_DRIVER_NOT_LOADED = 9
ERROR_TIMEOUT = 10  # nvmlEventSetWait: no event came within the time given
ERROR_FUNCTION_NOT_FOUND = 13
ERROR_GPU_IS_LOST = 15
ERROR_LIBRARY_NOT_FOUND = 12
ERROR_UNKNOWN = 999
NAMES = {
    ERROR_UNINITIALIZED: "NVML not initialized", ERROR_NOT_SUPPORTED: "Not Supported",
    ERROR_NO_PERMISSION: "Insufficient Permissions", ERROR_INSUFFICIENT_SIZE: "Insufficient Size",
    ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded", ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    ERROR_FUNCTION_NOT_FOUND: "Function Not Found", ERROR_GPU_IS_LOST: "GPU is lost", ERROR_UNKNOWN: "Unknown Error",
    ERROR_TIMEOUT: "Timeout",
}
CODES = {  # the names replay recordings use for an error
    "UNINITIALIZED": ERROR_UNINITIALIZED, "NOT_SUPPORTED": ERROR_NOT_SUPPORTED,
    "NO_PERMISSION": ERROR_NO_PERMISSION, "DRIVER_NOT_LOADED": ERROR_DRIVER_NOT_LOADED,
    "LIBRARY_NOT_FOUND": ERROR_LIBRARY_NOT_FOUND, "FUNCTION_NOT_FOUND": ERROR_FUNCTION_NOT_FOUND,
    "GPU_IS_LOST": ERROR_GPU_IS_LOST, "TIMEOUT": ERROR_TIMEOUT, "UNKNOWN": ERROR_UNKNOWN,
}

VALUE_NOT_AVAILABLE = 2 ** 64 - 1  # NVML_VALUE_NOT_AVAILABLE as an unsigned long long
TEMPERATURE_GPU = 0
MEMORY_ERROR_CORRECTED, MEMORY_ERROR_UNCORRECTED = 0, 1
VOLATILE_ECC = 0
STRING_BUFFER = 96  # NVML_DEVICE_NAME_V2_BUFFER_SIZE, enough for a uuid (80) and a version too
PROCESS_SLACK = 8  # processes may start between the count and the list
# nvmlEventType* bits (nvml.h): the events the probe registers for.
EVENT_SINGLE_BIT_ECC, EVENT_DOUBLE_BIT_ECC, EVENT_XID = 0x1, 0x2, 0x8
ERROR_EVENTS = EVENT_SINGLE_BIT_ECC | EVENT_DOUBLE_BIT_ECC | EVENT_XID


class NvmlError(Exception):
    def __init__(self, code: int, text: str | None = None) -> None:
        Exception.__init__(self, text or NAMES.get(code, "NVML error %d" % code))
        self.code = code


class Utilization(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class MemoryV2(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("total", ctypes.c_ulonglong), ("reserved", ctypes.c_ulonglong),
                ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


MEMORY_V2 = ctypes.sizeof(MemoryV2) | (2 << 24)  # NVML_STRUCT_VERSION(Memory, 2)


class PciInfo(ctypes.Structure):  # nvmlPciInfo_t as nvmlDeviceGetPciInfo_v3 fills it
    _fields_ = [("busIdLegacy", ctypes.c_char * 16), ("domain", ctypes.c_uint), ("bus", ctypes.c_uint),
                ("device", ctypes.c_uint), ("pciDeviceId", ctypes.c_uint), ("pciSubSystemId", ctypes.c_uint),
                ("busId", ctypes.c_char * 32)]


class ProcessInfoV1(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


class ProcessInfoV2(ctypes.Structure):  # what the _v2 and _v3 calls both fill
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


class EventData(ctypes.Structure):
    """nvmlEventData_t as nvmlEventSetWait_v2 fills it (the older nvmlEventSetWait fills the
    first three fields only). eventData is the Xid number for an Xid event, else 0."""
    _fields_ = [("device", ctypes.c_void_p), ("eventType", ctypes.c_ulonglong), ("eventData", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


# Newest first: the first one the library has is called (older drivers lack the newer names).
PROCESS_CALLS = {
    False: (("nvmlDeviceGetComputeRunningProcesses_v3", ProcessInfoV2),
            ("nvmlDeviceGetComputeRunningProcesses_v2", ProcessInfoV2),
            ("nvmlDeviceGetComputeRunningProcesses", ProcessInfoV1)),
    True: (("nvmlDeviceGetGraphicsRunningProcesses_v3", ProcessInfoV2),
           ("nvmlDeviceGetGraphicsRunningProcesses_v2", ProcessInfoV2),
           ("nvmlDeviceGetGraphicsRunningProcesses", ProcessInfoV1)),
}


class Nvml(object):
    """The real library. init() once, then any of the readings, then shutdown()."""

    def __init__(self, library: str = LIBRARY) -> None:
        self.library = library
        self.lib: ctypes.CDLL | None = None
        self.indices: dict[int | None, int] = {}  # each handle given out (its address) -> its device index, for events

    # ------------------------------------------------------------ plumbing

    def function(self, *names: str) -> Any:
        """The first of names the library exports (FUNCTION_NOT_FOUND when none)."""
        for name in names:
            try:
                return getattr(self.lib, name)
            except AttributeError:
                continue
        raise NvmlError(ERROR_FUNCTION_NOT_FOUND, "%s: Function Not Found" % names[0])

    def call(self, names: Sequence[str], *args: Any) -> None:
        if self.lib is None:
            raise NvmlError(ERROR_UNINITIALIZED)
        code = self.function(*names)(*args)
        if code != SUCCESS:
            raise NvmlError(code, self.error_text(code))

    def error_text(self, code: int) -> str | None:
        if self.lib is None:
            return None
        try:
            text = self.lib.nvmlErrorString
            text.restype = ctypes.c_char_p
            return (text(code) or b"").decode("utf-8", "replace") or None
        except (AttributeError, ctypes.ArgumentError):
            return None

    def text(self, names: Sequence[str], *args: Any) -> str:
        buf = ctypes.create_string_buffer(STRING_BUFFER)
        self.call(names, *(args + (buf, ctypes.c_uint(STRING_BUFFER))))
        return buf.value.decode("utf-8", "replace")

    def number(self, names: Sequence[str], kind: Any, *args: Any) -> int:
        out = kind()
        self.call(names, *(args + (ctypes.byref(out),)))
        return out.value

    # ------------------------------------------------------------ the session

    def init(self) -> None:
        try:
            self.lib = ctypes.CDLL(self.library)
        except OSError as e:
            why = "%s not found (no NVIDIA driver): %s" % (self.library, e)
            raise NvmlError(ERROR_LIBRARY_NOT_FOUND, why) from None
        self.call(("nvmlInit_v2", "nvmlInit"))

    def shutdown(self) -> None:
        if self.lib is not None:
            self.call(("nvmlShutdown",))
            self.lib, self.indices = None, {}

    def driver_version(self) -> str:
        return self.text(("nvmlSystemGetDriverVersion",))

    def device_count(self) -> int:
        return self.number(("nvmlDeviceGetCount_v2", "nvmlDeviceGetCount"), ctypes.c_uint)

    def handle(self, index: int) -> ctypes.c_void_p:
        out = ctypes.c_void_p()
        self.call(("nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex"),
                  ctypes.c_uint(index), ctypes.byref(out))
        self.indices[out.value] = index
        return out

    # ------------------------------------------------------------ events (Xid and ECC errors)

    def event_set_create(self) -> ctypes.c_void_p:
        out = ctypes.c_void_p()
        self.call(("nvmlEventSetCreate",), ctypes.byref(out))
        return out

    def register_events(self, handle: ctypes.c_void_p, mask: int, event_set: ctypes.c_void_p) -> None:
        """NOT_SUPPORTED when the device lacks any one of the types in mask."""
        self.call(("nvmlDeviceRegisterEvents",), handle, ctypes.c_ulonglong(mask), event_set)

    def event_set_wait(self, event_set: ctypes.c_void_p) -> tuple[int | None, int, int]:
        """(device index, event type, event data) of the next event, without waiting: TIMEOUT
        when none is there. The index is None for a device this session has no handle of."""
        data = EventData()
        self.call(("nvmlEventSetWait_v2", "nvmlEventSetWait"), event_set, ctypes.byref(data), ctypes.c_uint(0))
        return self.indices.get(data.device), data.eventType, data.eventData

    def event_set_free(self, event_set: ctypes.c_void_p) -> None:
        self.call(("nvmlEventSetFree",), event_set)

    # ------------------------------------------------------------ one device

    def name(self, handle: ctypes.c_void_p) -> str:
        return self.text(("nvmlDeviceGetName",), handle)

    def uuid(self, handle: ctypes.c_void_p) -> str:
        return self.text(("nvmlDeviceGetUUID",), handle)

    def bus_id(self, handle: ctypes.c_void_p) -> str:
        info = PciInfo()
        self.call(("nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetPciInfo_v2"), handle, ctypes.byref(info))
        return info.busId.decode("utf-8", "replace")

    def utilization(self, handle: ctypes.c_void_p) -> tuple[int, int]:
        util = Utilization()
        self.call(("nvmlDeviceGetUtilizationRates",), handle, ctypes.byref(util))
        return util.gpu, util.memory

    def memory(self, handle: ctypes.c_void_p) -> tuple[int, int]:
        """(used, total) bytes: the v2 call where present (its used leaves out the driver's
        reserve, as nvidia-smi shows it), else v1."""
        mem: MemoryV2 | Memory
        try:
            mem = MemoryV2(version=MEMORY_V2)
            self.call(("nvmlDeviceGetMemoryInfo_v2",), handle, ctypes.byref(mem))
        except NvmlError as e:
            if e.code not in (ERROR_FUNCTION_NOT_FOUND, ERROR_NOT_SUPPORTED):
                raise
            mem = Memory()
            self.call(("nvmlDeviceGetMemoryInfo",), handle, ctypes.byref(mem))
        return mem.used, mem.total

    def temperature(self, handle: ctypes.c_void_p) -> int:
        return self.number(("nvmlDeviceGetTemperature",), ctypes.c_uint, handle, ctypes.c_int(TEMPERATURE_GPU))

    def power_usage(self, handle: ctypes.c_void_p) -> int:
        """Milliwatts."""
        return self.number(("nvmlDeviceGetPowerUsage",), ctypes.c_uint, handle)

    def power_limit(self, handle: ctypes.c_void_p) -> int:
        """Milliwatts: the limit the driver enforces."""
        return self.number(("nvmlDeviceGetEnforcedPowerLimit",), ctypes.c_uint, handle)

    def clocks_event_reasons(self, handle: ctypes.c_void_p) -> int:
        """The bit mask of nvmlClocksEventReason* (the older name: ClocksThrottleReasons)."""
        return self.number(("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"),
                           ctypes.c_ulonglong, handle)

    def ecc_errors(self, handle: ctypes.c_void_p, uncorrected: bool) -> int:
        """Volatile ECC errors (since the driver loaded); NOT_SUPPORTED where ECC is off or absent."""
        kind = MEMORY_ERROR_UNCORRECTED if uncorrected else MEMORY_ERROR_CORRECTED
        return self.number(("nvmlDeviceGetTotalEccErrors",), ctypes.c_ulonglong, handle,
                           ctypes.c_int(kind), ctypes.c_int(VOLATILE_ECC))

    def processes(self, handle: ctypes.c_void_p, graphics: bool) -> list[tuple[int, int]]:
        """[(pid, used bytes)] of the compute (or graphics) processes on the device; used may
        be VALUE_NOT_AVAILABLE (no permission, WDDM)."""
        for name, struct in PROCESS_CALLS[graphics]:
            try:
                return self.process_list(name, struct, handle)
            except NvmlError as e:
                if e.code != ERROR_FUNCTION_NOT_FOUND:
                    raise
        raise NvmlError(ERROR_FUNCTION_NOT_FOUND)

    def process_list(self, name: str, struct: type[ProcessInfoV1] | type[ProcessInfoV2],
                     handle: ctypes.c_void_p) -> list[tuple[int, int]]:
        count = ctypes.c_uint(0)
        try:
            self.call((name,), handle, ctypes.byref(count), None)  # asks how many
            return []
        except NvmlError as e:
            if e.code != ERROR_INSUFFICIENT_SIZE:
                raise
        count = ctypes.c_uint(count.value + PROCESS_SLACK)
        found = (struct * count.value)()
        self.call((name,), handle, ctypes.byref(count), found)
        return [(p.pid, p.usedGpuMemory) for p in found[: count.value]]
