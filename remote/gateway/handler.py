"""The HTTP side of the gateway: routing, the checks in their order, /execute, /_faults and how replies go out."""

from __future__ import annotations

import hmac
import http.client
import io
import json
import socket
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Protocol
from urllib.parse import urlsplit

from samai.remote.gateway.faults import FAULTS_THAT_SKIP_THE_RUN, Fault, FaultError, fault_from_spec
from samai.remote.gateway.limits import BUSY_RETRY_AFTER_S
from samai.remote.gateway.protocol import ExecuteParams, parse_content_length, parse_execute_query
from samai.remote.gateway.replies import Reply, json_reply, outcome_reply, render_head
from samai.remote.gateway.runner import Outcome

if TYPE_CHECKING:
    import threading

    from samai.remote.gateway.faults import FaultPlan
    from samai.remote.gateway.limits import ConnectionSlots
    from samai.remote.gateway.protocol import Settings
    from samai.remote.gateway.runner import PayloadRunner


class GatewayServer(Protocol):
    """What a handler asks of the server it runs in (server.py EnvelopeServer is one)."""

    settings: Settings
    faults: FaultPlan
    runner: PayloadRunner
    slots: ConnectionSlots
    stopping: threading.Event

    def make_pending(self, conn: socket.socket, client: str, *, wait_s: float) -> None: ...

    def log(self, line: str) -> None: ...

# How long a closing connection keeps reading what the client still sends, so the kernel sends FIN, not RST,
# and the client gets to read our reply (e.g. a 413 sent before a large body was read).
LINGER_S = 2.0
# How long one read or write may wait. The header and body deadlines bound a request's reads on their own; this
# bounds a reply the client stops reading, which holds an active slot.
SOCKET_TIMEOUT_S = 30.0
BODY_CHUNK = 64 * 1024


class HeadLimitedReader(io.BufferedReader):
    """The connection's reader. Lines (the request line and the headers are read line by line) may take at most
    BUDGET bytes in all per request: past it, http.client.LineTooLong, which the standard library answers 431 for
    the headers (and handle_one_request 414 for the request line)."""

    def __init__(self, raw: io.RawIOBase, budget: int) -> None:
        super().__init__(raw)
        self.budget = budget
        self.head_left = budget

    def start_head(self) -> None:
        self.head_left = self.budget

    def readline(self, size: int | None = -1, /) -> bytes:
        cap = self.head_left + 1
        line = super().readline(cap if size is None or size < 0 else min(size, cap))
        self.head_left -= len(line)
        if self.head_left < 0:
            raise http.client.LineTooLong(f"request line and headers over {self.budget} bytes")
        return line


class EnvelopeHandler(BaseHTTPRequestHandler):
    server: GatewayServer  # type: ignore[assignment]  # (socketserver types it as its BaseServer)
    rfile: HeadLimitedReader
    protocol_version = "HTTP/1.1"
    timeout = SOCKET_TIMEOUT_S

    def setup(self) -> None:
        super().setup()
        self.rfile = HeadLimitedReader(self.rfile.detach(), self.server.settings.limits.max_head_bytes)

    def handle_one_request(self) -> None:
        self.rfile.start_head()
        try:
            self.read_and_answer()
        except OSError:  # reset by the client, or shut down here (its deadline passed): nobody to answer
            self.close_connection = True

    def read_and_answer(self) -> None:
        try:
            super().handle_one_request()
        except http.client.LineTooLong:  # the request line alone spent the budget (parse_request answers headers)
            self.requestline = self.request_version = self.command = ""
            self.send_error(HTTPStatus.REQUEST_URI_TOO_LONG)

    def do_POST(self) -> None:
        self.handle_request()

    do_GET = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_HEAD = do_POST

    # -- one request

    def handle_request(self) -> None:
        started = time.monotonic()
        self.body_read = False
        self.active = False
        self.log_detail = ""
        if not self.server.slots.holds(self.connection):
            self.close_connection = True  # dropped as its headers ended (past its deadline, or displaced): shut
            return
        path = urlsplit(self.path).path
        reply, fault = self.route(path)
        if reply is not None:
            # Only the token holder's connections stay open: the others would hold a pending slot for another try.
            if not self.active or (not self.body_read and self.declared_length()):
                reply.close = True
            self.deliver(reply, fault)
        else:
            self.close_connection = True
        if self.active and not self.close_connection:
            self.server.make_pending(self.connection, self.client_address[0],
                                     wait_s=self.server.settings.limits.keep_alive_s)
        status = reply.status if reply is not None else "-"
        self.server.log(f"{self.command} {path if self.known_path(path) else '-'}{self.log_detail} {status} "
                        f"{time.monotonic() - started:.3f}s" + (f" fault={fault.mode}" if fault else ""))
        if reply is not None and reply.close:
            # After the log line: a client slow to close keeps this thread up to LINGER_S, and a server
            # stopped meanwhile must not lose the line of a request it answered.
            self.linger()

    def endpoints(self) -> dict[str, tuple[str, ...]]:
        prefix = self.server.settings.prefix
        routes: dict[str, tuple[str, ...]] = {prefix + "/execute": ("POST",)}
        if self.server.settings.faults:
            routes[prefix + "/_faults"] = ("GET", "POST", "DELETE")
        return routes

    def known_path(self, path: str) -> bool:
        return path in self.endpoints()

    def route(self, path: str) -> tuple[Reply | None, Fault | None]:
        allowed = self.endpoints().get(path)
        if allowed is None:
            return json_reply(404, {"error": "not found"}), None
        if self.command not in allowed:
            return json_reply(405, {"error": "method not allowed"}, headers=(("Allow", ", ".join(allowed)),)), None
        if not self.authorized():
            return json_reply(401, {"error": "unauthorized"}, headers=(("WWW-Authenticate", "Bearer"),)), None
        if not self.server.slots.start_work(self.connection):
            return json_reply(503, {"error": "busy"}, headers=(("Retry-After", str(BUSY_RETRY_AFTER_S)),),
                              close=True), None
        self.active = True
        if path.endswith("/_faults"):
            return self.control_faults(), None
        return self.execute()

    def authorized(self) -> bool:
        scheme, _, credentials = (self.headers.get("Authorization") or "").partition(" ")
        offered = credentials.strip().encode("utf-8", "replace")
        return scheme.lower() == "bearer" and hmac.compare_digest(offered, self.server.settings.token.encode())

    def declared_length(self) -> int | None:
        return parse_content_length(self.headers.get("Content-Length", ""))

    def read_body(self) -> tuple[bytes | None, Reply | None]:
        """The request body, or the reply that refuses it."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return None, json_reply(411, {"error": "length required (no chunked bodies)"}, close=True)
        length = self.declared_length()
        if length is None:
            return None, json_reply(411, {"error": "length required"}, close=True)
        if length > self.server.settings.max_body:
            return None, json_reply(413, {"error": "body too large", "max_bytes": self.server.settings.max_body},
                                    close=True)
        deadline_s = self.server.settings.limits.body_deadline_s(length)
        body = self.read_within(length, deadline_s)
        self.body_read = True
        if body is None:
            return None, json_reply(408, {"error": "body not received in time", "after_s": round(deadline_s, 3)},
                                    close=True)
        if len(body) < length:
            return None, None  # the client went away mid-body: nobody to answer
        return body, None

    def read_within(self, length: int, seconds: float) -> bytes | None:
        """LENGTH bytes of body, fewer if the client closed first; None if they took longer than SECONDS (a
        deadline for the whole body: a per-read timeout alone lets a client send a byte at a time for ever)."""
        deadline = time.monotonic() + seconds
        chunks: list[bytes] = []
        left = length
        try:
            while left > 0:
                remaining_s = deadline - time.monotonic()
                if remaining_s <= 0:
                    return None
                self.connection.settimeout(min(remaining_s, self.timeout))
                chunk = self.rfile.read1(min(left, BODY_CHUNK))
                if not chunk:
                    break
                chunks.append(chunk)
                left -= len(chunk)
        except TimeoutError:
            return None
        finally:
            self.connection.settimeout(self.timeout)
        return b"".join(chunks)

    # -- /execute

    def execute(self) -> tuple[Reply | None, Fault | None]:
        source, refusal = self.read_body()
        if source is None:
            return refusal, None
        try:
            params = parse_execute_query(urlsplit(self.path).query, self.server.settings.hard_cut_s)
        except ValueError as e:
            return json_reply(400, {"error": str(e)}), None
        self.log_detail = f" timeout={params.timeout_s:g} respenc={params.respenc or '-'}"
        fault = self.server.faults.take() if self.server.settings.faults else None
        if fault is not None and fault.mode in FAULTS_THAT_SKIP_THE_RUN:
            return self.fault_reply(fault, params), fault
        try:
            outcome = self.server.runner.run(source, params.timeout_s)
        except OSError as e:  # out of processes or descriptors for now: worth a retry, not the payload's doing
            return json_reply(503, {"error": f"cannot start the payload: {e.strerror or e}"},
                              headers=(("Retry-After", str(BUSY_RETRY_AFTER_S)),)), fault
        return outcome_reply(outcome, params.respenc, params.timeout_s), fault

    def fault_reply(self, fault: Fault, params: ExecuteParams) -> Reply | None:
        if fault.mode == "500":
            return json_reply(500, {"error": "injected fault: 500"})
        if fault.mode == "503":
            return json_reply(503, {"error": "unavailable"}, headers=(("Retry-After", str(fault.retry_after_s)),))
        if fault.mode == "silent_spawn":
            return outcome_reply(Outcome(0, b"", b"", 0.0), params.respenc, params.timeout_s)
        # hang: like a gateway whose exec slot never answers; a stopping server lets it go without a reply
        hard_cut = self.server.settings.hard_cut_s
        if self.server.stopping.wait(hard_cut):
            return None
        return json_reply(504, {"error": "timeout", "after_s": hard_cut}, close=True)

    # -- /_faults

    def control_faults(self) -> Reply:
        plan = self.server.faults
        if self.command == "DELETE":
            plan.clear()
        elif self.command == "POST":
            body, refusal = self.read_body()
            if body is None:
                return refusal or json_reply(400, {"error": "incomplete body"}, close=True)
            try:
                fault, count, after = fault_from_spec(json.loads(body or b"null"))
            except (ValueError, FaultError) as e:  # json.JSONDecodeError is a ValueError
                return json_reply(400, {"error": str(e)})
            plan.arm(fault.mode, count, after, delay_s=fault.delay_s, retry_after_s=fault.retry_after_s)
        return json_reply(200, plan.describe())

    # -- sending

    def deliver(self, reply: Reply, fault: Fault | None) -> None:
        mode = fault.mode if fault else None
        if mode in ("hang", "close_mid_body"):
            reply.close = True
        head = render_head(reply)
        body = b"" if self.command == "HEAD" else reply.body
        try:
            if fault is not None and mode == "trickle":
                self.trickle(head + body, fault.delay_s)
            elif mode == "close_mid_body":
                self.wfile.write(head + body[: len(body) // 2])
            else:
                self.wfile.write(head + body)
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            reply.close = True
        if reply.close:
            self.close_connection = True  # lingered on once the request is logged (handle_request)

    def trickle(self, data: bytes, delay_s: float) -> None:
        for i in range(len(data)):
            if self.server.stopping.is_set():
                return
            self.wfile.write(data[i:i + 1])
            self.wfile.flush()
            time.sleep(delay_s)

    def linger(self) -> None:
        """Half-close and read what the client still sends, so it can read our reply before the socket goes."""
        try:
            self.connection.shutdown(socket.SHUT_WR)
            self.connection.settimeout(0.2)
            until = time.monotonic() + LINGER_S
            while time.monotonic() < until and not self.server.stopping.is_set():
                try:
                    if not self.connection.recv(65536):
                        return
                except TimeoutError:
                    continue
        except OSError:
            pass

    # -- the base class's own logging would print request lines; ours never does

    def log_request(self, code="-", size="-") -> None:
        pass

    def log_error(self, format, *args) -> None:
        code = args[0] if args and isinstance(args[0], int) else "-"
        self.server.log(f"- - {code} rejected a malformed or stalled request")

