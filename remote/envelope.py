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

from samai.remote.transport import RunResult, TransportError, TransportTimeout, read_framed

MAX_SYNC_S = 120.0
RESULT_MARK = "SAMAI-RESULT "
DEFAULT_TOKEN_ENV = "SAMAI_ENVELOPE_TOKEN"
READ_RETRIES = 3


@dataclass(frozen=True)
class GatewayReply:
    rc: int
    stdout: bytes
    stderr: bytes


def decode_reply(response: httpx.Response) -> GatewayReply:
    """The reference gateway's reply format (the one place to adapt for another gateway)."""
    body = response.json()
    return GatewayReply(int(body["rc"]), base64.urlsafe_b64decode(body.get("stdout") or ""),
                        base64.urlsafe_b64decode(body.get("stderr") or ""))


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
        f"print({RESULT_MARK!r} + json.dumps(result))",
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
        f"print({RESULT_MARK!r} + json.dumps({{'rc': 0, 'out': '', 'err': ''}}))",
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
                    response = await self._client.post(url, content=code.encode(), headers=headers)
            except (TimeoutError, httpx.TimeoutException):
                failure: TransportError = TransportTimeout(
                    f"the gateway did not answer within {timeout + self.margin:g} s")
            except httpx.HTTPError as e:
                failure = TransportError(f"gateway {self.base}: {type(e).__name__}: {e}")
            else:
                if response.status_code == 200:
                    try:
                        return decode_reply(response)
                    except (ValueError, KeyError, TypeError) as e:
                        raise TransportError(f"the gateway answered 200 with an unreadable body: {e}") from e
                if response.status_code == 401:
                    raise TransportError(f"the gateway refused the token in {self.token_env} (401)")
                failure = TransportError(f"the gateway answered {response.status_code}: {response.text[:200]}")
                if response.status_code < 500:
                    raise failure
            if attempt == attempts:
                if not retry_safe:
                    raise TransportError(f"{failure}; the call may have run on the box, so it is not sent again")
                raise failure
            await asyncio.sleep(self.backoff * 2 ** (attempt - 1))
        raise AssertionError("unreachable")

    async def run(self, argv: Sequence[str], *, stdin: bytes = b"", timeout: float,
                  retry_safe: bool = False) -> RunResult:
        reply = await self.execute(run_payload(argv, stdin, timeout), timeout, retry_safe=retry_safe)
        frame = _result_frame(reply)
        return RunResult(int(frame["rc"]), base64.b64decode(frame["out"]), base64.b64decode(frame["err"]))

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
            raise TransportError(f"{self.argv[-2]} exited with rc={result.rc}: {result.stderr_text()[-300:]}")
        reader = asyncio.StreamReader()
        reader.feed_data(result.stdout)
        reader.feed_eof()
        return await read_framed(reader.readline, reader.readexactly)

    async def close(self) -> None:
        return None


def _result_frame(reply: GatewayReply) -> dict:
    for line in reply.stdout.decode("utf-8", "replace").splitlines():
        if line.startswith(RESULT_MARK):
            return json.loads(line[len(RESULT_MARK):])
    detail = reply.stderr.decode("utf-8", "replace").strip()[-300:]
    raise TransportError("the gateway answered but the payload printed no result: the exec slot did not run it"
                         + (f" ({detail})" if detail else ""))
