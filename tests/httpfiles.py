"""A loopback HTTP file server for tests: Range requests, and knobs to make it misbehave on purpose.

    with FileServer(folder, throttle=256 * 1024) as server:
        url = server.url("model.gguf")

Knobs (attributes; a test may change them while it runs):
  throttle      bytes per second per response (None: as fast as it goes)
  drop_after    close the connection after this many body bytes, once (then it is reset to None)
  corrupt       flip the byte in the middle of the file in every body that covers it
  ignore_range  answer a Range request with 200 and the whole file
  etag, last_modified   send these validators (from the file's inode, mtime and size)
  conditions    honour If-Match / If-Unmodified-Since with 412, as a real file server does
  override      {header: value} sent instead of what the server would send (Content-Range, ...)
  redirects     {request path: Location} answered with 302 instead of a file
hold(after=N) makes each request after the next N wait until release(); `held` is set once one
is waiting. With
tls=(certificate, key) it speaks https (self_signed() makes a pair for 127.0.0.1).
`requests` records (path, Range header or None, status) of every request, in order;
`authorizations` the Authorization header of each request that had one.
"""

from __future__ import annotations

import datetime
import email.utils
import ipaddress
import os
import re
import ssl
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
        files.wait_at_the_gate()
        path = files.resolve(self.path)
        header = self.headers.get("Range")
        if self.headers.get("Authorization"):
            files.authorizations.append(self.headers["Authorization"])
        if self.path in files.redirects:
            files.record(self.path, header, 302)
            self.send_response(302)
            self.send_headers({"Location": files.redirects[self.path], "Content-Length": "0"})
            return
        if path is None:
            files.record(self.path, header, 404)
            self.send_error(404)
            return
        st = path.stat()
        size = st.st_size
        validators = files.validators(st)
        if files.conditions and not self.preconditions_hold(validators, st):
            files.record(self.path, header, 412)
            self.send_response(412)
            self.send_headers({**validators, "Content-Length": "0"})
            return
        span = None if header is None or files.ignore_range else parse_range(header, size)
        if span == "unsatisfiable":
            files.record(self.path, header, 416)
            self.send_response(416)
            self.send_headers({"Content-Range": f"bytes */{size}", "Content-Length": "0"})
            return
        first, last = span or (0, size - 1)
        status = 206 if span else 200
        files.record(self.path, header, status)
        self.send_response(status)
        headers = {"Content-Type": "application/octet-stream", "Content-Length": str(last - first + 1),
                   "Accept-Ranges": "bytes", **validators}
        if span:
            headers["Content-Range"] = f"bytes {first}-{last}/{size}"
        self.send_headers({**headers, **files.override})
        if with_body:
            try:
                self.send_body(files, path, first, last, size)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client went away (killed, or it stopped reading): nothing to do

    def send_headers(self, headers: dict[str, str]) -> None:
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()

    def preconditions_hold(self, validators: dict[str, str], st: os.stat_result) -> bool:
        """If-Match and If-Unmodified-Since as RFC 9110 has them (If-Match wins when both are sent)."""
        if_match = self.headers.get("If-Match")
        if if_match is not None:
            tags = [t.strip() for t in if_match.split(",")]
            return "*" in tags or validators.get("ETag") in tags
        since = self.headers.get("If-Unmodified-Since")
        if since is not None and "Last-Modified" in validators:
            try:
                return int(st.st_mtime) <= email.utils.parsedate_to_datetime(since).timestamp()
            except (TypeError, ValueError):
                return True  # an invalid date is ignored
        return True

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
                 corrupt: bool = False, ignore_range: bool = False, etag: bool = True, last_modified: bool = True,
                 conditions: bool = True, tls: tuple[Path, Path] | None = None) -> None:
        self.root = Path(root).resolve()
        self.throttle, self.drop_after = throttle, drop_after
        self.corrupt, self.ignore_range = corrupt, ignore_range
        self.etag, self.last_modified, self.conditions = etag, last_modified, conditions
        self.override: dict[str, str] = {}
        self.redirects: dict[str, str] = {}
        self.tls = tls
        self.requests: list[tuple[str, str | None, int]] = []
        self.authorizations: list[str] = []
        self.held = threading.Event()
        self._gate = threading.Event()
        self._gate.set()
        self._arrived = 0
        self._hold_after = 0
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None

    def __enter__(self) -> FileServer:
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if self.tls:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*map(str, self.tls))
            self._httpd.socket = context.wrap_socket(self._httpd.socket, server_side=True)
        self._httpd.daemon_threads = True
        self._httpd.files = self
        threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
        self._httpd.shutdown()
        self._httpd.server_close()

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    def url(self, rel: str, host: str = "127.0.0.1") -> str:
        scheme = "https" if self.tls else "http"
        return f"{scheme}://{host}:{self.port}/{urllib.parse.quote(rel)}"

    def validators(self, st: os.stat_result) -> dict[str, str]:
        """What a file server says identifies this version of the file (nginx's kind of ETag)."""
        out = {}
        if self.etag:
            out["ETag"] = f'"{st.st_ino:x}-{st.st_mtime_ns:x}-{st.st_size:x}"'
        if self.last_modified:
            out["Last-Modified"] = email.utils.formatdate(st.st_mtime, usegmt=True)
        return out

    def hold(self, after: int = 0) -> None:
        """Requests wait until release(), once `after` more have come and been let through."""
        with self._lock:
            self._hold_after = self._arrived + after
        self.held.clear()
        self._gate.clear()

    def release(self) -> None:
        self._gate.set()

    def wait_at_the_gate(self) -> None:
        with self._lock:
            self._arrived += 1
            waits = not self._gate.is_set() and self._arrived > self._hold_after
        if waits:
            self.held.set()
            self._gate.wait(60)

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


def self_signed(folder: Path, host: str = "127.0.0.1") -> tuple[Path, Path]:
    """(certificate, key) for https on host: the certificate is its own CA, so a client trusts it
    when given it (SSL_CERT_FILE for Python's default context)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)])
    now = datetime.datetime.now(datetime.UTC)
    public = key.public_key()
    certificate = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(host))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False, data_encipherment=False,
                                     key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(public), critical=False)
        .sign(key, hashes.SHA256()))
    cert_path, key_path = folder / "server.pem", folder / "server.key"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path
