"""Typed data that crosses from the Box to the console: built from the box tools' JSON."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

from samai.remote.needles import required_needles


@dataclass(frozen=True)
class Marker:
    name: str
    pattern: str  # a regular expression matched against each log line's bytes
    severity: str = "info"  # info | warning | error

    def request(self) -> dict:
        needles = required_needles(self.pattern)
        return {"name": self.name, "pattern": self.pattern, "needles": list(needles) if needles else None}


@dataclass(frozen=True)
class Disk:
    label: str
    path: str
    mount: str
    total: int
    used: int
    free: int


@dataclass(frozen=True)
class ArtifactSize:
    name: str
    path: str
    exists: bool
    bytes: int = 0
    allocated: int = 0
    files: int = 0
    complete: bool = True  # False when the size walk ran out of its time budget
    error: str | None = None


@dataclass(frozen=True)
class Process:
    pid: int
    ppid: int
    pgid: int
    sid: int
    user: str
    start_time: float
    state: str
    cpu_time: float
    cpu_percent: float
    rss: int
    comm: str
    argv: tuple[str, ...]

    @property
    def command(self) -> str:
        return " ".join(self.argv) if self.argv else f"[{self.comm}]"


@dataclass(frozen=True)
class Listener:
    proto: str
    host: str
    port: int
    inode: int
    pid: int | None


@dataclass(frozen=True)
class MarkerHit:
    marker: str
    offset: int
    line: str


@dataclass(frozen=True)
class LogChunk:
    path: str
    data: bytes = b""
    offset: int = 0
    next_offset: int = 0
    line_end: int | None = None  # just after the last line break read (where the next line starts)
    tail: bytes = b""  # the last bytes read: the next read checks them to catch a rewrite
    size: int = 0
    inode: int | None = None
    dev: int | None = None
    mtime: float | None = None
    more: bool = False
    rotated: bool = False
    truncated: bool = False
    drain: str | None = None  # "renamed" | "copy": the bytes are the rest of the file the path named before
    old_file: str = ""  # that file's name now ("" if unknown)
    hits: tuple[MarkerHit, ...] = ()
    error: str | None = None
    missing: bool = False
    special: str | None = None  # refused: not a regular file but this (fifo, socket, character device...)


@dataclass(frozen=True)
class Report:
    """A small file read whole (an eval summary, say), found by a workspace glob."""

    glob: str
    path: str
    mtime: float
    text: str


@dataclass(frozen=True)
class StageRecord:
    """A stage launch as recorded on the box, with what the probe saw of it just now."""

    stage: str
    pid: int
    pgid: int
    start_time: float | None
    log: str
    cmd: str
    fired_at: float
    alive: bool = False
    rc: int | None = None
    group: tuple[int, ...] = ()

    @property
    def status(self) -> str:
        if self.alive:
            return "running"
        if self.rc is None:
            return "lost" if not self.group else "orphaned"
        return "done" if self.rc == 0 else "failed"


@dataclass(frozen=True)
class Boot:
    """The boot a snapshot was taken on, and the boot time its start times were computed from:
    the box reads a start time sent back with them against that boot time (a clock stepped
    since moves /proc/stat's, not a process's start in ticks since boot)."""

    time: int
    id: str | None


@dataclass(frozen=True)
class Snapshot:
    time: float
    host: str
    boot_time: int
    rtt: float  # seconds for the whole round trip, as the console saw it
    disks: tuple[Disk, ...]
    artifacts: tuple[ArtifactSize, ...]
    processes: tuple[Process, ...]
    listeners: tuple[Listener, ...]
    logs: tuple[LogChunk, ...]
    states: tuple[StageRecord, ...]
    reports: tuple[Report, ...] = ()
    writers: tuple[tuple[str, tuple[int, ...]], ...] = ()  # files under the workspace with 2+ writers
    binaries: tuple[tuple[str, bool, bool], ...] = ()  # (path, exists, executable)
    errors: tuple[dict[str, Any], ...] = ()
    probe_pid: int | None = None
    boot_id: str | None = None

    @property
    def boot(self) -> Boot:
        return Boot(self.boot_time, self.boot_id)

    def process(self, pid: int) -> Process | None:
        return next((p for p in self.processes if p.pid == pid), None)

    def state(self, stage: str) -> StageRecord | None:
        return next((s for s in self.states if s.stage == stage), None)


@dataclass(frozen=True)
class FireResult:
    ok: bool
    state: str  # running | done | failed | refused
    stage: str
    reason: str = ""
    pid: int | None = None
    start_time: float | None = None
    rc: int | None = None
    log: str | None = None
    log_tail: tuple[str, ...] = ()


@dataclass(frozen=True)
class SignalResult:
    """A kill or a stop as the box did it. ok is false while anything it was asked to end is
    still alive (survivors); remaining is what it was not asked to end and still runs: the
    children or group of a process killed alone, or what a group started outside it."""

    ok: bool
    result: str  # exited | killed | failed | refused | gone
    reason: str = ""
    signalled: tuple[int, ...] = ()
    survivors: tuple[int, ...] = ()
    remaining: tuple[int, ...] = ()


@dataclass(frozen=True)
class CleanResult:
    removed: tuple[tuple[str, int], ...] = ()  # (path, bytes)
    refused: tuple[tuple[str, str], ...] = ()  # (path, reason)
    missing: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.refused

    @property
    def freed(self) -> int:
        return sum(n for _, n in self.removed)


# ------------------------------------------------------------ from the tools' JSON


def _pick(cls, raw: dict[str, Any], **overrides: Any):
    names = cls.__dataclass_fields__.keys()
    values = {k: v for k, v in raw.items() if k in names}
    values.update(overrides)
    return cls(**values)


def log_chunk(raw: dict[str, Any]) -> LogChunk:
    hits = tuple(MarkerHit(**h) for h in raw.get("hits") or ())
    return _pick(LogChunk, raw, data=base64.b64decode(raw.get("data") or ""),
                 tail=base64.b64decode(raw.get("tail") or ""), hits=hits)


def process(raw: dict[str, Any], now: float) -> Process:
    """A process entry, with its CPU use averaged over its life so far (at least a second)."""
    percent = round(100 * raw["cpu_time"] / max(now - raw["start_time"], 1.0), 1)
    return _pick(Process, raw, argv=tuple(raw.get("argv") or ()), cpu_percent=percent)


def snapshot(raw: dict[str, Any], rtt: float) -> Snapshot:
    return Snapshot(
        time=raw["time"],
        host=raw.get("host", ""),
        boot_time=raw["boot_time"],
        rtt=rtt,
        disks=tuple(_pick(Disk, d) for d in raw.get("disks") or ()),
        artifacts=tuple(_pick(ArtifactSize, a) for a in raw.get("artifacts") or ()),
        processes=tuple(process(p, raw["time"]) for p in raw.get("processes") or ()),
        listeners=tuple(_pick(Listener, s) for s in raw.get("listeners") or ()),
        logs=tuple(log_chunk(c) for c in raw.get("logs") or ()),
        states=tuple(_pick(StageRecord, s, group=tuple(s.get("group") or ())) for s in raw.get("states") or ()),
        reports=tuple(_pick(Report, r) for r in raw.get("reports") or ()),
        writers=tuple((path, tuple(pids)) for path, pids in (raw.get("writers") or {}).items()),
        binaries=tuple((b["path"], b["exists"], b["executable"]) for b in raw.get("binaries") or ()),
        errors=tuple(raw.get("errors") or ()),
        probe_pid=raw.get("probe_pid"),
        boot_id=raw.get("boot_id"),
    )


def fire_result(raw: dict[str, Any], stage: str) -> FireResult:
    return _pick(FireResult, raw, stage=stage, log_tail=tuple(raw.get("log_tail") or ()))


def signal_result(raw: dict[str, Any]) -> SignalResult:
    return _pick(SignalResult, raw, signalled=tuple(raw.get("signalled") or ()),
                 survivors=tuple(raw.get("survivors") or ()), remaining=tuple(raw.get("remaining") or ()))


def clean_result(raw: dict[str, Any]) -> CleanResult:
    return CleanResult(tuple((r["path"], r["bytes"]) for r in raw.get("removed") or ()),
                       tuple((r["path"], r["reason"]) for r in raw.get("refused") or ()),
                       tuple(raw.get("missing") or ()))
