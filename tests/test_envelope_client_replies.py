"""The envelope client against a gateway that answers garbage (issue 29, items 2 and 12).

A real HTTP server on loopback answers every call with one reply shape: a body that is not the
gateway's object, a result frame that is not the payload's, a probe reply whose length line lies,
a body far past the largest legitimate one. Each is one TransportError: one line and exit 2 on
the command line, an `unreachable` entry in `snapshot --all-boxes`, an error on the fleet's row;
never a traceback, and a huge reply is refused without being held in memory."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import subprocess
import sys
import threading
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from samai.console.core import config
from samai.console.core.fleet import BoxWatch
from samai.remote.boxapi import Box, BoxError
from samai.remote.envelope import MAX_REPLY_BYTES, EnvelopeTransport
from samai.remote.gateway import serve
from samai.remote.transport import TransportError
from tests.helpers import run_cli

TOKEN = "tok-" + "malformed" * 4
ENV = {"SAMAI_ENVELOPE_TOKEN": TOKEN}
MIB = 1024 * 1024
HUGE = 1024 * MIB  # far past the cap: a client that reads a reply whole holds several times this
FUZZ = settings(max_examples=150, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


# ------------------------------------------------------------------ a gateway that answers garbage


@dataclass(frozen=True)
class Answer:
    """What the fake gateway sends back to every POST."""

    body: bytes = b""
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    chunks: Callable[[], Iterable[bytes]] | None = None  # sent chunked instead of body
    relay: bool = False  # the call passed to the real gateway at server.upstream, its reply passed back


RELAY = Answer(relay=True)


class GarbageHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: GarbageGateway

    def do_POST(self) -> None:
        code = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        answer = self.server.answer
        if answer.relay:
            answer = self._relayed(code)
        self.send_response(answer.status)
        self.send_header("Content-Type", "application/json")
        for name, value in answer.headers.items():
            self.send_header(name, value)
        try:
            if answer.chunks is None:
                if "Content-Length" not in answer.headers:
                    self.send_header("Content-Length", str(len(answer.body)))
                self.end_headers()
                self.wfile.write(answer.body)
            else:
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for chunk in answer.chunks():
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):  # the client refused the rest: as it should
            self.close_connection = True

    def _relayed(self, code: bytes) -> Answer:
        import httpx

        got = httpx.post(self.server.upstream + self.path, content=code, timeout=200,
                         headers={"Authorization": self.headers["Authorization"], "Content-Type": "text/plain"})
        return Answer(got.content, got.status_code)

    def log_message(self, format: str, *args) -> None:  # noqa: A002 (http.server's own name)
        return None


class GarbageGateway(ThreadingHTTPServer):
    daemon_threads = True
    answer = Answer()
    upstream = ""  # the real gateway RELAY passes calls to

    def handle_error(self, request, client_address) -> None:  # a client that hung up: what the tests do
        return None

    @property
    def url(self) -> str:
        return f"envelope+http://127.0.0.1:{self.server_address[1]}"


@pytest.fixture(scope="module")
def garbage() -> Iterator[GarbageGateway]:
    server = GarbageGateway(("127.0.0.1", 0), GarbageHandler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


# ------------------------------------------------------------------ the shapes, by layer


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii")


def gateway_json(value) -> Answer:
    """The whole body is this JSON value."""
    return Answer(json.dumps(value).encode())


def gateway_reply(rc=0, stdout=b"") -> Answer:
    """A well-formed gateway reply: the payload printed stdout."""
    return gateway_json({"rc": rc, "stdout": b64url(stdout), "stderr": ""})


def frame_text(text: str | bytes) -> Answer:
    """The payload's stdout is the result mark and then this text."""
    return gateway_reply(stdout=b"SAMAI-RESULT " + (text.encode() if isinstance(text, str) else text) + b"\n")


def frame(**fields) -> Answer:
    return frame_text(json.dumps({"rc": 0, "out": "", "err": "", **fields}))


def probe_out(out: bytes) -> Answer:
    """A well-formed frame whose command printed out (the probe's reply: a length line, then it)."""
    return frame(out=b64(out))


MALFORMED = {
    # the gateway's body
    "body broken JSON": Answer(b'{"rc": 0, "stdout": '),
    "body a list": gateway_json([1, 2]),
    "body a number": gateway_json(5),
    "body a string": gateway_json("rc"),
    "body null": gateway_json(None),
    "body nested past the parser": Answer(b"[" * 100_000),
    "body not UTF-8": Answer(b'{"rc": 0, "stdout": "\xff\xfe"}'),
    "body without rc": gateway_json({"stdout": "", "stderr": ""}),
    "body rc a string": gateway_json({"rc": "0", "stdout": ""}),
    "body rc null": gateway_json({"rc": None, "stdout": ""}),
    "body rc a fraction": gateway_json({"rc": 1.5, "stdout": ""}),
    "body rc true": gateway_json({"rc": True, "stdout": ""}),
    "body rc infinite": Answer(b'{"rc": 1e400, "stdout": ""}'),
    "body rc huge": Answer(b'{"rc": 1' + b"0" * 400 + b', "stdout": ""}'),
    "body stdout not base64": gateway_json({"rc": 0, "stdout": "*not base64*"}),
    "body stdout a number": gateway_json({"rc": 0, "stdout": 5}),
    "body stdout not ASCII": gateway_json({"rc": 0, "stdout": "\u00e9t\u00e9"}),
    "body stderr a list": gateway_json({"rc": 0, "stdout": "", "stderr": ["x"]}),
    # the payload's result frame
    "no result frame": gateway_reply(stdout=b"the exec slot ran nothing\n"),
    "frame broken JSON": frame_text('{"rc": 0, "out": '),
    "frame a list": frame_text("[0, 1]"),
    "frame a number": frame_text("0"),
    "frame a string": frame_text('"ok"'),
    "frame null": frame_text("null"),
    "frame nested past the parser": frame_text("[" * 100_000),
    "frame not UTF-8": frame_text(b'{"rc": 0, "out": "\xff", "err": ""}'),
    "frame rc a string": frame(rc="0"),
    "frame rc null": frame(rc=None),
    "frame rc a fraction": frame(rc=1.5),
    "frame rc true": frame(rc=True),
    "frame rc huge": frame(rc=10 ** 300),
    "frame without out": frame_text('{"rc": 0, "err": ""}'),
    "frame out not base64": frame(out="*not base64*"),
    "frame out a number": frame(out=7),
    "frame err not base64": frame(err="\u00e9"),
    # the probe's reply inside it
    "probe said nothing": probe_out(b""),
    "length line longer than the body": probe_out(b"100\n{}"),
    "length line not digits": probe_out(b"ten\n{}"),
    "length line negative": probe_out(b"-1\n{}"),
    "length line a huge number": probe_out(b"9" * 5000 + b"\n{}"),
    "length line past any reply": probe_out(b"99999999999999999999\n{}"),
    "length line without its end": probe_out(b"1" * 200_000),
    "probe reply not UTF-8": probe_out(b"4\n\xff\xfe\xfd\xfc"),
    "probe reply a list": probe_out(b"2\n[]"),
    # a body past the cap
    "body declared past the cap": Answer(headers={"Content-Length": str(10 * HUGE)}),
    "body past the cap": Answer(chunks=lambda: itertools.repeat(b"A" * MIB, MAX_REPLY_BYTES // MIB + 8)),
}
# One of each class for the command line: each run is a new process.
CLASSES = ["body a list", "body broken JSON", "body rc a string", "body stdout not base64", "body not UTF-8",
           "frame a number", "frame rc a fraction", "frame out not base64", "no result frame",
           "length line longer than the body", "length line not digits", "length line a huge number",
           "body past the cap"]


async def snapshot_through(url: str) -> Exception | None:
    """What a snapshot through the gateway at url raised (None: it answered)."""
    box = Box(EnvelopeTransport(url, backoff=0.01), "/nowhere/ws", python="python3", timeout=10)
    try:
        await box.snapshot()
    except (TransportError, BoxError) as e:
        return e
    finally:
        await box.close()
    return None


@pytest.mark.slow
@pytest.mark.parametrize("shape", list(MALFORMED))
async def test_every_malformed_reply_is_one_transport_error(garbage: GarbageGateway, shape: str, monkeypatch) -> None:
    monkeypatch.setenv("SAMAI_ENVELOPE_TOKEN", TOKEN)
    garbage.answer = MALFORMED[shape]
    error = await snapshot_through(garbage.url)
    assert error is not None
    assert "\n" not in str(error) and 0 < len(str(error)) < 1000, str(error)[:2000]


RESULT = b"SAMAI-RESULT " + json.dumps({"rc": 0, "out": "", "err": ""}).encode()
# A field of the wrong type where the rest is well-formed: loose parsing would have read it as a number.
WRONG_FIELDS = {
    "body rc a string": (gateway_json({"rc": "0", "stdout": b64url(RESULT)}), "rc"),
    "body rc a fraction": (gateway_json({"rc": 1.5, "stdout": b64url(RESULT)}), "rc"),
    "body rc true": (gateway_json({"rc": True, "stdout": b64url(RESULT)}), "rc"),
    "body rc past any exit status": (gateway_json({"rc": 10 ** 30, "stdout": b64url(RESULT)}), "rc"),
    "body stdout with stray characters": (gateway_json({"rc": 0, "stdout": "*" + b64url(RESULT) + "*"}), "stdout"),
    "frame rc a string": (frame(rc="0"), "rc"),
    "frame rc a fraction": (frame(rc=0.5), "rc"),
    "frame rc false": (frame(rc=False), "rc"),
    "frame out with stray characters": (frame(out="QUJD!"), "out"),
}


@pytest.mark.parametrize("shape", list(WRONG_FIELDS))
async def test_a_field_of_the_wrong_type_is_named(garbage: GarbageGateway, shape: str, monkeypatch) -> None:
    monkeypatch.setenv("SAMAI_ENVELOPE_TOKEN", TOKEN)
    garbage.answer, name = WRONG_FIELDS[shape]
    transport = EnvelopeTransport(garbage.url)
    try:
        with pytest.raises(TransportError, match=rf"\b{name}\b"):
            await transport.run(["true"], timeout=10, retry_safe=True)
    finally:
        await transport.close()


@pytest.mark.parametrize("shape", ["body declared past the cap", "body past the cap"])
async def test_an_oversized_reply_names_the_cap(garbage: GarbageGateway, shape: str, monkeypatch) -> None:
    monkeypatch.setenv("SAMAI_ENVELOPE_TOKEN", TOKEN)
    garbage.answer = MALFORMED[shape]
    transport = EnvelopeTransport(garbage.url, margin=20)
    with pytest.raises(TransportError, match=f"{MAX_REPLY_BYTES // MIB} MiB"):
        await transport.run(["true"], timeout=10, retry_safe=True)
    await transport.close()


# ------------------------------------------------------------------ generated shapes

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=12)
FIELD = JSON | st.sampled_from(["", "*", "AAAA", "AA==", "A", "\u00e9", "-_-_", "////"])


def frames() -> st.SearchStrategy[Answer]:
    by_field = st.builds(lambda rc, out, err: frame_text(json.dumps({"rc": rc, "out": out, "err": err})),
                         FIELD, FIELD, FIELD)
    return by_field | JSON.map(lambda v: frame_text(json.dumps(v))) | st.binary(max_size=64).map(frame_text)


def probe_replies() -> st.SearchStrategy[Answer]:
    length_line = st.one_of(st.integers(-5, 10 ** 30).map(lambda n: str(n).encode()), st.binary(max_size=12))
    lied = st.builds(lambda line, sep, body: probe_out(line + sep + body), length_line,
                     st.sampled_from([b"\n", b"\r\n", b"", b" \n"]), st.binary(max_size=64))
    return lied | st.binary(max_size=200).map(probe_out)


def bodies() -> st.SearchStrategy[Answer]:
    by_field = st.builds(lambda rc, out, err: gateway_json({"rc": rc, "stdout": out, "stderr": err}),
                         FIELD, FIELD, FIELD)
    return by_field | JSON.map(gateway_json) | st.binary(max_size=64).map(Answer)


@pytest.mark.slow
@FUZZ
@given(answer=st.one_of(bodies(), frames(), probe_replies()))
def test_generated_replies_are_transport_or_box_errors(garbage: GarbageGateway, answer: Answer, monkeypatch) -> None:
    """No exception but the two the Box's callers catch, whatever the gateway sends."""
    monkeypatch.setenv("SAMAI_ENVELOPE_TOKEN", TOKEN)
    garbage.answer = answer
    error = asyncio.run(snapshot_through(garbage.url))
    assert not isinstance(error, TransportError) or "\n" not in str(error)


# ------------------------------------------------------------------ end to end


@pytest.mark.slow
@pytest.mark.parametrize("shape", CLASSES)
def test_the_cli_says_one_line_and_exits_2(garbage: GarbageGateway, shape: str) -> None:
    garbage.answer = MALFORMED[shape]
    r = run_cli("--target", garbage.url, "snapshot", env=ENV)
    assert r.returncode == 2, r.stderr[-3000:]
    assert r.stdout == "" and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert r.stderr.startswith(f"samai-console: cannot reach {garbage.url}: ")


def two_boxes(tmp_path: Path, bad_url: str) -> Path:
    good = tmp_path / "ws-good"
    good.mkdir()
    f = tmp_path / "fleet.toml"
    f.write_text(f'pipeline = "fleet"\n[boxes.good]\nurl = "local"\nworkspace = "{good}"\n'
                 f'[boxes.bad]\nurl = "{bad_url}"\nworkspace = "{tmp_path / "ws-bad"}"\n'
                 '[stages.slow]\nkey = "z"\ncommand = "sleep 30"\n')
    return f


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["frame a list", "length line longer than the body", "body past the cap"])
def test_all_boxes_shows_the_good_box_and_the_bad_one_unreachable(garbage: GarbageGateway, tmp_path: Path,
                                                                 shape: str) -> None:
    garbage.answer = MALFORMED[shape]
    r = run_cli("--config", str(two_boxes(tmp_path, garbage.url)), "snapshot", "--all-boxes", "--json", env=ENV)
    assert r.returncode == 1, r.stderr[-3000:]  # one box answered, one did not
    assert r.stderr.count("\n") == 1 and "bad" in r.stderr and "Traceback" not in r.stderr, r.stderr[-3000:]
    boxes = json.loads(r.stdout)["boxes"]
    assert boxes["good"]["processes"]
    assert boxes["bad"]["state"] == "unreachable" and boxes["bad"]["error"]
    assert "internal error" not in boxes["bad"]["error"]  # the transport's own reason, not the fleet's net


@pytest.mark.parametrize("shape", ["frame rc null", "frame nested past the parser", "length line a huge number"])
async def test_the_fleet_row_says_why_the_box_does_not_answer(garbage: GarbageGateway, tmp_path: Path, shape: str,
                                                             monkeypatch) -> None:
    from samai.console.core.connect import open_box

    monkeypatch.setenv("SAMAI_ENVELOPE_TOKEN", TOKEN)
    garbage.answer = MALFORMED[shape]
    cfg = config.load(two_boxes(tmp_path, garbage.url)).on_box("bad")
    watch = BoxWatch("bad", cfg, open_box)
    try:
        for _ in range(2):  # and again: a poll after a malformed reply fails the same way
            row = await watch.poll_once()
            assert row.state == "unreachable" and row.error and "\n" not in row.error, row
            assert "internal error" not in row.error  # the transport's own reason, not the fleet's net
    finally:
        await watch.close()


@pytest.mark.slow
async def test_the_tui_greys_the_box_and_polls_on_until_the_gateway_answers_again(
        garbage: GarbageGateway, workspace: Path, spawn, monkeypatch) -> None:
    from samai.console.app import SamaiApp
    from tests.helpers import pilot_until

    monkeypatch.setenv("SAMAI_ENVELOPE_TOKEN", TOKEN)
    victim = spawn("sleep", "46.5")
    f = workspace.parent / "relayed.toml"
    f.write_text(f'[target]\nurl = "{garbage.url}"\npython = "{sys.executable}"\npoll_interval = 0.3\n'
                 f'[workspace]\npath = "{workspace}"\n[stages.a]\nkey = "z"\ncommand = "true"\n')
    with serve(TOKEN) as gateway:
        garbage.upstream, garbage.answer = gateway.url, RELAY
        app = SamaiApp(config.load(f))
        async with app.run_test(size=(140, 45)) as pilot:
            await pilot_until(pilot, lambda: app.state.snapshot and app.state.snapshot.process(victim.pid))
            garbage.answer = MALFORMED["frame a list"]
            await pilot_until(pilot, lambda: app.connection.state == "lost")
            assert "not a JSON object" in app.connection.error and "internal error" not in app.connection.error
            garbage.answer = RELAY
            await pilot_until(pilot, lambda: app.connection.state == "connected")
        garbage.answer = Answer()


# ------------------------------------------------------------------ bounded memory


MEASURE = """
import asyncio, resource, sys
from samai.remote.envelope import EnvelopeTransport
from samai.remote.transport import TransportError

async def main():
    transport = EnvelopeTransport(sys.argv[1], margin=50)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        await transport.run(["true"], timeout=60, retry_safe=True)
        said = "answered"
    except TransportError as e:
        said = str(e)
    print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)  # KiB on Linux
    print(said)

asyncio.run(main())
"""


def gzip_bomb() -> bytes:
    """HUGE zeros, gzipped: 1 MiB on the wire. Each MiB is flushed fully, so each packs to the
    same block: packed once and repeated (its trailer is wrong, but the client stops long before it)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    head = packer.compress(bytes(MIB)) + packer.flush(zlib.Z_FULL_FLUSH)
    block = packer.compress(bytes(MIB)) + packer.flush(zlib.Z_FULL_FLUSH)
    return head + block * (HUGE // MIB - 1) + packer.flush()


@pytest.mark.slow
@pytest.mark.parametrize("how", ["chunked", "gzip"])
def test_a_huge_reply_is_refused_without_being_held(garbage: GarbageGateway, how: str) -> None:
    """Its peak memory grows by a fraction of the reply (generous: the cap and a chunk, not a
    timing or tight bound), where reading it whole grew by more than the reply itself."""
    if how == "chunked":
        garbage.answer = Answer(chunks=lambda: itertools.chain(
            [b'{"rc": 0, "stdout": "'], itertools.repeat(b"A" * MIB, HUGE // MIB), [b'"}']))
    else:
        garbage.answer = Answer(gzip_bomb(), headers={"Content-Encoding": "gzip"})
    done = subprocess.run([sys.executable, "-c", MEASURE, garbage.url], capture_output=True, text=True,
                          env={**os.environ, **ENV}, timeout=110)
    assert done.returncode == 0, done.stderr[-3000:]
    grown, said = done.stdout.splitlines()
    assert int(grown) < HUGE * 3 / 8, f"peak memory grew by {int(grown) // MIB} MiB for a {HUGE // MIB} MiB reply"
    assert f"{MAX_REPLY_BYTES // MIB} MiB" in said


# ------------------------------------------------------------------ the largest legitimate reply


@pytest.mark.slow
async def test_the_largest_range_the_probe_reads_passes_the_cap(workspace: Path, monkeypatch) -> None:
    """A 16 MiB range (the probe's own cap) through the reference gateway: base64 twice on the way."""
    from samai.remote.box.logfiles import MAX_RANGE_BYTES

    monkeypatch.setenv("SAMAI_ENVELOPE_TOKEN", TOKEN)
    big = workspace / "big.bin"
    big.write_bytes(os.urandom(MAX_RANGE_BYTES))
    with serve(TOKEN) as gateway:
        box = Box(EnvelopeTransport("envelope+" + gateway.url), str(workspace), python=sys.executable, timeout=60)
        try:
            assert await box.read_range(str(big), 0, MAX_RANGE_BYTES - 1) == big.read_bytes()
        finally:
            await box.close()
