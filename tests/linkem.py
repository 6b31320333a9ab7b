"""A link emulator: a userspace TCP relay on loopback with delay, loss, a rate limit and outages.

This kernel has no netem, so the SSH tests and benchmarks put this relay between the console
and sshd. It runs its own asyncio loop in its own thread, so that synchronous tests (a CLI
subprocess) and async ones (Textual's pilot) can both drive it; every control method may be
called from any thread.

    with Link("127.0.0.1", sshd_port, rtt=0.1, loss=0.01) as link:
        ... connect to 127.0.0.1:link.port ...
        link.outage(5)                    # a pulled cable, back after 5 s
        link.outage(2, mode="reset")      # every connection reset, new ones refused for 2 s
"""

from __future__ import annotations

import asyncio
import math
import random
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, TypeVar

MSS = 1448  # bytes of payload in one TCP segment on a 1500-byte MTU with timestamps
CHUNK = 65536
QUEUE_CHUNKS = 256  # per direction: a reader waits (TCP's back-pressure) once this many are in flight
Mode = Literal["blackhole", "reset"]
T = TypeVar("T")


@dataclass(frozen=True)
class LinkStats:
    connections: int  # accepted, refused ones included
    bytes_up: int  # client to target
    bytes_down: int  # target to client
    stalls: int  # loss events: a direction held for a retransmission timeout
    round_trips: int  # turns from client-to-target to target-to-client traffic on a connection
    resets: int  # connections aborted or refused by reset outages


@dataclass(eq=False)
class _Conn:
    writers: tuple[asyncio.StreamWriter, asyncio.StreamWriter]
    tasks: list[asyncio.Task] = field(default_factory=list)
    last_up: bool = False
    open_dirs: int = 2

    def abort(self) -> None:
        for w in self.writers:
            _reset(w)
        for t in self.tasks:
            t.cancel()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with an RST (linger 0), as a middlebox or a rebooted peer would, not a polite FIN."""
    sock = writer.get_extra_info("socket")
    try:
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass  # already closed
    writer.transport.abort()


class Link:
    """Each direction of each connection delays every chunk by rtt/2, in order; the rate limit is
    the link's (shared by its connections, per direction). The TCP handshake itself costs nothing
    here (the relay accepts at once): only bytes pay the rtt."""

    def __init__(self, target_host: str, target_port: int, rtt: float = 0.1, loss: float = 0.0,
                 rate: float | None = None, seed: int = 0) -> None:
        self.target = (target_host, target_port)
        self.rtt, self.loss, self.rate = rtt, loss, rate
        self.port = 0
        self._rng = random.Random(seed)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=f"linkem->{target_port}", daemon=True)
        self._ready = threading.Event()
        self._server: asyncio.Server | None = None
        self._conns: set[_Conn] = set()
        self._flowing = asyncio.Event()  # cleared while a blackhole holds every byte
        self._flowing.set()
        self._refusing = False  # a reset outage: new connections are closed at once
        self._outage_end: asyncio.TimerHandle | None = None
        self._busy = {True: 0.0, False: 0.0}  # when each direction's rate limit frees up
        self._counts = dict(connections=0, bytes_up=0, bytes_down=0, stalls=0, round_trips=0, resets=0)

    # ------------------------------------------------------------ control (any thread)

    def start(self) -> Link:
        self._thread.start()
        self._ready.wait(10)
        if not self.port:
            raise RuntimeError("link emulator did not start")
        return self

    def stop(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    def __enter__(self) -> Link:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def set(self, *, rtt: float | None = None, loss: float | None = None, rate: float | None = None) -> None:
        """Change the link live (rate=0 lifts the limit); chunks already queued keep their times."""
        def change() -> None:
            self.rtt = self.rtt if rtt is None else rtt
            self.loss = self.loss if loss is None else loss
            self.rate = self.rate if rate is None else (rate or None)
        self._call(change)

    def down(self, mode: Mode = "blackhole") -> None:
        self._call(lambda: self._down(mode))

    def up(self) -> None:
        self._call(self._up)

    def outage(self, seconds: float, mode: Mode = "blackhole") -> None:
        """An outage that ends by itself after seconds; returns at once."""
        def begin() -> None:
            self._down(mode)
            self._outage_end = self._loop.call_later(seconds, self._up)
        self._call(begin)

    def stats(self) -> LinkStats:
        return self._call(lambda: LinkStats(**self._counts))

    def _call(self, fn: Callable[[], T]) -> T:
        """fn run on the link's loop (its state is the loop's alone), its result handed back; run
        here when no loop runs yet or any more (stats() after stop() are the final counts)."""
        if threading.current_thread() is self._thread or not self._thread.is_alive():
            return fn()

        async def wrapped() -> T:
            return fn()
        return asyncio.run_coroutine_threadsafe(wrapped(), self._loop).result(10)

    # ------------------------------------------------------------ the loop's thread

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._server = self._loop.run_until_complete(asyncio.start_server(self._accept, "127.0.0.1", 0))
            self.port = self._server.sockets[0].getsockname()[1]
            self._ready.set()
            self._loop.run_forever()
        finally:
            self._ready.set()  # start() must not wait out its timeout on a failed start
            self._shutdown()

    def _shutdown(self) -> None:
        if self._server is not None:
            # Accepts under way get their handler first (cancelled half-way, their sockets would leak).
            self._loop.run_until_complete(asyncio.sleep(0.05))
            self._server.close()
        for conn in list(self._conns):
            conn.abort()
        tasks = asyncio.all_tasks(self._loop)
        for t in tasks:
            t.cancel()
        self._loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        self._loop.close()

    def _down(self, mode: Mode) -> None:
        self._up()
        if mode == "blackhole":
            self._flowing.clear()
            return
        self._refusing = True
        for conn in list(self._conns):
            self._counts["resets"] += 1
            conn.abort()
        self._conns.clear()

    def _up(self) -> None:
        if self._outage_end is not None:
            self._outage_end.cancel()  # a manual up() (or a new outage) ends the timed one too
            self._outage_end = None
        self._refusing = False
        self._flowing.set()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._counts["connections"] += 1
        if self._refusing:
            self._counts["resets"] += 1
            _reset(writer)
            return
        try:
            t_reader, t_writer = await asyncio.open_connection(*self.target)
        except (OSError, asyncio.CancelledError):  # the target is down, or the link stops meanwhile
            _reset(writer)  # (and a handler must not end cancelled: asyncio logs that as an error)
            return
        conn = _Conn((writer, t_writer))
        self._conns.add(conn)
        # Tasks of their own, not this handler: asyncio logs a cancelled handler as an error.
        conn.tasks = [asyncio.create_task(self._pump(conn, reader, t_writer, up=True)),
                      asyncio.create_task(self._pump(conn, t_reader, writer, up=False))]

    async def _pump(self, conn: _Conn, src: asyncio.StreamReader, dst: asyncio.StreamWriter, up: bool) -> None:
        """One direction: read chunks as they come, deliver each when it is due, in order."""
        queue: asyncio.Queue[tuple[float, bytes | None]] = asyncio.Queue(QUEUE_CHUNKS)
        deliver = asyncio.create_task(self._deliver(conn, queue, dst))
        conn.tasks.append(deliver)
        while True:
            try:
                data: bytes | None = await src.read(CHUNK)
            except OSError:
                data = None  # reset by the peer: passed on in its turn, like its bytes
            await queue.put((self._due(conn, len(data or b""), up), data))
            if not data:
                break
        await deliver

    def _due(self, conn: _Conn, n: int, up: bool) -> float:
        """When a chunk read now reaches the other end: queued behind the rate limit, half an rtt
        on the wire, and a retransmission timeout later if one of its segments is lost."""
        self._counts["bytes_up" if up else "bytes_down"] += n
        if n and not up and conn.last_up:
            self._counts["round_trips"] += 1
        conn.last_up = up if n else conn.last_up
        sent = self._loop.time()
        if self.rate and n:
            sent = self._busy[up] = max(sent, self._busy[up]) + n / self.rate
        due = sent + self.rtt / 2
        if n and self.loss and self._rng.random() < 1 - (1 - self.loss) ** math.ceil(n / MSS):
            self._counts["stalls"] += 1
            due += max(0.2, 2 * self.rtt)  # and every later chunk waits behind it: the queue is FIFO
        return due

    async def _deliver(self, conn: _Conn, queue: asyncio.Queue[tuple[float, bytes | None]],
                       dst: asyncio.StreamWriter) -> None:
        while True:
            due, data = await queue.get()
            await asyncio.sleep(max(0.0, due - self._loop.time()))
            await self._flowing.wait()
            try:
                if data is None:
                    break
                if not data:
                    if dst.can_write_eof():
                        dst.write_eof()  # half-close, as the sender did
                    break
                dst.write(data)
                await dst.drain()
            except OSError:
                break
        if data or data is None:  # a reset, or the other end gone: the whole connection goes
            self._conns.discard(conn)
            conn.abort()
            return
        conn.open_dirs -= 1
        if conn.open_dirs == 0:
            self._conns.discard(conn)
            for w in conn.writers:
                w.close()
