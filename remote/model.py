"""Typed data that crosses from the Box to the console: built from the box tools' JSON.

Each parser takes its tool's reply as box/wire.py declares it (the keys the tool writes): the
declaration is the tool's promise, not the bytes', so every value is checked here as before."""

from __future__ import annotations

import base64
import functools
import math
import re
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, is_dataclass, replace
from typing import Any, Literal, NamedTuple, ParamSpec, TypeVar

from samai.remote.box.chainline import is_nonce, said_by_chain
from samai.remote.box.identity import same_start as same_start  # the box tools' rule, re-exported
from samai.remote.box.wire import (
    BinaryEntry,
    CheckpointsReply,
    CleanReply,
    GgufWriteReply,
    GpuSection,
    KillReply,
    LaunchReply,
    ProbeReply,
    StageState,
    WatchersReply,
)
from samai.remote.errors import BoxError as BoxError  # re-exported: what a malformed reply raises
from samai.remote.marker import Marker as Marker  # re-exported: a stage's marker, the probe's request
from samai.remote.marker import Severity as Severity

RunStatus = Literal["running", "stopped", "lost", "orphaned", "done", "failed"]  # a recorded run's, as the box shows it


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
class DiskUser:
    """One of the workspace's largest entries (a top-level file, or a top-level folder's entry)."""

    path: str  # relative to the workspace, as the box names it (untrusted text)
    bytes: int
    allocated: int
    files: int
    complete: bool = True  # False when the walk ran out of its time budget


@dataclass(frozen=True)
class DiskUsers:
    top: tuple[DiskUser, ...]
    allocated: int  # all the entries measured, not only the top ones
    entries: int
    complete: bool


@dataclass(frozen=True)
class Listing:
    """The names in one folder that start with what was typed (folders end in "/")."""

    names: tuple[str, ...]
    complete: bool  # False: there are more than these (the box sent its first ones)


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
    # Several rotations between two reads (box/logfiles.py): the inodes of the log's generations
    # no newer than the file read, which the follower sends back; the file it read before, when
    # no name or descriptor of it was left (its rest not read); and the generations on the way
    # that could not be read: (name, bytes of log it holds, -1 if unknown).
    older: tuple[int, ...] | None = None
    gone: int | None = None
    unread: tuple[tuple[str, int], ...] = ()
    hits: tuple[MarkerHit, ...] = ()
    error: str | None = None
    missing: bool = False
    special: str | None = None  # refused: not a regular file but this (fifo, socket, character device...)


@dataclass(frozen=True)
class ByteRange:
    """One byte range the probe read, or could not read (error)."""

    path: str | None
    start: int = 0
    size: int = 0
    data: bytes = b""
    error: str | None = None


@dataclass(frozen=True)
class Report:
    """A small file read whole (an eval summary, say), found by a workspace glob. One over the
    box's limit comes without its text: its size says so (too_big), never a part as the whole."""

    glob: str
    path: str
    mtime: float
    text: str
    size: int | None = None  # its bytes, as the box found them
    limit: int | None = None  # the most the box reads of a report

    @property
    def too_big(self) -> bool:
        return self.size is not None and self.limit is not None and self.size > self.limit


# Why a run ended badly, most specific first (remote/box/death.py; console/core/death.py).
DEATH_CAUSES = ("stopped", "oom_killed", "disk_full", "cuda_oom", "collective_timeout", "gpu_xid", "exception",
                "signal", "reboot", "exit")


@dataclass(frozen=True)
class Death:
    """Why a run ended badly: one of DEATH_CAUSES, a line of detail and the lines it was read from."""

    cause: str
    detail: str
    evidence: tuple[str, ...] = ()

    @property
    def line(self) -> str:
        return f"{self.cause}: {self.detail}"


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
    stopped_at: float | None = None  # when the operator stopped this run (kill.py's note)
    stopped_by: str = ""  # by whom: the console's user@host and what it did (box text: shown inert)
    death: Death | None = None  # why it died, as its chain said (rc other than 0)
    boot_id: str | None = None  # the boot it was fired on
    nonce: str = ""  # what its chain's lines in the log carry (remote/box/chainline.py); '' if not recorded

    def said_by_chain(self, line: str) -> str | None:
        """A log line's text when it is one of this run's chain's lines (None: the stage's text)."""
        return said_by_chain(line, self.nonce)

    @property
    def status(self) -> RunStatus:
        if self.alive:
            return "running"
        if self.stopped_at is not None and self.rc != 0:
            return "stopped"  # a deliberate stop is not a failure, whatever rc its trap wrote (a chain
            # that had finished well is done, whatever of it was stopped afterwards)
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


class SharedFile(NamedTuple):
    """A file under the workspace with two or more writers (two downloads into one file)."""

    path: str
    pids: tuple[int, ...]


class BinaryCheck(NamedTuple):
    """A binary the config names, as the box found it (a tarball with a nested prefix misses it)."""

    path: str
    exists: bool
    executable: bool


@dataclass(frozen=True)
class GpuProcess:
    """A process holding memory on one GPU, as NVML lists it (its pid in the box's namespace,
    or another container's: it may not be in the snapshot's processes)."""

    pid: int
    used_memory: int | None = None  # bytes; None where NVML cannot say (NVML_VALUE_NOT_AVAILABLE)
    kind: str = "C"  # "C" compute, "G" graphics, "C+G" both (as nvidia-smi shows it)


@dataclass(frozen=True)
class Gpu:
    """One GPU as the probe read it through NVML: None wherever a call failed or is not supported
    (ECC on a consumer card), never a guess. Strings are untrusted and bounded by the probe."""

    index: int
    name: str | None = None
    uuid: str | None = None
    bus_id: str | None = None
    util_gpu: int | None = None  # percent over NVML's last sample period
    util_memory: int | None = None  # percent of time memory was read or written
    memory_used: int | None = None  # bytes
    memory_total: int | None = None  # bytes
    temperature: int | None = None  # degrees C
    power_draw: float | None = None  # watts
    power_limit: float | None = None  # watts (the enforced limit)
    throttle_reasons: tuple[str, ...] | None = None  # active clocks event reasons, by name
    ecc_corrected: int | None = None  # volatile counts (since the driver loaded)
    ecc_uncorrected: int | None = None
    processes: tuple[GpuProcess, ...] = ()
    error: str | None = None  # why this GPU could not be read at all (e.g. "GPU is lost")

    @property
    def memory_fraction(self) -> float | None:
        if self.memory_used is None or not self.memory_total:
            return None
        return self.memory_used / self.memory_total

    @property
    def slowdowns(self) -> tuple[str, ...]:
        """Active reasons that mean the GPU is held back (idle and clock settings are not)."""
        return tuple(r for r in self.throttle_reasons or () if r not in BENIGN_THROTTLE_REASONS)


# Clocks event reasons that are not a problem: an idle GPU, clocks the operator chose.
BENIGN_THROTTLE_REASONS = frozenset({"gpu_idle", "applications_clocks_setting", "display_clock_setting"})


# The kinds of GpuEvent: an Xid error, a single-bit (corrected) or double-bit (uncorrected) ECC error.
GPU_EVENT_KINDS = ("xid", "ecc_sbe", "ecc_dbe")
MAX_GPU_EVENTS = 64  # the probe sends its last 32
MAX_EVENT_TIME = 1e11  # seconds since the epoch: year 5138, far beyond any real clock


@dataclass(frozen=True)
class GpuEvent:
    """An event NVML's event API reported for one GPU (a --serve probe watches them), with the
    box's wall time when the probe took it: within a poll of when it happened."""

    gpu: int  # the GPU's index
    kind: str  # one of GPU_EVENT_KINDS
    code: int  # the Xid number (999: one NVML cannot name); 0 for an ECC event
    time: float


@dataclass(frozen=True)
class GpuReading:
    """The box's GPUs: none and an error saying why (no driver, no device, NVML failed to start)."""

    gpus: tuple[Gpu, ...] = ()
    error: str | None = None
    driver: str | None = None  # the driver version NVML reports
    events: tuple[GpuEvent, ...] = ()  # the recent ones, oldest first
    events_note: str | None = None  # what the event API could not do (a GPU without events, a failed wait)

    def holders(self) -> dict[int, int]:
        """pid -> bytes of GPU memory it holds over every GPU (unknown amounts count 0)."""
        held: dict[int, int] = {}
        for gpu in self.gpus:
            for proc in gpu.processes:
                held[proc.pid] = held.get(proc.pid, 0) + (proc.used_memory or 0)
        return held


@dataclass(frozen=True)
class EndpointAnswer:
    """One monitoring endpoint's answer as the probe got it (its body: the server's text, unread)."""

    path: str
    status: int | None = None
    body: str = ""
    seconds: float = 0.0
    truncated: bool = False
    error: str = ""  # why there is no answer (refused, not within the budget, not HTTP)


@dataclass(frozen=True)
class PortAnswers:
    port: int
    answers: tuple[EndpointAnswer, ...] = ()

    def get(self, path: str) -> EndpointAnswer | None:
        return next((a for a in self.answers if a.path == path), None)


@dataclass(frozen=True)
class Memory:
    """The box's RAM and the memory cgroup limit its stages run under (0 / None: not known)."""

    total: int = 0
    available: int = 0
    cgroup: str | None = None
    limit: int | None = None

    @property
    def ceiling(self) -> int:
        """What a stage's memory can grow to: its cgroup's limit when set below the RAM, else the RAM."""
        return min(self.limit, self.total) if self.limit and self.total else self.limit or self.total


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
    writers: tuple[SharedFile, ...] = ()
    binaries: tuple[BinaryCheck, ...] = ()
    errors: tuple[dict[str, Any], ...] = ()
    probe_pid: int | None = None
    boot_id: str | None = None
    gpus: GpuReading = GpuReading()
    memory: Memory = Memory()
    serving: tuple[PortAnswers, ...] = ()  # when asked: each serving port's monitoring answers

    @property
    def boot(self) -> Boot:
        return Boot(self.boot_time, self.boot_id)

    def process(self, pid: int) -> Process | None:
        return next((p for p in self.processes if p.pid == pid), None)

    def same_process(self, pid: int, start_time: float) -> Process | None:
        """The process with this pid if it is the one that started then (not a reuse of its pid)."""
        proc = self.process(pid)
        return proc if proc is not None and same_start(proc.start_time, start_time) else None

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
    nonce: str = ""  # what its chain's lines carry

    @property
    def stage_tail(self) -> tuple[str, ...]:
        """The stage's own last lines: log_tail without its chain's lines around them (those that
        carry this run's nonce; a copy the stage printed is its own text) and blank lines."""
        return tuple(line for line in self.log_tail if line.strip() and said_by_chain(line, self.nonce) is None)


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


@dataclass(frozen=True)
class Distribution:
    """One distribution installed in a Python environment (untrusted text, as its metadata says)."""

    name: str
    version: str
    path: str  # its dist-info (or egg-info) folder


@dataclass(frozen=True)
class PythonPackages:
    """The distributions installed in one Python environment on the box (box/packages.py)."""

    python: str  # the interpreter as asked for: a stage's venv/bin/python
    prefix: str = ""
    site: tuple[str, ...] = ()
    found: tuple[Distribution, ...] = ()
    complete: bool = True  # False when there were more than asked for
    error: str | None = None

    def get(self, name: str) -> Distribution | None:
        """The installed distribution of that name, compared as pip compares names."""
        wanted = normalised_name(name)
        return next((d for d in self.found if normalised_name(d.name) == wanted), None)


def normalised_name(name: str) -> str:
    """PEP 503: runs of -, _ and . are one -, case ignored (as box/packages.py compares them)."""
    return re.sub(r"[-_.]+", "-", name).lower()


# ------------------------------------------------------------ from the tools' JSON
#
# A reply is untrusted: anything but the documented shape is a BoxError naming what is wrong,
# never a KeyError or TypeError from deep in a converter, nor a wrongly typed field that breaks
# a view later. Every field is checked against its annotation.


P = ParamSpec("P")
R = TypeVar("R")


def _converting(convert: Callable[P, R]) -> Callable[P, R]:
    """A converter whose malformed input is a BoxError."""
    @functools.wraps(convert)
    def checked(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return convert(*args, **kwargs)
        except BoxError:
            raise
        except (KeyError, IndexError, TypeError, ValueError, AttributeError, OverflowError, RecursionError) as e:
            raise BoxError(f"malformed reply ({convert.__name__}): {type(e).__name__}: {str(e)[:200]}") from None
    return checked


def _checker(hint: Any):
    """A test of whether a value read from JSON (lists made tuples) has the annotated type: exact
    types, as json.loads makes them (a bool is no int here), built once per annotation."""
    if hint is Any:
        return lambda value: True
    if hint is float:
        return lambda value: type(value) is float or type(value) is int
    if isinstance(hint, type) and not typing.get_args(hint):
        return (lambda value: type(value) is hint) if hint in (int, str, bool, bytes) else (
            lambda value: isinstance(value, hint))
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        tests = [_checker(a) for a in args]
        return lambda value: any(test(value) for test in tests)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        each = _checker(args[0])
        return lambda value: type(value) is tuple and all(each(v) for v in value)
    if origin is tuple:
        tests = [_checker(a) for a in args]
        return lambda value: (type(value) is tuple and len(value) == len(tests)
                              and all(test(v) for test, v in zip(tests, value, strict=True)))
    if origin is dict:
        return lambda value: isinstance(value, dict)
    return lambda value: True  # an annotation this check does not know: not checked


@functools.cache
def _checks(cls) -> tuple[tuple[str, Any], ...]:
    return tuple((name, _checker(hint)) for name, hint in typing.get_type_hints(cls).items())


def _typed(cls, **values: Any):
    """cls(**values), each value checked against its field's annotation."""
    for name, fits in _checks(cls):
        if name in values and not fits(values[name]):
            value = values[name]
            shown = repr(value)[:60] if not is_dataclass(value) else type(value).__name__
            raise BoxError(f"malformed reply: {cls.__name__}.{name} is {type(value).__name__} {shown}")
    try:
        return cls(**values)
    except TypeError as e:  # a field without a default is missing
        raise BoxError(f"malformed reply: {cls.__name__}: {e}") from None


def _pick(cls, raw: Mapping[str, Any], **overrides: Any):
    if not isinstance(raw, dict):
        raise BoxError(f"malformed reply: {cls.__name__} is {type(raw).__name__}, not an object")
    names = cls.__dataclass_fields__.keys()
    values = {k: v for k, v in raw.items() if k in names}
    values.update(overrides)
    return _typed(cls, **values)


def _items(raw: Mapping[str, Any], key: str, kind: type = list) -> Any:
    """raw[key] when it is a `kind` (absent or null: an empty one)."""
    value = raw.get(key)
    if value is None:
        return kind()
    if not isinstance(value, kind):
        raise BoxError(f"malformed reply: {key} is {type(value).__name__}, not a {kind.__name__}")
    return value


@_converting
def log_chunk(raw: dict[str, Any]) -> LogChunk:
    hits = tuple(_pick(MarkerHit, h) for h in raw.get("hits") or ())
    return checked_cursor(_pick(LogChunk, raw, data=_data(raw), tail=base64.b64decode(raw.get("tail") or ""),
                                hits=hits, **_generations(raw)))


MAX_OLDER = 64  # the probe names at most the 18 generations it looks at, and the file read


def _generations(raw: dict[str, Any]) -> dict[str, Any]:
    """older and unread as tuples (JSON gives lists), for the annotation check to judge; older
    goes back to the probe, so it is a short list of inode numbers or the reply is refused."""
    fields: dict[str, Any] = {}
    older, unread = raw.get("older"), raw.get("unread")
    if isinstance(older, list):
        if len(older) > MAX_OLDER or not all(type(i) is int and 0 <= i < 2**64 for i in older):
            raise BoxError("malformed reply: LogChunk.older is not a short list of inode numbers")
        fields["older"] = tuple(older)
    if isinstance(unread, list):
        fields["unread"] = tuple(tuple(u) if isinstance(u, list) else u for u in unread)
    return fields


CURSOR_FIELDS = ("offset", "next_offset", "line_end", "size", "inode", "dev")
MAX_CURSOR = 2**64 - 1  # an inode or device number (the probe takes offsets up to 2**63 - 1 back)
MAX_TAIL = 64  # the probe sends the last 16 bytes it read, for the next read to check


def checked_cursor(chunk: LogChunk) -> LogChunk:
    """chunk, if what its follower sends back next time is a cursor the probe takes (an offset
    of -1 or a NaN mtime kept from one reply would have every later request refused: the log
    stalled for good)."""
    for name in CURSOR_FIELDS:
        value = getattr(chunk, name)
        if value is not None and not 0 <= value <= (MAX_CURSOR if name in ("inode", "dev") else 2**63 - 1):
            raise BoxError(f"malformed reply: LogChunk.{name} is {value}, out of range")
    if chunk.mtime is not None and not math.isfinite(chunk.mtime):
        raise BoxError(f"malformed reply: LogChunk.mtime is {chunk.mtime}")
    if len(chunk.tail) > MAX_TAIL:
        raise BoxError(f"malformed reply: LogChunk.tail is {len(chunk.tail)} bytes, more than {MAX_TAIL}")
    return chunk


@_converting
def process(raw: dict[str, Any], now: float) -> Process:
    """A process entry, with its CPU use averaged over its life so far (at least a second)."""
    return _pick(Process, raw, argv=tuple(_items(raw, "argv")), cpu_percent=_lifetime_percent(raw, now))


def _lifetime_percent(raw: dict[str, Any], now: float) -> float:
    return round(100 * raw["cpu_time"] / max(now - raw["start_time"], 1.0), 1)


class ProcessCache:
    """The last reply's processes as converted, by pid. An entry handed again as the very same
    object (the running probe said it had not changed: boxapi.HeldProcesses keeps it) was
    checked when it came: only its lifetime CPU average is worked out again, for the reply's
    time. A box has hundreds of kernel threads and idle processes that never change."""

    def __init__(self) -> None:
        self.by_pid: dict[int, tuple[dict[str, Any], Process]] = {}

    def convert(self, entries: list[Any], now: float) -> tuple[Process, ...]:
        held, self.by_pid = self.by_pid, {}
        converted = []
        for raw in entries:
            known = held.get(raw["pid"]) if type(raw) is dict and "pid" in raw else None
            if known is not None and known[0] is raw:
                proc, percent = known[1], _lifetime_percent(raw, now)
                if proc.cpu_percent != percent:
                    proc = replace(proc, cpu_percent=percent)
            else:
                proc = process(raw, now)
            self.by_pid[proc.pid] = (raw, proc)
            converted.append(proc)
        return tuple(converted)


@_converting
def snapshot(raw: ProbeReply | Mapping[str, Any], rtt: float, processes: ProcessCache | None = None) -> Snapshot:
    """The probe's reply (or a recorded one, plain JSON: console/replay.py); processes: the cache
    of the last replies' (a Box keeps one for its probe)."""
    entries = _items(raw, "processes")
    return _typed(
        Snapshot,
        time=raw["time"],
        host=raw.get("host", ""),
        boot_time=raw["boot_time"],
        rtt=rtt,
        disks=tuple(_pick(Disk, d) for d in _items(raw, "disks")),
        artifacts=tuple(_pick(ArtifactSize, a) for a in _items(raw, "artifacts")),
        processes=(processes or ProcessCache()).convert(entries, raw["time"]),
        listeners=tuple(_pick(Listener, s) for s in _items(raw, "listeners")),
        logs=tuple(log_chunk(c) for c in _items(raw, "logs")),
        states=tuple(_stage_record(s) for s in _items(raw, "states")),
        reports=tuple(_pick(Report, r) for r in _items(raw, "reports")),
        writers=tuple(_shared_file(path, _items(raw["writers"], path)) for path in _items(raw, "writers", dict)),
        binaries=tuple(_binary(b) for b in _items(raw, "binaries")),
        errors=tuple(_items(raw, "errors")),
        probe_pid=raw.get("probe_pid"),
        boot_id=raw.get("boot_id"),
        gpus=gpu_reading(raw),
        memory=_memory(raw.get("memory")),
        serving=serving_answers(raw.get("serving")),
    )


MAX_SERVING_BODY = 256 * 1024  # what the probe sends at most; a longer body is cut here too


def serving_answers(raw: Any) -> tuple[PortAnswers, ...]:
    """The reply's serving section; an entry not of the documented shape is left out (never the
    snapshot's loss), a body or error cut to its bound."""
    if not isinstance(raw, list):
        return ()
    out = []
    for entry in raw[:16]:
        port, answers = (entry.get("port"), entry.get("answers")) if isinstance(entry, dict) else (None, None)
        if type(port) is int and 0 < port < 65536 and isinstance(answers, dict):
            out.append(PortAnswers(port, tuple(a for a in (_endpoint(k, v) for k, v in list(answers.items())[:8])
                                               if a is not None)))
    return tuple(out)


def _endpoint(path: Any, raw: Any) -> EndpointAnswer | None:
    if not (isinstance(path, str) and isinstance(raw, dict)):
        return None
    status, body, seconds, error = raw.get("status"), raw.get("body"), raw.get("seconds"), raw.get("error")
    return EndpointAnswer(
        path[:40], status if type(status) is int and 100 <= status < 1000 else None,
        body[:MAX_SERVING_BODY] if isinstance(body, str) else "",
        float(seconds) if isinstance(seconds, (int, float)) and not isinstance(seconds, bool)
        and 0 <= seconds < 1e6 else 0.0,
        raw.get("truncated") is True or (isinstance(body, str) and len(body) > MAX_SERVING_BODY),
        error[:300] if isinstance(error, str) else "" if type(status) is int else "no answer")


def _memory(raw: Any) -> Memory:
    """The reply's memory section; one not of the documented shape is no reading (never the snapshot's loss)."""
    if not isinstance(raw, dict):
        return Memory()
    try:
        return _pick(Memory, raw)
    except BoxError:
        return Memory()


def _stage_record(raw: StageState) -> StageRecord:
    return _pick(StageRecord, raw, group=tuple(_items(raw, "group")), death=_death(raw.get("death")),
                 nonce=_nonce(raw))


def _nonce(raw: Mapping[str, Any]) -> str:
    """A record's or reply's run nonce: one of the launcher's shape, else none (a record anyone
    on the box could have rewritten: an odd value costs its chain lines their trust, not the reply)."""
    nonce = raw.get("nonce")
    return nonce if isinstance(nonce, str) and is_nonce(nonce) else ""


def _death(raw: Any) -> Death | None:
    """The chain's verdict; one that is not of the documented shape (an older or a tampered
    file) is no verdict: the console judges from what it sees."""
    if not isinstance(raw, dict) or raw.get("cause") not in DEATH_CAUSES or not isinstance(raw.get("detail"), str):
        return None
    evidence = raw.get("evidence")
    lines = tuple(e[:400] for e in evidence[:8] if isinstance(e, str)) if isinstance(evidence, list) else ()
    return Death(raw["cause"], raw["detail"][:400], lines)


def gpu_reading(raw: GpuSection | Mapping[str, Any]) -> GpuReading:
    """The reply's GPU section. A malformed one costs the GPUs (said in its error), not the
    snapshot: the rest of the reply is as good without them. Its events are read on their own,
    each one that is not of the documented shape left out."""
    events = gpu_events(raw.get("gpu_events"))
    note = raw.get("gpu_events_note")
    note = note[:300] if type(note) is str else None
    try:
        return _gpu_reading(raw, events, note)
    except BoxError as e:
        return GpuReading(error=str(e)[:300], events=events, events_note=note)


@_converting
def _gpu_reading(raw: GpuSection | Mapping[str, Any], events: tuple[GpuEvent, ...], note: str | None) -> GpuReading:
    gpus = tuple(_gpu(g) for g in _items(raw, "gpus"))
    return _typed(GpuReading, gpus=gpus, error=raw.get("gpu_error"), driver=raw.get("gpu_driver"), events=events,
                  events_note=note)


def gpu_events(raw: Any) -> tuple[GpuEvent, ...]:
    """The well-formed entries of a reply's "gpu_events" (the last MAX_GPU_EVENTS), garbage left out."""
    if type(raw) is not list:
        return ()
    return tuple(e for e in map(_gpu_event, raw[-MAX_GPU_EVENTS:]) if e is not None)


def _gpu_event(raw: Any) -> GpuEvent | None:
    if type(raw) is not dict:
        return None
    gpu, kind, code, at = raw.get("gpu"), raw.get("kind"), raw.get("code"), raw.get("time")
    if type(gpu) is not int or not 0 <= gpu < 2**31 or type(kind) is not str or kind not in GPU_EVENT_KINDS:
        return None
    if type(code) is not int or not 0 <= code < 2**64:
        return None
    if isinstance(at, bool) or not isinstance(at, int | float) or not 0 <= at < MAX_EVENT_TIME:  # NaN fails too
        return None
    return GpuEvent(gpu, kind, code, float(at))


def _gpu(raw: Any) -> Gpu:
    if not isinstance(raw, dict):
        raise BoxError(f"malformed reply: Gpu is {type(raw).__name__}, not an object")
    procs = tuple(_pick(GpuProcess, p) for p in _items(raw, "processes"))
    reasons = None if raw.get("throttle_reasons") is None else tuple(_items(raw, "throttle_reasons"))
    return _pick(Gpu, raw, processes=procs, throttle_reasons=reasons)


@_converting
def disk_users(raw: ProbeReply) -> DiskUsers:
    users = raw.get("users")
    if users is None and _items(raw, "errors"):  # the workspace could not be read: the probe's reason
        raise BoxError(str(_items(raw, "errors")[0].get("error", "the workspace could not be measured"))[:300])
    if not isinstance(users, dict):
        raise BoxError(f"malformed reply: users is {type(users).__name__}, not an object")
    return _pick(DiskUsers, users, top=tuple(_pick(DiskUser, u) for u in _items(users, "top")))


def _shared_file(path: Any, pids: list[Any]) -> SharedFile:
    if type(path) is not str or not all(type(p) is int for p in pids):
        raise BoxError(f"malformed reply: writers entry {repr(path)[:60]}: {repr(pids)[:60]}")
    return SharedFile(path, tuple(pids))


def _binary(raw: BinaryEntry) -> BinaryCheck:
    checked = BinaryCheck(raw["path"], raw["exists"], raw["executable"])
    if type(checked.path) is not str or type(checked.exists) is not bool or type(checked.executable) is not bool:
        raise BoxError(f"malformed reply: binaries entry {repr(raw)[:60]}")
    return checked


@_converting
def fire_result(raw: LaunchReply, stage: str) -> FireResult:
    return _pick(FireResult, raw, stage=stage, log_tail=tuple(_items(raw, "log_tail")), nonce=_nonce(raw))


@_converting
def signal_result(raw: KillReply) -> SignalResult:
    return _pick(SignalResult, raw, signalled=tuple(raw.get("signalled") or ()),
                 survivors=tuple(raw.get("survivors") or ()), remaining=tuple(raw.get("remaining") or ()))


@_converting
def clean_result(raw: CleanReply) -> CleanResult:
    return _typed(CleanResult,
                  removed=tuple((r["path"], r["bytes"]) for r in _items(raw, "removed")),
                  refused=tuple((r["path"], r["reason"]) for r in _items(raw, "refused")),
                  missing=tuple(_items(raw, "missing")))


def check_process_delta(reply: ProbeReply) -> None:
    """BoxError unless a --serve probe's marked reply has the shape HeldProcesses.fold reads:
    its marks are strings, "processes" a list of objects with an integer pid, "processes_gone"
    a list of pids."""
    if reply.get("processes_mark") is None:
        return  # not marked: folded as it is
    for key in ("processes_mark", "processes_since"):
        if reply.get(key) is not None and not isinstance(reply[key], str):
            raise BoxError(f"malformed reply: {key} is {type(reply[key]).__name__}, not a string")
    if not isinstance(reply.get("processes"), list):
        raise BoxError("malformed reply: marked, but without a list of processes")
    for entry in reply["processes"]:
        if not isinstance(entry, dict) or type(entry.get("pid")) is not int:
            raise BoxError(f"malformed reply: a process entry without a pid: {repr(entry)[:60]}")
    if not all(type(pid) is int for pid in _items(reply, "processes_gone")):
        raise BoxError("malformed reply: processes_gone holds something that is not a pid")


@_converting
def only_entry(raw: ProbeReply, key: Literal["logs", "ranges"]) -> dict[str, Any]:
    """The one entry of raw[key], for a request that asked for one (a log, a range)."""
    entries = _items(raw, key)
    if len(entries) != 1 or not isinstance(entries[0], dict):
        raise BoxError(f"malformed reply: {key} holds {len(entries)} entries, not the one object asked for")
    return entries[0]


@_converting
def byte_range(raw: dict[str, Any]) -> ByteRange:
    return _pick(ByteRange, raw, data=_data(raw))


def _data(raw: dict[str, Any]) -> bytes:
    """An entry's bytes: attached to the reply (the Box put them in "data"), else base64."""
    data = raw.get("data") or b""
    if isinstance(data, (bytes, memoryview)):  # never from JSON: only what was attached
        return bytes(data)
    if not isinstance(data, str):
        raise BoxError(f"malformed reply: data is {type(data).__name__}, not base64 text")
    return base64.b64decode(data)


@_converting
def python_packages(raw: ProbeReply) -> tuple[PythonPackages, ...]:
    """The reply's "packages": one entry per environment asked for."""
    return tuple(_pick(PythonPackages, env, site=tuple(_items(env, "site")),
                       found=tuple(_pick(Distribution, d) for d in _items(env, "found")))
                 for env in _items(raw, "packages"))


# ------------------------------------------------------------ checkpoints (box/checkpoints.py)


@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint-STEP folder of a training run, as the box judged it."""

    name: str
    step: int
    mtime: float
    bytes: int
    files: int
    complete: bool
    missing: tuple[str, ...] = ()
    temporary: tuple[str, ...] = ()
    settling: bool = False
    finite: bool | None = None  # None: no safetensors weights were read
    nonfinite: tuple[str, ...] = ()
    weights: str | None = None
    problems: tuple[str, ...] = ()


@dataclass(frozen=True)
class Checkpoints:
    folder: str
    checkpoints: tuple[Checkpoint, ...]  # newest step first: the newest the box judges
    error: str | None = None
    unjudged: int = 0  # older checkpoints the folder holds beyond those: neither judged nor listed

    def left_out(self) -> str:
        """What the listing leaves out, said ('' when it lists every checkpoint)."""
        if not self.unjudged:
            return ""
        return (f"{self.unjudged:,} older checkpoint(s) in {self.folder} beyond the newest {len(self.checkpoints)} "
                "were not judged")


MAX_UNJUDGED = 10**12  # checkpoints a folder could hold: far more than any, far less than a float's integers


@_converting
def checkpoints(raw: CheckpointsReply) -> Checkpoints:
    found = tuple(_pick(Checkpoint, c, **{k: tuple(_items(c, k)) for k in ("missing", "temporary", "nonfinite",
                                                                           "problems")})
                  for c in _items(raw, "checkpoints"))
    listed = _pick(Checkpoints, raw, checkpoints=found)
    if not 0 <= listed.unjudged <= MAX_UNJUDGED:
        raise BoxError(f"malformed reply: Checkpoints.unjudged is {listed.unjudged!r:.40}, not a count")
    return listed


# ------------------------------------------------------------ watchers (box/watchers.py)


@dataclass(frozen=True)
class WatcherBeat:
    """One watcher's heartbeat, as it wrote it (anyone may write that folder: checked here)."""

    id: str
    who: str = ""  # user@host
    host: str = ""
    pid: int = 0
    since: float = 0.0
    interval: float = 10.0
    written: float = 0.0  # the box's clock, when the beat was written
    last_poll: float | None = None
    last_sent: float | None = None
    last_error: str = ""
    sent: int = 0
    held: int = 0  # messages the hourly cap held back
    unsent: int = 0  # messages that could not be sent (after their retries)
    leading: bool = False
    at: float | None = None  # the watcher's clock when it beat, under its signature
    key: str = ""  # the id of the key it signed with (console/core/watch/trust.py)
    mac: str = ""


@dataclass(frozen=True)
class WatchShared:
    watchers: tuple[WatcherBeat, ...]
    leader: str | None  # the id holding the lease to send (the box gives it only while its holder beats)
    leading: bool  # the asking watcher holds it
    ledger: dict[str, Any]  # the leader's, as written: read by the console's policy, defensively
    acks: dict[str, Any]  # KEY -> {by, at, text}
    now: float  # the box's clock
    leader_since: float | None = None  # the box's clock when the leader took the lease
    problems: tuple[str, ...] = ()  # files of the folder the box could not read (too big, not JSON, a link)

    def beat_of(self, watcher: str | None) -> WatcherBeat | None:
        return next((b for b in self.watchers if b.id == watcher), None) if watcher else None


MAX_WATCH_TIME = 2.0**40  # seconds since the epoch: any clock's reading for the next 30,000 years
BEAT_TIMES = ("since", "written", "last_poll", "last_sent", "at")
BEAT_COUNTS = ("pid", "sent", "held", "unsent")
BEAT_TEXTS = {"id": 64, "who": 200, "host": 200, "last_error": 500, "key": 64, "mac": 128}


def watch_time(value: object) -> float | None:
    """A time read from the watch folder: a finite number of seconds since the epoch, in range
    (an int of 400 digits, inf, NaN or a negative time is none)."""
    if type(value) not in (int, float):
        return None
    try:
        t = float(value)  # type: ignore[arg-type]
    except OverflowError:
        return None
    return t if math.isfinite(t) and 0.0 <= t <= MAX_WATCH_TIME else None


def _checked_beat(beat: WatcherBeat) -> WatcherBeat:
    """The beat if every number is one arithmetic can take and every text is short."""
    for name in BEAT_TIMES:
        value = getattr(beat, name)
        if value is not None and watch_time(value) is None:
            raise BoxError(f"malformed reply: WatcherBeat.{name} out of range")
    if not 0 < beat.interval <= 86400.0 or not math.isfinite(beat.interval):
        raise BoxError("malformed reply: WatcherBeat.interval out of range")
    if not all(0 <= getattr(beat, name) < 2**53 for name in BEAT_COUNTS):
        raise BoxError("malformed reply: WatcherBeat count out of range")
    if any(len(getattr(beat, name)) > limit for name, limit in BEAT_TEXTS.items()):
        raise BoxError("malformed reply: WatcherBeat text too long")
    floats: dict[str, Any] = {name: float(getattr(beat, name)) for name in (*BEAT_TIMES, "interval")
                              if getattr(beat, name) is not None}  # an int of JSON as the float it stands for
    return replace(beat, **floats)


@_converting
def watch_shared(raw: WatchersReply) -> WatchShared:
    beats = []
    for item in _items(raw, "watchers")[:64]:
        try:
            beats.append(_checked_beat(_pick(WatcherBeat, item)))
        except (BoxError, TypeError, OverflowError):  # one watcher's unreadable beat costs only its own line
            continue
    leader = raw.get("leader")
    leader = leader if isinstance(leader, dict) else {}
    leader_id = leader.get("id") if isinstance(leader.get("id"), str) else None
    problems = tuple(str(p)[:200] for p in _items(raw, "problems")[:16])
    now = watch_time(raw.get("now"))
    if now is None:
        raise BoxError("malformed reply: WatchShared.now out of range")
    return WatchShared(tuple(beats), leader_id, raw.get("leading") is True, _items(raw, "ledger", dict),
                       _items(raw, "acks", dict), now, watch_time(leader.get("since")) if leader_id else None,
                       problems)


# ------------------------------------------------------------ GGUF surgery (box/gguf_surgery.py)


@dataclass(frozen=True)
class GgufKv:
    """One KV of a GGUF header, as `gguf show` sends it: untrusted text, bounded by the box."""

    key: str
    type: str  # u8 .. f64, str, bool, or arr[T]
    value: str  # short text: a string cut to a few hundred characters, an array's first items
    count: int | None = None  # an array's length


@dataclass(frozen=True)
class GgufTensorInfo:
    name: str
    type: str  # the ggml type's name (F32, Q4_K, ...), or "type N" when unknown
    shape: tuple[int, ...]
    offset: int  # relative to the data area (data_start)
    size: int | None  # bytes of data; None for an unknown type


@dataclass(frozen=True)
class GgufProblem:
    """What the checker (box/gguf_check.py) finds wrong; codes as it documents them."""

    code: str
    severity: str
    message: str
    offset: int | None = None


@dataclass(frozen=True)
class GgufHeader:
    """A GGUF file's header and tensor table (what `gguf show` returns); the lists are bounded
    and say how many they leave out."""

    path: str
    file_size: int
    version: int | None = None
    tensor_count: int | None = None
    kv_count: int | None = None
    alignment: int = 32
    header_end: int | None = None  # after the last tensor info
    data_start: int | None = None  # align(header_end, alignment)
    data_end: int | None = None  # data_start + the end of the last tensor's data
    kvs: tuple[GgufKv, ...] = ()
    tensors: tuple[GgufTensorInfo, ...] = ()
    kvs_left_out: int = 0
    tensors_left_out: int = 0
    problems: tuple[GgufProblem, ...] = ()

    @property
    def ok(self) -> bool:
        return not any(p.severity == "error" for p in self.problems)


@dataclass(frozen=True)
class GgufAssertion:
    """One of the mandatory checks after a write, with the numbers it compared."""

    name: str  # tensor_count | last_tensor | size | sha256 | check
    ok: bool
    detail: str


@dataclass(frozen=True)
class GgufWriteResult:
    """A set_kv, add_tensors or extract as the box did it (or, planned, what it would write)."""

    ok: bool
    op: str
    out: str
    planned: bool = False  # a dry run: nothing written, `bytes` is what the output needs
    bytes: int = 0
    tensors: int = 0
    last_tensor: str | None = None
    added: tuple[str, ...] = ()  # the tensors added or extracted
    fetched: int = 0  # bytes read from the donor (header and tensor data)
    donor_size: int | None = None
    free: int | None = None  # bytes free on the filesystem OUT goes to
    pin: dict[str, Any] | None = None  # a plan's: what its write must find again (box/gguf_surgery.py)
    assertions: tuple[GgufAssertion, ...] = ()
    error: str | None = None  # why it was refused or failed (an assertion names its numbers)


@_converting
def gguf_header(raw: dict[str, Any]) -> GgufHeader:
    return _pick(GgufHeader, raw,
                 kvs=tuple(_pick(GgufKv, kv) for kv in _items(raw, "kvs")),
                 tensors=tuple(_pick(GgufTensorInfo, t, shape=tuple(_items(t, "shape")))
                               for t in _items(raw, "tensors")),
                 problems=tuple(_pick(GgufProblem, p) for p in _items(raw, "problems")))


@_converting
def gguf_write_result(raw: GgufWriteReply) -> GgufWriteResult:
    """The tool's reply; its "failure" (a refusal, a failed assertion) is the result's error."""
    return _pick(GgufWriteResult, raw, added=tuple(_items(raw, "added")), error=raw.get("failure"),
                 assertions=tuple(_pick(GgufAssertion, a) for a in _items(raw, "assertions")))
