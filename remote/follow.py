"""Following a log by byte offset: resumes without gaps or duplicates across polls,
reconnects and rotations, and decodes incrementally.

A rotation (see the box's logfiles.py) comes as chunks of the old file first (`drain`), then,
once that file has stayed at its end for a poll, a `rotated` chunk of the new file from its
start: its lines follow the old file's last ones, none twice, none missing, and an unfinished
last line of the old file ends there instead of being glued to the new file's first. After
several rotations between two reads, each generation in between (LOG.2, then LOG.1) is read
the same way, by inode, before the current file; what could not be read any more (a file
deleted or compressed before its end was reached) is said in the notice, never skipped
silently."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field

from samai.remote.box.chainline import read_header
from samai.remote.decode import DEFAULT_MAX_LINE, LineDecoder
from samai.remote.model import LogChunk, Marker, MarkerHit
from samai.remote.safe_text import visible

DEFAULT_READ = 256 * 1024
CATCH_UP_READ = 8 * 1024 * 1024  # the most the box reads at once (logfiles.MAX_LOG_BYTES)
MARKER_SCAN_READ = 4 * 1024 * 1024  # a markers-only watch transfers no bytes, so it can scan more
SCAN_CARRY = 64 * 1024  # the probe re-scans at most this much of an unfinished line


def missing_notice(path: str) -> str:
    """What the log pane says while the file it follows does not exist (yet)."""
    return f"No such file on the box: {visible(path)}"


def new_run(lines: list[str], first_line: int | None) -> list[str] | None:
    """The lines of a run that starts among `lines`: those after its header, the first line of
    a log file (first_line: its index here, when lines hold one). None when no run starts here.
    The launcher starts each run's log afresh with its header, written before the stage runs
    (remote/box/chainline.py): a header-shaped line anywhere else is the stage's text."""
    if first_line is None or not 0 <= first_line < len(lines) or read_header(lines[first_line]) is None:
        return None
    return lines[first_line + 1:]


@dataclass(frozen=True)
class LogCursor:
    """Where to read a log next: what the probe needs, and nothing else."""

    path: str
    offset: int | None = None  # None: start at the last `last_lines` lines (0: at the end)
    inode: int | None = None  # with dev: the file offset is in (the path may name another by now)
    check: bytes = b""  # the last bytes read before offset: a rewrite of them means truncation
    scan_from: int | None = None
    last_lines: int | None = None
    max_bytes: int = DEFAULT_READ
    markers: tuple[Marker, ...] = ()
    want_data: bool = True
    dev: int | None = None
    mtime: float | None = None  # the file's when last read: a copytruncate copy is no older
    drained: bool = False  # the last read reached the end of the file the path named before
    older: tuple[int, ...] | None = None  # the generations no newer than the file read (the box's, sent back)

    def request(self) -> dict:
        return {
            "path": self.path,
            "offset": self.offset,
            "inode": self.inode,
            "dev": self.dev,
            "mtime": self.mtime,
            "drained": self.drained,
            "older": None if self.older is None else list(self.older),
            "check": base64.b64encode(self.check).decode("ascii"),
            "scan_from": self.scan_from,
            "last_lines": self.last_lines,
            "max_bytes": self.max_bytes,
            "data": self.want_data,
            "markers": [m.request() for m in self.markers],
        }


@dataclass
class TailUpdate:
    lines: list[str] = field(default_factory=list)
    hits: tuple[MarkerHit, ...] = ()
    notice: str | None = None  # rotation, truncation, a missing file: said once
    more: bool = False  # the file has more bytes than one read returned
    cut_line: bool = False  # an unfinished line ended here (rotation, truncation): raw bytes need a line break
    first_line: int | None = None  # the index in lines of a file's first line (that file read from its start)


@dataclass
class LogFollower:
    """One followed log. With want_data=False only marker hits come back (no bytes moved).

    Behind a burst (a read that left more), each read asks for twice the last, up to
    catch_up_bytes: on a link with a long round trip, a fixed small read would cost one round
    trip per max_bytes however fast the link is. Once caught up, reads are small again."""

    path: str
    markers: tuple[Marker, ...] = ()
    last_lines: int | None = 0
    offset: int | None = None
    max_bytes: int = DEFAULT_READ
    max_line: int = DEFAULT_MAX_LINE
    want_data: bool = True
    catch_up_bytes: int = 0  # the largest read while behind (below max_bytes: no growth)
    inode: int | None = None
    dev: int | None = None
    mtime: float | None = None
    missing: bool = False
    refused: bool = False  # the path is not a regular file (a FIFO, a device, a socket): waiting will not help
    check: bytes = b""
    line_start: int | None = None  # where the unfinished last line began
    draining: str | None = None  # "renamed" | "copy" while the old file of a rotation is read
    drained: bool = False
    older: tuple[int, ...] | None = None
    size: int | None = None  # of the file read, when last read: what a file gone since held unread
    line_one: bool = False  # the next line decoded is the first of its file
    decoder: LineDecoder = field(init=False)
    read_bytes: int = field(init=False)  # what the next read asks for

    def __post_init__(self) -> None:
        self.decoder = LineDecoder(self.max_line)
        self.read_bytes = self.max_bytes

    def cursor(self) -> LogCursor:
        scan_from = None
        if self.offset is not None and self.line_start is not None and self.offset - self.line_start <= SCAN_CARRY:
            scan_from = self.line_start
        return LogCursor(self.path, self.offset, self.inode, self.check, scan_from, self.last_lines,
                         self.read_bytes, self.markers, self.want_data, self.dev, self.mtime, self.drained,
                         self.older)

    def consume(self, chunk: LogChunk) -> TailUpdate:
        update = TailUpdate()
        if chunk.error is not None:
            if not self.missing:
                update.notice = missing_notice(self.path) if chunk.missing else f"{self.path}: {chunk.error}"
            self.missing, self.refused = True, chunk.special is not None
            if self.offset is None:
                self.offset = 0  # a file that appears later is read from its start
            return update
        if self.missing:
            update.notice = f"{self.path}: file appeared"
            self.missing = self.refused = False
        if chunk.drain is not None and self.draining is None:
            update.notice = self._rotation_notice(chunk)
        if chunk.rotated or chunk.truncated:
            cut = self._flush()  # the old file's unfinished last line ends with it
            update.lines.extend(cut)
            update.cut_line = bool(cut)
            update.notice = self._switch_notice(chunk)
            self.check, self.line_start = b"", None
        self._starts_file(chunk)
        self.draining = chunk.drain
        self.drained = chunk.drain is not None and not chunk.more
        if self.want_data:
            before = len(update.lines)
            update.lines.extend(self.decoder.feed(chunk.data))
            if self.line_one and len(update.lines) > before:
                update.first_line, self.line_one = before, False
        update.hits = chunk.hits
        update.more = chunk.more
        self.read_bytes = max(self.max_bytes, min(2 * self.read_bytes, self.catch_up_bytes)) if chunk.more \
            else self.max_bytes
        if chunk.next_offset != chunk.offset or self.offset is None:
            self.check = chunk.tail or self.check
        if self.line_start is None or chunk.offset != self.offset:
            self.line_start = chunk.offset  # reads start on a line boundary unless told otherwise
        if chunk.line_end is not None:
            self.line_start = chunk.line_end
        self.offset, self.inode, self.dev, self.mtime = chunk.next_offset, chunk.inode, chunk.dev, chunk.mtime
        self.older, self.size = chunk.older, chunk.size
        return update

    def _starts_file(self, chunk: LogChunk) -> None:
        """Whether the next line decoded is its file's first: the chunk is read from byte 0 of a
        file not read before (the first read, or the next file of a rotation). A file truncated
        in place starts again with whatever its writer writes next: no first line of a log."""
        if chunk.offset == 0 and not chunk.truncated and (chunk.rotated or self.offset in (None, 0)):
            self.line_one = True
        elif chunk.rotated or chunk.truncated:
            self.line_one = False

    def _rotation_notice(self, chunk: LogChunk) -> str:
        old = visible(chunk.old_file) or "its old file"
        if chunk.drain == "copy":
            return f"{self.path}: truncated in place; reading the rest from its copy {old} first"
        return f"{self.path}: rotated (now {old}); reading the rest of it first"

    def _switch_notice(self, chunk: LogChunk) -> str:
        """One line: what became of the file read so far, what could not be read on the way, and
        what is read now (the next generation, the new file, or this one again)."""
        gone = chunk.gone is not None and not chunk.truncated
        if gone:
            parts = ["the file it was reading is gone (deleted or compressed)"]
        elif self.draining is not None:
            parts = ["the old file is read to its end"]
        else:
            parts = ["replaced by a new file" if chunk.rotated and not chunk.truncated else "truncated"]
        lost = self._not_read(chunk)
        if lost:
            parts.append("not read: " + "; ".join(lost))
        if chunk.drain is not None:
            parts.append(f"reading the generation after it, {visible(chunk.old_file)}, from its start")
        elif gone or self.draining is not None:
            parts.append("reading the new one from its start")
        else:
            parts.append("reading from its start")
        return f"{self.path}: " + "; ".join(parts)

    def _not_read(self, chunk: LogChunk) -> list[str]:
        """What the box could not read on the way to this chunk: the rest of the file read so far
        (gone, or truncated with no copy of it), and each generation after it that is compressed
        or was gone before it could be read."""
        lost = []
        if chunk.gone is not None and self.offset is not None:
            known = max(self.size or 0, self.offset)
            # A truncation with no generation after it is an ordinary one: nothing is known lost.
            rotation = not chunk.truncated or chunk.drain is not None or bool(chunk.unread)
            if known > self.offset:
                lost.append(f"inode {chunk.gone}, bytes {self.offset}-{known} ({known - self.offset} bytes) and "
                            "whatever was written to it after")
            elif rotation and not self.drained:
                lost.append(f"inode {chunk.gone} from byte {self.offset} (whatever was written to it after the "
                            "last read)")
        for name, size in chunk.unread:
            if size >= 0:
                what = f"compressed, {size} bytes of log"
            else:
                what = "compressed" if name.endswith(".gz") else "gone before it was read, its size unknown"
            lost.append(f"{visible(name)} ({what})")
        return lost

    def _flush(self) -> list[str]:
        last = self.decoder.flush()
        return [] if last is None else [last]
