"""Where GGUF surgery reads its bytes from: a file on the box, or an http(s) URL read by byte
range only (a donor of many GB is never downloaded whole).

Runs ON the box (standard library only, Python >= 3.8), imported by gguf_surgery.py. Both
sources give size, read_at(offset, length) (what gguf_format.RangeReader reads the header
through) and chunks(start, length) (tensor data, streamed); `fetched` counts what came over
the network. Every HTTP reply must be 206 Partial Content for exactly the range asked: a server
that ignores Range (200, the whole file) is refused at once, its body never read.
"""

import http.client
import os
import re
import stat
import urllib.error
import urllib.request

STREAM_CHUNK = 1 << 20
FIRST_RANGE = 64 * 1024  # the first request: the header's start, and the donor's size
HTTP_TIMEOUT_S = 60.0
CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+)$")


class SourceError(Exception):
    """The source cannot be read as asked: the message says why, with the numbers."""


def is_url(text):
    return text.startswith(("http://", "https://"))


def open_source(given, workspace):
    """A LocalSource (relative paths are in the workspace) or an HttpSource."""
    if is_url(given):
        return HttpSource(given)
    return LocalSource(os.path.join(workspace, given))


class LocalSource:
    def __init__(self, path):
        self.name = path
        self.fetched = 0
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise SourceError("%s is not a regular file" % path)
        self.fd = fd
        self.size = st.st_size
        self.identity = (st.st_dev, st.st_ino)

    def read_at(self, offset, length):
        return os.pread(self.fd, length, offset)

    def chunks(self, start, length):
        end = start + length
        while start < end:
            part = os.pread(self.fd, min(STREAM_CHUNK, end - start), start)
            if not part:
                raise SourceError("%s ended at %d while reading its bytes %d..%d" % (self.name, start, start, end - 1))
            start += len(part)
            yield part

    def close(self):
        os.close(self.fd)


class HttpSource:
    """A GGUF behind a URL, read by Range requests; its size comes from the first reply."""

    def __init__(self, url):
        self.name = url
        self.fetched = 0
        self.identity = None
        self.size, self.first = self._first_range()

    def _first_range(self):
        response, start, end, total = self._open(0, FIRST_RANGE - 1, None)
        with response:
            data = self._read_exactly(response, start, end)
        return total, data

    def _open(self, start, end, total):
        request = urllib.request.Request(self.name, headers={
            "Range": "bytes=%d-%d" % (start, end), "Accept-Encoding": "identity", "User-Agent": "samai-console"})
        try:
            response = urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S)
        except urllib.error.HTTPError as e:
            e.close()
            raise SourceError("%s answered HTTP %d to the range request bytes=%d-%d"
                              % (self.name, e.code, start, end)) from None
        except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as e:
            raise SourceError("%s: %s" % (self.name, getattr(e, "reason", e))) from None
        if response.status != 206:
            length = response.headers.get("Content-Length")
            response.close()  # the body (likely the whole file) is never read
            raise SourceError("%s answered HTTP %d, not 206 Partial Content, to the range request bytes=%d-%d: the"
                              " server ignores Range and would send the whole file (Content-Length %s). Refused:"
                              " nothing was downloaded." % (self.name, response.status, start, end, length))
        return self._checked_range(response, start, end, total)

    def _checked_range(self, response, start, end, total):
        header = response.headers.get("Content-Range") or ""
        match = CONTENT_RANGE.match(header.strip())
        if not match:
            response.close()
            raise SourceError("%s answered 206 with Content-Range %r, not 'bytes START-END/SIZE'"
                              % (self.name, header[:80]))
        got_start, got_end, got_total = (int(g) for g in match.groups())
        want_end = min(end, (got_total if total is None else total) - 1)  # a server clamps to the file's end
        if (got_start, got_end) != (start, want_end) or (total is not None and got_total != total):
            response.close()
            raise SourceError("%s answered bytes %d-%d/%d to the request bytes=%d-%d (size %s): not the range asked"
                              " for" % (self.name, got_start, got_end, got_total, start, want_end, total))
        return response, got_start, got_end, got_total

    def _read_exactly(self, response, start, end):
        return b"".join(self._body(response, start, end))

    def _body(self, response, start, end):
        """The body, asserted to be exactly end - start + 1 bytes."""
        want = end - start + 1
        got = 0
        while got < want:
            try:
                part = response.read(min(STREAM_CHUNK, want - got))
            except (http.client.HTTPException, OSError) as e:  # cut short: IncompleteRead, a reset, a timeout
                raise SourceError("%s: the range %d-%d broke off after %d of %d bytes (%s)"
                                  % (self.name, start, end, got, want, type(e).__name__)) from None
            if not part:
                break
            got += len(part)
            self.fetched += len(part)
            yield part
        if got != want or response.read(1):
            raise SourceError("%s sent %s bytes for the range %d-%d: expected exactly end - start + 1 = %d"
                              % (self.name, "%d" % got if got != want else "more than %d" % got, start, end, want))

    def read_at(self, offset, length):
        if length <= 0 or offset >= self.size:
            return b""
        if offset + length <= len(self.first):
            return self.first[offset:offset + length]
        end = min(offset + length, self.size) - 1
        response, start, end, _ = self._open(offset, end, self.size)
        with response:
            return self._read_exactly(response, start, end)

    def chunks(self, start, length):
        if length <= 0:
            return
        response, start, end, _ = self._open(start, start + length - 1, self.size)
        with response:
            for part in self._body(response, start, end):
                yield part

    def close(self):
        pass
