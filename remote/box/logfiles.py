"""Log bytes by offset (new bytes, the last N lines, rotation and truncation, marker hits) and
byte ranges of any file.

Runs ON the box, imported by probe.py. Standard library only, Python >= 3.8.
"""

import base64
import os
import re

from markers import compiled, marker_hits

DEFAULT_LOG_BYTES = 256 * 1024
MAX_LOG_BYTES = 8 * 1024 * 1024
MAX_RANGE_BYTES = 16 * 1024 * 1024
MAX_SCAN_CARRY = 64 * 1024  # longest unfinished line re-scanned for markers
TAIL_BLOCK = 64 * 1024
CHECK_BYTES = 16  # the last bytes read, which the next read checks to catch a rewrite


def pread(fd, offset, n):
    """n bytes at offset, fewer only at the end of the file: one read unless the kernel
    returns a short one (no file object, so no second copy through its buffer)."""
    data = os.pread(fd, n, offset)
    while len(data) < n:
        more = os.pread(fd, n - len(data), offset + len(data))
        if not more:
            break
        data += more
    return data


def start_of_last_lines(fd, size, n, limit):
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


def rewritten(fd, offset, check):
    """True when the bytes just before offset are no longer the ones last read there: the
    file was truncated and has since grown past the old offset (tail -F misses this)."""
    if not check:
        return False
    expected = base64.b64decode(check)
    if offset < len(expected):
        return True
    return pread(fd, offset - len(expected), len(expected)) != expected


def read_log(req):
    path = req["path"]
    max_bytes = min(int(req.get("max_bytes") or DEFAULT_LOG_BYTES), MAX_LOG_BYTES)
    entry = {"path": path}
    fd = os.open(path, os.O_RDONLY)
    try:
        st = os.fstat(fd)
        size = st.st_size
        entry.update(inode=st.st_ino, dev=st.st_dev, size=size, mtime=st.st_mtime)
        offset = req.get("offset")
        rotated = req.get("inode") is not None and req["inode"] != st.st_ino
        truncated = not rotated and offset is not None and (size < offset or rewritten(fd, offset, req.get("check")))
        if rotated or truncated:
            offset = 0
        if offset is None:
            n = req.get("last_lines")
            offset = start_of_last_lines(fd, size, int(n), max_bytes) if n else size
        scan_from = req.get("scan_from")
        if scan_from is None or rotated or truncated or not (0 <= offset - scan_from <= MAX_SCAN_CARRY):
            scan_from = offset
        data = pread(fd, scan_from, offset - scan_from + max_bytes)
    finally:
        os.close(fd)
    new = memoryview(data)[offset - scan_from :]  # no copy of megabytes
    last_nl = data.rfind(b"\n")
    entry.update(
        offset=offset,
        next_offset=offset + len(new),
        line_end=scan_from + last_nl + 1 if last_nl >= 0 else None,
        more=offset + len(new) < size,
        rotated=rotated,
        truncated=truncated,
        data=base64.b64encode(new).decode("ascii") if req.get("data", True) else "",
        tail=base64.b64encode(data[-CHECK_BYTES:]).decode("ascii"),
        hits=marker_hits(data, scan_from, compiled(req.get("markers") or ())),
    )
    return entry


def logs(requests):
    out = []
    for req in requests:
        try:
            out.append(read_log(req))
        except (OSError, ValueError, re.error) as e:
            out.append({"path": req.get("path"), "error": str(e), "missing": isinstance(e, FileNotFoundError)})
    return out


def read_range(req):
    path, start, end = req["path"], int(req["start"]), int(req["end"])
    if start < 0 or end < start or end - start + 1 > MAX_RANGE_BYTES:
        raise ValueError("bad range %d-%d (at most %d bytes)" % (start, end, MAX_RANGE_BYTES))
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        f.seek(start)
        data = f.read(end - start + 1)
    return {"path": path, "start": start, "size": size, "data": base64.b64encode(data).decode("ascii")}


def ranges(requests):
    out = []
    for req in requests:
        try:
            out.append(read_range(req))
        except (OSError, ValueError, KeyError) as e:
            out.append({"path": req.get("path"), "error": str(e)})
    return out
