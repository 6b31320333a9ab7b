"""Where GGUF surgery reads its bytes from: a file on the box, or an http(s) URL read by byte
range only (a donor of many GB is never downloaded whole).

Runs ON the box (standard library only, Python >= 3.8), imported by gguf_surgery.py. Both
sources give size, read_at(offset, length) (what gguf_format.RangeReader reads the header
through), chunks(start, length) (tensor data, streamed) and header_sha256(length); `fetched`
counts what came over the network. Every HTTP reply must be 206 Partial Content for exactly the
range asked: a server that ignores Range (200, the whole file) is refused at once, its body
never read.

Each source has a pin, what says these are the same bytes: a file's size, device, inode and
mtime; a URL's size and the validators its first reply sent (ETag, Last-Modified). A write
carries its plan's pins (pinned=): a source whose pin differs is refused, the difference named,
before any of its tensor bytes is fetched. A URL is then asked with If-Match / If-Unmodified-
Since, and every reply must still show the same size and validators; a file must still have
its size and mtime once its bytes are copied.

A redirect is followed to the same host, or to a host the request allows (allowed_hosts), at
most MAX_REDIRECTS times: never from https to plain http, never to another scheme. Integers in
reply headers are bounded (digits, length, value) before int() sees them.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import re
import stat
import urllib.error
import urllib.parse
import urllib.request
from email.message import Message
from typing import IO, Any, Iterable, Iterator, Mapping, Union

from .gguf_format import MAX_HEADER_BYTES  # a URL's header is kept while read: no longer one is checked

STREAM_CHUNK = 1 << 20
FIRST_RANGE = 64 * 1024  # the first request: the header's start, and the donor's size
HTTP_TIMEOUT_S = 60.0
MAX_REDIRECTS = 5
MAX_SOURCE_SIZE = 1 << 50  # 1 PiB: no GGUF is larger; a size beyond is a lie or garbage
MAX_DIGITS = len(str(MAX_SOURCE_SIZE))  # a longer digit string is refused before int() sees it
MAX_VALIDATOR = 200  # characters of an ETag or Last-Modified
CONTENT_RANGE = re.compile(r"bytes ([0-9]+)-([0-9]+)/([0-9]+)")
VALIDATOR = re.compile(r"[\x21-\x7e][\x20-\x7e]*")  # visible ASCII (a date has spaces inside)
FILE_PIN = ("size", "device", "inode", "mtime_ns")
URL_PIN = ("size", "etag", "last_modified")
VALIDATORS = (("etag", "ETag"), ("last_modified", "Last-Modified"))
LABELS = dict(VALIDATORS)  # a pin's key as a message names it


class SourceError(Exception):
    """The source cannot be read as asked: the message says why, with the numbers."""


def is_url(text: str) -> bool:
    return text.startswith(("http://", "https://"))


def open_source(given: str, workspace: str, pinned: Mapping[str, Any] | None = None,
                allowed_hosts: Iterable[str] = ()) -> Source:
    """A LocalSource (relative paths are in the workspace) or an HttpSource, checked against
    its pin from the plan when one is given."""
    if is_url(given):
        return HttpSource(given, pinned, allowed_hosts)
    return LocalSource(os.path.join(workspace, given), pinned)


def refuse_changes(name: str, pinned: Mapping[str, Any] | None, now: Mapping[str, Any], keys: Iterable[str],
                   when: str = "since the plan") -> None:
    """SourceError naming each of keys whose value differs between a pin and now."""
    changed = differences(pinned, now, keys) if pinned is not None else []
    if changed:
        raise changed_error(name, when, changed)


def differences(pinned: Mapping[str, Any], now: Mapping[str, Any], keys: Iterable[str]) -> list[str]:
    return ["%s was %s, now %s" % (LABELS.get(key, key), shown(pinned.get(key)), shown(now.get(key)))
            for key in keys if pinned.get(key) != now.get(key)]


def changed_error(name: str, when: str, changed: list[str]) -> SourceError:
    return SourceError("%s changed %s (%s): refused, nothing written%s"
                       % (name, when, "; ".join(changed), "; plan it again" if when == "since the plan" else ""))


def shown(value: Any) -> str:
    if value is None:
        return "none"
    return str(value) if isinstance(value, int) else repr(value)[:120]


class LocalSource:
    def __init__(self, path: str, pinned: Mapping[str, Any] | None = None) -> None:
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
        self.pin = file_pin(st)
        try:
            refuse_changes(path, pinned, self.pin, FILE_PIN)
        except SourceError:
            os.close(fd)
            raise

    def read_at(self, offset: int, length: int) -> bytes:
        return os.pread(self.fd, length, offset)

    def chunks(self, start: int, length: int) -> Iterator[bytes]:
        end = start + length
        while start < end:
            part = os.pread(self.fd, min(STREAM_CHUNK, end - start), start)
            if not part:
                raise SourceError("%s ended at %d while reading its bytes %d..%d" % (self.name, start, start, end - 1))
            start += len(part)
            yield part

    def header_sha256(self, length: int) -> str:
        digest = hashlib.sha256()
        for part in self.chunks(0, length):
            digest.update(part)
        return digest.hexdigest()

    def recheck(self) -> None:
        """After its bytes were copied: a file written to meanwhile is refused."""
        refuse_changes(self.name, self.pin, file_pin(os.fstat(self.fd)), FILE_PIN, "while it was read")

    def close(self) -> None:
        os.close(self.fd)


def file_pin(st: os.stat_result) -> dict[str, Any]:
    return {"size": st.st_size, "device": st.st_dev, "inode": st.st_ino, "mtime_ns": st.st_mtime_ns}


# ---------------------------------------------------------------------------------------------
# A URL


def bounded_int(text: str, what: str) -> int:
    """A non-negative decimal integer of at most MAX_DIGITS digits, or SourceError ("WHAT '...',
    not a byte count")."""
    if not (0 < len(text) <= MAX_DIGITS) or not text.isdigit() or not text.isascii():
        raise SourceError("%s %r, not a byte count (at most %d decimal digits)" % (what, text[:40], MAX_DIGITS))
    return int(text)


def parse_content_range(text: str) -> tuple[int, int, int]:
    """(start, end, total) of 'bytes START-END/TOTAL', each bounded, start <= end < total."""
    match = CONTENT_RANGE.fullmatch(text.strip())
    if not match:
        raise SourceError("a Content-Range %r, not 'bytes START-END/SIZE'" % text[:80])
    start, end, total = (bounded_int(g, "a Content-Range number") for g in match.groups())
    if not start <= end < total <= MAX_SOURCE_SIZE:
        raise SourceError("a Content-Range %r, not a range of a file (start <= end < size <= %d)"
                          % (text[:80], MAX_SOURCE_SIZE))
    return start, end, total


def redirect_refusal(current: str, target: str, allowed_hosts: Iterable[str]) -> str | None:
    """Why a redirect from current to target is not followed, or None when it is."""
    old = urllib.parse.urlsplit(current)
    try:
        new = urllib.parse.urlsplit(target)
        new.port  # noqa: B018 -- raises for a port out of range or not a number
    except ValueError:
        return "redirects to %r, not a URL: refused" % target[:120]
    if new.scheme not in ("http", "https"):
        return "redirects to %r, not an http(s) URL: refused" % target[:120]
    if old.scheme == "https" and new.scheme == "http":
        return "redirects from https to plain http (%s): refused, the donor would come unencrypted" % target[:120]
    host = (new.hostname or "").lower()
    if host == (old.hostname or "").lower() or host in [h.lower() for h in allowed_hosts]:
        return None
    return ("redirects to another host, %s: refused (allow it with --allow-redirect %s)"
            % (target[:120], host[:80] or "?"))


class Redirects(urllib.request.HTTPRedirectHandler):
    """urllib's redirects, each judged by redirect_refusal against the hop it comes from."""

    max_redirections = MAX_REDIRECTS

    def __init__(self, name: str, allowed_hosts: Iterable[str]) -> None:
        self.name = name
        self.allowed_hosts = tuple(allowed_hosts) + (urllib.parse.urlsplit(name).hostname or "",)  # and back

    def redirect_request(self, req: urllib.request.Request, fp: IO[bytes], code: int, msg: str,
                         headers: http.client.HTTPMessage, newurl: str) -> urllib.request.Request | None:
        fp.close()  # urllib would read a redirect's body whole: it is not ours to read
        refusal = redirect_refusal(req.full_url, newurl, self.allowed_hosts)
        if refusal:
            raise SourceError("%s %s" % (self.name, refusal))
        return urllib.request.HTTPRedirectHandler.redirect_request(self, req, fp, code, msg, headers, newurl)


class HttpSource:
    """A GGUF behind a URL, read by Range requests; its size comes from the first reply. Its
    header is read once, from its start on, and kept (header_sha256 hashes what was parsed)."""

    def __init__(self, url: str, pinned: Mapping[str, Any] | None = None, allowed_hosts: Iterable[str] = ()) -> None:
        self.name = url
        self.fetched = 0
        self.identity: tuple[int, int] | None = None
        self.opener = urllib.request.build_opener(Redirects(url, allowed_hosts))
        self.pinned = pinned  # the plan's: sent as conditions on the first request
        self.pin: dict[str, Any] | None = None  # from the first reply on: what every reply must show
        self.size = 0  # the file's: the first reply's Content-Range says it
        self.prefix = bytearray()
        self._first_range()

    def _first_range(self) -> None:
        response, start, end = self._open(0, FIRST_RANGE - 1)
        with response:
            self.prefix += self._read_exactly(response, start, end)

    def _open(self, start: int, end: int) -> tuple[http.client.HTTPResponse, int, int]:
        """A 206 reply for bytes start..end (clamped to the file's end); its headers checked."""
        headers = {"Range": "bytes=%d-%d" % (start, end), "Accept-Encoding": "identity", "User-Agent": "samai-console"}
        headers.update(conditions(self.pin or self.pinned or {}))
        try:
            response = self.opener.open(urllib.request.Request(self.name, headers=headers), timeout=HTTP_TIMEOUT_S)
        except urllib.error.HTTPError as e:
            e.close()
            raise self._http_error(e, start, end) from None
        except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError, OverflowError) as e:
            raise SourceError("%s: %s" % (self.name, getattr(e, "reason", e))) from None  # Overflow: a port
        try:
            if response.status != 206:
                raise SourceError("%s answered HTTP %d, not 206 Partial Content, to the range request bytes=%d-%d: the"
                                  " server ignores Range and would send the whole file (Content-Length %r). Refused:"
                                  " nothing was downloaded." % (self.name, response.status, start, end,
                                                                (response.headers.get("Content-Length") or "")[:40]))
            got_start, got_end = self._checked_range(response, start, end)
            self._check_validators(response)
        except SourceError:
            response.close()  # the body (likely the whole file) is never read
            raise
        return response, got_start, got_end

    def _http_error(self, e: urllib.error.HTTPError, start: int, end: int) -> SourceError:
        if e.code == 412:
            return self._precondition_failed(e.headers)
        if 300 <= e.code < 400:
            return SourceError("%s redirects where this tool does not follow (more than %d times, in a loop, or to"
                               " %r, not an http(s) URL): refused"
                               % (self.name, MAX_REDIRECTS, (e.headers.get("Location") or "")[:120]))
        return SourceError("%s answered HTTP %d to the range request bytes=%d-%d" % (self.name, e.code, start, end))

    def _precondition_failed(self, headers: Message) -> SourceError:
        """412: the server says the file is no longer the version pinned (its reply may say which)."""
        expected = self.pin or self.pinned or {}
        try:
            now = validators_of(self.name, headers)
        except SourceError:
            now = {}
        said = differences(expected, now, [key for key in LABELS if now.get(key) is not None])
        if not said:  # the reply does not say what it has now
            asked = ", ".join("%s %s" % pair for pair in sorted(conditions(expected).items()))
            said = ["it answers 412 Precondition Failed to %s" % asked]
        return changed_error(self.name, "since the plan" if self.pin is None else "while it was read", said)

    def _checked_range(self, response: http.client.HTTPResponse, start: int, end: int) -> tuple[int, int]:
        """The reply's Content-Range (and Content-Length) are exactly the range asked."""
        try:
            got_start, got_end, total = parse_content_range(single_header(response.headers, "Content-Range") or "")
            said = single_header(response.headers, "Content-Length")
            length = None if said is None else bounded_int(said.strip(), "a Content-Length")
        except SourceError as e:
            raise SourceError("%s answered 206 with %s: refused" % (self.name, e)) from None
        size = total if self.pin is None else self.size  # the first reply (no pin yet) sets the size
        want_end = min(end, size - 1)  # a server clamps to the file's end
        if (got_start, got_end, total) != (start, want_end, size) or length not in (None, got_end - got_start + 1):
            raise SourceError("%s answered bytes %d-%d/%d (Content-Length %s) to the request bytes=%d-%d: expected"
                              " bytes %d-%d/%d, refused" % (self.name, got_start, got_end, total, shown(length),
                                                            start, end, start, want_end, size))
        self.size = size
        return got_start, got_end

    def _check_validators(self, response: http.client.HTTPResponse) -> None:
        now = dict(validators_of(self.name, response.headers), size=self.size)
        if self.pin is None:
            refuse_changes(self.name, self.pinned, now, URL_PIN)
            self.pin = now
        else:
            refuse_changes(self.name, self.pin, now, URL_PIN, "while it was read")

    def _read_exactly(self, response: http.client.HTTPResponse, start: int, end: int) -> bytes:
        return b"".join(self._body(response, start, end))

    def _body(self, response: http.client.HTTPResponse, start: int, end: int) -> Iterator[bytes]:
        """The body, asserted to be exactly end - start + 1 bytes."""
        want = end - start + 1
        got = 0
        while got < want:
            try:
                part = response.read(min(STREAM_CHUNK, want - got))
            except (http.client.HTTPException, OSError, ValueError) as e:  # cut short, reset, a bad chunk size
                raise SourceError("%s: the range %d-%d broke off after %d of %d bytes (%s)"
                                  % (self.name, start, end, got, want, type(e).__name__)) from None
            if not part:
                break
            got += len(part)
            self.fetched += len(part)
            yield part
        if got != want or self._more(response):
            raise SourceError("%s sent %s bytes for the range %d-%d: expected exactly end - start + 1 = %d"
                              % (self.name, "%d" % got if got != want else "more than %d" % got, start, end, want))

    def _more(self, response: http.client.HTTPResponse) -> bool:
        try:
            return bool(response.read(1))
        except (http.client.HTTPException, OSError, ValueError):
            return False  # nothing more came: what was asked for is all there is

    def read_at(self, offset: int, length: int) -> bytes:
        end = min(offset + length, self.size)
        if offset >= end:
            return b""
        if end > len(self.prefix):
            self._extend(end)
        return bytes(self.prefix[offset:end])

    def _extend(self, end: int) -> None:
        """The header read on from where it was read to: never a gap, so it is hashed as parsed."""
        if end > MAX_HEADER_BYTES:
            raise SourceError("%s: its header would go past %d bytes: refused" % (self.name, MAX_HEADER_BYTES))
        response, start, got_end = self._open(len(self.prefix), end - 1)
        with response:
            self.prefix += self._read_exactly(response, start, got_end)

    def header_sha256(self, length: int) -> str:
        return hashlib.sha256(self.read_at(0, length)).hexdigest()

    def chunks(self, start: int, length: int) -> Iterator[bytes]:
        if length <= 0:
            return
        response, start, end = self._open(start, start + length - 1)
        with response:
            for part in self._body(response, start, end):
                yield part

    def recheck(self) -> None:
        pass  # every reply was checked as it came

    def close(self) -> None:
        pass


def single_header(headers: Message, name: str) -> str | None:
    """A header's value; a reply that sends it twice (which one would count?) is refused."""
    values = headers.get_all(name) or []
    if len(values) > 1:
        raise SourceError("%d %s headers" % (len(values), name))
    return values[0] if values else None


def validators_of(name: str, headers: Message) -> dict[str, str | None]:
    """{"etag", "last_modified"} as the reply sent them (None where absent), each visible ASCII."""
    out = {}
    for key, header in VALIDATORS:
        try:
            value = single_header(headers, header)
        except SourceError as e:
            raise SourceError("%s sent %s: refused" % (name, e)) from None
        value = None if value is None else value.strip()
        if value is not None and (len(value) > MAX_VALIDATOR or not VALIDATOR.fullmatch(value)):
            raise SourceError("%s sent %s %r: not a validator this tool keeps (visible ASCII, at most %d characters)"
                              % (name, header, value[:60], MAX_VALIDATOR))
        out[key] = value
    return out


def conditions(pin: Mapping[str, Any]) -> dict[str, str]:
    """The request headers that make a server refuse (412) what is no longer the pinned file. A
    weak ETag (W/...) never matches If-Match: it is checked in the reply instead."""
    headers = {}
    etag, last_modified = pin.get("etag"), pin.get("last_modified")
    if isinstance(etag, str) and etag and not etag.startswith("W/"):
        headers["If-Match"] = etag
    if isinstance(last_modified, str) and last_modified:
        headers["If-Unmodified-Since"] = last_modified
    return headers


Source = Union[LocalSource, HttpSource]  # what surgery reads a GGUF from (open_source)
