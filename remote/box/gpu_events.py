"""NVML's events for the probe's GPU section: Xid errors, which only NVML's event API reports,
and single- and double-bit ECC error events where a GPU has them.

Runs ON the box. Standard library only, Python >= 3.8.

A --serve probe's GpuSession keeps one EventWatch: one event set, created on the first read,
every GPU registered for Xid and ECC events (each type on its own where the GPU refuses them
together; a GPU that refuses all is left out and said in the note), and on every read the set
drained without waiting. What it drains it keeps, the last KEEP events of each kind with the box's
wall time when drained (a storm of single-bit ECC events never pushes an Xid out), and every reply
carries them all: each console polling the probe sees an Xid that
happened since it last looked, not only the poll right after it.

A probe run once (not --serve) watches no events: NVML delivers only those that happen after
registration, and such a probe would register and exit in the same moment.

Any failure of the event API is no events and a note ("gpu_events_note"), never a failed reply.
Whatever the source returns is checked before it is kept.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Deque, Mapping

if TYPE_CHECKING:
    from .nvml_source import Source

import collections
import time

from .nvml import (
    ERROR_EVENTS,
    ERROR_NOT_SUPPORTED,
    ERROR_TIMEOUT,
    EVENT_DOUBLE_BIT_ECC,
    EVENT_SINGLE_BIT_ECC,
    EVENT_XID,
    NvmlError,
)
from .wire import GpuSection

KEEP = 32  # the recent events of each kind every reply carries
MAX_DRAIN = 64  # events taken per read: a storm of them costs one read a bounded time
MAX_NOTE = 300
MAX_CODE = 2 ** 64 - 2
KINDS = {EVENT_XID: "xid", EVENT_SINGLE_BIT_ECC: "ecc_sbe", EVENT_DOUBLE_BIT_ECC: "ecc_dbe"}


class EventWatch(object):
    """The event set of one NVML session: start(count) once, read() each poll, close()."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self.event_set: Any = None
        self.note: str | None = None  # what the watch could not do, said in each reply
        self.registered: dict[int, int] = {}  # device index -> the event types it is registered for
        self.recent: dict[str, Deque[dict[str, Any]]] = dict(
            (kind, collections.deque(maxlen=KEEP)) for kind in KINDS.values())

    def start(self, count: int) -> None:
        """Create the set and register every GPU for the events it has: once per session."""
        try:
            self.event_set = self.source.event_set_create()
        except NvmlError as e:
            self.note = note("NVML events", e)
            return
        refused = []
        for index in range(count):
            mask, why = register(self.source, self.event_set, index)
            if mask:
                self.registered[index] = mask
            else:
                refused.append("GPU %d (%s)" % (index, why))
        if refused:
            self.note = ("no NVML events from " + ", ".join(refused))[:MAX_NOTE]

    def read(self) -> GpuSection:
        """The reply's event keys, after taking what has come since the last read."""
        failed = self.drain() if self.event_set is not None and self.registered else None
        kept = sorted((e for kind in self.recent.values() for e in kind), key=lambda e: e["time"])
        return {"gpu_events": kept, "gpu_events_note": failed or self.note}

    def drain(self) -> str | None:
        """Take the waiting events (at most MAX_DRAIN); why it stopped short, or None."""
        now = time.time()
        for _ in range(MAX_DRAIN):
            try:
                got = self.source.event_set_wait(self.event_set)
            except NvmlError as e:
                return None if e.code == ERROR_TIMEOUT else note("NVML event wait", e)
            event = checked(got, now, self.registered)
            if event is not None:
                self.recent[event["kind"]].append(event)
        return None

    def close(self) -> None:
        event_set, self.event_set = self.event_set, None
        if event_set is not None:
            try:
                self.source.event_set_free(event_set)
            except NvmlError:
                pass  # the session shuts down next: nothing is left to free it for


def register(source: Source, event_set: Any, index: int) -> tuple[int, str | None]:
    """(the types device index is now registered for, why none where that is 0)."""
    try:
        handle = source.handle(index)
    except NvmlError as e:
        return 0, note(None, e)
    try:
        source.register_events(handle, ERROR_EVENTS, event_set)
        return ERROR_EVENTS, None
    except NvmlError as e:
        if e.code != ERROR_NOT_SUPPORTED:
            return 0, note(None, e)
        why = note(None, e)
    mask = 0
    for kind in sorted(KINDS):  # one by one: a GPU without ECC may still report Xids
        try:
            source.register_events(handle, kind, event_set)
            mask |= kind
        except NvmlError as e:
            why = note(None, e)
    return mask, why


def checked(got: Any, now: float, registered: Mapping[int, int]) -> dict[str, Any] | None:
    """The reply's entry for what a wait returned, or None where it is no event we watch."""
    if not isinstance(got, (list, tuple)) or len(got) != 3:
        return None
    index, kind, code = got
    if not integer(index) or index not in registered or not integer(kind) or not registered[index] & kind:
        return None
    if kind not in KINDS or not integer(code) or not 0 <= code <= MAX_CODE:
        return None
    return {"gpu": index, "kind": KINDS[kind], "code": code, "time": now}


def integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def note(what: str | None, error: BaseException) -> str:
    text = str(error)
    return ("%s: %s" % (what, text) if what else text)[:MAX_NOTE]
