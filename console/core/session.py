"""One box watched: its Box (opened on the first poll), its ConsoleState, and the poll loop.

The box screen and each row of the fleet run on a BoxSession, so a box is polled, backed off
and reconnected the same way wherever it is shown. The session does the I/O; what it reads is
folded into the state by the state's own methods, and each poll's StateUpdate is handed to
whoever shows it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from samai.console.core.backoff import Backoff
from samai.console.core.config import Config
from samai.console.core.state import ConsoleState, StateUpdate
from samai.remote.boxapi import Box, BoxError
from samai.remote.targets import TargetError
from samai.remote.transport import TransportError

CATCH_UP_S = 0.05  # the log pane behind a flood asks again at once
BOX_ERRORS = (BoxError, TransportError, TargetError, OSError, TimeoutError)

OpenBox = Callable[[Config], Box]
Link = Literal["connecting", "connected", "unreachable", "lost"]  # unreachable: never answered yet


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


class BoxSession:
    def __init__(self, config: Config, open_box: OpenBox, *, clock: Callable[[], float] = time.time,
                 row_only: bool = False) -> None:
        self.config = config
        self.state = ConsoleState(config, row_only=row_only)  # row_only: a fleet row's share of the box
        self.box: Box | None = None
        self.link: Link = "connecting"
        self._open_box, self._clock = open_box, clock

    def connected_box(self) -> Box:
        """The box, opened on first use (opening connects lazily: the first call does)."""
        if self.box is None:
            self.box = self._open_box(self.config)
        return self.box

    async def poll_once(self) -> StateUpdate | PollFailed:
        """One snapshot, folded in. A failure to read it is a PollFailed (the state raises the
        outage alert when the box had been answering); a bug folding it in raises."""
        try:
            followers = self.state.followers()
            snap = await self.connected_box().snapshot(**self.state.request(followers))  # the Box's own deadline
        except Exception as e:  # nothing read from the box ends the poll: it is said, and asked again
            return self._failed(e)
        self.link = "connected"
        return self.state.apply(snap, followers, self._clock())

    def _failed(self, e: BaseException) -> PollFailed:
        error = error_text(e)
        update = self.state.failed_poll(error, self._clock()) if self.link == "connected" else None
        failed = PollFailed(error, e, self.link, update)
        self.link = "unreachable" if self.link in ("connecting", "unreachable") else "lost"
        return failed

    async def run(self, report: Callable[[StateUpdate | PollFailed], None],
                  on_bug: Callable[[Exception], None]) -> None:
        """Poll until cancelled, the next poll when the last is done and shown; a box that does not
        answer is asked again with backoff. A bug folding in or showing a snapshot goes to on_bug
        and ends nothing."""
        backoff = Backoff(self.config.target.poll_interval)
        while True:
            try:
                result = await self.poll_once()
                report(result)
            except Exception as e:  # a bug in folding it in or showing it must not stop the polling
                on_bug(e)
                result = None
            if isinstance(result, PollFailed):
                await asyncio.sleep(backoff.failed())
                continue
            backoff.answered()
            await asyncio.sleep(CATCH_UP_S if result is not None and self._behind(result) else backoff.interval)

    def _behind(self, u: StateUpdate) -> bool:
        """Whether the shown log has more bytes waiting than one poll brought."""
        return u.log_source is not None and u.log_source is self.state.shown and bool(u.snapshot.logs) \
            and u.snapshot.logs[-1].more

    async def close(self) -> None:
        box, self.box = self.box, None
        if box is not None:
            await box.close()
