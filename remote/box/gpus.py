"""The probe's GPU section: every GPU NVML sees, with its processes, as the reply's "gpus".

Runs ON the box. Standard library only, Python >= 3.8.

Reads through an NVML source (nvml.Nvml, or nvml_replay.ReplayNvml where the environment names
a recording). A --serve probe keeps one GpuSession: NVML is initialised once, on the first
request that asks for GPUs, not on every poll (after a failure, tried again RETRY_S later). No
library, no driver, no device or a failed init give "gpus": [] and "gpu_error" saying why; any
single call that fails gives null for its field, and a device whose handle fails is one entry
with its "error". Nothing here raises on what the source returns: every value is checked for
its type and range before it is sent.

The session also watches NVML's events (gpu_events.py): each reply carries the recent Xid and
ECC error events as "gpu_events" and what the event API could not do as "gpu_events_note". A
probe run once (read_once) watches none: only a --serve probe is there when an Xid happens.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from .nvml_source import Source

import time

from .gpu_events import EventWatch
from .nvml import VALUE_NOT_AVAILABLE, Nvml, NvmlError
from .nvml_replay import from_environment
from .wire import GpuSection

MAX_GPUS = 64
MAX_PROCESSES = 256  # per GPU
MAX_TEXT = 128
RETRY_S = 60.0  # a failed init is tried again after this long (a driver being loaded), not every poll

# nvmlClocksEventReason* bits (nvml.h), named as nvidia-smi -q -x names them.
THROTTLE_REASONS = (
    (0x1, "gpu_idle"), (0x2, "applications_clocks_setting"), (0x4, "sw_power_cap"), (0x8, "hw_slowdown"),
    (0x10, "sync_boost"), (0x20, "sw_thermal_slowdown"), (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"), (0x100, "display_clock_setting"),
)
KNOWN_REASONS = 0x1FF


class GpuSession(object):
    """One NVML session: started on the first read, kept until close()."""

    def __init__(self, source: Source | None = None, watch_events: bool = True) -> None:
        self.source = source
        self.started = False
        self.error: str | None = None  # why it could not start, said in each reply until it can
        self.failed_at: float | None = None
        self.driver: str | None = None
        self.watch_events = watch_events
        self.events: EventWatch | None = None  # the EventWatch, from the first read that finds a GPU until close()

    def start(self) -> None:
        if self.started or (self.failed_at is not None and time.monotonic() - self.failed_at < RETRY_S):
            return
        if self.source is None:
            self.source = from_environment() or Nvml()
        try:
            self.source.init()
        except NvmlError as e:
            self.error, self.failed_at = "NVML: %s" % text(str(e)), time.monotonic()
            return
        self.started, self.error = True, None
        self.driver = text(field(self.source.driver_version))

    def read(self) -> GpuSection:
        """The reply's GPU keys: {"gpus": [...], "gpu_error": why or None, "gpu_driver": ...,
        "gpu_events": [...], "gpu_events_note": why or None}."""
        self.start()
        source = self.source
        if not self.started or source is None:  # started: a source is there
            return GpuSection(**no_events(), gpus=[], gpu_error=self.error, gpu_driver=None)
        try:
            count = bounded(source.device_count(), MAX_GPUS)
        except NvmlError as e:
            return GpuSection(**no_events(), gpus=[], gpu_error="NVML device count: %s" % text(str(e)),
                              gpu_driver=self.driver)
        if not count:
            return GpuSection(**no_events(), gpus=[], gpu_error="no NVIDIA GPU found", gpu_driver=self.driver)
        gpus = [device(source, index) for index in range(count)]
        return GpuSection(**self.read_events(source, count), gpus=gpus, gpu_error=None, gpu_driver=self.driver)

    def read_events(self, source: Source, count: int) -> GpuSection:
        """The event keys alone (gpu_events, gpu_events_note)."""
        if not self.watch_events:
            return no_events()
        try:
            if self.events is None:
                self.events = EventWatch(source)
                self.events.start(count)
            return self.events.read()
        except Exception as e:  # a bug, or a library answering oddly, costs the events, not the GPUs
            return {"gpu_events": [],
                    "gpu_events_note": "NVML events failed: %s: %s" % (type(e).__name__, text(str(e)))}

    def close(self) -> None:
        if self.events is not None:
            self.events.close()
            self.events = None
        if self.started and self.source is not None:
            self.started = False
            field(self.source.shutdown)


def read_once() -> GpuSection:
    """One reading in a session of its own (a probe run once, not --serve): no events, since
    NVML gives only those that happen after registration, and this session ends at once."""
    session = GpuSession(watch_events=False)
    try:
        return session.read()
    finally:
        session.close()


def no_events() -> GpuSection:
    return {"gpu_events": [], "gpu_events_note": None}


def device(source: Source, index: int) -> dict[str, Any]:
    try:
        handle = source.handle(index)
    except NvmlError as e:
        return {"index": index, "error": text(str(e))}
    util = pair(field(source.utilization, handle))
    mem = pair(field(source.memory, handle))
    return {
        "index": index,
        "name": text(field(source.name, handle)),
        "uuid": text(field(source.uuid, handle)),
        "bus_id": text(field(source.bus_id, handle)),
        "util_gpu": percent(util[0]),
        "util_memory": percent(util[1]),
        "memory_used": count(mem[0]),
        "memory_total": count(mem[1]),
        "temperature": bounded(field(source.temperature, handle), 1000),
        "power_draw": watts(field(source.power_usage, handle)),
        "power_limit": watts(field(source.power_limit, handle)),
        "throttle_reasons": reasons(field(source.clocks_event_reasons, handle)),
        "ecc_corrected": count(field(source.ecc_errors, handle, False)),
        "ecc_uncorrected": count(field(source.ecc_errors, handle, True)),
        "processes": processes(field(source.processes, handle, False), field(source.processes, handle, True)),
    }


def field(call: Callable[..., Any], *args: Any) -> Any:
    """call(*args), or None where NVML says no (NOT_SUPPORTED is normal: ECC on a GeForce)."""
    try:
        return call(*args)
    except NvmlError:
        return None


def processes(compute: Any, graphics: Any) -> list[dict[str, Any]]:
    """One entry per pid: compute and graphics lists merged ("C+G", as nvidia-smi shows it)."""
    merged: dict[int, dict[str, Any]] = {}
    for kind, listed in (("C", compute), ("G", graphics)):
        for entry in listed if isinstance(listed, (list, tuple)) else ():
            pid, used = pair(entry)
            pid = bounded(pid, 2 ** 32 - 1)
            if pid is None or (pid not in merged and len(merged) >= MAX_PROCESSES):
                continue
            used = count(used)
            seen = merged.get(pid)
            if seen is None:
                merged[pid] = {"pid": pid, "used_memory": used, "kind": kind}
            elif seen["kind"] != kind:  # the same context listed twice: one amount, not two
                seen["kind"] = "C+G"
                if seen["used_memory"] is None:
                    seen["used_memory"] = used
    return list(merged.values())


def reasons(mask: Any) -> list[str] | None:
    """The names of the active clocks event reasons (an unknown bit by its value)."""
    mask = count(mask)
    if mask is None:
        return None
    names = [name for bit, name in THROTTLE_REASONS if mask & bit]
    if mask & ~KNOWN_REASONS:
        names.append("0x%x" % (mask & ~KNOWN_REASONS))
    return names


# ---------------------------------------------------------------- values checked


def pair(value: Any) -> tuple[Any, Any]:
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return value[0], value[1]
    return None, None


def bounded(value: Any, limit: int) -> int | None:
    """value when it is an integer from 0 to limit (never a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= limit:
        return None
    return value


def count(value: Any) -> int | None:
    """An unsigned 64-bit count, None for NVML_VALUE_NOT_AVAILABLE."""
    return bounded(value, VALUE_NOT_AVAILABLE - 1)


def percent(value: Any) -> int | None:
    return bounded(value, 100)


def watts(milliwatts: Any) -> float | None:
    milliwatts = bounded(milliwatts, 2 ** 32 - 1)
    return None if milliwatts is None else round(milliwatts / 1000.0, 2)


def text(value: Any) -> str | None:
    """A string from the library, bounded (a recording, or a broken driver, may hold anything)."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if not isinstance(value, str):
        return None
    return value[:MAX_TEXT]
