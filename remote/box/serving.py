"""A serving port's monitoring endpoints, asked over loopback within one time budget.

Each path of each port is asked at once, in its own thread, and the poll waits for them no
longer than the budget: a server that is stopped (SIGSTOP) or stuck still accepts connections
(the kernel does) but never answers. A --serve probe (ServingReader) keeps such a request in
flight across polls and does not wait on it again; a one-shot probe gives it up at the budget.
Answers are bounded in size; what they say is the console's to read (untrusted), nothing here
parses them.

Request: {"ports": [18080, ...], "paths": ["/health", "/metrics", ...], "budget_s": 0.8,
          "canary": [18080]}
  "canary": the ports to send a 1-token completion (POST /v1/completions, max_tokens 1): an idle
  server whose health answers but whose generation is stuck shows only so. Its answer is under
  "canary", said again each read while it is in flight.
Reply: [{"port": 18080, "answers": {"/health": {"status": 200, "body": "...", "seconds": 0.003,
         "truncated": false} | {"error": "no answer within 0.8 s", "seconds": 0.8}}}]"""

from __future__ import annotations

import http.client
import threading
import time
from typing import Any, Callable, Dict, Tuple

MAX_BODY = 256 * 1024  # a /slots answer of a few dozen slots is far below it
MAX_PORTS = 8
MAX_BUDGET_S = 5.0
PATHS = ("/health", "/metrics", "/slots", "/props")
CANARY = "canary"
CANARY_BODY = b'{"prompt": "1", "max_tokens": 1, "temperature": 0}'


def ask_port(port: int, path: str, timeout: float) -> dict[str, Any]:
    started = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        if path == CANARY:
            conn.request("POST", "/v1/completions", CANARY_BODY, {"Content-Type": "application/json"})
        else:
            conn.request("GET", path, headers={"Accept": "application/json, text/plain"})
        response = conn.getresponse()
        body = response.read(MAX_BODY + 1)
        return {"status": response.status, "body": body[:MAX_BODY].decode("utf-8", "replace"),
                "truncated": len(body) > MAX_BODY, "seconds": round(time.monotonic() - started, 4)}
    except OSError as e:  # refused, reset, or the socket's timeout
        waited = time.monotonic() - started
        said = "no answer within %.1f s" % timeout if isinstance(e, TimeoutError) or "timed out" in str(e) \
            else "%s: %s" % (type(e).__name__, str(e)[:200])
        return {"error": said, "seconds": round(waited, 4)}
    except (http.client.HTTPException, ValueError) as e:  # not HTTP at all
        return {"error": "not an HTTP answer: %s" % type(e).__name__, "seconds": round(time.monotonic() - started, 4)}
    finally:
        conn.close()


class _Asking(object):
    """One request in flight, in its own thread."""

    def __init__(self, port: int, path: str, timeout: float) -> None:
        self.started = time.monotonic()
        self.result: dict[str, Any] | None = None
        self.thread = threading.Thread(target=self._run, args=(port, path, timeout),
                                       name="serving %d%s" % (port, path), daemon=True)
        self.thread.start()

    def _run(self, port: int, path: str, timeout: float) -> None:
        self.result = ask_port(port, path, timeout)


class ServingReader(object):
    """The serving endpoints as a --serve probe asks them, poll after poll: a request still in
    flight from an earlier poll (a stopped server) is not asked again nor waited on, only said
    (how long it has gone unanswered); so a stuck server costs one poll its budget, once, and
    the polls after it nothing. Each request gives up after HANG_S, and is then asked anew."""

    HANG_S = 120.0

    def __init__(self) -> None:
        self.asking: Dict[Tuple[int, str], _Asking] = {}

    def begin(self, spec: dict[str, Any]) -> Callable[[], list[dict[str, Any]]]:
        """Ask what is not in flight already; the function returned collects by the budget."""
        budget, ports, paths = _spec(spec)
        deadline = time.monotonic() + budget
        fresh = []
        canaries = [(port, CANARY) for port in _canary_ports(spec, ports)]
        for key in [(port, path) for port in ports for path in paths] + canaries:
            if key not in self.asking:
                self.asking[key] = _Asking(key[0], key[1], self.HANG_S)
                fresh.append(self.asking[key])
        return lambda: self._collect(fresh, deadline, ports, paths)

    def read(self, spec: dict[str, Any]) -> list[dict[str, Any]]:
        return self.begin(spec)()

    def _collect(self, fresh: list[_Asking], deadline: float, ports: list[int],
                 paths: list[str]) -> list[dict[str, Any]]:
        for asking in fresh:  # only this poll's own requests are waited for, each until the deadline
            asking.thread.join(max(0.0, deadline - time.monotonic()))
        out = []
        for port in ports:
            answers: Dict[str, Any] = {}
            for path in paths + ([CANARY] if (port, CANARY) in self.asking else []):
                asking = self.asking[(port, path)]
                if asking.result is not None:
                    answers[path] = asking.result
                    del self.asking[(port, path)]  # asked anew next time
                else:
                    waited = time.monotonic() - asking.started
                    answers[path] = {"error": "no answer within %.1f s" % waited, "seconds": round(waited, 4)}
            out.append({"port": port, "answers": answers})
        for key in [k for k in self.asking if k[0] not in ports]:  # a port no longer asked about: let it go
            del self.asking[key]
        return out


def _canary_ports(spec: dict[str, Any], ports: list[int]) -> list[int]:
    return [int(p) for p in spec.get("canary", ()) if p in ports]


def _spec(spec: dict[str, Any]) -> tuple[float, list[int], list[str]]:
    budget = min(float(spec.get("budget_s", 0.8)), MAX_BUDGET_S)
    ports = [int(p) for p in spec.get("ports", ())][:MAX_PORTS]
    return budget, ports, [p for p in spec.get("paths", PATHS) if p in PATHS]


def start_reading(spec: dict[str, Any]) -> Callable[[], list[dict[str, Any]]]:
    """A one-shot probe's read: every path of every port asked at once, now; the function
    returned collects the answers (or gives them up) by the budget. The probe starts it first,
    so the rest of its reply is read while the servers answer."""
    budget, ports, paths = _spec(spec)
    deadline = time.monotonic() + budget
    canaries = _canary_ports(spec, ports)
    keys = [(port, path) for port in ports for path in paths] + [(port, CANARY) for port in canaries]
    asking = dict((key, _Asking(key[0], key[1], budget)) for key in keys)

    def collect() -> list[dict[str, Any]]:
        for a in asking.values():
            a.thread.join(max(0.0, deadline - time.monotonic()) + 0.2)  # its socket's timeout ends it by then
        return [{"port": port, "answers": dict(
            (path, asking[(port, path)].result or {"error": "no answer within %.1f s" % budget, "seconds": budget})
            for path in paths + ([CANARY] if port in canaries else []))} for port in ports]

    return collect


def read_ports(spec: dict[str, Any]) -> list[dict[str, Any]]:
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
    canary = spec.get("canary", [])
    if not (isinstance(canary, list) and all(type(p) is int for p in canary)):
        raise ValueError("request.serving.canary must be a list of TCP ports")
    budget = spec.get("budget_s", 0.8)
    if not (isinstance(budget, (int, float)) and not isinstance(budget, bool) and 0 < budget <= MAX_BUDGET_S):
        raise ValueError("request.serving.budget_s must be above 0 and at most %g" % MAX_BUDGET_S)
