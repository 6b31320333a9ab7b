"""SshTransport: the box over one asyncssh connection, reused for every poll and action.

Bytes mode only (an `encoding=` would make one invalid byte drop the connection). Host keys
are checked against known_hosts, ~/.ssh/config, the agent and key files are honoured as
OpenSSH would. Every call has a deadline; a call that runs past it is killed on the box by
its pid (read from the command itself) and exact command line, not left behind. A lost
connection is dropped and made again by the next call; calls are never retried here, since
only the caller knows whether a call may safely run twice.
"""

from __future__ import annotations

import asyncio
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypedDict
from urllib.parse import urlsplit

import asyncssh

from samai.remote.transport import RunResult, StderrTail, TransportError, TransportTimeout, read_framed

KILL_TIMEOUT_S = 10.0
# What the box may send a stream ahead of our reading it. asyncssh's default (2 MiB) caps a
# reply at 2 MiB per round trip: 20 MB/s at 100 ms, less than a catch-up read could move.
STREAM_WINDOW = 16 * 1024 * 1024


@dataclass(frozen=True)
class SshOptions:
    keepalive_interval: float = 5.0
    keepalive_count: int = 3
    connect_timeout: float = 10.0
    max_channels: int = 6  # sshd's MaxSessions defaults to 10 per connection


class _ConnectArgs(TypedDict, total=False):
    """The asyncssh.connect options set here; a key left out keeps asyncssh's (and ~/.ssh/config's) value."""
    keepalive_interval: float
    keepalive_count_max: int
    connect_timeout: float
    port: int
    username: str


@dataclass(frozen=True)
class SshTarget:
    host: str  # a name, an address, or a Host alias of ~/.ssh/config
    user: str | None = None
    port: int | None = None

    @classmethod
    def parse(cls, url: str) -> SshTarget:
        parts = urlsplit(url)
        try:
            port = parts.port
        except ValueError as e:
            raise TransportError(f"target {url}: {e}") from e
        if parts.scheme != "ssh" or not parts.hostname or parts.path not in ("", "/"):
            raise TransportError(f"target {url}: expected ssh://[user@]host[:port]")
        return cls(parts.hostname, parts.username, port)

    def __str__(self) -> str:
        user = f"{self.user}@" if self.user else ""
        return f"{user}{self.host}" + (f":{self.port}" if self.port else "")


class SshTransport:
    name = "ssh"

    def __init__(self, target: SshTarget, options: SshOptions | None = None) -> None:
        self.target = target
        self.options = options or SshOptions()
        self.generation = 0  # counts lost connections: what lived on the old one is gone
        self._conn: asyncssh.SSHClientConnection | None = None
        self._connecting = asyncio.Lock()
        self._channels = asyncio.Semaphore(self.options.max_channels)

    # ------------------------------------------------------------ connection

    async def _connection(self) -> asyncssh.SSHClientConnection:
        async with self._connecting:
            if self._conn is None:
                self._conn = await self._connect()
            return self._conn

    async def _connect(self) -> asyncssh.SSHClientConnection:
        t, o = self.target, self.options
        kwargs: _ConnectArgs = {"keepalive_interval": o.keepalive_interval,
                                "keepalive_count_max": o.keepalive_count, "connect_timeout": o.connect_timeout}
        if t.port:
            kwargs["port"] = t.port
        if t.user:
            kwargs["username"] = t.user
        try:
            return await asyncssh.connect(t.host, **kwargs)
        except asyncssh.HostKeyNotVerifiable as e:
            raise TransportError(
                f"host key of {t} is not trusted ({e.reason}): nothing was run. Check the key's fingerprint "
                f"with whoever runs the box, then add it to ~/.ssh/known_hosts (ssh-keyscan -p "
                f"{t.port or 22} {t.host}, or connect once with ssh and accept it)") from e
        except asyncssh.PermissionDenied as e:
            raise TransportError(f"{t}: authentication failed ({e.reason}); check the user, the key "
                                 f"(IdentityFile) and the agent") from e
        except (TimeoutError, OSError, asyncssh.Error) as e:
            raise TransportError(f"cannot connect to {t}: {_reason(e)}") from e

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn.abort()
            self._conn = None
            self.generation += 1

    async def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            await self._conn.wait_closed()
            self._conn = None

    # ------------------------------------------------------------ calls

    async def run(self, argv: Sequence[str], *, stdin: bytes = b"", timeout: float,
                  retry_safe: bool = False) -> RunResult:
        # The login shell prints its pid, then becomes the command (same pid): a deadline can
        # then kill exactly that process. Every argument is quoted; data travels on stdin.
        command = "echo $$; exec " + shlex.join(argv)
        conn = await self._connection()
        async with self._channels:
            try:
                proc = await conn.create_process(command, encoding=None)
            except (OSError, asyncssh.Error) as e:
                self._drop()
                raise TransportError(f"{self.target}: connection lost ({_reason(e)})") from e
            pid: int | None = None
            try:
                async with asyncio.timeout(timeout):
                    if stdin:
                        proc.stdin.write(stdin)
                    proc.stdin.write_eof()  # always: a command that reads stdin must see its end
                    pid = int((await proc.stdout.readline()).strip() or 0) or None
                    out, err = await proc.communicate()
            except TimeoutError as e:
                proc.close()
                await self._kill_remote(pid, argv)
                raise TransportTimeout(f"{argv[0]} on {self.target} ran past its {timeout:g} s deadline and was "
                                       f"killed there" + ("" if pid else " (its pid was never seen)")) from e
            except (OSError, asyncssh.Error, ValueError) as e:
                self._drop()
                raise TransportError(f"{self.target}: connection lost during {argv[0]} ({_reason(e)})") from e
        if proc.exit_status is None:  # the channel closed without an exit status: the link broke
            self._drop()
            raise TransportError(f"{self.target}: connection lost during {argv[0]}")
        return RunResult(proc.exit_status, out or b"", err or b"")

    async def open_stream(self, argv: Sequence[str], *, preamble: bytes = b"") -> SshStream:
        """A long-running command on its own channel (held for the stream's life)."""
        conn = await self._connection()
        await self._channels.acquire()
        try:
            proc = await conn.create_process("echo $$; exec " + shlex.join(argv), encoding=None,
                                             window=STREAM_WINDOW)
            header = await asyncio.wait_for(proc.stdout.readline(), self.options.connect_timeout)
            if preamble:
                proc.stdin.write(preamble)
            return SshStream(self, proc, int(header), argv)
        except (TimeoutError, OSError, asyncssh.Error, ValueError) as e:
            self._channels.release()
            self._drop()
            raise TransportError(f"{self.target}: cannot start {argv[0]} ({_reason(e)})") from e

    async def _kill_remote(self, pid: int | None, argv: Sequence[str]) -> None:
        """KILL pid only if its command line is still exactly argv (the pid was not reused)."""
        if pid is None:
            self._drop()  # nothing to aim at; a fresh connection at least frees the channel
            return
        guard = f"printf '%s\\0' {shlex.join(argv)} | cmp -s - /proc/{pid}/cmdline && kill -KILL {pid}"
        try:
            conn = await self._connection()
            await asyncio.wait_for(conn.run(guard, encoding=None), KILL_TIMEOUT_S)
        except (TimeoutError, OSError, asyncssh.Error, TransportError):
            self._drop()


class SshStream:
    persistent = True

    def __init__(self, transport: SshTransport, proc: asyncssh.SSHClientProcess, pid: int,
                 argv: Sequence[str]) -> None:
        self.transport, self.proc, self.pid, self.argv = transport, proc, pid, list(argv)
        self.stderr = StderrTail(proc.stderr)
        self._open = True

    async def request(self, line: bytes, *, timeout: float) -> bytes:
        try:
            async with asyncio.timeout(timeout):
                self.proc.stdin.write(line + b"\n")
                return await read_framed(self.proc.stdout.readline, self.proc.stdout.readexactly)
        except TimeoutError as e:
            await self.close(kill=True)
            raise TransportTimeout(f"{self.argv[0]} on {self.transport.target} ran past its {timeout:g} s "
                                   f"deadline and was killed there") from e
        except (OSError, asyncssh.Error, asyncio.IncompleteReadError, TransportError) as e:
            said = await self.stderr.said() if self.proc.exit_status is not None else ""
            self.transport._drop()
            await self.close()
            if said:  # the command ended, and said why: that first (a status line cuts the end)
                raise TransportError(f"{said} ({self.argv[0]} on {self.transport.target} ended, "
                                     f"rc={self.proc.exit_status})") from e
            raise TransportError(f"{self.transport.target}: connection lost during {self.argv[0]} "
                                 f"({_reason(e)})") from e

    async def close(self, *, kill: bool = False) -> None:
        if not self._open:
            return
        self._open = False
        self.proc.close()  # the command reads end-of-input and exits
        self.stderr.cancel()
        if kill:
            await self.transport._kill_remote(self.pid, self.argv)
        self.transport._channels.release()


def _reason(e: BaseException) -> str:
    return getattr(e, "reason", None) or str(e) or type(e).__name__
