"""Following a log by byte offset: resumes without gaps or duplicates across polls,
reconnects and rotations, and decodes incrementally."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field

from samai.remote.decode import DEFAULT_MAX_LINE, LineDecoder
from samai.remote.model import LogChunk, Marker, MarkerHit

DEFAULT_READ = 256 * 1024
SCAN_CARRY = 64 * 1024  # the probe re-scans at most this much of an unfinished line
CHECK_BYTES = 16


@dataclass(frozen=True)
class LogCursor:
    """Where to read a log next: what the probe needs, and nothing else."""

    path: str
    offset: int | None = None  # None: start at the last `last_lines` lines (0: at the end)
    inode: int | None = None
    check: bytes = b""  # the last bytes read before offset: a rewrite of them means truncation
    scan_from: int | None = None
    last_lines: int | None = None
    max_bytes: int = DEFAULT_READ
    markers: tuple[Marker, ...] = ()

    def request(self) -> dict:
        return {
            "path": self.path,
            "offset": self.offset,
            "inode": self.inode,
            "check": base64.b64encode(self.check).decode("ascii"),
            "scan_from": self.scan_from,
            "last_lines": self.last_lines,
            "max_bytes": self.max_bytes,
            "markers": [m.request() for m in self.markers],
        }


@dataclass
class TailUpdate:
    lines: list[str] = field(default_factory=list)
    hits: tuple[MarkerHit, ...] = ()
    notice: str | None = None  # rotation, truncation, a missing file: said once
    more: bool = False  # the file has more bytes than one read returned


@dataclass
class LogFollower:
    path: str
    markers: tuple[Marker, ...] = ()
    last_lines: int | None = 0
    offset: int | None = None
    max_bytes: int = DEFAULT_READ
    max_line: int = DEFAULT_MAX_LINE
    inode: int | None = None
    missing: bool = False
    check: bytes = b""
    decoder: LineDecoder = field(init=False)

    def __post_init__(self) -> None:
        self.decoder = LineDecoder(self.max_line)

    def cursor(self) -> LogCursor:
        carry = self.decoder.pending_bytes
        scan_from = None
        if self.offset is not None and carry <= SCAN_CARRY:
            scan_from = self.offset - carry
        return LogCursor(self.path, self.offset, self.inode, self.check, scan_from, self.last_lines,
                         self.max_bytes, self.markers)

    def consume(self, chunk: LogChunk) -> TailUpdate:
        update = TailUpdate()
        if chunk.error is not None:
            if not self.missing:
                update.notice = f"{self.path}: {chunk.error}"
            self.missing = True
            if self.offset is None:
                self.offset = 0  # a file that appears later is read from its start
            return update
        if self.missing:
            update.notice = f"{self.path}: file appeared"
            self.missing = False
        if chunk.rotated or chunk.truncated:
            update.lines.extend(self._flush())
            self.check = b""
            what = "replaced by a new file" if chunk.rotated else "truncated"
            update.notice = f"{self.path}: {what}; reading from its start"
        update.lines.extend(self.decoder.feed(chunk.data))
        update.hits = chunk.hits
        update.more = chunk.more
        self.offset, self.inode = chunk.next_offset, chunk.inode
        self.check = (self.check + chunk.data)[-CHECK_BYTES:]
        return update

    def _flush(self) -> list[str]:
        last = self.decoder.flush()
        return [] if last is None else [last]
