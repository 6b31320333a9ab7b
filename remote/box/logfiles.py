"""Log bytes by offset (new bytes, the last N lines, rotation and truncation, marker hits) and
byte ranges of any file.

Runs ON the box, imported by probe.py. Standard library only, Python >= 3.8.

A followed log names the file it was reading (dev, inode) and where (offset). When the path now
names another file (logrotate's rename and create), the old file is read to its end first:
through the descriptor a --serve probe kept (HeldLogs), else found by (dev, inode) among the
log's siblings; only once a read finds it still at the end it reached last time ("drained":
no writer added to it for one poll) does the reader switch to the new file, from its start.
A file truncated in place (copytruncate) is caught at once (size below the offset, or the
last bytes read rewritten); its copy (a sibling holding the same bytes before the offset) is
then read to its end the same way.

Several rotations between two reads leave several generations the follower has not read:
LOG.2, LOG.1, then LOG. Each reply names the generations that are not newer than the file it
read ("older": their inodes, among LOG.1 .. LOG.9 and their .gz); the follower sends that back.
Once the file it reads is done, the next one is the oldest generation not among them: read
from its start, to its end, and so on up to the current file. What cannot be read any more is
said in the reply instead of skipped silently: "gone", the file being read when no name or
descriptor of it is left (its rest was not read), and "unread", each generation between it and
the next one read that is compressed (with the bytes of log it holds) or gone.

Only regular files are read: a FIFO, device or socket is refused before it can block the probe
(and opened non-blocking, for one swapped in after that check).
"""

from __future__ import annotations

import base64
import errno
import itertools
import os
import re
import stat
import time
from typing import Any, Callable, Iterable, Mapping, Tuple

from .markers import compiled, marker_hits

DEFAULT_LOG_BYTES = 256 * 1024
MAX_LOG_BYTES = 8 * 1024 * 1024
MAX_RANGE_BYTES = 16 * 1024 * 1024
MAX_SCAN_CARRY = 64 * 1024  # longest unfinished line re-scanned for markers
TAIL_BLOCK = 64 * 1024
CHECK_BYTES = 16  # the last bytes read, which the next read checks to catch a rewrite
MAX_SIBLINGS = 100000  # entries of a log's folder looked through for its rotated file
MAX_NAMED_SIBLINGS = 256  # entries named after the log that are stat'ed (and maybe read) one by one
MAX_GENERATIONS = 9  # LOG.1 .. LOG.9 (and LOG.N.gz) are looked at for the generations of a log
MAX_HELD = 64  # descriptors a --serve probe keeps
HOLD_S = 60.0  # a kept descriptor unused this long is closed
HOLD_DELETED_S = 5.0  # ... and sooner for a deleted file, whose disk space it holds
OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)
SPECIAL_KINDS = ((stat.S_ISFIFO, "fifo"), (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"),
                 (stat.S_ISSOCK, "socket"), (stat.S_ISDIR, "directory"))
Found = Tuple[int, os.stat_result, str]  # (fd, stat, name) of a file found for a log


# ---------------------------------------------------------------- regular files only


class NotRegular(OSError):
    """A path that names a FIFO, a device, a socket or a folder: reading it could block or never end."""

    def __init__(self, kind: str) -> None:
        OSError.__init__(self, "not a regular file: %s" % kind)
        self.kind = kind


def refuse_special(st: os.stat_result) -> None:
    if not stat.S_ISREG(st.st_mode):
        kind = next((name for test, name in SPECIAL_KINDS if test(st.st_mode)), "special file")
        raise NotRegular(kind)


def open_regular(path: str, flags: int = 0) -> tuple[int, os.stat_result]:
    """(fd, stat) of a regular file. Checked before the open (a FIFO's open blocks until a writer
    comes, a socket's fails with a useless message) and after it (the path may have been swapped
    meanwhile: the open is non-blocking, so that swap cannot block it either)."""
    refuse_special(os.stat(path))
    fd = os.open(path, OPEN_FLAGS | flags)
    try:
        st = os.fstat(fd)
        refuse_special(st)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_regular(path: str, limit: int) -> bytes:
    """At most limit bytes from the start of a regular file."""
    fd, _ = open_regular(path)
    try:
        return pread(fd, 0, limit)
    finally:
        os.close(fd)


class TooBig(ValueError):
    """A small file (a record, a report) that holds more than it may: not read as if the part
    read were the whole of it. Its size and the limit say why."""

    def __init__(self, size: int, limit: int) -> None:
        ValueError.__init__(self, "too big: %d bytes, over the %d read of such a file" % (size, limit))
        self.size, self.limit = size, limit


def read_small(path: str, limit: int) -> bytes:
    """All of a regular file of at most limit bytes; TooBig for a longer one (limit + 1 bytes
    read to tell: a file that grows meanwhile is caught too), never a part as if the whole."""
    fd, st = open_regular(path)
    try:
        data = pread(fd, 0, limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise TooBig(max(st.st_size, len(data)), limit)
    return data


def pread(fd: int, offset: int, n: int) -> bytes:
    """n bytes at offset, fewer only at the end of the file: one read unless the kernel
    returns a short one (no file object, so no second copy through its buffer)."""
    data = os.pread(fd, n, offset)
    while len(data) < n:
        more = os.pread(fd, n - len(data), offset + len(data))
        if not more:
            break
        data += more
    return data


# ---------------------------------------------------------------- descriptors a --serve probe keeps


class HeldLogs(object):
    """The descriptors of the logs a --serve probe read, kept between requests by (dev, inode):
    a log renamed out of its folder, compressed away or deleted after its last read can still be
    read to its end. Closed when unused for a while (a deleted file soon: while a descriptor is
    open, its disk space is not freed)."""

    def __init__(self) -> None:
        self.fds: dict[tuple[int, int], list[Any]] = {}  # (dev, inode) -> [fd, last used (monotonic)]

    def get(self, dev: int | None, ino: int, touch: bool = True) -> int | None:
        key = (dev, ino) if dev is not None else next((k for k in self.fds if k[1] == ino), None)
        held = self.fds.get(key) if key is not None else None
        if held is None:
            return None
        if touch:
            held[1] = time.monotonic()
        return held[0]

    def touch(self, st: os.stat_result) -> None:
        held = self.fds.get((st.st_dev, st.st_ino))
        if held is not None:
            held[1] = time.monotonic()

    def keep(self, fd: int, st: os.stat_result) -> bool:
        key = (st.st_dev, st.st_ino)
        if key in self.fds:
            return False
        if len(self.fds) >= MAX_HELD:
            self.close(min(self.fds, key=lambda k: self.fds[k][1]))
        self.fds[key] = [fd, time.monotonic()]
        return True

    def tidy(self) -> None:
        now = time.monotonic()
        for key, (fd, used) in list(self.fds.items()):
            if now - used > HOLD_S or (now - used > HOLD_DELETED_S and os.fstat(fd).st_nlink == 0):
                self.close(key)

    def close(self, key: tuple[int, int]) -> None:
        os.close(self.fds.pop(key)[0])


def fd_name(fd: int) -> str:
    """Where an open file is now (Linux names it in /proc; " (deleted)" when it is gone)."""
    try:
        return os.readlink("/proc/self/fd/%d" % fd)
    except OSError:
        return ""


def shown_name(name: str) -> str:
    """A file name as text that JSON and any terminal can carry (undecodable bytes replaced)."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


# ---------------------------------------------------------------- the log's siblings


def siblings(path: str) -> list[os.DirEntry[str]]:
    """Entries of the folder that holds path (logrotate keeps LOG.1 and the like beside LOG),
    those named after it first, the log itself left out."""
    folder, base = os.path.split(path)
    try:
        with os.scandir(folder or ".") as it:
            found = [e for e in itertools.islice(it, MAX_SIBLINGS) if e.name != base]
    except OSError:
        return []
    found.sort(key=lambda e: not e.name.startswith(base))
    return found


def plain_stat(entry: os.DirEntry[str]) -> os.stat_result | None:
    try:
        st = entry.stat(follow_symlinks=False)
    except OSError:
        return None
    return st if stat.S_ISREG(st.st_mode) else None


def open_sibling(entry: os.DirEntry[str],
                 wanted: Callable[[os.stat_result], bool]) -> tuple[int, os.stat_result] | None:
    """(fd, stat) of a sibling if it is a regular file for which wanted(stat) holds."""
    try:
        fd, st = open_regular(entry.path, getattr(os, "O_NOFOLLOW", 0))  # the file there, not a link's
    except OSError:
        return None
    if wanted(st):
        return fd, st
    os.close(fd)
    return None


def find_by_identity(path: str, dev: int | None, ino: int) -> Found | None:
    """(fd, stat, name) of the file (dev, ino) among path's siblings. The folder's own inode
    numbers find it without a stat each; where they may not be st_ino (some overlay file
    systems), the siblings named after the log are stat'ed too."""
    same = lambda st: st.st_ino == ino and (dev is None or st.st_dev == dev)  # noqa: E731
    entries = siblings(path)
    named = [e for e in entries[:MAX_NAMED_SIBLINGS] if e.name.startswith(os.path.basename(path))]
    for entry in [e for e in entries if e.inode() == ino] + named:
        st = plain_stat(entry)
        found = open_sibling(entry, same) if st is not None and same(st) else None
        if found:
            return found[0], found[1], entry.path
    return None


def find_copy(path: str, now: os.stat_result, offset: int, check: bytes, mtime: float | None) -> Found | None:
    """(fd, stat, name) of copytruncate's copy of a truncated log: a sibling named after it, made
    since the last read (modified no earlier), that holds at least offset bytes and the very
    bytes last read before offset. The newest of them, if several."""
    if not check or offset < len(check):
        return None
    best = None
    for entry in [e for e in siblings(path)[:MAX_NAMED_SIBLINGS] if e.name.startswith(os.path.basename(path))]:
        st = plain_stat(entry)
        if (st is None or st.st_ino == now.st_ino or st.st_size <= offset or (mtime is not None and st.st_mtime < mtime)
                or (best is not None and st.st_mtime <= best[1].st_mtime)):
            continue
        found = open_sibling(entry, lambda s: s.st_size > offset)
        if found and pread(found[0], offset - len(check), len(check)) == check:
            if best is not None:
                os.close(best[0])
            best = (found[0], found[1], entry.path)
        elif found:
            os.close(found[0])
    return best


# ---------------------------------------------------------------- the log's generations


class Generation(object):
    """A rotated generation of a log: LOG.N (position N), or LOG.N.gz, which cannot be read here."""

    def __init__(self, position: int, name: str, st: os.stat_result) -> None:
        self.position, self.name, self.st = position, name, st
        self.compressed = name.endswith(".gz")


def generations(path: str) -> list[Generation]:
    """The log's rotated generations there now, oldest first (LOG.9 .. LOG.1): regular files
    only, never through a symlink. A dozen or two lstat calls, no listing of the folder."""
    found = []
    for position in range(MAX_GENERATIONS, 0, -1):
        for name in ("%s.%d" % (path, position), "%s.%d.gz" % (path, position)):
            try:
                st = os.lstat(name)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                found.append(Generation(position, name, st))
    return found


def older_of(req: Mapping[str, Any]) -> set[int] | None:
    """The inodes the follower knows not to be newer than the file it reads, or None when the
    request does not say (then no generation is read but the current file, as before)."""
    older = req.get("older")
    if not isinstance(older, list):
        return None
    return set(i for i in older[:4 * MAX_GENERATIONS] if isinstance(i, int) and not isinstance(i, bool))


def newer_than(gens: list[Generation], ino: int, older: set[int] | None) -> list[Generation]:
    """The generations the follower has not read, oldest first: not the file ino, not one it
    knew to be no newer, and below ino's own position when it has one."""
    if older is None:
        return []
    top = position_of(gens, ino)
    return [g for g in gens if g.st.st_ino != ino and g.st.st_ino not in older and (top is None or g.position < top)]


def position_of(gens: Iterable[Generation], ino: int) -> int | None:
    """Where the plain file ino is among the generations (None: it has no LOG.N name)."""
    return next((g.position for g in gens if g.st.st_ino == ino and not g.compressed), None)


def gzip_size(name: str) -> int:
    """The bytes of log a .gz holds (its trailer's ISIZE, modulo 4 GiB), or -1 if unreadable."""
    try:
        fd, st = open_regular(name, getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return -1
    try:
        tail = pread(fd, st.st_size - 4, 4) if st.st_size >= 18 else b""  # 18: the smallest gzip file
    finally:
        os.close(fd)
    return int.from_bytes(tail, "little") if len(tail) == 4 else -1


def unread_between(path: str, gens: list[Generation], ino: int, newer: list[Generation], floor: int) -> list[list[Any]]:
    """[name, bytes] of each generation between the finished file ino and the next one read
    (at position floor; 0: the current file) that cannot be read: compressed (the bytes of log
    it holds), or a position left empty (gone; -1: its size is unknown). A finished file with
    no LOG.N name left (read through a kept descriptor, or gone) has its own copy in the oldest
    new .gz, if any: that one is not counted."""
    top = position_of(gens, ino)
    compressed = [g for g in newer if g.compressed and g.position > floor]
    if top is None and compressed and compressed[0] is newer[0]:
        top = compressed.pop(0).position
    unread = [(g.position, g.name, gzip_size(g.name)) for g in compressed if top is None or g.position < top]
    if top is not None:
        taken = set(g.position for g in gens)
        unread += [(p, "%s.%d" % (path, p), -1) for p in range(floor + 1, top) if p not in taken]
    return [[name, size] for _, name, size in sorted(unread, reverse=True)]


def open_generation(gen: Generation, held: HeldLogs | None, opened: list[int]) -> tuple[int, os.stat_result] | None:
    """(fd, stat) of a generation, if it is still the file the listing found."""
    try:
        fd, st = open_regular(gen.name, getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    if (st.st_dev, st.st_ino) != (gen.st.st_dev, gen.st.st_ino):
        os.close(fd)
        return None
    if held is None or not held.keep(fd, st):
        opened.append(fd)
    return fd, st


def older_in(req: Mapping[str, Any], gens: list[Generation], src: Source,
             current: os.stat_result | None) -> list[int] | None:
    """What the follower sends back with its next read ("older"): the inodes of the generations
    not newer than the file read now, that one included; None while that is not known."""
    ino = src.st.st_ino
    if current is not None and ino == current.st_ino:  # listed before the current file was opened: all older
        return [ino] + [g.st.st_ino for g in gens]
    at = position_of(gens, ino)
    if at is not None:
        return [g.st.st_ino for g in gens if g.position >= at]
    known = older_of(req)
    return None if known is None else sorted(known | set([ino]))


# ---------------------------------------------------------------- log reads


def start_of_last_lines(fd: int, size: int, n: int, limit: int) -> int:
    """Offset where the last n lines of an open file begin, looking back at most limit bytes."""
    pos = size
    newlines = 0
    floor = max(0, size - limit)
    # A trailing newline ends the last line; it does not start a new one.
    if size and pread(fd, size - 1, 1) == b"\n":
        newlines = -1
    while pos > floor:
        step = min(TAIL_BLOCK, pos - floor)
        pos -= step
        block = pread(fd, pos, step)
        found = block.count(b"\n")
        if newlines + found < n:
            newlines += found
            continue
        before = block.rsplit(b"\n", n - newlines)[0]  # all before the newline that starts the last n lines
        return pos + len(before) + 1
    return floor


def rewritten(fd: int, offset: int, check: bytes) -> bool:
    """True when the bytes just before offset are no longer the ones last read there: the
    file was truncated and has since grown past the old offset (tail -F misses this)."""
    if not check:
        return False
    if offset < len(check):
        return True
    return pread(fd, offset - len(check), len(check)) != check


def number(req: Mapping[str, Any], key: str, types: tuple[type, ...] = (int,)) -> Any:
    """req[key] if it is a number of types (not a bool), else None: these keys only refine a read."""
    value = req.get(key)
    return value if isinstance(value, types) and not isinstance(value, bool) else None


class Source(object):
    """The file one read takes its bytes from, and where in it."""

    def __init__(self, fd: int, st: os.stat_result, offset: int | None, rotated: bool = False,
                 truncated: bool = False, drain: str | None = None, old_file: str = "", gone: int | None = None,
                 unread: Iterable[list[Any]] = ()) -> None:
        self.fd, self.st, self.offset = fd, st, offset
        self.rotated, self.truncated = rotated, truncated
        self.drain, self.old_file = drain, old_file  # drain: "renamed" | "copy" while the old file is read
        self.gone, self.unread = gone, list(unread)  # what could not be read on the way here


def open_current(path: str, held: HeldLogs | None, opened: list[int]) -> tuple[int, os.stat_result]:
    """(fd, stat) of the file path names now: a kept descriptor if the probe has one for it."""
    st = os.stat(path)
    refuse_special(st)
    fd = held.get(st.st_dev, st.st_ino) if held is not None else None
    if fd is not None:
        return fd, os.fstat(fd)
    fd, st = open_regular(path)
    if held is None or not held.keep(fd, st):
        opened.append(fd)
    return fd, st


def open_old(path: str, dev: int | None, ino: int, held: HeldLogs | None, opened: list[int]) -> Found | None:
    """(fd, stat, name) of the file the path named before, or None if it cannot be found."""
    fd = held.get(dev, ino, touch=False) if held is not None else None  # kept on only while read (below)
    if fd is not None:
        return fd, os.fstat(fd), fd_name(fd)
    found = find_by_identity(path, dev, ino)
    if found is not None:
        opened.append(found[0])
    return found


def locate(req: Mapping[str, Any], held: HeldLogs | None,
           opened: list[int]) -> tuple[Source, list[Generation], os.stat_result | None]:
    """Which file this read takes its bytes from, and from where (None: the last lines)."""
    path = req["path"]
    offset: Any = req.get("offset")  # the request's (probe.check_request checked them)
    ino: Any = req.get("inode")
    dev = number(req, "dev")
    following = offset is not None and ino is not None
    gens = generations(path)  # before the current file is opened: every one listed is older than it
    fd: int | None
    st: os.stat_result | None
    try:
        fd, st = open_current(path, held, opened)
    except FileNotFoundError:
        if not following:
            raise
        fd = st = None
    if following and (st is None or st.st_ino != ino or (dev is not None and st.st_dev != dev)):
        old = open_old(path, dev, ino, held, opened)
        # The old file until a read finds it where the last one left it: nothing written to it since.
        if old is not None and (offset < old[1].st_size or (offset == old[1].st_size and not req.get("drained"))):
            if held is not None:
                held.touch(old[1])
            return Source(old[0], old[1], offset, drain="renamed", old_file=old[2]), gens, st
        return after_finished(req, gens, ino, old is None, (fd, st), held, opened), gens, st
    assert fd is not None and st is not None  # found unless following, and then the branch above returned
    check = base64.b64decode(req.get("check") or "") if following else b""
    if following and (st.st_size < offset or rewritten(fd, offset, check)):
        copy = find_copy(path, st, offset, check, number(req, "mtime", (int, float)))
        if copy is not None:
            opened.append(copy[0])
            return Source(copy[0], copy[1], offset, drain="copy", old_file=copy[2]), gens, st
        return after_finished(req, gens, ino, True, (fd, st), held, opened, truncated=True), gens, st
    return Source(fd, st, offset), gens, st


def after_finished(req: Mapping[str, Any], gens: list[Generation], ino: int, gone: bool,
                   current: tuple[int | None, os.stat_result | None], held: HeldLogs | None, opened: list[int],
                   truncated: bool = False) -> Source:
    """Where to read once the file ino is done (or gone, or truncated with no copy of its rest):
    the oldest generation the follower has not read, from its start, else the current file from
    its start. The generations that cannot be read on the way, and the file itself when gone,
    are named in the Source."""
    newer = newer_than(gens, ino, older_of(req))
    unreadable: list[list[Any]] = []
    for gen in [g for g in newer if not g.compressed]:
        found = open_generation(gen, held, opened)
        if found is not None:
            unread = unreadable + unread_between(req["path"], gens, ino, newer, gen.position)
            return Source(found[0], found[1], 0, rotated=not truncated, truncated=truncated, drain="renamed",
                          old_file=gen.name, gone=ino if gone else None, unread=unread)
        unreadable.append([gen.name, -1])  # gone between the listing and the open
    fd, st = current
    if fd is None or st is None:  # the two are None together
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), req["path"])
    return Source(fd, st, 0, rotated=not truncated, truncated=truncated, gone=ino if gone else None,
                  unread=unreadable + unread_between(req["path"], gens, ino, newer, 0))


def read_log(req: Mapping[str, Any], held: HeldLogs | None = None) -> dict[str, Any]:
    max_bytes = min(int(req.get("max_bytes") or DEFAULT_LOG_BYTES), MAX_LOG_BYTES)
    opened: list[int] = []  # descriptors this read opened and does not keep
    try:
        src, gens, current = locate(req, held, opened)
        size = src.st.st_size
        offset, restarted = src.offset, src.rotated or src.truncated
        if offset is None:
            n = req.get("last_lines")
            offset = start_of_last_lines(src.fd, size, int(n), max_bytes) if n else size
        scan_from = req.get("scan_from")
        if scan_from is None or restarted or not (0 <= offset - scan_from <= MAX_SCAN_CARRY):
            scan_from = offset
        data = pread(src.fd, scan_from, offset - scan_from + max_bytes)
    finally:
        for fd in opened:
            os.close(fd)
    new = memoryview(data)[offset - scan_from :]  # no copy of megabytes
    last_nl = data.rfind(b"\n")
    return {
        "path": req["path"],
        "inode": src.st.st_ino,
        "dev": src.st.st_dev,
        "size": size,
        "mtime": src.st.st_mtime,
        "offset": offset,
        "next_offset": offset + len(new),
        "line_end": scan_from + last_nl + 1 if last_nl >= 0 else None,
        "more": offset + len(new) < size,
        "rotated": src.rotated,
        "truncated": src.truncated,
        "drain": src.drain,
        "old_file": shown_name(src.old_file),
        "older": older_in(req, gens, src, current),
        "gone": src.gone,
        "unread": [[shown_name(name), size] for name, size in src.unread],
        "data": new if req.get("data", True) else b"",  # encoded, or attached, by probe.pack_data
        "tail": base64.b64encode(data[-CHECK_BYTES:]).decode("ascii"),
        "hits": marker_hits(data, scan_from, compiled(req.get("markers") or ())),
    }


def logs(requests: Iterable[Mapping[str, Any]], held: HeldLogs | None = None) -> list[dict[str, Any]]:
    out = []
    for req in requests:
        try:
            out.append(read_log(req, held))
        except (OSError, ValueError, re.error) as e:
            out.append({"path": req.get("path"), "error": str(e), "missing": isinstance(e, FileNotFoundError),
                        "special": e.kind if isinstance(e, NotRegular) else None})
    if held is not None:
        held.tidy()
    return out


def read_range(req: Mapping[str, Any]) -> dict[str, Any]:
    path, start, end = req["path"], int(req["start"]), int(req["end"])
    if start < 0 or end < start or end - start + 1 > MAX_RANGE_BYTES:
        raise ValueError("bad range %d-%d (at most %d bytes)" % (start, end, MAX_RANGE_BYTES))
    fd, st = open_regular(path)
    try:
        data = pread(fd, start, end - start + 1)
    finally:
        os.close(fd)
    return {"path": path, "start": start, "size": st.st_size, "data": data}


def ranges(requests: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for req in requests:
        try:
            out.append(read_range(req))
        except (OSError, ValueError, KeyError) as e:
            out.append({"path": req.get("path"), "error": str(e)})
    return out
