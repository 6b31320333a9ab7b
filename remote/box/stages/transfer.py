"""Moving bytes onto the box and checking them: byte ranges, retries, sha256 and progress lines.

Runs ON the box (standard library only, Python >= 3.8), shared by the fetch and push stages;
what it prints goes to the stage's log. A download goes into PATH.part and resumes there after
every transient failure (a dropped connection, a stalled read, HTTP 5xx/408/429), retried
RETRIES times in a row with backoff; a retry after progress starts the count again. A byte
range is exactly START..END inclusive (like `curl -r`), and its length is asserted.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from email.message import Message
from typing import Any, Callable, Sequence, TypeVar

from ..confine import open_append

T = TypeVar("T")  # what retrying's attempt returns
CHUNK = 1024 * 1024
QUIET_BELOW = 8 * CHUNK  # no progress lines for smaller files
HEARTBEAT_S = 10.0  # a progress line at least this often, even between 10 % steps
READ_TIMEOUT_S = 30  # per socket read: a stalled server is a retry, not a hang
RETRIES = 5
MAX_BACKOFF_S = 60.0
USER_AGENT = "samai-fetch/1"


class FetchError(Exception):
    """A failure that retrying will not fix. Printed as one line: MARKER text."""

    def __init__(self, text: str, marker: str = "FETCH_FAIL") -> None:
        Exception.__init__(self, text)
        self.marker = marker


class Transient(Exception):
    """A failure worth retrying: a dropped connection, a stalled read, a 5xx."""


class Unsatisfiable(Exception):
    """The server refused the byte range (HTTP 416); total is the file's size when it said."""

    def __init__(self, total: int | None) -> None:
        Exception.__init__(self, "range not satisfiable")
        self.total = total


# ------------------------------------------------------------------ small helpers


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return ("%d %s" % (n, unit)) if unit == "B" else ("%.1f %s" % (n, unit))
        n /= 1024.0
    return "%.1f GiB" % n


def one_line(error: object) -> str:
    text = str(error) or type(error).__name__
    return " ".join(text.split())


def shown(url: str) -> str:
    """The URL without query or credentials: presigned URLs carry their token in the query."""
    parts = urllib.parse.urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", ""))


def size_of(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def truncate(path: str) -> None:
    """Empty the .part file (open_append's rules: never through a symlink planted at its name)."""
    fd = open_append(None, path)
    try:
        os.ftruncate(fd, 0)
    finally:
        os.close(fd)


class Progress:
    """Progress lines for the stage log: one per 10 % step or every HEARTBEAT_S, never two
    within a second; none for files under QUIET_BELOW, done before anyone could read them."""

    def __init__(self, label: str, total: int | None = None, done: int = 0) -> None:
        self.label, self.total, self.first = label, total, done
        self.quiet = total is not None and total < QUIET_BELOW
        self.started = self.last_time = time.monotonic()
        self.last_step = self.step(done)

    def step(self, done: int) -> int | None:
        return None if not self.total else int(done * 10 // self.total)

    def update(self, done: int) -> None:
        if self.quiet:
            return
        now = time.monotonic()
        step = self.step(done)
        since = now - self.last_time
        if since < 1.0 or (since < HEARTBEAT_S and (step is None or self.last_step is None or step <= self.last_step)):
            return
        self.last_time, self.last_step = now, step
        rate = (done - self.first) / max(now - self.started, 1e-3)
        if self.total:
            print("%s: %s / %s (%d%%) %s/s" % (self.label, human(done), human(self.total),
                                               done * 100 // self.total, human(rate)))
        else:
            print("%s: %s %s/s" % (self.label, human(done), human(rate)))


def sha256_file(path: str, label: str | None = None) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks; with a label it reports progress."""
    digest = hashlib.sha256()
    progress = Progress(label, os.path.getsize(path)) if label else None
    done = 0
    with open(path, "rb") as f:
        while True:
            block = f.read(CHUNK)
            if not block:
                break
            digest.update(block)
            done += len(block)
            if progress:
                progress.update(done)
    return digest.hexdigest()


# ------------------------------------------------------------------ sources: http(s) and file


class Source:
    """An open body: its bytes start at file offset `offset`; `length` bytes follow when known."""

    def __init__(self, stream: Any, offset: int, length: int | None, total: int | None) -> None:
        self.stream, self.offset, self.length, self.total = stream, offset, length, total

    def read(self, n: int) -> bytes:
        try:
            return self.stream.read(n)
        except (OSError, http.client.HTTPException) as e:  # socket.timeout is an OSError
            raise Transient("read failed: %s" % one_line(e)) from None

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.stream.close()


def parse_content_range(value: str | None) -> tuple[int, int, int | None]:
    """(first, last, total) from 'bytes 10-99/1000'; total is None for '*'."""
    m = re.match(r"^\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*$", value or "")
    if not m:
        raise Transient("unreadable Content-Range %r" % value)
    total = None if m.group(3) == "*" else int(m.group(3))
    return int(m.group(1)), int(m.group(2)), total


def total_from_416(headers: Message | None) -> int | None:
    said = headers.get("Content-Range", "") if headers is not None else ""
    m = re.match(r"^\s*bytes\s+\*/(\d+)\s*$", said or "")
    return int(m.group(1)) if m else None


def open_http(url: str, first: int, last: int | None, token: str | None) -> Source:
    request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
    if first > 0 or last is not None:
        request.add_header("Range", "bytes=%d-%s" % (first, "" if last is None else last))
    if token:
        # Unredirected: a redirect to a CDN must not carry the token along.
        request.add_unredirected_header("Authorization", "Bearer " + token)
    try:
        response = urllib.request.urlopen(request, timeout=READ_TIMEOUT_S)
    except urllib.error.HTTPError as e:
        headers = e.headers
        e.close()
        if e.code == 416:
            raise Unsatisfiable(total_from_416(headers)) from None
        if e.code >= 500 or e.code in (408, 429):
            raise Transient("HTTP %d %s" % (e.code, e.reason)) from None
        raise FetchError("HTTP %d %s for %s" % (e.code, e.reason, shown(url))) from None
    except urllib.error.URLError as e:
        raise Transient("cannot reach %s: %s" % (shown(url), one_line(e.reason))) from None
    except (OSError, http.client.HTTPException) as e:
        raise Transient("request failed: %s" % one_line(e)) from None
    if response.status == 206:
        start, end, total = parse_content_range(response.headers.get("Content-Range"))
        return Source(response, start, end - start + 1, total)
    length = response.headers.get("Content-Length")
    length = int(length) if length and length.isdigit() else None
    return Source(response, 0, length, length)


def open_local(url: str, first: int, last: int | None) -> Source:
    path = urllib.request.url2pathname(urllib.parse.urlsplit(url).path)
    try:
        f = open(path, "rb")
    except OSError as e:
        raise FetchError("cannot open %s: %s" % (path, one_line(e))) from None
    total = os.fstat(f.fileno()).st_size
    if first > total or (last is not None and last >= total):
        f.close()
        raise Unsatisfiable(total)
    f.seek(first)
    end = total - 1 if last is None else last
    return Source(f, first, end - first + 1, total)


def open_source(url: str, first: int, last: int | None, token: str | None) -> Source:
    """The body from byte `first` (to `last` inclusive, or the end). A server may ignore the
    range and start at 0: callers must look at source.offset."""
    if urllib.parse.urlsplit(url).scheme == "file":
        return open_local(url, first, last)
    return open_http(url, first, last, token)


def retrying(attempt: Callable[[], T], backoff: float, progress_mark: Callable[[], object] | None = None) -> T:
    """Run attempt(), retrying Transient failures RETRIES times in a row with exponential backoff.
    A failure after progress (progress_mark() changed) starts the count again: a long download
    through a flaky link keeps going as long as it keeps getting somewhere."""
    failures = 0
    while True:
        before = progress_mark() if progress_mark else None
        try:
            return attempt()
        except Transient as e:
            if progress_mark and progress_mark() != before:
                failures = 0
            failures += 1
            if failures > RETRIES:
                raise FetchError("gave up after %d retries: %s" % (RETRIES, e)) from None
            print("FETCH_RETRY %d/%d: %s" % (failures, RETRIES, e))
            time.sleep(min(MAX_BACKOFF_S, backoff * 2 ** (failures - 1)))


# ------------------------------------------------------------------ downloading into PATH.part


def skip(source: Source, count: int) -> None:
    """Read and drop count bytes: a server that ignored our Range sends the whole file."""
    while count > 0:
        block = source.read(min(CHUNK, count))
        if not block:
            raise Transient("connection closed while skipping to the range")
        count -= len(block)


def body_end(source: Source, span: Sequence[int] | None) -> int | None:
    """The file offset right after the last byte we want from this body, or None if unknown."""
    end = source.offset + source.length if source.length is not None else None
    if span is None:
        return end
    if end is not None and end < span[1] + 1:
        raise FetchError("range %d-%d wants %d bytes but the file ends at byte %d (%s bytes)"
                         % (span[0], span[1], span[1] - span[0] + 1, end - 1, source.total or "?"))
    return span[1] + 1


def copy_body(source: Source, part: str, position: int, end: int | None, label: str, want: int | None) -> None:
    """Append the body to part from file offset position up to end; a short body is Transient."""
    progress = Progress(label, want, size_of(part))
    with os.fdopen(open_append(None, part), "ab") as f:  # a symlink or FIFO at part is refused, not followed
        while end is None or position < end:
            block = source.read(CHUNK if end is None else min(CHUNK, end - position))
            if not block:
                break
            f.write(block)
            position += len(block)
            progress.update(f.tell())
    if end is not None and position < end:
        raise Transient("connection closed %d bytes short" % (end - position))


def transfer(url: str, part: str, span: Sequence[int] | None, want: int | None, token: str | None, label: str) -> None:
    """One attempt: resume part from where it stops. Returns when the body is complete."""
    have = size_of(part)
    first = (span[0] if span else 0) + have  # file offset of the next byte we need
    last = span[1] if span else None
    try:
        source = open_source(url, first, last, token)
    except Unsatisfiable as e:
        if span:
            raise FetchError("range %d-%d is outside the file (%s bytes)"
                             % (span[0], span[1], e.total or "?")) from None
        if have and e.total == have:
            return  # we already hold every byte
        truncate(part)
        raise Transient("server refused to resume at byte %d (file is %s bytes); starting over"
                        % (have, e.total)) from None
    try:
        if source.offset > first:
            raise FetchError("asked for bytes from %d, the server sent them from %d" % (first, source.offset))
        if source.offset < first and source.offset == 0 and not span:
            # Never append a whole body to a partial file: that is how a file grows garbage.
            print("server ignored the Range request: restarting %s from byte 0" % part)
            truncate(part)
            first = 0
        elif source.offset < first:
            print("server sent bytes from %d: reading through to byte %d" % (source.offset, first))
            skip(source, first - source.offset)
        whole = want if want is not None or span else source.total  # for the progress lines
        copy_body(source, part, first, body_end(source, span), label, whole)
    finally:
        source.close()


def download(url: str, part: str, span: Sequence[int] | None, want: int | None, token: str | None, backoff: float,
             label: str) -> None:
    """Bring part to its full length, resuming after every transient failure."""
    def attempt() -> None:
        have = size_of(part)
        if want is not None and have > want:
            truncate(part)  # longer than the whole file: not a prefix of it
        elif want is not None and have == want:
            return
        if have:
            print("resuming %s at %s" % (part, human(have)))
        transfer(url, part, span, want, token, label)
    retrying(attempt, backoff, progress_mark=lambda: size_of(part))
