"""The watchers feed: who watches the box with nobody at the keys (the status line says "watched
by …" from the lease holder's live heartbeat), read from its watch folder every WATCHERS_READ_S
and at once after an acknowledgement. The box screen's alone: a watcher knows its own."""

from __future__ import annotations

from dataclasses import dataclass

from samai.console.core.alertbook import Alert
from samai.console.core.feeds import Feed, Read, Surroundings
from samai.remote.model import WatchShared

WATCHERS_READ_S = 30.0  # how often the box's watch folder is read: its heartbeats change every few seconds


@dataclass(frozen=True)
class Watched:
    words: str  # "watched by op@host · last sent 3 min ago", a watcher gone silent, "not watched"
    ok: bool  # good news


class WatchersFeed(Feed):
    name = "watchers"
    headless = False

    def __init__(self, state, around: Surroundings) -> None:
        super().__init__(state, around)
        self.shared: WatchShared | None = None
        self._asked = float("-inf")
        self._new = False

    def refresh(self) -> None:
        """Read again at once (an acknowledgement changed it)."""
        self._asked = float("-inf")

    def reads(self, now: float) -> list[Read]:
        if now - self._asked < WATCHERS_READ_S:
            return []
        self._asked = now
        return [Read("the box's watchers", lambda box: box.watchers(), self._read)]

    def _read(self, shared: WatchShared, now: float) -> list[Alert]:
        self.shared, self._new = shared, True
        return []

    def view(self) -> Watched | None:
        from samai.console.core.watch.seen import watched_words

        if self.shared is None or not self._new:
            return None
        self._new = False
        return Watched(*watched_words(self.shared, self.shared.now))
