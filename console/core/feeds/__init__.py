"""Feeds: one feature's whole data path, in one place.

A feed may add to the poll's probe request (`request`) and follow logs in it (`followers`),
folds each poll's snapshot (`fold`), may read the box beside the poll when that is due (`reads`:
each a fetch and its fold), gives the detectors what it knows (`context`), and the panes a view of
it (`view`). feed_classes() (table.py) is the one table: the box session runs every feed of it (a fleet row only
those marked `row`, `watch` and `doctor` those marked `headless`), so the TUI, the watcher,
`doctor` and the fleet rows see the same box and raise the same alerts from it (k9s keeps one
registry row per resource; nvitop's api serves every front end the same way).

A feed reads the box only through its reads, which the session runs; it never writes into a pane:
what a pane shows of it is its view, in the update the session hands down."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

if TYPE_CHECKING:
    from samai.console.core.alertbook import Alert, AlertBook
    from samai.console.core.config import Config
    from samai.console.core.disk.budget import DiskBudget
    from samai.console.core.multinode.session import MultiNodeSession
    from samai.console.core.runs import StageRuns
    from samai.console.core.update import StageView
    from samai.remote.boxapi import Box
    from samai.remote.follow import LogFollower
    from samai.remote.model import LogChunk, Severity, Snapshot


@dataclass(frozen=True)
class Poll:
    """One poll as a feed folds it."""

    snapshot: Snapshot
    chunks: Mapping[int, LogChunk]  # each follower's chunk, by id(follower)
    new_runs: frozenset[str]  # the stages whose new run this poll saw start
    connected: bool  # the first poll after a (re)connect
    stages: list[StageView]
    budget: DiskBudget
    now: float


@dataclass(frozen=True)
class Read:
    """One read of the box beside the poll: what it is (one in flight per `what`; said when it
    fails), how it reads, and how what it read is folded in (the alerts it raises of its own)."""

    what: str
    fetch: Callable[[Box], Awaitable[Any]]
    fold: Callable[[Any, float], list[Alert]]
    failed: Callable[[str], None] = lambda error: None  # why it did not answer, for a view that says it


@dataclass(frozen=True)
class Surroundings:
    """What a feed may need beyond the box's session: which box of the fleet it is, and the app's
    connections to the nodes of multi-node stages (None: a session without them, as a fleet row)."""

    box_name: str | None = None
    nodes: Callable[[], MultiNodeSession] | None = None
    one_look: bool = False  # doctor's: one reading, no history (the serving watch judges it alone)


class FeedHost(Protocol):
    """What a feed reads of the state that runs it (console/core/state.py ConsoleState is one)."""

    config: Config
    row_only: bool
    book: AlertBook
    snapshot: Snapshot | None
    received_at: float | None
    stages: StageRuns

    def clock(self) -> float: ...

    def running(self) -> list[str]: ...

    def run_alert(self, stage: str, severity: Severity, text: str, code: str = "") -> Alert: ...


class Feed:
    name: ClassVar[str] = ""
    row: ClassVar[bool] = False  # a fleet row runs it too
    headless: ClassVar[bool] = True  # `watch` and `doctor` run it (False: the box screen's alone)
    detectors: ClassVar[tuple[str, ...]] = ()  # the detectors that judge it, run again after each read

    def __init__(self, state: FeedHost, around: Surroundings) -> None:
        self.state, self.config, self.around = state, state.config, around

    def followers(self) -> list[LogFollower]:
        """The logs it follows in the poll (their cursors ride with the probe's request)."""
        return []

    def request(self, now: float) -> dict[str, Any]:
        """Its part of the probe's request."""
        return {}

    def prepare(self, snap: Snapshot) -> None:
        """Parse what of the snapshot costs to parse, into the feed's own keeping for fold: called in
        a worker thread before the poll is folded in (pure work; nothing else of the state is read
        or written there)."""

    def fold(self, poll: Poll) -> list[Alert]:
        """A poll folded in; the alerts it raises of its own (the detectors' are the state's)."""
        return []

    def reads(self, now: float) -> list[Read]:
        """Its reads beside the poll that are due now (each taken as asked: a slow read is not asked twice)."""
        return []

    def refresh(self) -> None:
        """Read again at the next chance (something the operator did changed what it reads)."""

    def context(self) -> dict[str, Any]:
        """Its share of the detectors' context (console/core/detectors.py DetectorContext)."""
        return {}

    def view(self) -> object | None:
        """What the panes show of it now (None: nothing new)."""
        return None
