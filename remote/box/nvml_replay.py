"""A recorded NVML reading answered through nvml.Nvml's methods: the boundary where the tests
(and the bench) put a GPU that is not there. gpus.py reads it exactly as it reads the library.

Runs ON the box. Standard library only, Python >= 3.8.

A recording is JSON (tests/data/nvml/ holds some converted from real `nvidia-smi -q -x` output):
  {"init": null, "driver_version": "535.54.03", "devices": [DEVICE, ...]}
  DEVICE: {"name", "uuid", "bus_id": str, "utilization": [gpu, memory], "memory": [used, total],
           "temperature": C, "power_usage": mW, "power_limit": mW, "clocks_event_reasons": MASK,
           "ecc_errors": [corrected, uncorrected], "compute_processes": [[pid, used], ...],
           "graphics_processes": [...], "handle": null}
Any value may instead be {"nvml_error": NAME} (a key of nvml.CODES): that call fails with it; a
key left out is NOT_SUPPORTED. Values are handed on as recorded, however odd: the reading
above must cope with anything a library could return.

Events (NVML's event API: Xid and ECC errors) come from two more keys:
  "events": [[device_index, type_mask, data], ...]: delivered in order by the waits after
            registration (each once), except one for a device not registered for its type, as
            NVML would; any other entry is handed on as recorded, and {"nvml_error": NAME}
            fails that wait. Without the key a GPU registers and no event comes.
  "event_set": {"nvml_error": NAME}: nvmlEventSetCreate fails with it.
  DEVICE "event_types": the nvmlEventType* mask the GPU supports (left out: Xid and both ECC
            types), or {"nvml_error": NAME}: registering for types outside it is NOT_SUPPORTED.

The environment variable SAMAI_NVML_REPLAY names a recording for the probe to read instead of
the library (tests and bench only); SAMAI_NVML_REPLAY_CALLS names a file each init appends a
line to, so that a test can count them across processes.
"""

from __future__ import annotations

import json
import os
from typing import Any

from .nvml import CODES, ERROR_EVENTS, ERROR_NOT_SUPPORTED, ERROR_TIMEOUT, ERROR_UNINITIALIZED, ERROR_UNKNOWN, NvmlError

REPLAY_ENV = "SAMAI_NVML_REPLAY"
CALLS_ENV = "SAMAI_NVML_REPLAY_CALLS"
MAX_RECORDING = 16 * 1024 * 1024


class ReplayNvml(object):
    def __init__(self, recording: Any, calls: str | None = None) -> None:
        self.recording = recording if isinstance(recording, dict) else {}
        self.calls = calls
        self.started = False
        self.pending: list[Any] = []  # the recorded events not yet delivered
        self.registered: dict[int, int] = {}  # device index -> the types registered for
        self.open_sets = 0

    @classmethod
    def from_file(cls, path: str, calls: str | None = None) -> ReplayNvml:
        try:
            with open(path, "rb") as f:
                recording = json.loads(f.read(MAX_RECORDING).decode("utf-8"))
        except (OSError, ValueError) as e:
            recording = {"init": {"nvml_error": "LIBRARY_NOT_FOUND", "text": "replay %s: %s" % (path, e)}}
        return cls(recording, calls)

    # ------------------------------------------------------------ plumbing

    def value(self, where: Any, key: str) -> Any:
        if not self.started:
            raise NvmlError(ERROR_UNINITIALIZED)
        if not isinstance(where, dict) or key not in where:
            raise NvmlError(ERROR_NOT_SUPPORTED)
        return answer(where[key])

    def devices(self) -> list[Any]:
        devices = self.recording.get("devices")
        return devices if isinstance(devices, list) else []

    # ------------------------------------------------------------ the session

    def init(self) -> None:
        if self.calls:
            with open(self.calls, "a") as f:
                f.write("init\n")
        failure = self.recording.get("init")
        if failure is not None:
            answer(failure if isinstance(failure, dict) else {"nvml_error": "UNKNOWN"})
        self.started = True

    def shutdown(self) -> None:
        self.started = False
        self.registered = {}

    def driver_version(self) -> Any:
        return self.value(self.recording, "driver_version")

    def device_count(self) -> Any:
        if "device_count" in self.recording:
            return self.value(self.recording, "device_count")
        return len(self.devices()) if self.started else self.value(None, "")

    def handle(self, index: int) -> Any:
        devices = self.devices()
        if not self.started or not 0 <= index < len(devices):
            raise NvmlError(ERROR_UNINITIALIZED if not self.started else ERROR_NOT_SUPPORTED)
        device = devices[index]
        if isinstance(device, dict) and device.get("handle") is not None:
            answer(device["handle"] if isinstance(device["handle"], dict) else {"nvml_error": "UNKNOWN"})
        return device

    # ------------------------------------------------------------ one device: as recorded

    def name(self, handle: Any) -> Any:
        return self.value(handle, "name")

    def uuid(self, handle: Any) -> Any:
        return self.value(handle, "uuid")

    def bus_id(self, handle: Any) -> Any:
        return self.value(handle, "bus_id")

    def utilization(self, handle: Any) -> Any:
        return self.value(handle, "utilization")

    def memory(self, handle: Any) -> Any:
        return self.value(handle, "memory")

    def temperature(self, handle: Any) -> Any:
        return self.value(handle, "temperature")

    def power_usage(self, handle: Any) -> Any:
        return self.value(handle, "power_usage")

    def power_limit(self, handle: Any) -> Any:
        return self.value(handle, "power_limit")

    def clocks_event_reasons(self, handle: Any) -> Any:
        return self.value(handle, "clocks_event_reasons")

    def ecc_errors(self, handle: Any, uncorrected: bool) -> Any:
        counts = self.value(handle, "ecc_errors")
        if isinstance(counts, list) and len(counts) == 2:
            return answer(counts[1 if uncorrected else 0])
        return counts

    def processes(self, handle: Any, graphics: bool) -> Any:
        return self.value(handle, "graphics_processes" if graphics else "compute_processes")

    # ------------------------------------------------------------ events: as recorded

    def event_set_create(self) -> Any:
        if not self.started:
            raise NvmlError(ERROR_UNINITIALIZED)
        failure = self.recording.get("event_set")
        if failure is not None:
            answer(failure if isinstance(failure, dict) else {"nvml_error": "UNKNOWN"})
        events = self.recording.get("events")
        self.pending = list(events) if isinstance(events, list) else []
        self.open_sets += 1
        return {"event_set": self.open_sets}

    def register_events(self, handle: Any, mask: int, event_set: Any) -> None:
        index = next((i for i, d in enumerate(self.devices()) if d is handle), None)
        if not self.started or index is None:
            raise NvmlError(ERROR_UNINITIALIZED if not self.started else ERROR_NOT_SUPPORTED)
        supported = answer(handle.get("event_types", ERROR_EVENTS)) if isinstance(handle, dict) else None
        if not isinstance(supported, int) or mask & ~supported:
            raise NvmlError(ERROR_NOT_SUPPORTED)
        self.registered[index] = self.registered.get(index, 0) | mask

    def event_set_wait(self, event_set: Any) -> Any:
        if not self.started:
            raise NvmlError(ERROR_UNINITIALIZED)
        while self.pending:
            entry = answer(self.pending.pop(0))
            if not self.unregistered(entry):
                return entry
        raise NvmlError(ERROR_TIMEOUT)

    def unregistered(self, entry: Any) -> bool:
        """Whether entry is a well-formed event NVML would not deliver: its device is not
        registered for its type."""
        if not isinstance(entry, list) or len(entry) != 3:
            return False
        index, kind = entry[0], entry[1]
        if not isinstance(index, int) or not isinstance(kind, int) or not 0 <= index < len(self.devices()):
            return False
        return not self.registered.get(index, 0) & kind

    def event_set_free(self, event_set: Any) -> None:
        self.open_sets -= 1


def answer(value: Any) -> Any:
    """value, or the NvmlError a {"nvml_error": NAME} stands for."""
    if isinstance(value, dict) and "nvml_error" in value:
        name = value.get("nvml_error")
        code = CODES.get(name, ERROR_UNKNOWN) if isinstance(name, str) else ERROR_UNKNOWN
        text = value.get("text")
        raise NvmlError(code, text if isinstance(text, str) else None)
    return value


def from_environment() -> ReplayNvml | None:
    """The replay the environment names, else None (the real library)."""
    path = os.environ.get(REPLAY_ENV)
    if not path:
        return None
    return ReplayNvml.from_file(path, os.environ.get(CALLS_ENV))

