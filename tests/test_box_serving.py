"""The probe asks serving ports within one time budget (remote/box/serving.py): real servers on
loopback, one that answers, one stopped with SIGSTOP, one that never accepts, one refusing, one
sending a megabyte, one that is not HTTP."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from samai.remote.box.probe import check_request, probe
from samai.remote.box.serving import MAX_BODY, read_ports
from tests.receivers import free_port

BUDGET = 0.5
SLACK_S = 3.0  # generous: the machines these run on are shared (a bound, not a timing figure)


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        body = {"/health": b'{"status":"ok"}', "/metrics": b"llamacpp:requests_processing 1\n",
                "/slots": b"x" * (MAX_BODY * 4)}.get(self.path)
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def answering() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.fixture
def never_accepting() -> Iterator[int]:
    """A listening socket nobody accepts on: connections complete (the kernel's backlog), no byte comes."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    yield s.getsockname()[1]
    s.close()


@pytest.fixture
def stopped(spawn) -> Iterator[int]:
    """A real HTTP server, then SIGSTOP: alive, its port open, answering nothing."""
    port = free_port()
    proc = spawn(sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGSTOP)
    yield port
    os.kill(proc.pid, signal.SIGCONT)


def test_an_answering_server_is_read_bounded(answering: int) -> None:
    [got] = read_ports({"ports": [answering], "budget_s": BUDGET, "props": [answering]})
    answers = got["answers"]
    assert answers["/health"]["status"] == 200 and answers["/health"]["body"] == '{"status":"ok"}'
    assert answers["/metrics"]["body"] == "llamacpp:requests_processing 1\n"
    assert answers["/props"]["status"] == 404
    assert len(answers["/slots"]["body"]) == MAX_BODY and answers["/slots"]["truncated"] is True
    [only] = read_ports({"ports": [answering], "paths": ["/../admin", "http://elsewhere/", "/health"]})
    assert list(only["answers"]) == ["/health"]  # the endpoints it knows, never a path the request names
    [plain] = read_ports({"ports": [answering], "budget_s": BUDGET, "props": [answering + 1]})
    assert list(plain["answers"]) == ["/health", "/metrics", "/slots"]  # /props only where asked


def test_stuck_servers_cost_the_budget_and_no_more(answering: int, stopped: int, never_accepting: int) -> None:
    started = time.monotonic()
    got = read_ports({"ports": [stopped, answering, never_accepting], "budget_s": BUDGET})
    waited = time.monotonic() - started
    assert waited < BUDGET + SLACK_S, waited  # all asked at once: not 8 budgets one after the other
    by_port = {g["port"]: g["answers"] for g in got}
    for port in (stopped, never_accepting):
        assert all(a["error"].startswith("no answer within") for a in by_port[port].values()), by_port[port]
    assert by_port[answering]["/health"]["status"] == 200


def test_a_refusing_port_and_a_port_that_is_not_http() -> None:
    refusing = free_port()
    garbage = socket.socket()
    garbage.bind(("127.0.0.1", 0))
    garbage.listen(4)

    def babble() -> None:
        while True:  # every connection the read makes, until the listener is shut
            try:
                conn, _ = garbage.accept()
            except OSError:
                return
            with conn:
                conn.recv(4096)  # the request read, as a server does; a close with it unread is a reset
                conn.sendall(b"\x00\xffSSH-2.0-not-http\r\n\r\n")

    babbler = threading.Thread(target=babble, daemon=True)
    babbler.start()
    got = read_ports({"ports": [refusing, garbage.getsockname()[1]], "budget_s": 2.0})
    garbage.shutdown(socket.SHUT_RDWR)
    garbage.close()
    babbler.join(5)
    assert "ConnectionRefusedError" in got[0]["answers"]["/health"]["error"]
    assert got[1]["answers"]["/health"]["error"].startswith("not an HTTP answer")


def test_the_probe_reads_serving_ports_beside_the_rest(answering: int, workspace) -> None:
    request = {"workspace": str(workspace), "serving": {"ports": [answering], "paths": ["/health"], "budget_s": 1.0}}
    check_request(request)
    reply = probe(request)
    assert reply["serving"] == [{"port": answering, "answers": {"/health": {
        "status": 200, "body": '{"status":"ok"}', "truncated": False,
        "seconds": reply["serving"][0]["answers"]["/health"]["seconds"]}}}]
    assert "serving" not in probe({"workspace": str(workspace)})


@pytest.mark.parametrize(("serving", "key"), [
    ([], "request.serving must be an object"),
    ({"ports": [0]}, "ports"), ({"ports": [True]}, "ports"), ({"ports": "18080"}, "ports"),
    ({"ports": [80], "paths": "/health"}, "paths"),
    ({"ports": [80], "budget_s": 0}, "budget_s"), ({"ports": [80], "budget_s": 60}, "budget_s"),
    ({"ports": [80], "canary": "80"}, "canary"), ({"ports": [80], "canary": [True]}, "canary"),
])
def test_a_malformed_serving_request_is_refused_by_name(serving: object, key: str) -> None:
    with pytest.raises(ValueError, match=key):
        check_request({"serving": serving})


def test_a_serve_probe_waits_on_a_stopped_server_once_then_says_how_long_it_is_silent(
        answering: int, spawn) -> None:
    """The persistent probe's reader: the poll after the first does not wait on the request
    still in flight (the server stopped), it says how long it has gone unanswered; once the server
    runs again its answer arrives and it is asked anew."""
    from samai.remote.box.serving import ServingReader

    port = free_port()
    proc = spawn(sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not read_ports({"ports": [port], "paths": ["/health"], "budget_s": 1.0})[0]["answers"]["/health"].get(
            "status") and time.monotonic() < deadline:
        time.sleep(0.1)
    reader = ServingReader()
    spec = {"ports": [port, answering], "paths": ["/health"], "budget_s": BUDGET}
    assert reader.read(spec)[0]["answers"]["/health"]["status"] == 404  # http.server has no /health
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        first = reader.read(spec)
        assert first[0]["answers"]["/health"]["error"].startswith("no answer within")
        started = time.monotonic()
        [later] = reader.read({**spec, "ports": [port]})  # only the request in flight: nothing new to wait for
        assert time.monotonic() - started < BUDGET, "the request still in flight was waited on again"
        silent = later["answers"]["/health"]
        assert silent["error"].startswith("no answer within") and silent["seconds"] > first[0]["answers"][
            "/health"]["seconds"]
        assert reader.read(spec)[1]["answers"]["/health"]["status"] == 200  # the other port answers on
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    deadline = time.monotonic() + 10
    while "status" not in reader.read(spec)[0]["answers"]["/health"]:
        assert time.monotonic() < deadline, "the stopped server's answer never came once it ran again"
        time.sleep(0.1)


def test_the_serve_probe_reads_through_its_memory(answering: int, workspace) -> None:
    from samai.remote.box.probe import Memory

    memory = Memory()
    request = {"workspace": str(workspace), "processes": False,
               "serving": {"ports": [answering], "paths": ["/metrics"], "budget_s": 1.0}}
    for _ in range(2):
        [got] = probe(request, memory)["serving"]
        assert got["answers"]["/metrics"]["body"] == "llamacpp:requests_processing 1\n"


class StuckGeneration(Handler):
    """/health answers; a completion never finishes (an engine dead behind a health check)."""

    release = threading.Event()
    posted: list[bytes] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        type(self).posted.append(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        type(self).release.wait(30)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")


def test_a_canary_in_flight_is_said_each_read_until_it_finishes() -> None:
    from samai.remote.box.serving import ServingReader

    server = ThreadingHTTPServer(("127.0.0.1", 0), StuckGeneration)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    reader = ServingReader()
    try:
        first = reader.read({"ports": [port], "paths": ["/health"], "budget_s": BUDGET, "canary": [port]})
        assert first[0]["answers"]["/health"]["status"] == 200
        assert first[0]["answers"]["canary"]["error"].startswith("no answer within")
        assert json.loads(StuckGeneration.posted[0]) == {"prompt": "1", "max_tokens": 1, "temperature": 0}
        later = reader.read({"ports": [port], "paths": ["/health"], "budget_s": BUDGET})  # not asked again
        assert later[0]["answers"]["canary"]["seconds"] >= first[0]["answers"]["canary"]["seconds"]
        assert len(StuckGeneration.posted) == 1
        StuckGeneration.release.set()
        deadline = time.monotonic() + 10
        while "status" not in reader.read({"ports": [port], "paths": ["/health"]})[0]["answers"].get("canary", {}):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert "canary" not in reader.read({"ports": [port], "paths": ["/health"]})[0]["answers"]  # done with it
    finally:
        StuckGeneration.release.set()
        server.shutdown()
        server.server_close()


HTTPISH = st.one_of(
    st.binary(max_size=2000),
    st.builds(lambda status, headers, body: b"HTTP/1.1 " + status + b"\r\n" + headers + b"\r\n\r\n" + body,
              st.sampled_from([b"200 OK", b"501 Not Implemented", b"99 x", b"abc", b""]),
              st.sampled_from([b"Content-Length: 5", b"Content-Length: -1", b"Content-Length: 99999999",
                               b"Transfer-Encoding: chunked", b"X: " + b"y" * 70000, b"\xff\xfe: \x00"]),
              st.binary(max_size=500) | st.just(b"5\r\nhello\r\n0\r\n\r\n") | st.just(b"zz\r\n")))


@given(HTTPISH, st.booleans())
@settings(max_examples=300, deadline=None)
def test_whatever_a_server_sends_is_an_answer_or_why_not(received: bytes, truncated: bool) -> None:
    """The box-side parse of what came back (untrusted: any process may hold the port): a status
    and a bounded body, or an error in words; never an exception."""
    from samai.remote.box.serving import parse_answer

    got = parse_answer(received, "GET", truncated, 0.01)
    assert set(got) in ({"status", "body", "truncated", "seconds"}, {"error", "seconds"}), got
    if "body" in got:
        assert isinstance(got["status"], int) and len(got["body"]) <= MAX_BODY
        json.dumps(got)
