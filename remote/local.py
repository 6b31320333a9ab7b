"""LocalTransport: the target is this machine; commands are asyncio subprocesses."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Sequence

from samai.remote.transport import RunResult, StderrTail, TransportError, TransportTimeout, read_framed


class LocalTransport:
    name = "local"
    generation = 0  # there is no connection to lose

    async def run(self, argv: Sequence[str], *, stdin: bytes = b"", timeout: float,
                  retry_safe: bool = False) -> RunResult:
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,  # so a timeout can take its whole group down
            )
        except OSError as e:
            raise TransportError(f"cannot start {argv[0]}: {e.strerror}") from e
        try:
            out, err = await asyncio.wait_for(proc.communicate(stdin), timeout)
        except (TimeoutError, asyncio.CancelledError) as e:
            _kill_group(proc.pid)
            await proc.wait()
            if isinstance(e, asyncio.CancelledError):
                raise
            raise TransportTimeout(f"{argv[0]} ran past its {timeout:g} s deadline and was killed") from e
        assert proc.returncode is not None  # communicate() returned: the process has exited
        return RunResult(proc.returncode, out, err)

    async def open_stream(self, argv: Sequence[str], *, preamble: bytes = b"") -> LocalStream:
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, start_new_session=True)
        except OSError as e:
            raise TransportError(f"cannot start {argv[0]}: {e.strerror}") from e
        stream = LocalStream(proc, argv[0])
        if preamble:
            stream.stdin.write(preamble)  # drained with the first request
        return stream

    async def close(self) -> None:
        return None


class LocalStream:
    persistent = True

    def __init__(self, proc: asyncio.subprocess.Process, name: str) -> None:
        self.proc, self.name = proc, name
        # open_stream made both pipes (stdin=PIPE, stdout=PIPE), so asyncio set both.
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        self.stdin, self.stdout = proc.stdin, proc.stdout
        self.stderr = StderrTail(proc.stderr)

    async def request(self, line: bytes, *, timeout: float) -> bytes:
        try:
            self.stdin.write(line + b"\n")
            async with asyncio.timeout(timeout):
                await self.stdin.drain()
                return await read_framed(self.stdout.readline, self.stdout.readexactly)
        except TimeoutError as e:
            await self.close()
            raise TransportTimeout(f"{self.name} ran past its {timeout:g} s deadline and was killed") from e
        except (OSError, ValueError, asyncio.IncompleteReadError, TransportError) as e:
            said = await self.stderr.said()
            await self.close()
            if said:  # why it ended, first: a status line cuts the end of a long message
                raise TransportError(f"{said} ({self.name} ended, rc={self.proc.returncode})") from e
            raise TransportError(f"{self.name} stream failed (rc={self.proc.returncode}): {e}") from e

    async def close(self) -> None:
        if self.proc.returncode is None:
            _kill_group(self.proc.pid)
        await self.proc.wait()
        self.stderr.cancel()


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass

