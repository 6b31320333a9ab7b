"""The console's view of one box: each snapshot folded into what the panes show.

Data flows one way: Box snapshot → ConsoleState.apply → a StateUpdate handed to whoever shows
it. The state composes the stages' runs (console/core/runs.py), the alert book, the feeds
(console/core/feeds/: each feature's part of the poll, its reads beside it, its view) and the
detectors (the same registry as `doctor`'s), so every front end folds the same box the same way.
It owns the log followers, so every byte of every watched log is read once."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

from samai.console.core.alertbook import Alert, AlertBook
from samai.console.core.config import Config, Stage
from samai.console.core.detectors import (
    DETECTORS,
    ROW_DETECTORS,
    DetectorContext,
    DetectorRegistry,
    declared_binaries,
)
from samai.console.core.disk.budget import DiskBudget, disk_budget
from samai.console.core.disk.sizing import ArtifactSizer
from samai.console.core.feeds import Feed, Poll, Read, Surroundings
from samai.console.core.feeds.table import feed_classes
from samai.console.core.kinds import ActionKind
from samai.console.core.logcursor import LogCursor
from samai.console.core.preflight import Preflight, poison_artifacts, preflight
from samai.console.core.preflight.evidence import training_sources
from samai.console.core.runs import StageRuns
from samai.console.core.update import ProcessRow, StageView, StateUpdate
from samai.remote.follow import LogFollower
from samai.remote.model import Severity, Snapshot

F = TypeVar("F", bound=Feed)


class ConsoleState:
    """One box as the console knows it, poll after poll. row_only: a fleet row's share of it (the
    stages, the disk, the GPUs and what raises an alert): the probe sends only the stages'
    processes, and only the feeds marked `row` run. headless: the watcher's and doctor's (the
    feeds that only the box screen shows, its watchers' status and the disk's largest users, do not run)."""

    def __init__(self, config: Config, detectors: DetectorRegistry = DETECTORS, *, row_only: bool = False,
                 headless: bool = False, around: Surroundings | None = None,
                 clock: Callable[[], float] | None = None) -> None:
        import time

        self.config = config
        self.detectors = detectors  # the same registry as `doctor`'s: the same box, the same findings
        self.row_only = row_only
        self.clock = clock or time.time
        self.book = AlertBook()
        self.snapshot: Snapshot | None = None
        self.received_at: float | None = None
        self.stages = StageRuns(config, self.book, lambda: self.received_at or 0.0)
        self.sizer = ArtifactSizer([(a.name, a.path) for a in config.artifacts] + poison_artifacts(config))
        self.last_update: StateUpdate | None = None  # the last poll's: what a read beside the poll amends
        self._cpu: dict[tuple[int, float], tuple[float, float]] = {}
        self._standing: set[tuple[str, str]] = set()
        around = around or Surroundings()
        self.one_look = around.one_look
        self.feeds: list[Feed] = [cls(self, around) for cls in feed_classes()
                                  if (cls.row or not row_only) and (cls.headless or not headless)]

    def feed(self, kind: type[F]) -> F | None:
        """This state's feed of that kind (None: it does not run here, as a fleet row's)."""
        return next((f for f in self.feeds if isinstance(f, kind)), None)

    @property
    def alerts(self) -> list[Alert]:
        return self.book.alerts

    def active_alerts(self) -> list[Alert]:
        return self.book.active()

    def path_of(self, path: str) -> str:
        return self.config.path_of(path)

    def running(self) -> list[str]:
        return self.stages.running()

    # ------------------------------------------------------------ one poll

    def followers(self, cursor: LogCursor | None = None) -> list[LogFollower]:
        """Every log the next poll reads: the stages' marker watches, the feeds', the log pane's."""
        out = [*self.stages.watches.values(), *(f for feed in self.feeds for f in feed.followers())]
        return out + ([cursor.follower] if cursor is not None and cursor.follower is not None else [])

    def request(self, followers: list[LogFollower]) -> dict[str, Any]:
        """The next snapshot's keyword arguments: artifact paths, log cursors, report globs, and the
        feeds' parts (the running servers' ports when they are due)."""
        making = {name for s in self.config.stages if self.stages.status(s.name) == "running" for name in s.makes}
        artifacts, logs = self.sizer.due(self.received_at, making), [f.cursor() for f in followers]
        if self.row_only:
            return {"artifacts": artifacts, "logs": logs, "processes": "stages"}
        now = self.received_at or 0.0
        parts: dict[str, Any] = {}
        for feed in self.feeds:
            parts.update(feed.request(now))
        return {"artifacts": artifacts, "logs": logs, "reports": self.config.ui.reports, "writers": True,
                "binaries": declared_binaries(self.config), **parts}

    def prepare(self, snap: Snapshot) -> None:
        """The feeds' parsing of a snapshot, ahead of apply: the session runs it in a worker thread."""
        for feed in self.feeds:
            feed.prepare(snap)

    def apply(self, snap: Snapshot, followers: list[LogFollower], now: float, *, cursor: LogCursor | None = None,
              connected: bool = False) -> StateUpdate:
        """Fold in a snapshot taken with the cursors of `followers` (in that order). connected: the
        first poll after a (re)connect."""
        states = self.stages.settled(snap.states, one_look=self.one_look)
        snap = replace(snap, artifacts=self.sizer.merge(snap.artifacts, now), states=states)
        self.snapshot, self.received_at = snap, now
        new_runs, resolved = self.stages.new_runs(snap, now)  # before the logs: a new run's lines start it clean
        restarted = cursor.new_runs(new_runs) if cursor is not None else None
        chunks = {id(f): chunk for f, chunk in zip(followers, snap.logs, strict=True)}
        new_alerts: list[Alert] = []
        for stage in self.config.stages:
            watch = self.stages.watches[stage.name]
            if id(watch) in chunks:  # (replaced while this snapshot was in flight: a new run)
                new_alerts += self.stages.read(stage, chunks[id(watch)], snap)
        log = None
        if cursor is not None and cursor.follower is not None:
            shown = next((f for f in followers if f is cursor.follower), cursor.follower)
            log = cursor.consume(shown, chunks.get(id(shown)), restarted)
        budget = disk_budget(self.config, snap)
        statuses = self.stages.statuses()
        stages = []
        for stage in self.config.stages:
            view, ended = self.stages.view(stage, snap, lambda s: self._blocked(s, snap, budget))
            stages.append(view)
            new_alerts += [ended] if ended else []
        now_statuses = self.stages.statuses()
        if any(was != now_statuses.get(name) for name, was in statuses.items()):
            self.sizer.refresh_all()  # what a stage made (or removed) is sized in the next poll
        poll = Poll(snap, chunks, frozenset(new_runs), connected, stages, budget, now)
        for feed in self.feeds:
            new_alerts += feed.fold(poll)
        new_alerts += self._findings(self.detector_context(snap, budget))
        resolved += self._resolve_gone(snap, now)
        self.book.raise_all(new_alerts)
        update = StateUpdate(snap, stages, budget, self._process_rows(snap), self.book.alerts, new_alerts,
                             # The first poll shows the alerts whatever came before it.
                             bool(new_alerts or resolved) or self.last_update is None, now, log,
                             {type(v): v for feed in self.feeds if (v := feed.view()) is not None})
        self.last_update = update
        return update

    def _blocked(self, stage: Stage, snap: Snapshot, budget: DiskBudget) -> bool:
        """An idle stage its preflight would refuse, or one that takes on a training run whose log
        has an error-level finding (the fire's preflight reads the log itself)."""
        return not self.row_only and (preflight(self.config, snap, stage, budget, self.step_rate()).blocked
                                      or self.unproven(stage))

    def step_rate(self) -> float | None:
        """The training run's steps a second, as last measured (what a preflight weighs a save interval by)."""
        from samai.console.core.training.feed import TrainingFeed

        training = self.feed(TrainingFeed)
        return training.step_rate() if training else None

    def unproven(self, stage: Stage) -> bool:
        from samai.console.core.training.feed import TrainingFeed

        training = self.feed(TrainingFeed)
        train = self.config.stage(training.stage) if training and training.stage else None
        return train is not None and training is not None and train in training_sources(self.config, stage) \
            and training.unproven()

    def detector_context(self, snap: Snapshot, budget: DiskBudget | None = None) -> DetectorContext:
        """What the detectors read: the snapshot, and what the feeds know (read beside the poll, or
        kept across polls)."""
        if self.row_only:  # only the stages' processes: not the table the process detectors judge
            snap = replace(snap, processes=())
        parts: dict[str, Any] = {}
        for feed in self.feeds:
            parts.update(feed.context())
        return DetectorContext.of(self.config, snap, budget, **parts)

    def _findings(self, ctx: DetectorContext, only: tuple[str, ...] | None = None) -> list[Alert]:
        """Detector findings as alerts: once when they appear, again only if they go and come back.
        A detector that raises is its own internal_error finding: the poll goes on. only: these
        detectors alone (a read beside the poll); what the others found stands until the next poll."""
        findings = self.detectors.run(ctx, only or (ROW_DETECTORS if self.row_only else None))
        new = [f for f in findings if f.key not in self._standing]
        self._standing = {f.key for f in findings} | (self._standing if only else set())
        return [Alert(self.received_at or 0.0, f.severity, f.message, code=f.code, action=f.action,
                      hint="x fix" if f.action else "", finding=f.key) for f in new]

    def _resolve_gone(self, snap: Snapshot, now: float) -> int:
        """Alerts whose condition no longer holds: a finding absent now, a process to kill that is
        gone, a box that answers again."""
        def gone(a: Alert) -> bool:
            if a.finding is not None and a.finding not in self._standing:
                return True
            if a.action is not None and a.action.kind is ActionKind.KILL:
                return snap.same_process(a.action.pid, a.action.start_time) is None
            return a.code == "box_unreachable"
        return self.book.resolve(gone, now)

    def _process_rows(self, snap: Snapshot) -> list[ProcessRow]:
        stage_of = {rec.pgid: rec.stage for rec in snap.states}
        ports: dict[int, list[int]] = {}
        for s in snap.listeners:
            if s.pid is not None:
                ports.setdefault(s.pid, []).append(s.port)
        cpu: dict[tuple[int, float], tuple[float, float]] = {}
        rows = []
        for p in snap.processes:
            if p.pid == snap.probe_pid:
                continue  # the probe looking at itself is noise
            key = (p.pid, p.start_time)
            cpu[key] = (p.cpu_time, snap.time)
            percent = p.cpu_percent
            if key in self._cpu:
                t0, w0 = self._cpu[key]
                if snap.time > w0:
                    percent = round(100 * (p.cpu_time - t0) / (snap.time - w0), 1)
            rows.append(ProcessRow(p, stage_of.get(p.pgid), percent, tuple(sorted(set(ports.get(p.pid, ()))))))
        self._cpu = cpu
        return rows

    # ------------------------------------------------------------ beside the poll

    def fold_read(self, feed: Feed, read: Read | None, reading: Any, now: float) -> StateUpdate | None:
        """What a feed read beside the poll, folded in and judged at once by its detectors: the last
        poll's update with the alerts as they now stand and that feed's view (None before the first
        poll, whose update shows everything). read None: it failed (its view may say why)."""
        return self.fold_beside(feed, lambda: read.fold(reading, now) if read is not None else None, now)

    def fold_beside(self, feed: Feed, fold: Callable[[], list[Alert] | None], now: float) -> StateUpdate | None:
        """Something a feed learnt beside the poll (a read, a reference the operator picked) folded
        in by `fold` (its alerts; None: nothing to judge again), then its detectors run."""
        before = list(self.book.alerts)
        new = fold()
        if new is not None and self.snapshot is not None and feed.detectors:
            new += self._findings(self.detector_context(self.snapshot), feed.detectors)
        self.book.raise_all(new or [])
        view = feed.view()
        if self.last_update is None or (self.book.alerts == before and view is None):
            return None
        return self.last_update.beside_poll(new or [], self.book.alerts, now, {type(view): view} if view else {})

    def raise_alert(self, alert: Alert, now: float) -> StateUpdate | None:
        """An alert raised outside a poll (a failed fire, the box gone quiet). A failed fire's
        alert replaces a poll's alert of the same run's end: one failure, one alert."""
        self.book.raise_failed_fire(alert)
        return self.last_update.beside_poll([alert], self.book.alerts, now, {}) if self.last_update else None

    def failed_poll(self, error: str, now: float) -> StateUpdate | None:
        """The box stopped answering: the outage alert (resolved by the next snapshot)."""
        return self.raise_alert(Alert(now, "error", f"box not answering: {error}", code="box_unreachable"), now)

    def run_alert(self, stage: str, severity: Severity, text: str, code: str = "") -> Alert:
        return self.stages.alert(stage, severity, text, code)

    def preflight(self, name: str) -> Preflight | None:
        stage = self.config.stage(name)
        return preflight(self.config, self.snapshot, stage, step_rate=self.step_rate()) \
            if stage and self.snapshot else None

    # ------------------------------------------------------------ what a watcher leaves for the next

    def seed_statuses(self, statuses: dict[str, str], looked_at: float | None = None) -> None:
        self.stages.seed_statuses(statuses, looked_at)

    def stage_statuses(self) -> dict[str, str]:
        return self.stages.statuses()

    def stage_views(self) -> list[StageView]:
        return self.last_update.stages if self.last_update else []
