"""The reference gateway's connection limits under real floods on loopback: caps, deadlines, the token holder's slot.

Linux routes all of 127.0.0.0/8 to the loopback interface, so one test process can be many clients: each
connection binds its own source address where a test needs more than one.
"""

from __future__ import annotations

import base64
import http.client
import io
import os
import re
import resource
import selectors
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from samai.remote.gateway import Limits, serve
from samai.remote.gateway.limits import FDS_PER_ACTIVE, FDS_SPARE, fit_to_open_files
from samai.remote.gateway.protocol import parse_content_length
from tests.helpers import wait_for

TOKEN = "fl00d-T0KEN-41c9e2"
AUTH = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "text/plain"}
OPEN_FILES = 200  # the gateway's open-file limit in the flood test
FLOOD_SIZE = 250  # more connections than it has descriptors for
FLOOD_ADDRESSES = [f"127.0.0.{n}" for n in range(10, 35)]  # 25 clients, 10 connections each


def marker_payload(path: Path) -> bytes:
    """A payload whose only visible effect is creating PATH: proves whether the code ran."""
    return f"open({str(path)!r}, 'w').close()\nprint('ran')".encode()


def request_head(length: int, *, token: str | None = TOKEN, path: str = "/execute?respenc=b64url") -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: gateway", "Content-Type: text/plain", f"Content-Length: {length}"]
    if token is not None:
        lines.append(f"Authorization: Bearer {token}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def connect(server_url: str, source: str = "127.0.0.1") -> socket.socket:
    host, port = server_url.removeprefix("http://").rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10, source_address=(source, 0))


def closed_by_server(sock: socket.socket, within_s: float = 10.0) -> bool:
    """Whether the server closes SOCK (sending nothing more) within WITHIN_S seconds."""
    sock.settimeout(within_s)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def read_reply(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    sock.settimeout(15)
    response = http.client.HTTPResponse(sock)
    try:
        response.begin()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        response.close()


def trickle(sock: socket.socket, data: bytes, gap_s: float) -> int:
    """Send DATA a byte every GAP_S seconds until it is all sent or the server speaks or closes; the bytes sent."""
    for sent in range(len(data)):
        if readable(sock, gap_s):
            return sent
        try:
            sock.sendall(data[sent:sent + 1])
        except OSError:
            return sent
    return len(data)


def readable(sock: socket.socket, within_s: float) -> bool:
    """Whether the server sent something, or closed SOCK, within WITHIN_S seconds."""
    with selectors.DefaultSelector() as selector:
        selector.register(sock, selectors.EVENT_READ)
        return bool(selector.select(within_s))


def authorized_execute(url: str, code: bytes, *, source: str = "127.0.0.1", timeout_s: float = 20.0) -> httpx.Response:
    with httpx.Client(transport=httpx.HTTPTransport(local_address=source), timeout=timeout_s) as client:
        return client.post(url + "/execute", params={"respenc": "b64url"}, content=code, headers=AUTH)


def stdout_of(response: httpx.Response) -> bytes:
    assert response.status_code == 200, response.text
    return base64.urlsafe_b64decode(response.json()["stdout"])


# ---------------------------------------------------------------------------------------------------------------
# A flood against a gateway with few descriptors


@pytest.fixture
def small_gateway(tmp_path):
    """`python -m samai.remote.gateway` at an open-file limit of 200; its pid, URL and its stderr's path. The header
    deadline is long, so only the caps can make room while a flood holds its connections open."""
    stderr_path = tmp_path / "gateway.stderr"

    def limit_open_files() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (OPEN_FILES, OPEN_FILES))

    with open(stderr_path, "wb") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "samai.remote.gateway", "--port", "0", "--header-timeout", "60"],
                                stdout=subprocess.PIPE, stderr=stderr, text=True, preexec_fn=limit_open_files,
                                env={**os.environ, "SAMAI_ENVELOPE_TOKEN": TOKEN})
    try:
        first_line = proc.stdout.readline()
        assert first_line.startswith("listening on http://127.0.0.1:"), first_line
        yield proc.pid, first_line.split()[-1], stderr_path
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()


@contextmanager
def flood(url: str) -> Iterator[None]:
    """FLOOD_SIZE connections from 25 addresses that never finish a request: a third send nothing, a third half a
    request line, a third trickle a header a byte every half second. All stay open for the block."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    socks: list[socket.socket] = []
    stop = threading.Event()
    trickler = threading.Thread(target=lambda: trickle_headers(socks[2::3], stop))
    try:
        for i in range(FLOOD_SIZE):
            sock = socket.socket()
            socks.append(sock)
            sock.setblocking(False)
            sock.bind((FLOOD_ADDRESSES[i % len(FLOOD_ADDRESSES)], 0))
            sock.connect_ex((host, int(port)))
            time.sleep(0.002)  # a pace the accept loop keeps up with: a burst would overflow the kernel's queue
        wait_until_connected(socks, within_s=5)
        for sock in socks[1::3]:
            quietly_send(sock, b"POST /exec")
        for sock in socks[2::3]:
            quietly_send(sock, b"POST /execute HTTP/1.1\r\nX-Slow: ")
        trickler.start()
        yield
    finally:
        stop.set()
        if trickler.is_alive():
            trickler.join()
        for sock in socks:
            sock.close()


def sockets_held(pid: int) -> int:
    """How many sockets the process PID has open (its listening socket included)."""
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            count += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
        except FileNotFoundError:
            pass  # closed while we looked
    return count


def wait_until_connected(socks: list[socket.socket], within_s: float) -> None:
    """Until every handshake is done, or WITHIN_S passed (a starved server leaves some waiting)."""
    with selectors.DefaultSelector() as selector:
        for sock in socks:
            selector.register(sock, selectors.EVENT_WRITE)
        deadline = time.monotonic() + within_s
        while selector.get_map() and time.monotonic() < deadline:
            for key, _ in selector.select(0.1):
                selector.unregister(key.fileobj)


def quietly_send(sock: socket.socket, data: bytes) -> None:
    try:
        sock.send(data)
    except OSError:
        pass  # not connected yet, or already closed by the server: a flood does not care


def trickle_headers(socks: list[socket.socket], stop: threading.Event) -> None:
    while not stop.wait(0.5):
        for sock in socks:
            quietly_send(sock, b"a")


@pytest.mark.slow
def test_a_flood_of_half_open_connections_does_not_starve_the_token_holder(small_gateway, tmp_path):
    pid, url, stderr_path = small_gateway
    with flood(url):
        wait_for(lambda: sockets_held(pid) > Limits().max_pending, timeout=30)  # the flood holds what it may
        # A client the flood does not share an address with, and one it does.
        assert stdout_of(authorized_execute(url, b"print('through')")) == b"through\n"
        assert stdout_of(authorized_execute(url, b"print('also')", source=FLOOD_ADDRESSES[0])) == b"also\n"
    log = stderr_path.read_text()
    assert "Traceback" not in log


# ---------------------------------------------------------------------------------------------------------------
# Per-client cap, deadlines, sizes, work slots


@pytest.fixture
def server_log() -> io.StringIO:
    return io.StringIO()


def test_a_client_over_its_cap_loses_its_oldest_waiting_connection(server_log):
    with serve(TOKEN, limits=Limits(max_pending_per_client=3, header_timeout_s=60), log_stream=server_log) as server:
        other = connect(server.url, "127.0.0.3")
        mine = [connect(server.url, "127.0.0.2") for _ in range(3)]
        newest = connect(server.url, "127.0.0.2")  # one over the cap of 3 for 127.0.0.2
        try:
            assert closed_by_server(mine[0])
            for sock in [*mine[1:], newest, other]:  # every other connection was kept: each still gets through
                sock.sendall(request_head(8) + b"print(1)")
                assert read_reply(sock)[0] == 200
        finally:
            for sock in [other, *mine, newest]:
                sock.close()
    assert "per client" in server_log.getvalue()


@pytest.mark.slow
def test_a_silent_connection_is_closed_at_the_header_deadline(server_log):
    with serve(TOKEN, limits=Limits(header_timeout_s=1), log_stream=server_log) as server:
        with connect(server.url) as silent:
            assert closed_by_server(silent)


@pytest.mark.slow
def test_a_slow_loris_is_closed_at_the_header_deadline_and_its_request_never_runs(server_log, tmp_path):
    marker = tmp_path / "ran"
    body = marker_payload(marker)
    request = request_head(len(body)) + body
    with serve(TOKEN, limits=Limits(header_timeout_s=1), log_stream=server_log) as server:
        with connect(server.url) as loris:
            sent = trickle(loris, request, gap_s=0.05)  # each byte well within any per-read timeout
            assert sent < len(request_head(len(body)))  # cut off before its headers were complete
            assert closed_by_server(loris)
    assert not marker.exists()


@pytest.mark.slow
def test_a_body_that_does_not_arrive_within_its_deadline_is_408_and_never_runs(server_log, tmp_path):
    marker = tmp_path / "ran"
    body = marker_payload(marker) + b"\n#" + b"x" * 300
    limits = Limits(body_timeout_s=1, body_min_rate=1_000_000)  # 1 s for this body
    with serve(TOKEN, limits=limits, log_stream=server_log) as server:
        with connect(server.url) as slow:
            slow.sendall(request_head(len(body)))
            assert trickle(slow, body, gap_s=0.05) < len(body)  # the reply came before the body was all sent
            status, headers, reply = read_reply(slow)
    assert status == 408
    assert headers["connection"] == "close"
    assert b"body" in reply
    assert not marker.exists()


@pytest.mark.slow
def test_the_body_deadline_grows_with_the_declared_length(server_log):
    body = b"print('whole')\n#" + b"x" * 1984  # 2000 bytes: 1 s + 2000 B at 200 B/s = 11 s
    with serve(TOKEN, limits=Limits(body_timeout_s=1, body_min_rate=200), log_stream=server_log) as server:
        with connect(server.url) as sock:
            sock.sendall(request_head(len(body)))
            for start in range(0, len(body), 200):  # about 2 s in all: past the 1 s floor
                time.sleep(0.2)
                sock.sendall(body[start:start + 200])
            status, _, reply = read_reply(sock)
    assert status == 200, reply


def test_oversized_headers_are_431_and_an_oversized_request_line_414(server_log, tmp_path):
    marker = tmp_path / "ran"
    code = marker_payload(marker)
    with serve(TOKEN, log_stream=server_log) as server:
        one_big = {**AUTH, "X-Pad": "a" * 20_000}
        many = {**AUTH, **{f"X-Pad-{i}": "a" * 200 for i in range(90)}}  # 18 KB in all, under 100 headers
        for headers in (one_big, many):
            assert httpx.post(server.url + "/execute", content=code, headers=headers, timeout=15).status_code == 431
        long_line = httpx.post(server.url + "/execute", params={"respenc": "b64url", "pad": "a" * 20_000},
                               content=code, headers=AUTH, timeout=15)
        assert long_line.status_code == 414
    assert not marker.exists()


def test_an_unauthenticated_reply_closes_the_connection(server_log):
    with serve(TOKEN, log_stream=server_log) as server:
        with connect(server.url) as sock:
            sock.sendall(request_head(0, token=None))
            assert read_reply(sock)[0] == 401
            assert closed_by_server(sock)  # it cannot hold the connection for another try


def test_when_every_work_slot_is_taken_the_next_request_is_503_with_retry_after(server_log, tmp_path):
    marker = tmp_path / "ran"
    with serve(TOKEN, faults=True, hard_cut_s=60, limits=Limits(max_active=1), log_stream=server_log) as server:
        server.faults.arm("hang")
        errors: list[Exception] = []

        def hang() -> None:
            try:
                httpx.post(server.url + "/execute", content=b"print(1)", headers=AUTH, timeout=90)
            except httpx.HTTPError as e:
                errors.append(e)

        holder = threading.Thread(target=hang)
        holder.start()
        wait_for(lambda: server.faults.describe()["queued"] == [], timeout=30)  # the hang holds the only slot
        busy = httpx.post(server.url + "/execute", content=marker_payload(marker), headers=AUTH, timeout=15)
        assert busy.status_code == 503
        assert busy.headers["retry-after"] == "1"
        assert httpx.post(server.url + "/execute", content=b"print(1)", timeout=15).status_code == 401
    holder.join(timeout=90)
    assert not marker.exists()


def test_a_payload_the_gateway_has_no_descriptors_to_start_is_503_and_the_next_runs(tmp_path):
    stderr_path = tmp_path / "gateway.stderr"
    with open(stderr_path, "wb") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "samai.remote.gateway", "--port", "0"], stdout=subprocess.PIPE,
                                stderr=stderr, text=True, env={**os.environ, "SAMAI_ENVELOPE_TOKEN": TOKEN})
    try:
        url = proc.stdout.readline().split()[-1]
        _, hard = resource.prlimit(proc.pid, resource.RLIMIT_NOFILE)
        # Room for the connection to be accepted, none for the payload's pipes: something else took the rest.
        resource.prlimit(proc.pid, resource.RLIMIT_NOFILE, (len(os.listdir(f"/proc/{proc.pid}/fd")) + 1, hard))
        starved = httpx.post(url + "/execute", content=b"print(1)", headers=AUTH, timeout=15)
        assert starved.status_code == 503
        assert starved.headers["retry-after"] == "1"
        assert "cannot start the payload" in starved.json()["error"]
        resource.prlimit(proc.pid, resource.RLIMIT_NOFILE, (OPEN_FILES, hard))
        assert stdout_of(authorized_execute(url, b"print('again')")) == b"again\n"
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    assert "Traceback" not in stderr_path.read_text()


@pytest.mark.parametrize("spell", [lambda n: f"+{n}", lambda n: f"{n // 10}_{n % 10}"], ids=["sign", "underscore"])
def test_a_content_length_that_is_not_all_digits_is_411(server_log, tmp_path, spell):
    marker = tmp_path / "ran"
    code = marker_payload(marker)
    head = request_head(len(code)).replace(f"Content-Length: {len(code)}".encode(),
                                           f"Content-Length: {spell(len(code))}".encode())  # int() reads it alike
    with serve(TOKEN, log_stream=server_log) as server:
        with connect(server.url) as sock:
            sock.sendall(head + code)
            assert read_reply(sock)[0] == 411
    assert not marker.exists()


# ---------------------------------------------------------------------------------------------------------------
# Sizing and parsing


def test_the_limits_shrink_to_fit_the_open_file_limit():
    fitted = fit_to_open_files(Limits(), OPEN_FILES)
    assert fitted.max_active < Limits().max_active
    assert fitted.max_pending + FDS_PER_ACTIVE * fitted.max_active + FDS_SPARE <= OPEN_FILES
    assert fit_to_open_files(Limits(), 1_000_000) == Limits()
    with pytest.raises(ValueError, match="open-file limit"):
        fit_to_open_files(Limits(), 20)


def test_a_gateway_that_cannot_fit_its_limits_says_so_and_exits_2():
    def tiny_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (40, 40))

    result = subprocess.run([sys.executable, "-m", "samai.remote.gateway", "--port", "0"], capture_output=True,
                            text=True, timeout=30, preexec_fn=tiny_limit,
                            env={**os.environ, "SAMAI_ENVELOPE_TOKEN": TOKEN})
    assert result.returncode == 2
    assert "open-file limit" in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("option", ["--header-timeout", "--max-pending", "--max-pending-per-client", "--max-active"])
def test_a_limit_option_must_be_positive(option, monkeypatch, capsys):
    from samai.remote import gateway

    monkeypatch.setenv("SAMAI_ENVELOPE_TOKEN", TOKEN)
    assert gateway.main(["--port", "0", option, "0"]) == 2
    assert "positive" in capsys.readouterr().err


@given(st.one_of(st.text(max_size=30), st.from_regex(r"[+ 0-9_\u0660-\u0669\u00b2]{1,12}", fullmatch=True)))
def test_content_length_is_ascii_digits_or_nothing(text):
    length = parse_content_length(text)
    if re.fullmatch(r"[0-9]+", text):
        assert length == int(text)
    else:
        assert length is None  # a sign, a space, an underscore, another script's digit


@given(st.integers(min_value=0, max_value=10**30))
def test_content_length_reads_any_number(number):
    assert parse_content_length(str(number)) == number
