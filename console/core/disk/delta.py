"""What a stage did to the workspace's disk: the SAMAI_DISK lines its chain writes at the run's
start and end (remote/box/diskline.py), read from the stage logs the console already follows
(and the start line from a log's head, when the watch began past it: start_in_head).
Only the chain's own count: a line that carries its run's nonce (StageRecord.said_by_chain, the
runs list's reader in history.py); one the stage printed is its text, whatever it says.

Pure parsing, no I/O. The lines are the box's words: a line that is not exactly the expected
shape, or whose numbers cannot be a file system's, is ignored; nothing here raises."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from samai.console.core import units
from samai.remote.box.chainline import read_header, said_by_chain
from samai.remote.marker import Marker

DISK_MARKER_NAME = "samai.disk"  # not a marker the operator declares: never shown as one
DISK_MARKER = Marker(DISK_MARKER_NAME, r"SAMAI_DISK (?:start|end) ", "info")
LINE = re.compile(r"SAMAI_DISK (?P<phase>start|end) used=(?P<used>[0-9]{1,19}) avail=(?P<avail>[0-9]{1,19}) "
                  r"size=(?P<size>[0-9]{1,19})(?![0-9])")  # ASCII digits: \d takes any script's

Phase = Literal["start", "end"]


@dataclass(frozen=True)
class DiskReading:
    """The workspace's file system at one end of a run, in bytes."""

    phase: Phase
    used: int
    avail: int
    size: int


@dataclass(frozen=True)
class DiskDelta:
    """A stage's run as its disk lines tell it. `now_used`: the file system's use at the last poll,
    for a running stage (its delta so far)."""

    stage: str
    start: DiskReading | None
    end: DiskReading | None = None
    now_used: int | None = None

    @property
    def delta(self) -> int | None:
        after = self.end.used if self.end else self.now_used
        return None if self.start is None or after is None else after - self.start.used

    @property
    def text(self) -> str:
        """`train: +1.2 GB (start 40.1 GB used, end 41.3 GB)`."""
        start = f"start {units.size(self.start.used)} used" if self.start else "no start line"
        if self.end is not None:
            after = f"end {units.size(self.end.used)}"
        elif self.now_used is not None:
            after = f"now {units.size(self.now_used)}"
        else:
            after = "no end line"
        delta = self.delta
        change = "?" if delta is None else signed_size(delta) + ("" if self.end or self.start is None else " so far")
        return f"{self.stage}: {change} ({start}, {after})"


def signed_size(n: int) -> str:
    return ("-" if n < 0 else "+") + units.size(abs(n))


def parse_disk_line(line: str) -> DiskReading | None:
    """The reading a SAMAI_DISK line holds, or None (any other line, or numbers no disk has)."""
    if not isinstance(line, str):
        return None
    m = LINE.search(line)
    if m is None:
        return None
    used, avail, size = int(m["used"]), int(m["avail"]), int(m["size"])
    if size <= 0 or used + avail > size:
        return None
    phase: Phase = "start" if m["phase"] == "start" else "end"
    return DiskReading(phase, used, avail, size)


def start_in_head(head: bytes, nonce: str) -> DiskReading | None:
    """The run's SAMAI_DISK start reading in the first bytes of its log (the chain writes it right
    after the run's header, before the stage runs): only when the file's first line is the header
    that names this nonce, and only a whole line that carries it. A line the stage printed (no
    nonce, another run's) is its text; a head cut inside a line or any other file holds none."""
    lines = head.decode("utf-8", "replace").split("\n")[:-1]  # the last piece may be cut short
    header = read_header(lines[0]) if lines else None
    if header is None or not nonce or header.nonce != nonce:
        return None
    for line in lines[1:]:
        said = said_by_chain(line, nonce)
        reading = parse_disk_line(said) if said is not None and said.startswith("SAMAI_DISK start ") else None
        if reading is not None and reading.phase == "start":
            return reading
    return None


def latest(readings: dict[str, tuple[DiskReading | None, DiskReading | None]], fired: dict[str, float],
           running: set[str], now_used: int | None) -> DiskDelta | None:
    """The delta of the most recently fired stage that has a disk line: its end when it has one,
    else, while it runs, the file system's use now."""
    known = [name for name, (start, end) in readings.items() if start or end]
    if not known:
        return None
    name = max(known, key=lambda n: fired.get(n, 0.0))
    start, end = readings[name]
    return DiskDelta(name, start, end, now_used if end is None and name in running else None)
