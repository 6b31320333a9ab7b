"""The Transport protocol: how the Box reaches a machine. Mirrors httpx's transport split."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


class TransportError(Exception):
    """The target could not be reached or the command could not be started."""


class TransportTimeout(TransportError):
    """A command ran past its deadline and was killed."""


@dataclass(frozen=True)
class RunResult:
    rc: int
    stdout: bytes
    stderr: bytes

    def stderr_text(self) -> str:
        return self.stderr.decode("utf-8", "replace").strip()


class Transport(Protocol):
    """Runs argv on the target with stdin as bytes. Arguments are passed as data, never as
    a shell line, so nothing in them is ever interpreted."""

    name: str
    generation: int  # changes whenever the connection under it was made anew

    async def run(self, argv: Sequence[str], *, stdin: bytes = b"", timeout: float) -> RunResult: ...

    async def put(self, path: str, data: bytes, mode: int = 0o644) -> None: ...

    async def close(self) -> None: ...
