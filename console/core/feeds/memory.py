"""The memory feed: each running stage's memory over the last polls (console/core/disk/trends.py), so
that one growing towards its limit is said before the OOM killer says it."""

from __future__ import annotations

from typing import Any

from samai.console.core.alertbook import Alert
from samai.console.core.disk.trends import MemoryTrend, MemoryWatch
from samai.console.core.feeds import Feed, Poll, Surroundings


class MemoryFeed(Feed):
    name = "memory"
    row = True
    detectors = ("memory_filling",)

    def __init__(self, state, around: Surroundings) -> None:
        super().__init__(state, around)
        self.watch = MemoryWatch()
        self.trends: tuple[MemoryTrend, ...] = ()

    def fold(self, poll: Poll) -> list[Alert]:
        self.trends = tuple(self.watch.observe(poll.snapshot))
        return []

    def context(self) -> dict[str, Any]:
        return {"memory_trends": self.trends}
