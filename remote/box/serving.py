"""A serving port's monitoring endpoints, asked over loopback within one time budget.

Every request is sent at once on its own non-blocking socket when the probe starts its reply,
and its answer is read when the rest of the reply is built: the servers answer while the probe
reads /proc, and no thread of the probe's competes for its lock with that work (threads did: a
poll with serving cost half as much again). A server that is stopped (SIGSTOP) or stuck still
accepts connections (the kernel does) but never answers; the poll waits for it no longer than the
budget. A --serve probe (ServingReader) keeps such a request in flight across polls and does not
wait on it again; a one-shot probe gives it up at the budget. Answers are bounded in size and
parsed by http.client; what they say is the console's to read (untrusted), nothing here reads it.

Request: {"ports": [18080, ...], "paths": ["/health", "/metrics", "/slots"], "budget_s": 0.8,
          "props": [18080], "canary": [18080]}
  "props": the ports also asked /props (the model and its context: the console asks it once per
  server, not at every read).
  "canary": the ports to send a 1-token completion (POST /v1/completions, max_tokens 1): an idle
  server whose health answers but whose generation is stuck shows only so. Its answer is under
  "canary", said again each read while it is in flight.
Reply: [{"port": 18080, "answers": {"/health": {"status": 200, "body": "...", "seconds": 0.003,
         "truncated": false} | {"error": "no answer within 0.8 s", "seconds": 0.8}}}]"""

from __future__ import annotations

import errno
import http.client
import io
import os
import selectors
import socket
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from .wire import ServingSpec

MAX_BODY = 256 * 1024  # a /slots answer of a few dozen slots is far below it
MAX_HEAD = 64 * 1024  # the status line and headers read at most beside the body
MAX_PORTS = 8
MAX_BUDGET_S = 5.0
PATHS = ("/health", "/metrics", "/slots")  # asked at every read
PROPS = "/props"
CANARY = "canary"
CANARY_BODY = b'{"prompt": "1", "max_tokens": 1, "temperature": 0}'


def request_bytes(port: int, path: str) -> Tuple[str, bytes]:
    """The method and the whole request: Connection: close, so the answer ends where the server closes."""
    head = "Host: 127.0.0.1:%d\r\nConnection: close\r\n" % port
    if path == CANARY:
        return "POST", ("POST /v1/completions HTTP/1.1\r\n%sContent-Type: application/json\r\n"
                        "Content-Length: %d\r\n\r\n" % (head, len(CANARY_BODY))).encode() + CANARY_BODY
    return "GET", ("GET %s HTTP/1.1\r\n%sAccept: application/json, text/plain\r\n\r\n" % (path, head)).encode()


class _Received(object):
    """What the server sent, as the socket http.client reads a response from."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def makefile(self, mode: str, *args: Any, **kwargs: Any) -> io.BytesIO:
        return io.BytesIO(self.data)


class Request(object):
    """One request on a non-blocking socket: connected and sent now, its answer read as it comes
    (step), parsed once the server has closed or the bound is reached (result)."""

    def __init__(self, port: int, path: str) -> None:
        self.port, self.path = port, path
        self.started = time.monotonic()
        self.method, self.unsent = request_bytes(port, path)
        self.received = bytearray()
        self.result: Optional[Dict[str, Any]] = None
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setblocking(False)
        code = self.sock.connect_ex(("127.0.0.1", port))  # EINPROGRESS: connected when writable
        if code not in (0, errno.EINPROGRESS, errno.EAGAIN):
            self._failed(OSError(code, os.strerror(code)))
        else:
            self.step()  # loopback has mostly connected by now: sent at once, the server starts now

    @property
    def events(self) -> int:
        return selectors.EVENT_WRITE if self.unsent else selectors.EVENT_READ

    def step(self) -> None:
        """Send what is unsent, then read what has come; done when the server closes."""
        try:
            if self.unsent:
                code = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if code:  # the connection itself failed (refused, unreachable)
                    raise OSError(code, os.strerror(code))
                self.unsent = self.unsent[self.sock.send(self.unsent):]
            while not self.unsent:
                data = self.sock.recv(65536)
                self.received += data
                if not data or len(self.received) > MAX_HEAD + MAX_BODY:
                    self._answered(truncated=bool(data))
                    return
        except (BlockingIOError, InterruptedError):  # not connected yet, or nothing more has come
            return
        except OSError as e:  # reset: what came before it is the answer, cut
            self._answered(truncated=True) if self.received else self._failed(e)

    def give_up(self, waited: float) -> None:
        self.sock.close()
        self.result = _unanswered(waited)

    def close(self) -> None:
        """Its socket closed: apart from reading the answer, as a close costs as much as a connect."""
        self.sock.close()

    def _answered(self, truncated: bool) -> None:
        self.result = parse_answer(bytes(self.received), self.method, truncated,
                                   round(time.monotonic() - self.started, 4))

    def _failed(self, e: OSError) -> None:
        self.result = {"error": "%s: %s" % (type(e).__name__, str(e)[:200]),
                       "seconds": round(time.monotonic() - self.started, 4)}


def parse_answer(received: bytes, method: str, truncated: bool, seconds: float) -> Dict[str, Any]:
    """What a server sent, by http.client: its status and body (bounded), or why it is no answer."""
    response = http.client.HTTPResponse(_Received(received), method=method)  # type: ignore[arg-type]
    try:
        response.begin()
        try:
            body = response.read(MAX_BODY + 1)
        except http.client.IncompleteRead as e:  # cut at the bound (or by the server) mid-chunk
            body, truncated = e.partial, True
    except OSError as e:  # closed without a word: RemoteDisconnected
        return {"error": "%s: %s" % (type(e).__name__, str(e)[:200]), "seconds": seconds}
    except (http.client.HTTPException, ValueError) as e:  # not HTTP at all
        return {"error": "not an HTTP answer: %s" % type(e).__name__, "seconds": seconds}
    return {"status": response.status, "body": body[:MAX_BODY].decode("utf-8", "replace"),
            "truncated": truncated or len(body) > MAX_BODY, "seconds": seconds}


def pump(requests: List[Request], waited_for: List[Request], deadline: float) -> None:
    """Move every request on as its socket allows, until those waited for are answered or the
    deadline passes; the others are only read as far as they have come."""
    live = [r for r in requests if r.result is None]
    if not live:
        return
    with selectors.DefaultSelector() as selector:
        for r in live:
            selector.register(r.sock, r.events, r)
        while selector.get_map():
            waiting = any(r.result is None for r in waited_for)
            ready = selector.select(max(0.0, deadline - time.monotonic()) if waiting else 0)
            for key, _ in ready:
                r = key.data
                r.step()
                if r.result is not None:
                    selector.unregister(r.sock)
                elif key.events != r.events:
                    selector.modify(r.sock, r.events, r)
            if not ready and (not waiting or time.monotonic() >= deadline):
                return


def send(requests: List[Request], deadline: float) -> None:
    """What the sockets did not take at once, sent as far as they take it now: the servers start
    answering while the probe reads the rest."""
    if any(r.unsent and r.result is None for r in requests):
        pump(requests, [], deadline)


class ServingReader(object):
    """The serving endpoints as a --serve probe asks them, poll after poll: a request still in
    flight from an earlier poll (a stopped server) is not asked again nor waited on, only said
    (how long it has gone unanswered); so a stuck server costs one poll its budget, once, and
    the polls after it nothing. Each request gives up after HANG_S, and is then asked anew."""

    HANG_S = 120.0

    def __init__(self) -> None:
        self.asking: Dict[Tuple[int, str], Request] = {}
        self.answered: List[Request] = []  # their sockets closed once the reply is on its way

    def after_reply(self) -> None:
        for r in self.answered:
            r.close()
        self.answered = []

    def begin(self, spec: ServingSpec) -> Callable[[], list[dict[str, Any]]]:
        """Send what is not in flight already; the function returned collects by the budget."""
        self.after_reply()  # should the probe not have called it
        budget, asked = _asked(spec)
        deadline = time.monotonic() + budget
        fresh = []
        for key in [(port, path) for port, paths in asked.items() for path in paths]:
            if key not in self.asking:
                self.asking[key] = Request(key[0], key[1])
                fresh.append(self.asking[key])
        send(fresh, deadline)
        return lambda: self._collect(fresh, deadline, asked)

    def read(self, spec: ServingSpec) -> list[dict[str, Any]]:
        return self.begin(spec)()

    def _collect(self, fresh: List[Request], deadline: float, asked: Dict[int, List[str]]) -> list[dict[str, Any]]:
        now = time.monotonic()
        for r in self.asking.values():
            if r.result is None and now - r.started > self.HANG_S:
                r.give_up(now - r.started)
        pump(list(self.asking.values()), fresh, deadline)  # only this poll's own requests are waited for
        out = []
        for port, paths in asked.items():
            answers: Dict[str, Any] = {}
            # what is in flight from an earlier read though not asked now (a canary): said until it ends
            in_flight = [path for p, path in self.asking if p == port and path not in paths]
            for path in paths + in_flight:
                asking = self.asking[(port, path)]
                if asking.result is not None:
                    answers[path] = asking.result
                    self.answered.append(self.asking.pop((port, path)))  # asked anew next time
                else:
                    answers[path] = _unanswered(time.monotonic() - asking.started)
            out.append({"port": port, "answers": answers})
        for key in [k for k in self.asking if k[0] not in asked]:  # a port no longer asked about: let it go
            self.asking.pop(key).give_up(0.0)
        return out


def _unanswered(waited: float) -> dict[str, Any]:
    return {"error": "no answer within %.1f s" % waited, "seconds": round(waited, 4)}


def _asked(spec: ServingSpec) -> Tuple[float, Dict[int, List[str]]]:
    """The budget, and each port's paths to ask (its canary among them, as CANARY)."""
    budget = min(float(spec.get("budget_s", 0.8)), MAX_BUDGET_S)
    ports = [int(p) for p in spec.get("ports", ())][:MAX_PORTS]
    paths = [p for p in spec.get("paths", PATHS) if p in PATHS]
    extra = ((PROPS, spec.get("props", ())), (CANARY, spec.get("canary", ())))
    return budget, dict((port, paths + [path for path, where in extra if port in where]) for port in ports)


def start_reading(spec: ServingSpec) -> Callable[[], list[dict[str, Any]]]:
    """A one-shot probe's read: every path of every port sent at once, now; the function
    returned collects the answers (or gives them up) by the budget. The probe starts it first,
    so the rest of its reply is read while the servers answer."""
    budget, asked = _asked(spec)
    deadline = time.monotonic() + budget
    sent = dict(((port, path), Request(port, path)) for port, paths in asked.items() for path in paths)
    send(list(sent.values()), deadline)

    def collect() -> list[dict[str, Any]]:
        pump(list(sent.values()), list(sent.values()), deadline)
        for r in sent.values():
            r.close()
            if r.result is None:
                r.result = _unanswered(budget)
        return [{"port": port, "answers": dict((path, sent[(port, path)].result) for path in paths)}
                for port, paths in asked.items()]

    return collect


def read_ports(spec: ServingSpec) -> list[dict[str, Any]]:
    return start_reading(spec)()


def check_serving_request(spec: Any) -> None:
    if not isinstance(spec, dict):
        raise ValueError("request.serving must be an object")
    ports = spec.get("ports")
    if not (isinstance(ports, list) and all(isinstance(p, int) and not isinstance(p, bool) and 0 < p < 65536
                                            for p in ports)):
        raise ValueError("request.serving.ports must be a list of TCP ports")
    paths = spec.get("paths", list(PATHS))
    if not (isinstance(paths, list) and all(isinstance(p, str) for p in paths)):
        raise ValueError("request.serving.paths must be a list of paths")
    for key in ("props", "canary"):
        if not (isinstance(spec.get(key, []), list) and all(type(p) is int for p in spec.get(key, []))):
            raise ValueError("request.serving.%s must be a list of TCP ports" % key)
    budget = spec.get("budget_s", 0.8)
    if not (isinstance(budget, (int, float)) and not isinstance(budget, bool) and 0 < budget <= MAX_BUDGET_S):
        raise ValueError("request.serving.budget_s must be above 0 and at most %g" % MAX_BUDGET_S)
