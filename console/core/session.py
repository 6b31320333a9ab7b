"""One box watched: its Box (opened on the first poll), its ConsoleState, the poll loop, and the
feeds' reads beside the poll.

Every front end runs on a BoxSession: the box screen, each row of the fleet, the watcher
(`watch`) and `doctor` (one look: `look_once`). So a box is polled, read beside the poll,
backed off and reconnected the same way wherever it is shown, and every front end raises the
same alerts from it. The session does the I/O; what it reads is folded into the state by the
state's own methods, and each poll's StateUpdate (and each read's) is handed to whoever shows it."""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from samai.console.core.backoff import Backoff
from samai.console.core.config import Config
from samai.console.core.feeds import Feed, Read, Surroundings
from samai.console.core.logcursor import LogCursor
from samai.console.core.state import ConsoleState
from samai.console.core.update import StateUpdate
from samai.remote.boxapi import Box, BoxError
from samai.remote.targets import TargetError
from samai.remote.transport import TransportError

CATCH_UP_S = 0.05  # the log pane behind a flood asks again at once
MIN_GAP = 0.1  # of the interval, between a poll that took longer than the interval and the next
MIN_PAUSE_S = 0.25  # and at least this (or the interval, if shorter): a slow box is never asked back to back
BOX_ERRORS = (BoxError, TransportError, TargetError, OSError, TimeoutError)

OpenBox = Callable[[Config], Box]
Link = Literal["connecting", "connected", "unreachable", "lost"]  # unreachable: never answered yet
Report = Callable[["StateUpdate | PollFailed"], "Awaitable[None] | None"]


def error_text(e: BaseException) -> str:
    """Why a box could not be read, in one line. Anything but the box errors is a bug below
    (a reply no layer turned into a BoxError): named by its type, and it ends no poll."""
    if isinstance(e, BOX_ERRORS):
        return str(e) or type(e).__name__
    return f"internal error reading the box: {type(e).__name__}: {e}"


@dataclass(frozen=True)
class PollFailed:
    """One poll that got no snapshot: why, in one line, and the exception (a bug when it is not a box error)."""

    error: str
    exception: BaseException
    link_was: Link
    update: StateUpdate | None = None  # the outage alert, as the panes show it (when the box had been answering)

    @property
    def bug(self) -> bool:
        return not isinstance(self.exception, BOX_ERRORS)


async def _handed(report: Report, result: StateUpdate | PollFailed) -> None:
    said = report(result)
    if inspect.isawaitable(said):
        await said


def pause_after(interval: float, took: float) -> float:
    """The pause after a poll that took `took` seconds: the rest of the interval, or a tenth of
    it (at least MIN_PAUSE_S, at most the interval) after a poll that took longer."""
    return max(interval - took, interval * MIN_GAP, min(interval, MIN_PAUSE_S))


class BoxSession:
    """row_only: a fleet row's share of the box; headless: the watcher's and doctor's (no log pane,
    no feed that only the box screen shows); log: the box screen's, with the log pane's cursor.
    monotonic and sleep time the poll loop (a test's own clock)."""

    def __init__(self, config: Config, open_box: OpenBox, *, clock: Callable[[], float] = time.time,
                 row_only: bool = False, headless: bool = False, around: Surroundings | None = None,
                 log: bool = False, monotonic: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.config = config
        self.state = ConsoleState(config, row_only=row_only, headless=headless, around=around, clock=clock)
        self.cursor = LogCursor(config) if log else None
        self.box: Box | None = None
        self.link: Link = "connecting"
        self.read_errors: dict[str, str] = {}  # each read beside the poll that failed last, and why
        self._open_box, self._clock = open_box, clock
        self._monotonic, self._sleep = monotonic, sleep
        self._reads: dict[str, asyncio.Task[None]] = {}  # the reads in flight, by what they read

    def connected_box(self) -> Box:
        """The box, opened on first use (opening connects lazily: the first call does)."""
        if self.box is None:
            self.box = self._open_box(self.config)
        return self.box

    async def poll_once(self) -> StateUpdate | PollFailed:
        """One snapshot, folded in. A failure to read it is a PollFailed (the state raises the
        outage alert when the box had been answering); a bug folding it in raises."""
        try:
            followers = self.state.followers(self.cursor)
            snap = await self.connected_box().snapshot(**self.state.request(followers))  # the Box's own deadline
        except Exception as e:  # nothing read from the box ends the poll: it is said, and asked again
            return self._failed(e)
        connected, self.link = self.link != "connected", "connected"
        await asyncio.to_thread(self.state.prepare, snap)  # a large /metrics body parsed off the event loop
        return self.state.apply(snap, followers, self._clock(), cursor=self.cursor, connected=connected)

    def _failed(self, e: BaseException) -> PollFailed:
        error = error_text(e)
        update = self.state.failed_poll(error, self._clock()) if self.link == "connected" else None
        failed = PollFailed(error, e, self.link, update)
        self.link = "unreachable" if self.link in ("connecting", "unreachable") else "lost"
        return failed

    # ------------------------------------------------------------ the reads beside the poll

    def due_reads(self) -> list[tuple[Feed, Read]]:
        """The feeds' reads due now, but those still in flight."""
        now = self._clock()
        return [(feed, read) for feed in self.state.feeds for read in feed.reads(now) if read.what not in self._reads]

    def start_reads(self, report: Report, on_bug: Callable[[Exception], None]) -> None:
        """The due reads started, each beside the polls (a slow one holds no poll), its update reported."""
        for feed, read in self.due_reads():
            task = asyncio.create_task(self._read(feed, read, report, on_bug))
            self._reads[read.what] = task
            task.add_done_callback(functools.partial(self._read_done, read.what))

    def _read_done(self, what: str, task: asyncio.Task[None]) -> None:
        self._reads.pop(what, None)

    def read_again(self, kind: type[Feed], report: Report, on_bug: Callable[[Exception], None]) -> None:
        """A feed read again now (the operator changed what it reads: an uninstall, an acknowledgement)."""
        feed = self.state.feed(kind)
        if feed is not None:
            feed.refresh()
            self.start_reads(report, on_bug)

    async def read_due(self) -> list[StateUpdate]:
        """Every due read, awaited (one look: doctor's, watch --once's); the updates they made."""
        updates: list[StateUpdate] = []

        def kept(update: StateUpdate | PollFailed) -> None:
            if isinstance(update, StateUpdate):
                updates.append(update)

        await asyncio.gather(*(self._read(feed, read, kept, self._raise) for feed, read in self.due_reads()))
        return updates

    @staticmethod
    def _raise(e: Exception) -> None:
        raise e

    async def _read(self, feed: Feed, read: Read, report: Report, on_bug: Callable[[Exception], None]) -> None:
        folded: Read | None = None  # None: it did not answer (the feed's view may say why)
        reading: Any = None
        try:
            reading, folded = await read.fetch(self.connected_box()), read
            self.read_errors.pop(read.what, None)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a box error is said where the feed shows it; a bug goes to on_bug
            if not isinstance(e, BOX_ERRORS):
                on_bug(e)
                return
            self.read_errors[read.what] = error_text(e)
            read.failed(error_text(e))
        try:
            update = self.state.fold_read(feed, folded, reading, self._clock())
            if update is not None:
                await _handed(report, update)
        except Exception as e:  # a bug folding it in must not end the session
            on_bug(e)

    # ------------------------------------------------------------ the loop

    async def look_once(self) -> StateUpdate | PollFailed:
        """One look at the box as doctor and `watch --once` take it: a poll, then every read due."""
        result = await self.poll_once()
        if not isinstance(result, PollFailed):
            await self.read_due()
            return self.state.last_update or result
        return result

    async def run(self, report: Report, on_bug: Callable[[Exception], None], *,
                  before: Callable[[], Awaitable[None]] | None = None) -> None:
        """Poll until cancelled, a poll every interval from the start of the last (a poll that took
        longer is followed after a short pause, pause_after: what happens on the box is seen at most
        an interval plus one poll after it, however slow the box or its reader); a box that does
        not answer is asked again with backoff. After each poll the due reads start beside it. A bug
        folding in or showing a snapshot goes to on_bug and ends nothing. before: awaited ahead of
        each poll (the watcher's first look at what the last watcher left)."""
        backoff = Backoff(self.config.target.poll_interval)
        while True:
            result: StateUpdate | PollFailed | None
            started = self._monotonic()
            try:
                if before is not None:
                    await before()
                result = await self.poll_once()
                await _handed(report, result)
                if not isinstance(result, PollFailed):
                    self.start_reads(report, on_bug)
            except Exception as e:  # a bug in folding it in or showing it must not stop the polling
                on_bug(e)
                result = None
            if isinstance(result, PollFailed):
                await self._sleep(backoff.failed())
                continue
            backoff.answered()
            if result is not None and self._behind(result):
                await self._sleep(CATCH_UP_S)
            else:
                took = self._monotonic() - started
                await self._sleep(pause_after(backoff.interval, took))

    def _behind(self, u: StateUpdate) -> bool:
        """Whether the shown log has more bytes waiting than one poll brought."""
        return u.log is not None and self.cursor is not None and u.log.source is self.cursor.follower \
            and bool(u.snapshot.logs) and u.snapshot.logs[-1].more

    async def close(self) -> None:
        reads, self._reads = list(self._reads.values()), {}
        for task in reads:
            task.cancel()
        await asyncio.gather(*reads, return_exceptions=True)
        box, self.box = self.box, None
        if box is not None:
            await box.close()
