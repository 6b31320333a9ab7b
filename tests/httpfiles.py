"""A loopback HTTP file server for tests: Range requests, and knobs to make it misbehave on purpose.

    with FileServer(folder, throttle=256 * 1024) as server:
        url = server.url("model.gguf")

Knobs (attributes; a test may change them while it runs):
  throttle      bytes per second per response (None: as fast as it goes)
  drop_after    close the connection after this many body bytes, once (then it is reset to None)
  corrupt       flip the byte in the middle of the file in every body that covers it
  ignore_range  answer a Range request with 200 and the whole file
`requests` records (path, Range header or None, status) of every request, in order;
`authorizations` the Authorization header of each request that had one.
"""

from __future__ import annotations

import re
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

BLOCK = 16 * 1024


def parse_range(header: str, size: int):
    """(first, last) of a single 'bytes=' range, 'unsatisfiable', or None to ignore the header."""
    m = re.match(r"^bytes=(\d*)-(\d*)$", header.strip())
    if not m or m.group(1) == m.group(2) == "":
        return None
    if m.group(1) == "":  # suffix: the last N bytes
        n = int(m.group(2))
        return (max(0, size - n), size - 1) if n and size else "unsatisfiable"
    first = int(m.group(1))
    last = int(m.group(2)) if m.group(2) else size - 1
    if first >= size or last < first:
        return "unsatisfiable"
    return first, min(last, size - 1)


class Handler(BaseHTTPRequestHandler):
    server_version = "httpfiles/1"

    def log_message(self, format, *args):  # keep test output quiet
        pass

    def do_HEAD(self):
        self.respond(with_body=False)

    def do_GET(self):
        self.respond(with_body=True)

    def respond(self, with_body: bool) -> None:
        files: FileServer = self.server.files
        path = files.resolve(self.path)
        header = self.headers.get("Range")
        if self.headers.get("Authorization"):
            files.authorizations.append(self.headers["Authorization"])
        if path is None:
            files.record(self.path, header, 404)
            self.send_error(404)
            return
        size = path.stat().st_size
        span = None if header is None or files.ignore_range else parse_range(header, size)
        if span == "unsatisfiable":
            files.record(self.path, header, 416)
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{size}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        first, last = span or (0, size - 1)
        status = 206 if span else 200
        files.record(self.path, header, status)
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(last - first + 1))
        self.send_header("Accept-Ranges", "bytes")
        if span:
            self.send_header("Content-Range", f"bytes {first}-{last}/{size}")
        self.end_headers()
        if with_body:
            try:
                self.send_body(files, path, first, last, size)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client went away (killed, or it stopped reading): nothing to do

    def send_body(self, files: FileServer, path: Path, first: int, last: int, size: int) -> None:
        budget = files.take_drop()
        middle = size // 2
        sent = 0
        with open(path, "rb") as f:
            f.seek(first)
            position = first
            while position <= last:
                block = bytearray(f.read(min(BLOCK, last - position + 1)))
                if files.corrupt and position <= middle < position + len(block):
                    block[middle - position] ^= 0xFF
                if budget is not None and sent + len(block) >= budget:
                    self.wfile.write(block[: budget - sent])
                    self.wfile.flush()
                    self.close_connection = True
                    return  # the socket closes mid-body: the client sees a short read
                self.wfile.write(block)
                sent += len(block)
                position += len(block)
                if files.throttle:
                    time.sleep(len(block) / files.throttle)


class FileServer:
    def __init__(self, root, *, throttle: float | None = None, drop_after: int | None = None,
                 corrupt: bool = False, ignore_range: bool = False) -> None:
        self.root = Path(root).resolve()
        self.throttle, self.drop_after = throttle, drop_after
        self.corrupt, self.ignore_range = corrupt, ignore_range
        self.requests: list[tuple[str, str | None, int]] = []
        self.authorizations: list[str] = []
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None

    def __enter__(self) -> FileServer:
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._httpd.files = self
        threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    def url(self, rel: str) -> str:
        return f"http://127.0.0.1:{self.port}/{urllib.parse.quote(rel)}"

    def resolve(self, request_path: str) -> Path | None:
        """The file a request path names, or None when it is missing or outside the root."""
        rel = urllib.parse.unquote(urllib.parse.urlsplit(request_path).path).lstrip("/")
        path = (self.root / rel).resolve()
        if path != self.root and self.root not in path.parents or not path.is_file():
            return None
        return path

    def take_drop(self) -> int | None:
        with self._lock:
            budget, self.drop_after = self.drop_after, None
            return budget

    def record(self, path: str, range_header: str | None, status: int) -> None:
        with self._lock:
            self.requests.append((path, range_header, status))

    def gets(self, rel: str) -> list[tuple[str | None, int]]:
        """(Range header, status) of every request for rel."""
        want = "/" + urllib.parse.quote(rel)
        with self._lock:
            return [(r, s) for p, r, s in self.requests if p == want]


def write_files(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
