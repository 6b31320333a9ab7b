"""A stand-in for the HTTP "exec envelope" gateway that some boxes are reachable through, with fault injection.

It reproduces the gateway closely enough that the console's envelope client and the payloads it sends can be
tested on one machine: same request and reply shapes, same execution traps, and on demand the same failures.

Protocol
========

Request
-------
``POST {prefix}/execute?respenc=b64url&timeout=N``

- Header ``Authorization: Bearer TOKEN``. The token is read at start-up from the environment variable
  ``SAMAI_ENVELOPE_TOKEN`` (or the one named by ``--token-env``) and compared with ``hmac.compare_digest``.
- Header ``Content-Type: text/plain`` (expected, not enforced). The body is the Python source to run, at most
  ``--max-body`` bytes (default 4 MiB); a ``Content-Length`` is required (no chunked bodies).
- ``timeout``: seconds, a positive number, default 60. It is capped by the hard cut (``--hard-cut``, default
  180): a larger value is silently cut to it.
- ``respenc``: ``b64url``, or absent.

Checks run in this order; the first that fails answers:

====  ======================================================================================
404   the path is neither ``{prefix}/execute`` nor (with ``--faults``) ``{prefix}/_faults``
405   the method is not allowed there (``Allow`` names the ones that are)
401   the ``Authorization`` header is missing or its token is wrong (also ``WWW-Authenticate: Bearer``)
411   no ``Content-Length``
413   the body is longer than ``--max-body``
400   ``timeout`` is not a positive number, or ``respenc`` is neither ``b64url`` nor absent
====  ======================================================================================

Every error reply is ``Content-Type: application/json`` with a body ``{"error": "<short reason>", ...}``.

Execution
---------
The body runs in a child process (``sys.executable -c RUNNER``, in a new session), so a hang can be killed and
a crash cannot take the server down. The runner reads the source from its stdin and does::

    exec(compile(source, "<payload>", "exec"),
         {"__name__": "__payload__", "__builtins__": __builtins__},  # globals
         {})                                                          # locals: a SEPARATE dict

Separate globals and locals are what the real gateway does, and they are why its traps reproduce here:
a ``def`` body cannot see top-level imports or names, a comprehension or generator expression cannot see a
top-level name in its body, and nested functions cannot see each other (see ``payload_lint``).

- The payload's stdout and stderr are the child's. An exception in the payload prints its traceback to stderr
  and the child exits 1; ``sys.exit(N)`` exits N; a child killed by signal S has rc ``-S``.
- The environment variable that holds the token (and any variable whose value equals it) is removed from the
  child's environment.
- When the child exits, what is left of its process group is killed. Only processes the payload detached into
  a session of their own (``subprocess.Popen(..., start_new_session=True)``, the playbook's "fire" pattern)
  outlive the request; output they write to the inherited pipes after the child exits is not collected.

Replies
-------
- The payload ran (whatever it printed, whatever its exit code): ``200``, ``Content-Type: application/json``::

      {"rc": <child exit code>, "stdout": <str>, "stderr": <str>, "elapsed_s": <float>}

  With ``respenc=b64url``, stdout and stderr are ``base64.urlsafe_b64encode(bytes)`` (padding kept);
  without ``respenc`` they are the bytes decoded as UTF-8 with ``errors="replace"``. ``elapsed_s`` is the
  child's wall time, rounded to milliseconds.
- The timeout expired: the child's whole process group is killed (SIGKILL) and the reply is ``504``,
  ``{"error": "timeout", "after_s": <the timeout applied, after the hard cut, as a float>}``.

The server speaks HTTP/1.1 with keep-alive; it closes the connection after any reply sent before the body was
read, and after the ``hang`` and ``close_mid_body`` faults.

Fault injection (only with ``--faults``)
----------------------------------------
Faults apply to authenticated, well-formed ``/execute`` requests only (after every check above passed).

====================  ===========================================================================================
``500``               answer 500 ``{"error": "injected fault: 500"}``; the code does not run
``503``               answer 503 with ``Retry-After: <retry_after_s>`` ``{"error": "unavailable"}``; no run
``hang``              accept and never answer until the hard cut, then 504 ``{"error": "timeout", "after_s":
                      <hard cut>}`` and close; the code does not run
``trickle``           run the code, then send the whole reply (status line, headers, body) one byte every
                      ``delay_s`` seconds (default 0.2)
``close_mid_body``    run the code, send the headers (with the full ``Content-Length``) and the first half of the
                      body, then close: the code ran but its reply is lost
``silent_spawn``      answer 200 ``{"rc": 0, "stdout": "", "stderr": "", "elapsed_s": 0.0}`` WITHOUT running the
                      code: the "exec slot failed silently" trap
====================  ===========================================================================================

Control endpoint, same bearer token:

- ``POST {prefix}/_faults`` with JSON ``{"mode": M, "count": K, "after": N, "delay_s": D, "retry_after_s": R}``
  (only ``mode`` is required; ``count`` defaults to 1, ``after`` to 0) queues a step: let the next N
  ``/execute`` requests through, then apply M to the K after them. Steps queued by later calls run after the
  earlier ones. Answers 200 with the plan (as for GET); 400 for an unknown mode or a bad number.
- ``GET {prefix}/_faults`` answers ``{"queued": [{"mode": M, "remaining": K, ...}, ...], "standing": M|null}``.
- ``DELETE {prefix}/_faults`` empties the queue (the standing fault stays).
- ``--fault MODE`` sets a standing fault that applies to every ``/execute`` request the queue does not cover.

Logging
-------
One line per request on stderr: UTC time, method, path (``-`` for a path that is not an endpoint), the
applied ``timeout`` and ``respenc`` for ``/execute``, the status, the elapsed seconds, and the fault if one
applied. Headers, the raw query string and request bodies are never logged, so neither is the token.

Command line
============
``python -m samai.remote.envelope_server [--host 127.0.0.1] [--port 8765] [--prefix ''] [--token-env
SAMAI_ENVELOPE_TOKEN] [--hard-cut 180] [--max-body 4194304] [--faults [--fault MODE]]``

``--port 0`` picks a free port. The first stdout line is always ``listening on http://HOST:PORT`` (flushed).
No token in the environment: a message on stderr and exit 2. SIGTERM or Ctrl-C: running children are killed,
exit 0.

In-process (tests): ``with serve(token, port=0, faults=True) as server: httpx.post(server.url + "/execute", ...)``;
``server.faults.arm("500", count=1)`` is the Python side of ``POST /_faults``.
"""

from __future__ import annotations

import argparse
import base64
import hmac
import json
import math
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TextIO
from urllib.parse import parse_qs, urlsplit

DEFAULT_PORT = 8765
DEFAULT_TOKEN_ENV = "SAMAI_ENVELOPE_TOKEN"
DEFAULT_TIMEOUT_S = 60.0
DEFAULT_HARD_CUT_S = 180.0
DEFAULT_MAX_BODY = 4 * 1024 * 1024
DEFAULT_TRICKLE_DELAY_S = 0.2
DEFAULT_RETRY_AFTER_S = 1

FAULT_MODES = ("500", "503", "hang", "trickle", "close_mid_body", "silent_spawn")
FAULTS_THAT_SKIP_THE_RUN = ("500", "503", "hang", "silent_spawn")

# After the child exits, how long its pipes may stay open (a detached grandchild inherited them) before we stop
# reading.
DRAIN_GRACE_S = 0.5
# How long a closing connection keeps reading what the client still sends, so the kernel sends FIN, not RST,
# and the client gets to read our reply (e.g. a 413 sent before a large body was read).
LINGER_S = 2.0
SOCKET_TIMEOUT_S = 120.0

RUNNER = r"""
import linecache, sys, traceback
source = sys.stdin.buffer.read()
# So tracebacks show the payload's lines.
linecache.cache["<payload>"] = (len(source), None, source.decode("utf-8", "replace").splitlines(True), "<payload>")
try:
    exec(compile(source, "<payload>", "exec"), {"__name__": "__payload__", "__builtins__": __builtins__}, {})
except Exception as exc:
    # tb_next: leave out the runner's own frame.
    traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next)
    sys.exit(1)
"""


# ---------------------------------------------------------------------------------------------------------------
# Running a payload


@dataclass(frozen=True)
class Outcome:
    rc: int | None  # None: killed at the deadline
    stdout: bytes
    stderr: bytes
    elapsed_s: float

    @property
    def timed_out(self) -> bool:
        return self.rc is None


def child_environment(token: str, token_env: str) -> dict[str, str]:
    """The server's environment minus anything that would hand the token to the payload."""
    return {name: value for name, value in os.environ.items() if name != token_env and value != token}


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def has_exited(proc: subprocess.Popen) -> bool:
    """Whether the child exited, WITHOUT reaping it: while it is a zombie its pid (= its group id) can't be reused,
    so killing its group afterwards cannot hit a stranger."""
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def feed_source(proc: subprocess.Popen, source: bytes) -> None:
    try:
        proc.stdin.write(source)
        proc.stdin.close()
    except BrokenPipeError:
        pass  # the child died before reading; its rc and stderr say why


def collect_output(proc: subprocess.Popen, deadline: float) -> tuple[bytes, bytes] | None:
    """Read the child's stdout and stderr until it exits; None if the deadline came first."""
    buffers = {proc.stdout: bytearray(), proc.stderr: bytearray()}
    exited_at = None
    with selectors.DefaultSelector() as selector:
        for pipe in buffers:
            selector.register(pipe, selectors.EVENT_READ)
        while True:
            now = time.monotonic()
            if now >= deadline:
                return None
            if exited_at is None and has_exited(proc):
                exited_at = now
            if exited_at is not None and (not selector.get_map() or now - exited_at >= DRAIN_GRACE_S):
                break
            for key, _ in selector.select(min(0.05, deadline - now)):
                chunk = os.read(key.fd, 65536)
                if chunk:
                    buffers[key.fileobj] += chunk
                else:
                    selector.unregister(key.fileobj)
    return bytes(buffers[proc.stdout]), bytes(buffers[proc.stderr])


class PayloadRunner:
    """Runs payloads in child processes and remembers the live ones, so a stopping server can kill them."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self._live: set[subprocess.Popen] = set()
        self._lock = threading.Lock()

    def run(self, source: bytes, timeout_s: float) -> Outcome:
        started = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-c", RUNNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True, env=self.env)
        with self._lock:
            self._live.add(proc)
        try:
            feed_source(proc, source)
            output = collect_output(proc, started + timeout_s)
        finally:
            kill_group(proc.pid)  # the timed-out child, or what an exited one left behind in its group
            proc.wait()
            proc.stdout.close()
            proc.stderr.close()
            with self._lock:
                self._live.discard(proc)
        elapsed = time.monotonic() - started
        if output is None:
            return Outcome(None, b"", b"", elapsed)
        return Outcome(proc.returncode, output[0], output[1], elapsed)

    def kill_all(self) -> None:
        with self._lock:
            for proc in self._live:
                kill_group(proc.pid)


# ---------------------------------------------------------------------------------------------------------------
# Faults


@dataclass(frozen=True)
class Fault:
    mode: str
    delay_s: float = DEFAULT_TRICKLE_DELAY_S
    retry_after_s: int = DEFAULT_RETRY_AFTER_S


@dataclass
class FaultStep:
    fault: Fault | None  # None: let requests through
    remaining: int


class FaultError(ValueError):
    """A fault request that makes no sense (unknown mode, bad count)."""


def _non_negative_number(spec: dict, name: str, default, kind):
    value = spec.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise FaultError(f"{name} must be a non-negative number")
    if kind is int and value != int(value):
        raise FaultError(f"{name} must be a whole number")
    return kind(value)


def fault_from_spec(spec: dict) -> tuple[Fault, int, int]:
    """Parse a control request's JSON into (fault, count, after)."""
    if not isinstance(spec, dict):
        raise FaultError("expected a JSON object")
    unknown = set(spec) - {"mode", "count", "after", "delay_s", "retry_after_s"}
    if unknown:
        raise FaultError(f"unknown field(s): {', '.join(sorted(unknown))}")
    mode = spec.get("mode")
    if mode not in FAULT_MODES:
        raise FaultError(f"mode must be one of {', '.join(FAULT_MODES)}")
    count = _non_negative_number(spec, "count", 1, int)
    if count < 1:
        raise FaultError("count must be at least 1")
    after = _non_negative_number(spec, "after", 0, int)
    delay_s = _non_negative_number(spec, "delay_s", DEFAULT_TRICKLE_DELAY_S, float)
    retry_after_s = _non_negative_number(spec, "retry_after_s", DEFAULT_RETRY_AFTER_S, int)
    return Fault(mode, delay_s, retry_after_s), count, after


class FaultPlan:
    """What the next /execute requests suffer: the queued steps in order, then the standing fault."""

    def __init__(self, standing: Fault | None = None) -> None:
        self.standing = standing
        self._steps: deque[FaultStep] = deque()
        self._lock = threading.Lock()

    def arm(self, mode: str, count: int = 1, after: int = 0, *, delay_s: float = DEFAULT_TRICKLE_DELAY_S,
            retry_after_s: int = DEFAULT_RETRY_AFTER_S) -> None:
        fault, count, after = fault_from_spec(
            {"mode": mode, "count": count, "after": after, "delay_s": delay_s, "retry_after_s": retry_after_s})
        with self._lock:
            if after:
                self._steps.append(FaultStep(None, after))
            self._steps.append(FaultStep(fault, count))

    def clear(self) -> None:
        with self._lock:
            self._steps.clear()

    def take(self) -> Fault | None:
        """The fault for the request being handled now (consumes one request of the current step)."""
        with self._lock:
            if not self._steps:
                return self.standing
            step = self._steps[0]
            step.remaining -= 1
            if step.remaining == 0:
                self._steps.popleft()
            return step.fault

    def describe(self) -> dict:
        with self._lock:
            queued = [{"mode": step.fault.mode if step.fault else "none", "remaining": step.remaining,
                       **({"delay_s": step.fault.delay_s, "retry_after_s": step.fault.retry_after_s}
                          if step.fault else {})}
                      for step in self._steps]
        return {"queued": queued, "standing": self.standing.mode if self.standing else None}


# ---------------------------------------------------------------------------------------------------------------
# HTTP


@dataclass(frozen=True)
class Settings:
    token: str
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    prefix: str = ""
    token_env: str = DEFAULT_TOKEN_ENV
    hard_cut_s: float = DEFAULT_HARD_CUT_S
    max_body: int = DEFAULT_MAX_BODY
    faults: bool = False


@dataclass
class Reply:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = ()
    close: bool = False  # close the connection after sending


def json_reply(status: int, document: dict, *, headers: tuple[tuple[str, str], ...] = (), close=False) -> Reply:
    return Reply(status, json.dumps(document).encode(), headers=headers, close=close)


def encode_stream(data: bytes, respenc: str | None) -> str:
    if respenc == "b64url":
        return base64.urlsafe_b64encode(data).decode("ascii")
    return data.decode("utf-8", "replace")


def outcome_reply(outcome: Outcome, respenc: str | None, timeout_s: float) -> Reply:
    if outcome.timed_out:
        return json_reply(504, {"error": "timeout", "after_s": timeout_s})
    return json_reply(200, {"rc": outcome.rc, "stdout": encode_stream(outcome.stdout, respenc),
                            "stderr": encode_stream(outcome.stderr, respenc),
                            "elapsed_s": round(outcome.elapsed_s, 3)})


def normalize_prefix(prefix: str) -> str:
    prefix = prefix.strip().rstrip("/")
    return prefix if not prefix or prefix.startswith("/") else "/" + prefix


@dataclass(frozen=True)
class ExecuteParams:
    timeout_s: float
    respenc: str | None


def parse_execute_query(query: str, hard_cut_s: float) -> ExecuteParams:
    """The query's timeout (capped by the hard cut) and respenc; ValueError says what is wrong."""
    params = parse_qs(query, keep_blank_values=True)
    respenc = params.get("respenc", [None])[-1]
    if respenc not in (None, "b64url"):
        raise ValueError("respenc must be b64url or absent")
    raw_timeout = params.get("timeout", [None])[-1]
    timeout_s = DEFAULT_TIMEOUT_S
    if raw_timeout is not None:
        try:
            timeout_s = float(raw_timeout)
        except ValueError:
            raise ValueError("timeout must be a number of seconds") from None
        if not math.isfinite(timeout_s) or timeout_s <= 0:
            raise ValueError("timeout must be a positive number of seconds")
    return ExecuteParams(min(timeout_s, hard_cut_s), respenc)


def render_head(reply: Reply) -> bytes:
    phrase = HTTPStatus(reply.status).phrase
    lines = [f"HTTP/1.1 {reply.status} {phrase}", f"Content-Type: {reply.content_type}",
             f"Content-Length: {len(reply.body)}"]
    lines += [f"{name}: {value}" for name, value in reply.headers]
    if reply.close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class EnvelopeHandler(BaseHTTPRequestHandler):
    server: EnvelopeServer
    protocol_version = "HTTP/1.1"
    timeout = SOCKET_TIMEOUT_S

    def do_POST(self) -> None:
        self.handle_request()

    do_GET = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_HEAD = do_POST

    # -- one request

    def handle_request(self) -> None:
        started = time.monotonic()
        self.body_read = False
        self.log_detail = ""
        path = urlsplit(self.path).path
        reply, fault = self.route(path)
        if reply is not None:
            if not self.body_read and self.declared_length():
                reply.close = True
            self.deliver(reply, fault)
        else:
            self.close_connection = True
        status = reply.status if reply is not None else "-"
        self.server.log(f"{self.command} {path if self.known_path(path) else '-'}{self.log_detail} {status} "
                        f"{time.monotonic() - started:.3f}s" + (f" fault={fault.mode}" if fault else ""))

    def endpoints(self) -> dict[str, tuple[str, ...]]:
        prefix = self.server.settings.prefix
        routes = {prefix + "/execute": ("POST",)}
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
        if path.endswith("/_faults"):
            return self.control_faults(), None
        return self.execute()

    def authorized(self) -> bool:
        scheme, _, credentials = (self.headers.get("Authorization") or "").partition(" ")
        offered = credentials.strip().encode("utf-8", "replace")
        return scheme.lower() == "bearer" and hmac.compare_digest(offered, self.server.settings.token.encode())

    def declared_length(self) -> int | None:
        try:
            return int(self.headers.get("Content-Length", ""))
        except ValueError:
            return None

    def read_body(self) -> tuple[bytes | None, Reply | None]:
        """The request body, or the reply that refuses it."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return None, json_reply(411, {"error": "length required (no chunked bodies)"}, close=True)
        length = self.declared_length()
        if length is None or length < 0:
            return None, json_reply(411, {"error": "length required"}, close=True)
        if length > self.server.settings.max_body:
            return None, json_reply(413, {"error": "body too large", "max_bytes": self.server.settings.max_body},
                                    close=True)
        body = self.rfile.read(length)
        self.body_read = True
        if len(body) < length:
            return None, None  # the client went away mid-body: nobody to answer
        return body, None

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
        outcome = self.server.runner.run(source, params.timeout_s)
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
            if mode == "trickle":
                self.trickle(head + body, fault.delay_s)
            elif mode == "close_mid_body":
                self.wfile.write(head + body[: len(body) // 2])
            else:
                self.wfile.write(head + body)
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            reply.close = True
        if reply.close:
            self.close_connection = True
            self.linger()

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


class EnvelopeServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, settings: Settings, *, standing_fault: Fault | None = None,
                 log_stream: TextIO | None = None) -> None:
        if ":" in settings.host:
            self.address_family = socket.AF_INET6
        super().__init__((settings.host, settings.port), EnvelopeHandler)
        self.settings = settings
        self.faults = FaultPlan(standing_fault)
        self.runner = PayloadRunner(child_environment(settings.token, settings.token_env))
        self.stopping = threading.Event()
        self.log_stream = log_stream if log_stream is not None else sys.stderr
        self._log_lock = threading.Lock()

    @property
    def url(self) -> str:
        """http://HOST:PORT, without the prefix."""
        host, port = self.server_address[:2]
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    def log(self, line: str) -> None:
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")[:-4] + "Z"
        with self._log_lock:
            self.log_stream.write(f"{stamp} {line}\n")
            self.log_stream.flush()

    def release(self) -> None:
        """Wake waiting handlers, kill running payloads, close the listening socket."""
        self.stopping.set()
        self.runner.kill_all()
        self.server_close()


def build_server(token: str, *, host: str = "127.0.0.1", port: int = 0, prefix: str = "",
                 token_env: str = DEFAULT_TOKEN_ENV, hard_cut_s: float = DEFAULT_HARD_CUT_S,
                 max_body: int = DEFAULT_MAX_BODY, faults: bool = False, fault: str | None = None,
                 log_stream: TextIO | None = None) -> EnvelopeServer:
    if not token:
        raise ValueError("an envelope server needs a token")
    if fault is not None and not faults:
        raise ValueError("a standing fault needs faults enabled")
    if fault is not None and fault not in FAULT_MODES:
        raise ValueError(f"unknown fault mode {fault!r}")
    settings = Settings(token, host, port, normalize_prefix(prefix), token_env, hard_cut_s, max_body, faults)
    return EnvelopeServer(settings, standing_fault=Fault(fault) if fault else None, log_stream=log_stream)


@contextmanager
def serve(token: str, **options) -> Iterator[EnvelopeServer]:
    """An envelope server answering in a background thread for the duration of the block (options: build_server's).
    Port 0 (the default here) picks a free port: read it from server.url."""
    server = build_server(token, **options)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True,
                              name="envelope-server")
    thread.start()
    try:
        yield server
    finally:
        server.stopping.set()
        server.shutdown()
        thread.join()
        server.release()


# ---------------------------------------------------------------------------------------------------------------
# Command line


def positive(kind):
    def parse(text: str):
        value = kind(text)
        if not value > 0:
            raise argparse.ArgumentTypeError(f"{text} is not a positive number")
        return value
    return parse


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m samai.remote.envelope_server",
                                     description="A local HTTP exec-envelope gateway (see the module docstring).")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"0 picks a free port (default {DEFAULT_PORT})")
    parser.add_argument("--prefix", default="", help="path prefix before /execute, e.g. /gw")
    parser.add_argument("--token-env", default=DEFAULT_TOKEN_ENV, metavar="NAME",
                        help=f"environment variable holding the bearer token (default {DEFAULT_TOKEN_ENV})")
    parser.add_argument("--hard-cut", type=positive(float), default=DEFAULT_HARD_CUT_S, metavar="SECONDS",
                        help="cap on any request's timeout (default 180)")
    parser.add_argument("--max-body", type=positive(int), default=DEFAULT_MAX_BODY, metavar="BYTES",
                        help="largest accepted payload (default 4 MiB)")
    parser.add_argument("--faults", action="store_true", help="enable fault injection and POST/GET/DELETE /_faults")
    parser.add_argument("--fault", choices=FAULT_MODES, metavar="MODE",
                        help=f"a standing fault for every request (needs --faults): {', '.join(FAULT_MODES)}")
    return parser


def parse_arguments(argv: list[str] | None) -> argparse.Namespace | int:
    """The parsed arguments, or the exit code argparse chose (--help, a usage error)."""
    parser = argument_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 2
    if args.fault and not args.faults:
        parser.print_usage(sys.stderr)
        print(f"{parser.prog}: error: --fault needs --faults", file=sys.stderr)
        return 2
    return args


def _stop_on_sigterm(signum, frame) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    if isinstance(args, int):
        return args
    token = os.environ.get(args.token_env, "")
    if not token:
        print(f"envelope_server: no token: set the environment variable {args.token_env} "
              "(clients must send it as 'Authorization: Bearer TOKEN')", file=sys.stderr)
        return 2
    try:
        server = build_server(token, host=args.host, port=args.port, prefix=args.prefix, token_env=args.token_env,
                              hard_cut_s=args.hard_cut, max_body=args.max_body, faults=args.faults, fault=args.fault)
    except OSError as e:
        print(f"envelope_server: cannot listen on {args.host}:{args.port}: {e.strerror or e}", file=sys.stderr)
        return 2
    print(f"listening on {server.url}", flush=True)
    if args.faults:
        server.log("fault injection is ON" + (f" (standing fault: {args.fault})" if args.fault else ""))
    previous = signal.signal(signal.SIGTERM, _stop_on_sigterm)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        server.release()
    return 0


if __name__ == "__main__":
    sys.exit(main())
