"""A serving port's monitoring endpoints, asked over loopback within one time budget.

Each path of each port is asked at once, in its own thread, and every thread ends by the
deadline: a server that is stopped (SIGSTOP) or stuck still accepts connections (the kernel does)
but never answers, and it must cost the poll no more than the budget. Answers are bounded in
size; what they say is the console's to read (untrusted), nothing here parses them.

Request: {"ports": [18080, ...], "paths": ["/health", "/metrics", ...], "budget_s": 0.8}
Reply: [{"port": 18080, "answers": {"/health": {"status": 200, "body": "...", "seconds": 0.003,
         "truncated": false} | {"error": "no answer within 0.8 s", "seconds": 0.8}}}]"""

from __future__ import annotations

import http.client
import threading
import time
from typing import Any, Callable, Dict, List

MAX_BODY = 256 * 1024  # a /slots answer of a few dozen slots is far below it
MAX_PORTS = 8
MAX_BUDGET_S = 5.0
PATHS = ("/health", "/metrics", "/slots", "/props")


def ask_port(port: int, path: str, deadline: float) -> dict[str, Any]:
    started = time.monotonic()
    left = deadline - started
    if left <= 0:
        return {"error": "no time left in the budget", "seconds": 0.0}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=left)
    try:
        conn.request("GET", path, headers={"Accept": "application/json, text/plain"})
        response = conn.getresponse()
        body = response.read(MAX_BODY + 1)
        return {"status": response.status, "body": body[:MAX_BODY].decode("utf-8", "replace"),
                "truncated": len(body) > MAX_BODY, "seconds": round(time.monotonic() - started, 4)}
    except OSError as e:  # refused, reset, or the socket's timeout: the deadline
        waited = time.monotonic() - started
        said = "no answer within %.1f s" % left if isinstance(e, TimeoutError) or "timed out" in str(e) \
            else "%s: %s" % (type(e).__name__, str(e)[:200])
        return {"error": said, "seconds": round(waited, 4)}
    except (http.client.HTTPException, ValueError) as e:  # not HTTP at all
        return {"error": "not an HTTP answer: %s" % type(e).__name__, "seconds": round(time.monotonic() - started, 4)}
    finally:
        conn.close()


def start_reading(spec: dict[str, Any]) -> Callable[[], list[dict[str, Any]]]:
    """Every path of every port asked at once, now; the function returned collects the answers
    (or gives them up) by the budget. The probe starts it first, so the rest of its reply is
    read while the servers answer."""
    budget = min(float(spec.get("budget_s", 0.8)), MAX_BUDGET_S)
    ports = [int(p) for p in spec.get("ports", ())][:MAX_PORTS]
    paths = [p for p in spec.get("paths", PATHS) if p in PATHS]
    deadline = time.monotonic() + budget
    answers: Dict[int, Dict[str, Any]] = dict((port, {}) for port in ports)
    threads: List[threading.Thread] = []
    for port in ports:
        for path in paths:
            def one(port: int = port, path: str = path) -> None:
                answers[port][path] = ask_port(port, path, deadline)
            thread = threading.Thread(target=one, name="serving %d%s" % (port, path), daemon=True)
            thread.start()
            threads.append(thread)

    def collect() -> list[dict[str, Any]]:
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()) + 0.2)  # the socket's timeout ends it by then
        out = []
        for port in ports:
            got = dict(answers[port])
            for path in paths:
                got.setdefault(path, {"error": "no answer within %.1f s" % budget, "seconds": budget})
            out.append({"port": port, "answers": got})
        return out

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
    budget = spec.get("budget_s", 0.8)
    if not (isinstance(budget, (int, float)) and not isinstance(budget, bool) and 0 < budget <= MAX_BUDGET_S):
        raise ValueError("request.serving.budget_s must be above 0 and at most %g" % MAX_BUDGET_S)
