"""The disk feed: how fast the workspace fills (over the last polls), what the next stage would
do to the disk, what the last fired stage did (its SAMAI_DISK lines, which the stages' marker
watches find; and the start line from the head of its log, read once beside the poll, when the
watch began past it: a console opened on a log longer than the lines it scans at start), and,
while the disk pane lists them, the workspace's largest users (a walk of the whole workspace on
the box: asked for when the operator looks, and again every USERS_EVERY_S while they do)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from samai.console.core.alertbook import Alert
from samai.console.core.disk.budget import Projection, project
from samai.console.core.disk.delta import DiskDelta
from samai.console.core.disk.trends import DiskTrend, DiskWatch
from samai.console.core.feeds import Feed, Poll, Read, Surroundings
from samai.console.core.runs import HEAD_BYTES, LogHead
from samai.console.core.update import StageView
from samai.remote.model import DiskUsers

USERS_SHOWN = 12  # the largest users of the workspace the disk pane lists
USERS_EVERY_S = 30.0  # while it lists them: a walk of the whole workspace, so not every poll
USERS_BUDGET_S = 3.0  # the box stops a walk after this long (and says the sizes are partial)


@dataclass(frozen=True)
class Users:
    """The workspace's largest users as last measured, or why they could not be."""

    found: DiskUsers | str
    measured_at: float


@dataclass(frozen=True)
class DiskView:
    projection: Projection | None  # the next stage to run: what it would do to the disk
    delta: DiskDelta | None  # what the last fired stage did to the disk, from its SAMAI_DISK lines
    trend: DiskTrend | None  # how fast the workspace fills, and when it is full at that rate
    users: Users | None = None  # the largest users, when measured (only while the pane lists them)


class DiskFeed(Feed):
    name = "disk"
    row = True
    detectors = ("disk_filling",)

    def __init__(self, state, around: Surroundings) -> None:
        super().__init__(state, around)
        self.watch = DiskWatch()
        self.trend: DiskTrend | None = None
        self.projection: Projection | None = None
        self.users: Users | None = None
        self.listing = False  # the disk pane lists the largest users
        self._users_asked = float("-inf")
        self.delta: DiskDelta | None = None
        self._stages: list[StageView] = []  # the last poll's

    def fold(self, poll: Poll) -> list[Alert]:
        self.trend = self.watch.observe(poll.snapshot)
        self._stages = poll.stages
        self.delta = self._delta()
        if not self.state.row_only:
            upcoming = next((self.config.stage(v.name) for v in poll.stages if v.status in ("idle", "blocked")), None)
            self.projection = project(self.config, poll.budget, upcoming) if upcoming else None
        return []

    def list_users(self, on: bool) -> None:
        """The disk pane lists the largest users (on) or the budget: measured at once, then every USERS_EVERY_S."""
        self.listing = on
        if on:
            self._users_asked = float("-inf")

    def _delta(self) -> DiskDelta | None:
        snap = self.state.snapshot
        return self.state.stages.disk_delta(snap, self._stages) if snap is not None else None

    def reads(self, now: float) -> list[Read]:
        heads = [] if self.state.row_only else [self._head(h) for h in self.state.stages.heads_due()]
        if not self.listing or now - self._users_asked < USERS_EVERY_S:
            return heads
        self._users_asked = now
        return heads + [Read("the workspace's largest users", lambda box: box.disk_users(top=USERS_SHOWN,
                                                                                  budget_s=USERS_BUDGET_S),
                     self._measured, self._not_measured)]

    def _head(self, head: LogHead) -> Read:
        """The first bytes of a run's log: the chain's start line, right after the run's header."""
        return Read(f"the start of {head.stage}'s log", lambda box: box.head(head.path, HEAD_BYTES),
                    lambda data, now: self._head_read(head, data),
                    lambda error: self.state.stages.head_unread(head))

    def _head_read(self, head: LogHead, data: bytes) -> list[Alert]:
        if self.state.snapshot is not None:
            self.state.stages.head_read(head, data, self.state.snapshot)
            self.delta = self._delta()
        return []

    def _measured(self, users: DiskUsers, now: float) -> list[Alert]:
        self.users = Users(users, now)
        return []

    def _not_measured(self, error: str) -> None:
        self.users = Users(error, self.state.clock())

    def context(self) -> dict[str, Any]:
        return {"disk_trend": self.trend}

    def view(self) -> DiskView:
        return DiskView(self.projection, self.delta, self.trend, self.users)
