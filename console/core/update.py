"""What one poll (or one read beside it) hands the panes: the box's core (its snapshot, stages,
disk budget, processes and alerts), the log pane's lines, and one view per feed that has
something to show. Light on purpose: the widgets import it, and nothing here reads the box."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Literal, TypeVar

from samai.remote.model import RunStatus

if TYPE_CHECKING:
    from samai.console.core.alertbook import Alert
    from samai.console.core.disk.budget import DiskBudget
    from samai.console.core.progress import Progress
    from samai.remote.follow import LogFollower
    from samai.remote.model import Death, Marker, Process, Snapshot

StageStatus = RunStatus | Literal["idle", "blocked"]  # blocked: idle, and its preflight would refuse it
V = TypeVar("V")


@dataclass(frozen=True)
class PreviousRun:
    """What is kept of a stage's earlier run once a new one starts: how it ended, its last marker."""

    fired_at: float
    status: str
    rc: int | None
    last_marker: str | None


@dataclass(frozen=True)
class StageView:
    name: str
    key: str
    status: StageStatus
    since: float | None  # fired_at of the recorded run
    pid: int | None
    rc: int | None
    last_marker: str | None
    last_marker_severity: str = "info"
    previous: PreviousRun | None = None  # the stage's run before this one
    progress: Progress | None = None  # how far a running stage is, from its log (steps, bytes, build step)
    death: Death | None = None  # why its last run died (console/core/death.py)


@dataclass(frozen=True)
class ProcessRow:
    process: Process
    stage: str | None
    cpu_percent: float  # over the last poll interval when known, else the lifetime average
    ports: tuple[int, ...]


@dataclass(frozen=True)
class LogLines:
    """The log pane's share of a poll: what its cursor's log brought (console/core/logcursor.py)."""

    source: LogFollower  # the follower they came from: appended only while it is the one shown
    stage: str | None  # whose log it is (None: a file)
    path: str
    markers: tuple[Marker, ...]  # what the pane highlights in it
    lines: list[str] = field(default_factory=list)
    notice: str | None = None
    restarted: str | None = None  # the shown stage's new run: the pane starts again with its file


@dataclass
class StateUpdate:
    snapshot: Snapshot
    stages: list[StageView]
    budget: DiskBudget
    processes: list[ProcessRow]
    alerts: list[Alert] = field(default_factory=list)  # every alert as it now stands, newest first
    new_alerts: list[Alert] = field(default_factory=list)
    alerts_changed: bool = False  # an alert was raised or resolved
    now: float = 0.0  # when it was folded in (the console's clock)
    log: LogLines | None = None  # the log pane's lines (None: no log shown, or a read beside the poll)
    views: dict[type, object] = field(default_factory=dict)  # each feed's view, by its type
    beside: bool = False  # a read beside the poll amended the last poll's update (no new snapshot)

    def view(self, kind: type[V]) -> V | None:
        """A feed's view in this update (None: that feed has nothing to show now)."""
        found = self.views.get(kind)
        return found if isinstance(found, kind) else None

    def beside_poll(self, new_alerts: list[Alert], alerts: list[Alert], now: float,
                    views: dict[type, object]) -> StateUpdate:
        """This poll's update as a read beside it amends it: the alerts as they now stand and that
        read's views, with nothing to append again (no log lines, no curve points)."""
        return replace(self, new_alerts=new_alerts, alerts=alerts, alerts_changed=True, now=now, log=None,
                       views=views, beside=True)
