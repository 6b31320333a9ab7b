"""EnvelopeTransport: the box through an HTTP exec gateway (playbook §1-§2).

The gateway runs posted Python with exec() in separate globals and locals, so every payload
this module builds is flat: no def, lambda, class, comprehension or generator expression, and
modules imported where they are used (`samai-console lint-payload` checks the rules). A payload
only ever runs a command with subprocess (a box tool: the real logic lives in files on the box)
or writes a file, and prints one framed result line.

What the client expects (see docs/envelope-protocol.md and samai.remote.gateway, the reference):
  POST {base}/execute?respenc=b64url&timeout=N, text/plain body, Authorization: Bearer TOKEN
  200 {"rc", "stdout": b64url, "stderr": b64url}: the payload ran (rc is the payload's own);
  401: the token was refused; 413: too big; 5xx or 504: the gateway failed or cut the call.
The payload's stdout carries `SAMAI-RESULT {json}`; a 200 without it means the exec slot did
not run the code (it happens: §1), and is reported as such. Decoding lives in `decode_reply`.

The token is read from an environment variable and sent only as a header: never in the URL,
a log line or a command on the box. Synchronous calls are capped at 120 s (the gateway cuts at
~180 s): longer work is started detached. Reads are retried on 5xx and timeouts; a call that may
have changed the box is never sent twice.

The gateway is not trusted: its reply is read as it streams in and refused past MAX_REPLY_BYTES,
and a reply that is not the shape above (or a frame that is not the payload's) is a
TransportError saying what is wrong with it, as a failed connection is.
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx

from samai.remote.transport import MAX_FRAME_BYTES, RunResult, TransportError, TransportTimeout, read_framed

MAX_SYNC_S = 120.0
RESULT_MARK = b"SAMAI-RESULT "
DEFAULT_TOKEN_ENV = "SAMAI_ENVELOPE_TOKEN"
READ_RETRIES = 3
# A box tool's reply is at most MAX_FRAME_BYTES (32 MiB: see transport.py). Through the gateway
# it is base64'd twice, once in the payload's frame and again in the gateway's b64url (x16/9):
# 57 MiB for a full one. Twice the frame, 64 MiB, holds that, the JSON around it and the tool's
# stderr beside it; a reply past it is refused before it is read whole.
MAX_REPLY_BYTES = 2 * MAX_FRAME_BYTES
ERROR_BODY_BYTES = 4096  # what is read of a reply that is not a 200: its reason (200 characters are shown)
MAX_EXIT_STATUS = 255  # an exit code, or minus the signal that killed the process


@dataclass(frozen=True)
class GatewayReply:
    rc: int
    stdout: bytes
    stderr: bytes


def decode_reply(body: bytes) -> GatewayReply:
    """The reference gateway's reply format (the one place to adapt for another gateway);
    ValueError, saying what is wrong, for a body that is not one."""
    reply = _json_object(body)
    return GatewayReply(_exit_status(reply.get("rc")), _base64(reply.get("stdout", ""), "stdout", b"-_"),
                        _base64(reply.get("stderr", ""), "stderr", b"-_"))


def decode_frame(line: bytes) -> RunResult:
    """The payload's result frame (what follows RESULT_MARK); ValueError for one it did not print."""
    frame = _json_object(line)
    return RunResult(_exit_status(frame.get("rc")), _base64(frame.get("out"), "out"), _base64(frame.get("err"), "err"))


def _json_object(text: bytes) -> dict:
    try:
        value = json.loads(text)
    except RecursionError as e:  # nested deeper than the parser goes
        raise ValueError("it is JSON nested too deep to read") from e
    except ValueError as e:  # broken JSON, and bytes that are not UTF-8
        raise ValueError(f"it is not JSON ({e})") from e
    if not isinstance(value, dict):
        raise ValueError(f"it is {'null' if value is None else _shown(value)}, not a JSON object")
    return value


def _exit_status(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or abs(value) > MAX_EXIT_STATUS:
        raise ValueError(f"rc is {_shown(value)}, not an exit status")
    return value


def _base64(value: object, name: str, altchars: bytes | None = None) -> bytes:
    if not isinstance(value, str):
        raise ValueError(f"{name} is {_shown(value)}, not base64 text")
    try:
        return base64.b64decode(value, altchars, validate=True)
    except ValueError as e:  # binascii.Error, and text that is not ASCII
        raise ValueError(f"{name} is not base64 ({e})") from e


def _shown(value: object) -> str:
    """A JSON value as an error names it: its kind, and the start of a number."""
    if value is None:
        return "null or missing"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        text = str(value)
        return f"the number {text[:20]}" + ("..." if len(text) > 20 else "")
    kinds = ((dict, "an object"), (list, "an array"), (str, "a string"))
    return next((name for kind, name in kinds if isinstance(value, kind)), type(value).__name__)


def _one_line(data: bytes, keep: int) -> str:
    """The end of text the box or the gateway wrote, on one line."""
    return " ".join(data.decode("utf-8", "replace").split())[-keep:]


def _embed(data: bytes) -> str:
    return repr(base64.b64encode(data).decode("ascii"))


def run_payload(argv: Sequence[str], stdin: bytes, timeout: float) -> str:
    """A flat payload that runs argv with stdin and prints the framed result."""
    return "\n".join([
        "import base64",
        "import json",
        "import subprocess",
        f"argv = json.loads(base64.b64decode({_embed(json.dumps(list(argv)).encode())}))",
        f"given = base64.b64decode({_embed(stdin)})",
        "rc = 127",
        "out = b''",
        "err = b''",
        "try:",
        f"    done = subprocess.run(argv, input=given, stdout=subprocess.PIPE, stderr=subprocess.PIPE, "
        f"timeout={timeout!r})",
        "    rc, out, err = done.returncode, done.stdout, done.stderr",
        "except subprocess.TimeoutExpired as e:",
        "    rc, out, err = 124, e.stdout or b'', (e.stderr or b'') + b'timed out on the box'",
        "except OSError as e:",
        "    err = str(e).encode()",
        "result = {'rc': rc, 'out': base64.b64encode(out).decode(), 'err': base64.b64encode(err).decode()}",
        f"print({RESULT_MARK.decode()!r} + json.dumps(result))",
        "",
    ])


def put_payload(path: str, data: bytes, mode: int) -> str:
    """A flat payload that writes a file atomically (its folder made first)."""
    return "\n".join([
        "import base64",
        "import json",
        "import os",
        f"path = {path!r}",
        "folder = os.path.dirname(path) or '.'",
        "os.makedirs(folder, exist_ok=True)",
        "tmp = path + '.put-' + str(os.getpid())",
        "f = open(tmp, 'wb')",
        f"f.write(base64.b64decode({_embed(data)}))",
        "f.close()",
        f"os.chmod(tmp, {mode})",
        "os.replace(tmp, path)",
        f"print({RESULT_MARK.decode()!r} + json.dumps({{'rc': 0, 'out': '', 'err': ''}}))",
        "",
    ])


class EnvelopeTransport:
    name = "envelope"
    generation = 0  # no connection to lose: every call stands alone

    def __init__(self, url: str, *, token_env: str = DEFAULT_TOKEN_ENV, backoff: float = 0.5,
                 margin: float = 10.0) -> None:
        parts = urlsplit(url.removeprefix("envelope+"))
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise TransportError(f"target {url}: expected envelope+http(s)://host[:port][/prefix]")
        self.base = f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}"
        self.token_env = token_env
        self.backoff = backoff
        self.margin = margin  # on top of the call's own timeout: the gateway's start-up and the reply
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(30.0, connect=10.0))

    def _token(self) -> str:
        token = os.environ.get(self.token_env)
        if not token:
            raise TransportError(f"no gateway token: set the environment variable {self.token_env}")
        return token

    async def execute(self, code: str, timeout: float, *, retry_safe: bool) -> GatewayReply:
        if timeout > MAX_SYNC_S:
            raise TransportError(f"a synchronous envelope call may take at most {MAX_SYNC_S:g} s ({timeout:g} s "
                                 "asked): start long work detached instead")
        headers = {"Authorization": f"Bearer {self._token()}", "Content-Type": "text/plain"}
        url = f"{self.base}/execute?respenc=b64url&timeout={math.ceil(timeout)}"
        attempts = READ_RETRIES if retry_safe else 1
        for attempt in range(1, attempts + 1):
            try:
                # httpx's timeouts apply per chunk: a trickling reply needs a deadline of its own
                async with asyncio.timeout(timeout + self.margin):
                    status, body = await self._post(url, code, headers)
            except (TimeoutError, httpx.TimeoutException):
                failure: TransportError = TransportTimeout(
                    f"the gateway did not answer within {timeout + self.margin:g} s")
            except httpx.HTTPError as e:
                failure = TransportError(f"gateway {self.base}: {type(e).__name__}: {e}")
            else:
                if status == 200:
                    try:
                        return decode_reply(body)
                    except ValueError as e:
                        raise TransportError(f"the gateway answered 200 with an unreadable body: {e}") from e
                if status == 401:
                    raise TransportError(f"the gateway refused the token in {self.token_env} (401)")
                failure = TransportError(f"the gateway answered {status}: {_one_line(body, ERROR_BODY_BYTES)[:200]}")
                if status < 500:
                    raise failure
            if attempt == attempts:
                if not retry_safe:
                    raise TransportError(f"{failure}; the call may have run on the box, so it is not sent again")
                raise failure
            await asyncio.sleep(self.backoff * 2 ** (attempt - 1))
        raise AssertionError("unreachable")

    async def _post(self, url: str, code: str, headers: dict[str, str]) -> tuple[int, bytes]:
        """The reply's status and body, read as it streams in: all of a 200 (refused past
        MAX_REPLY_BYTES), the start of any other (its reason)."""
        async with self._client.stream("POST", url, content=code.encode(), headers=headers) as response:
            if response.status_code != 200:
                return response.status_code, await _body_start(response, ERROR_BODY_BYTES)
            return 200, await _whole_body(response, MAX_REPLY_BYTES)

    async def run(self, argv: Sequence[str], *, stdin: bytes = b"", timeout: float,
                  retry_safe: bool = False) -> RunResult:
        reply = await self.execute(run_payload(argv, stdin, timeout), timeout, retry_safe=retry_safe)
        try:
            return decode_frame(_result_line(reply))
        except ValueError as e:
            raise TransportError(f"the payload's result is unreadable: {e}") from e

    async def open_stream(self, argv: Sequence[str], *, preamble: bytes = b"") -> EnvelopeStream:
        return EnvelopeStream(self, list(argv), preamble)

    async def close(self) -> None:
        await self._client.aclose()


class EnvelopeStream:
    """No connection stays open through a gateway: each request runs the command anew (the
    probe answers one request per line and ends at end of input)."""

    persistent = False

    def __init__(self, transport: EnvelopeTransport, argv: list[str], preamble: bytes = b"") -> None:
        self.transport, self.argv, self.preamble = transport, argv, preamble

    async def request(self, line: bytes, *, timeout: float) -> bytes:
        stdin = self.preamble + line + b"\n"  # each request a new process: each one reads the preamble
        result = await self.transport.run(self.argv, stdin=stdin, timeout=timeout, retry_safe=True)
        if result.rc != 0:
            raise TransportError(f"{self.argv[-2]} exited with rc={result.rc}: {_one_line(result.stderr, 300)}")
        reader = asyncio.StreamReader()
        reader.feed_data(result.stdout)
        reader.feed_eof()
        return await read_framed(reader.readline, reader.readexactly)

    async def close(self) -> None:
        return None


async def _whole_body(response: httpx.Response, cap: int) -> bytes:
    """The body, refused once it is known to be longer than cap: from its Content-Length before
    a byte is read, else as it comes (chunked, or compressed), so at most cap and the chunk that
    crossed it are ever held."""
    declared = response.headers.get("Content-Length", "")  # h11 has checked it is a number
    if declared.isascii() and declared.isdigit() and int(declared) > cap:
        raise _too_big(cap)
    chunks, size = [], 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > cap:
            raise _too_big(cap)
        chunks.append(chunk)
    return b"".join(chunks)


async def _body_start(response: httpx.Response, limit: int) -> bytes:
    """The first limit bytes of the body; the rest is never read."""
    start = b""
    async for chunk in response.aiter_bytes():
        start += chunk[:limit - len(start)]
        if len(start) >= limit:
            break
    return start


def _too_big(cap: int) -> TransportError:
    return TransportError(f"the gateway's reply is larger than {cap // 2 ** 20} MiB, more than any box tool "
                          "answers: refused")


def _result_line(reply: GatewayReply) -> bytes:
    """What follows RESULT_MARK on the payload's result line."""
    for line in reply.stdout.splitlines():
        if line.startswith(RESULT_MARK):
            return line[len(RESULT_MARK):]
    detail = _one_line(reply.stderr, 300)
    raise TransportError("the gateway answered but the payload printed no result: the exec slot did not run it"
                         + (f" ({detail})" if detail else ""))
