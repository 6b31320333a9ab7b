"""The Transport protocol: how the Box reaches a machine. Mirrors httpx's transport split."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


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
    """A reply framed as b"<length>\\n" and then that many bytes (see Stream.request)."""
    header = await read_line()
    if not header.endswith(b"\n") or not header.strip().isdigit():
        raise TransportError(f"the stream ended or sent {header[:80]!r} instead of a reply")
    return await read_exactly(int(header))


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
