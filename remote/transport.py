"""The Transport protocol: how the Box reaches a machine. Mirrors httpx's transport split."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

# The largest reply a box tool sends, framed or not. The biggest the Box asks for is a probe
# reply holding one 16 MiB range (logfiles.MAX_RANGE_BYTES, attached raw after its JSON); a log
# read is at most 8 MiB (MAX_LOG_BYTES), a GGUF header is read 1 MiB at a time (MAX_FETCH) and
# `gguf show` keeps at most 256 KVs and 4096 tensors. Twice the range leaves room for the JSON
# beside it (a snapshot's 50 report files of 64 KiB, escaped); a longer one is not a reply.
MAX_FRAME_BYTES = 32 * 1024 * 1024


class TransportError(Exception):
    """The target could not be reached or the command could not be started."""


class TransportTimeout(TransportError):
    """A command ran past its deadline and was killed."""


class StderrTail:
    """The last bytes a stream's command wrote on stderr, drained as they come (a pipe nobody
    reads would block the command once it fills): why a stream ended, for its error."""

    KEEP = 2048

    def __init__(self, reader) -> None:
        self.data = b""
        self._task = asyncio.ensure_future(self._drain(reader))

    async def _drain(self, reader) -> None:
        try:
            while chunk := await reader.read(65536):
                self.data = (self.data + chunk)[-self.KEEP:]
        except Exception:  # the connection under it went: what came so far is what there is
            return

    async def said(self, wait: float = 1.0) -> str:
        """What it wrote, once its end is read (or after `wait`), as one line; "" for nothing."""
        await asyncio.wait([self._task], timeout=wait)
        return " ".join(self.data.decode("utf-8", "replace").split())[-500:]

    def cancel(self) -> None:
        self._task.cancel()


async def read_framed(read_line, read_exactly) -> bytes:
    """A reply framed as b"<length>\\n" and then that many bytes (see Stream.request); any
    other bytes, and a stream that ends before the reply does, are a TransportError."""
    try:
        header = await read_line()
    except ValueError as e:  # a line longer than the reader holds: a length line is a few digits
        raise TransportError("the stream sent a line too long to be a reply's length") from e
    length = _frame_length(header)
    try:
        return await read_exactly(length)
    except asyncio.IncompleteReadError as e:
        raise TransportError(f"the stream ended {len(e.partial)} bytes into a reply of {length}") from e


def _frame_length(header: bytes) -> int:
    digits = header.strip()
    if not header.endswith(b"\n") or not digits.isdigit():
        raise TransportError(f"the stream ended or sent {header[:80]!r} instead of a reply")
    significant = digits.lstrip(b"0") or b"0"  # what int() reads: its length is checked first
    if len(significant) > len(str(MAX_FRAME_BYTES)) or int(significant) > MAX_FRAME_BYTES:
        raise TransportError(f"the stream announced a reply of {significant[:30].decode()} bytes, more than the "
                             f"{MAX_FRAME_BYTES // 2 ** 20} MiB any box tool sends")
    return int(significant)


@dataclass(frozen=True)
class RunResult:
    rc: int
    stdout: bytes
    stderr: bytes

    def stderr_text(self) -> str:
        return self.stderr.decode("utf-8", "replace").strip()


class Stream(Protocol):
    """A long-running command on the target spoken to one line at a time."""

    persistent: bool  # one process answers every request (it may remember the last one)

    async def request(self, line: bytes, *, timeout: float) -> bytes:
        """Send one line; return the reply that answers it (sent as a length line, then that
        many bytes). Past the deadline the command is killed on the target and TransportTimeout
        raised; after any failure the stream is closed."""
        ...

    async def close(self) -> None: ...


class Transport(Protocol):
    """Runs argv on the target with stdin as bytes. Arguments are passed as data, never as
    a shell line, so nothing in them is ever interpreted."""

    name: str
    generation: int  # changes whenever the connection under it is lost: streams on it are gone

    async def run(self, argv: Sequence[str], *, stdin: bytes = b"", timeout: float,
                  retry_safe: bool = False) -> RunResult:
        """retry_safe: the command only reads, so a transport that retries (the envelope's) may
        send it again; everything else runs at most once."""
        ...

    async def open_stream(self, argv: Sequence[str], *, preamble: bytes = b"") -> Stream:
        """preamble: bytes the command reads on stdin before the first request (the code of a
        tool run from stdin, where nothing may be written on the target)."""
        ...

    async def close(self) -> None: ...
