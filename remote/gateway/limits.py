"""Connection limits: how many connections may wait for their headers, how many requests may be at work, and the
deadlines that keep a silent or slow client from holding either.

Every connection is in one of two pools. It is *pending* from the moment it is accepted until its request line
and headers have arrived, and again while a kept-alive connection waits for its next request; a request without
the token stays pending until its reply is sent and the connection closed. It is *active* from the moment its
headers carry the token until its reply has been sent. Only the token holder's requests take the active pool, so
no number of connections without it can take the slots that run payloads.

A new connection over a pending cap (in all, or for its client address) closes the OLDEST pending connection,
not itself: a flood that holds its connections open would otherwise lock every newcomer out, the token holder
included, while this way a newcomer always gets the time its headers take to arrive.
"""

from __future__ import annotations

import socket
import threading
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, fields, replace

# The request line and headers must all arrive this many seconds after the connection was accepted: a client
# sends them in one packet, so only a slow-loris client needs longer.
HEADER_TIMEOUT_S = 5.0
# How long a kept-alive connection waits for its next request: longer than the 5 s after which the console's HTTP
# client drops an idle connection itself, so it never sends a request on one the gateway is closing.
KEEP_ALIVE_S = 15.0
# Pending connections in all and from one address. Each costs a thread and a descriptor; 64 is far more than the
# console opens at once, and 16 per address leaves the pool to others when one address floods it.
MAX_PENDING = 64
MAX_PENDING_PER_CLIENT = 16
# Requests with the token at work at once (body, run, reply): each may run a payload interpreter. More are
# answered 503 with Retry-After, before their body is read.
MAX_ACTIVE = 16
BUSY_RETRY_AFTER_S = 1
# The body must arrive within BODY_TIMEOUT_S plus its declared length at BODY_MIN_RATE bytes a second: the floor
# covers a small body on a distant link, the rate a slow uplink (the largest default body, 4 MiB, gets 74 s).
BODY_TIMEOUT_S = 10.0
BODY_MIN_RATE = 64 * 1024
# The request line and headers together: the console sends about 300 bytes; 16 KiB bounds what each pending
# connection may make the gateway hold (the standard library's own caps are 64 KiB a line and 100 header lines).
MAX_HEAD_BYTES = 16 * 1024

# Descriptors, to fit the limits to the process's open-file limit. An active request holds its connection and,
# while its payload starts, the eight pipe ends Popen opens (stdin, stdout, stderr and the child's exec-error
# pipe), then the selector that reads the child's output.
FDS_PER_ACTIVE = 10
# What the gateway holds besides connections: stdio, the listening socket and its selector, the log, the
# interpreter's own files, and room for a connection being accepted while another is closing.
FDS_SPARE = 32


@dataclass(frozen=True)
class Limits:
    max_pending: int = MAX_PENDING
    max_pending_per_client: int = MAX_PENDING_PER_CLIENT
    max_active: int = MAX_ACTIVE
    header_timeout_s: float = HEADER_TIMEOUT_S
    keep_alive_s: float = KEEP_ALIVE_S
    body_timeout_s: float = BODY_TIMEOUT_S
    body_min_rate: int = BODY_MIN_RATE
    max_head_bytes: int = MAX_HEAD_BYTES

    def __post_init__(self) -> None:
        for field in fields(self):
            if not getattr(self, field.name) > 0:
                raise ValueError(f"{field.name} must be positive")

    def body_deadline_s(self, length: int) -> float:
        """How long a body of LENGTH bytes may take to arrive."""
        return self.body_timeout_s + length / self.body_min_rate

    def describe(self) -> str:
        return (f"limits: {self.max_pending} pending ({self.max_pending_per_client} per client), "
                f"{self.max_active} active, headers within {self.header_timeout_s:g} s")


def fit_to_open_files(limits: Limits, open_files: int) -> Limits:
    """LIMITS, shrunk where the open-file limit could not hold them all at once: at most half of what is left
    after FDS_SPARE for active requests, the rest for pending connections. ValueError if not even one of each fits.
    """
    budget = open_files - FDS_SPARE
    active = min(limits.max_active, max(1, budget // 2 // FDS_PER_ACTIVE))
    pending = min(limits.max_pending, budget - active * FDS_PER_ACTIVE)
    if pending < 1:
        raise ValueError(f"the open-file limit ({open_files}) is too low for the gateway: it needs at least "
                         f"{FDS_SPARE + FDS_PER_ACTIVE + 1}")
    return replace(limits, max_active=active, max_pending=pending,
                   max_pending_per_client=min(limits.max_pending_per_client, pending))


@dataclass
class _Pending:
    client: str
    deadline: float


class ConnectionSlots:
    """The pending and the active connections. A connection it drops (displaced, or past its deadline) is shut
    down here, under the lock: the handler thread blocked reading it wakes up at once and closes it, and because a
    connection leaves these pools before its socket is closed, a dropped socket is never one already closed."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._pending: OrderedDict[socket.socket, _Pending] = OrderedDict()  # the oldest first
        self._per_client: Counter[str] = Counter()
        self._active: set[socket.socket] = set()
        self._lock = threading.Lock()

    def admit(self, conn: socket.socket, client: str, *, wait_s: float) -> list[str]:
        """CONN is pending for up to WAIT_S seconds. The oldest pending connections it displaced are closed; the
        caps it was over are returned ("16 per client", "64 in all")."""
        with self._lock:
            self._active.discard(conn)
            displaced = []
            if self._per_client[client] >= self.limits.max_pending_per_client:
                self._drop(next(c for c, pending in self._pending.items() if pending.client == client))
                displaced.append(f"{self.limits.max_pending_per_client} per client")
            if len(self._pending) >= self.limits.max_pending:
                self._drop(next(iter(self._pending)))
                displaced.append(f"{self.limits.max_pending} in all")
            self._pending[conn] = _Pending(client, time.monotonic() + wait_s)
            self._per_client[client] += 1
            return displaced

    def holds(self, conn: socket.socket) -> bool:
        """Whether CONN is still in a pool, i.e. was not dropped."""
        with self._lock:
            return conn in self._pending or conn in self._active

    def start_work(self, conn: socket.socket) -> bool:
        """Move CONN from pending to active; False (and CONN stays pending) when every active slot is taken."""
        with self._lock:
            if conn not in self._pending or len(self._active) >= self.limits.max_active:
                return False
            self._forget_pending(conn)
            self._active.add(conn)
            return True

    def release(self, conn: socket.socket) -> None:
        """CONN is about to be closed."""
        with self._lock:
            self._active.discard(conn)
            if conn in self._pending:
                self._forget_pending(conn)

    def drop_overdue(self) -> int:
        """Close the pending connections past their deadline; how many."""
        now = time.monotonic()
        with self._lock:
            overdue = [conn for conn, pending in self._pending.items() if pending.deadline <= now]
            for conn in overdue:
                self._drop(conn)
            return len(overdue)

    def _forget_pending(self, conn: socket.socket) -> None:
        client = self._pending.pop(conn).client
        self._per_client[client] -= 1
        if not self._per_client[client]:
            del self._per_client[client]

    def _drop(self, conn: socket.socket) -> None:
        self._forget_pending(conn)
        try:
            conn.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # the client reset it already
