"""The link emulator against a tiny echo server: delay, order under loss, rate, outages, stop.

Times are asserted as lower bounds (what the link must cost); the upper bounds are loose, since
the machines these run on are shared."""

from __future__ import annotations

import os
import socket
import socketserver
import threading
import time
from collections.abc import Iterator

import pytest

from tests.linkem import Link

pytestmark = pytest.mark.slow  # every test here takes seconds: real processes, sockets or an app, waited on


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        try:
            while data := self.request.recv(65536):
                self.request.sendall(data)
        except OSError:
            pass  # the link reset us: what a reset outage does


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


@pytest.fixture
def echo() -> Iterator[int]:
    server = _Server(("127.0.0.1", 0), _Echo)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def _connect(link: Link) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", link.port), timeout=10)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def _recv_exactly(s: socket.socket, n: int) -> bytes:
    got = bytearray()
    while len(got) < n:
        chunk = s.recv(min(n - len(got), 1 << 20))
        if not chunk:
            break
        got += chunk
    return bytes(got)


def _round_trip(s: socket.socket, data: bytes = b"ping") -> float:
    started = time.monotonic()
    s.sendall(data)
    assert _recv_exactly(s, len(data)) == data
    return time.monotonic() - started


def test_a_request_and_its_answer_cost_one_rtt(echo: int) -> None:
    with Link("127.0.0.1", echo, rtt=0.2) as link, _connect(link) as s:
        for _ in range(3):
            took = _round_trip(s)
            assert 0.2 * 0.9 <= took < 0.2 * 3 + 0.5
        link.set(rtt=0.5)  # live
        assert _round_trip(s) >= 0.45
        stats = link.stats()
        assert stats.connections == 1 and stats.round_trips == 4
        assert stats.bytes_up == stats.bytes_down == 16 and stats.stalls == 0


def _echo_through(link: Link, payload: bytes) -> bytes:
    with _connect(link) as s:
        sender = threading.Thread(target=s.sendall, args=(payload,), daemon=True)
        sender.start()
        got = _recv_exactly(s, len(payload))
        sender.join(30)
    return got


@pytest.mark.parametrize("loss", [0.0, 0.002])
def test_megabytes_arrive_complete_and_in_order(echo: int, loss: float) -> None:
    payload = os.urandom(3 << 20)
    with Link("127.0.0.1", echo, rtt=0.02, loss=loss, seed=7) as link:
        assert _echo_through(link, payload) == payload
    stats = link.stats()  # after stop(): the final counts
    assert stats.bytes_up == stats.bytes_down == len(payload)
    assert (stats.stalls > 0) == (loss > 0)  # seeded: the lossy link did lose segments


def test_a_rate_limit_queues_chunks_behind_each_other(echo: int) -> None:
    payload = os.urandom(1 << 20)
    with Link("127.0.0.1", echo, rtt=0.0, rate=2 << 20) as link:
        started = time.monotonic()
        assert _echo_through(link, payload) == payload
        assert time.monotonic() - started >= 0.45  # half a second each way, the two ways overlapping


def test_a_blackhole_holds_the_bytes_and_delivers_them_after(echo: int) -> None:
    with Link("127.0.0.1", echo, rtt=0.02) as link, _connect(link) as s:
        _round_trip(s)
        link.down()
        s.sendall(b"held")
        s.settimeout(0.5)
        with pytest.raises(TimeoutError):
            s.recv(16)
        with _connect(link) as late:  # a new connection is accepted, its bytes held as well
            late.settimeout(0.5)
            late.sendall(b"late")
            with pytest.raises(TimeoutError):
                late.recv(16)
            link.up()
            late.settimeout(10)
            assert _recv_exactly(late, 4) == b"late"
        s.settimeout(10)
        assert _recv_exactly(s, 4) == b"held"
        link.outage(0.6)  # ends by itself
        started = time.monotonic()
        assert _round_trip(s, b"after") >= 0.5
        assert time.monotonic() - started < 10
        assert link.stats().resets == 0


def _is_cut(s: socket.socket) -> bool:
    s.settimeout(10)
    try:
        return s.recv(16) == b""
    except ConnectionResetError:
        return True


def _refused(link: Link) -> bool:
    """Whether a new connection is cut at once (the reset may even beat connect() to its answer)."""
    try:
        with _connect(link) as s:
            return _is_cut(s)
    except ConnectionResetError:
        return True


def _answers(link: Link) -> bool:
    try:
        with _connect(link) as s:
            _round_trip(s)
            return True
    except (ConnectionResetError, AssertionError):
        return False


def test_a_reset_outage_cuts_connections_and_refuses_new_ones_until_it_ends(echo: int) -> None:
    with Link("127.0.0.1", echo, rtt=0.02) as link:
        first, second = _connect(link), _connect(link)
        _round_trip(first)
        _round_trip(second)
        link.down("reset")
        assert _is_cut(first) and _is_cut(second)
        assert _refused(link)
        link.up()
        assert _answers(link)
        link.outage(0.5, mode="reset")
        assert _refused(link)
        deadline = time.monotonic() + 10
        while not _answers(link):  # the outage ends by itself: then connections work again
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert link.stats().resets >= 4
        first.close()
        second.close()


def test_stop_leaves_no_thread_and_no_listener(echo: int) -> None:
    link = Link("127.0.0.1", echo, rtt=0.02).start()
    s = _connect(link)
    _round_trip(s)
    link.stop()
    assert _is_cut(s)
    s.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("linkem")]  # (the echo's may linger)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", link.port), timeout=5)
