"""The console's view of the box: snapshots folded into what the panes show.

Data flows one way: Box snapshot → ConsoleState.apply → a StateUpdate the app hands to its
widgets. The state owns the log followers, so every byte of every watched log is read once
and every marker hit is seen once."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from samai.console.core.budget import DiskBudget, Projection, project, workspace_disk
from samai.console.core.chunked_lines import piece_follower
from samai.console.core.config import CHAIN_DONE, Config, Stage
from samai.console.core.death import RunWatch, cause_of_death, death_line, exit_words
from samai.console.core.detectors import (
    CHECKPOINT_DETECTORS,
    DETECTORS,
    ENVIRONMENT_DETECTORS,
    EVAL_DETECTORS,
    ROW_DETECTORS,
    DetectorContext,
    DetectorRegistry,
    Finding,
    declared_binaries,
)
from samai.console.core.diskdelta import DISK_MARKER, DISK_MARKER_NAME, DiskDelta, DiskReading, latest, parse_disk_line
from samai.console.core.evalruns import EvalRun, RunCheck, newest_run
from samai.console.core.fixes import FixAction
from samai.console.core.gpu_findings import GpuWatch, oom_context
from samai.console.core.kinds import ActionKind
from samai.console.core.preflight import Preflight, poison_artifacts, preflight
from samai.console.core.preflight.evidence import training_sources
from samai.console.core.progress import PROGRESS_MARKER, PROGRESS_MARKER_NAME, Progress, parse_line
from samai.console.core.redact import redact
from samai.console.core.serving_watch import ServingView, ServingWatch
from samai.console.core.sizing import ArtifactSizer
from samai.console.core.trainlog import TrainLogCheck, TrainPoint, newest_run_points
from samai.console.core.trainref import CODE, Reference, ReferenceCurve, ReferenceWatch
from samai.console.core.trends import CHECKPOINT_READ_S, DiskTrend, DiskWatch, MemoryTrend, MemoryWatch
from samai.remote.follow import MARKER_SCAN_READ, LogFollower
from samai.remote.model import (
    Checkpoints,
    Death,
    Marker,
    Process,
    PythonPackages,
    RunStatus,
    Severity,
    Snapshot,
    StageRecord,
    WatchShared,
)

MAX_ALERTS = 200
WATCHERS_READ_S = 30.0  # how often the box's watch folder is read: its heartbeats change every few seconds
UNSEEN_GAP_S = 3600.0  # a run fired since the last watcher looked is news if that look was this recent
MARKER_HISTORY_LINES = 500  # how far back a stage log is scanned for markers at start-up
SHOWN_CATCH_UP = 1024 * 1024  # the log pane behind a burst reads up to this per poll (its lines are rendered at once)


@dataclass(frozen=True)
class Alert:
    time: float
    severity: Severity
    text: str
    stage: str | None = None
    hint: str = ""  # the key that fixes it, e.g. "r restart"
    code: str = ""  # a detector's code, e.g. stale_server
    action: FixAction | None = None  # what `x` does about it
    resolved_at: float | None = None  # when its condition stopped holding; None: active
    finding: tuple[str, str] | None = None  # the detector finding it stands for (resolved when it is gone)
    run: float | None = None  # the stage run (fired_at) it is about: resolved when a new run starts

    def __post_init__(self) -> None:  # every alert, whatever raised it: no secrets on screen or kept
        object.__setattr__(self, "text", redact(self.text))

    @property
    def active(self) -> bool:
        return self.resolved_at is None


RUN_ENDED = "run_ended"  # the alert of a run seen running that ended badly (ConsoleState._ended)
FIRE_FAILED = "fire_failed"  # the alert of a fire whose chain failed at once (box_actions.py)


def run_error(at: float, text: str, stage: str, run: float | None, code: str = "") -> Alert:
    """An error about a stage's run: `l` opens that stage's log, `x` restarts it (through
    restart's own dialog), whatever log the pane shows."""
    return Alert(at, "error", text, stage, "l log · x restart", code=code, action=FixAction.restart(stage),
                 run=run)


StageStatus = RunStatus | Literal["idle", "blocked"]  # blocked: idle, and its preflight would refuse it


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
class PreviousRun:
    """What is kept of a stage's earlier run once a new one starts: how it ended, its last marker."""

    fired_at: float
    status: str
    rc: int | None
    last_marker: str | None


@dataclass(frozen=True)
class ProcessRow:
    process: Process
    stage: str | None
    cpu_percent: float  # over the last poll interval when known, else the lifetime average
    ports: tuple[int, ...]


@dataclass
class StateUpdate:
    snapshot: Snapshot
    stages: list[StageView]
    budget: DiskBudget
    processes: list[ProcessRow]
    evals: list[EvalRun] = field(default_factory=list)
    log_lines: list[str] = field(default_factory=list)
    log_notice: str | None = None
    new_points: list[TrainPoint] = field(default_factory=list)
    new_evals: list[tuple[int, float]] = field(default_factory=list)  # the train log's eval losses, (step, loss)
    new_alerts: list[Alert] = field(default_factory=list)
    log_source: LogFollower | None = None  # the follower log_lines came from: appended only while it is shown
    curve_reset: bool = False  # a new training run: the curve starts again
    curve_resumed_at: int | None = None  # the run resumed from this step: the curve goes on from the last run's
    log_restarted: str | None = None  # the shown stage's new run: the log pane starts again with its file
    alerts_changed: bool = False  # an alert was raised or resolved
    disk_delta: DiskDelta | None = None  # what the last fired stage did to the disk, from its SAMAI_DISK lines
    projection: Projection | None = None  # the next stage to run: what it would do to the disk
    disk_trend: DiskTrend | None = None  # how fast the workspace fills, and when it is full at that rate
    gpu_utilization: list[float | None] = field(default_factory=list)  # each recent poll's mean, oldest first
    shown_stage: str | None = None  # whose log the log pane shows (None: a file)
    shown_path: str | None = None  # the log pane's file, and the markers it highlights
    shown_markers: tuple[Marker, ...] = ()
    alerts: list[Alert] = field(default_factory=list)  # every alert as it now stands, newest first
    now: float = 0.0  # when it was folded in (the console's clock)
    serving: tuple[ServingView, ...] = ()  # each running server's last reading (the serve pane)
    # The training run's reference, when it was (re)read (None: unchanged).
    reference_curve: ReferenceCurve | None = None


def _marker_of(stage: Stage, name: str) -> Marker | None:
    return next((m for m in stage.markers if m.name == name), None)


class ConsoleState:
    """One box as the console knows it, poll after poll. row_only: a fleet row's share of it
    (the stages, the disk, the GPUs and what raises an alert): the probe sends only the stages'
    processes, and the training curve, an idle stage's preflight, the serving ports, the report
    files and the binaries are the box screen's alone."""

    def __init__(self, config: Config, detectors: DetectorRegistry = DETECTORS, *, row_only: bool = False) -> None:
        self.config = config
        self.detectors = detectors  # the same registry as `doctor`'s: the same box, the same findings
        self.row_only = row_only
        self.watches = {s.name: self._watch(s) for s in config.stages}
        self._stages = {s.name: s for s in config.stages}
        train = config.stage_by_role("train")  # the stage whose log the curve and its alerts come from
        self.train_stage = train.name if train else None
        self.train_log = piece_follower(self.path_of(train.log), offset=0) if train and not row_only else None
        self.trainlog = TrainLogCheck()  # the same reader as `check trainlog`
        self._curve_resumed_at: int | None = None  # the followed run's resume step, once said
        self.runs: dict[str, tuple] = {}  # each stage's current run: (fired_at, pid, start_time)
        self.previous: dict[str, PreviousRun] = {}
        self.sizer = ArtifactSizer([(a.name, a.path) for a in config.artifacts] + poison_artifacts(config))
        self.shown: LogFollower | None = None  # the log in the log pane
        self.shown_stage: str | None = None
        self.last_markers: dict[str, tuple[str, str]] = {}
        self.alerts: list[Alert] = []
        self.snapshot: Snapshot | None = None
        self.received_at: float | None = None
        self._cpu: dict[tuple[int, float], tuple[float, float]] = {}
        self._statuses: dict[str, str] = {}
        self._fired_unseen_after: float | None = None  # a watcher's: the box time of the last watcher's look
        # Each stage's run (fired_at; None: no record) at the last poll: a run not among them ran since.
        self._looked_runs: dict[str, float | None] = {}
        self._unread_runs: set[str] = set()  # stages whose new run's log this poll's snapshot did not read
        self._rcs: dict[str, int | None] = {}
        self._last_said: dict[str, str] = {}  # each stage's last marker line of this run, CHAIN_DONE aside
        self._progress: dict[str, Progress] = {}  # each stage's last progress line of this run
        self._disk: dict[str, tuple[DiskReading | None, DiskReading | None]] = {}  # this run's (start, end)
        self._standing: set[tuple[str, str]] = set()
        # What the training environments hold, as last read (at each connect, and after an
        # uninstall): read apart from the poll, since it changes only when someone installs.
        self.environments: tuple[PythonPackages, ...] = ()
        # The newest eval run's items, checked once when its summary appears: (run, its check).
        self.eval_checked: tuple[EvalRun, RunCheck | None] | None = None
        self._lost_before: set[tuple[str, float]] = set()  # runs seen lost by the last poll
        self._rc_of_run: dict[tuple[str, float], int] = {}  # the rc each run was last seen with
        self.gpu = GpuWatch(config)  # the recent GPU readings: a stall shows only over time
        self.serving = ServingWatch(config)  # the running servers' readings, likewise
        self.reference = ReferenceWatch(config.train)  # the last good run the followed one is compared with
        self.disk = DiskWatch()  # the workspace's recent use: how fast it fills
        self.disk_trend: DiskTrend | None = None  # as of the last poll
        self.memory = MemoryWatch()  # each running stage's memory: how fast it grows towards its limit
        self.runs_seen = RunWatch()  # each run's last RSS and the GPUs' holders: evidence when it dies
        self.memory_trends: tuple[MemoryTrend, ...] = ()
        # Each running training run's checkpoints as last listed (sizes only), and when they were asked for.
        self.checkpoint_lists: dict[str, Checkpoints] = {}
        self._checkpoints_asked: dict[str, float] = {}
        self.last_update: StateUpdate | None = None  # the last poll's: what a read beside the poll amends
        self.watchers: WatchShared | None = None  # the box's watchers, heartbeats and acknowledgements, as last read
        self._watchers_asked = float("-inf")

    def _watch(self, stage: Stage) -> LogFollower:
        # Progress and disk lines come back as hits of more markers: the watch still moves no log bytes.
        return LogFollower(self.path_of(stage.log), markers=(*stage.markers, PROGRESS_MARKER, DISK_MARKER),
                           want_data=False, last_lines=MARKER_HISTORY_LINES, max_bytes=MARKER_SCAN_READ)

    def path_of(self, path: str) -> str:
        return self.config.path_of(path)

    # ------------------------------------------------------------ the log pane

    def show_log(self, path: str, stage: str | None = None, offset: int | None = None) -> LogFollower:
        """The log pane's log: its last lines, or (offset) from that byte on."""
        self.shown = LogFollower(self.path_of(path), offset=offset, last_lines=self.config.ui.tail_lines,
                                 catch_up_bytes=SHOWN_CATCH_UP)
        self.shown_stage = stage
        return self.shown

    def show_stage_log(self, name: str) -> LogFollower:
        stage = self.config.stage(name)
        if stage is None:
            raise KeyError(f"no stage {name!r} in the config")
        return self.show_log(stage.log, stage.name)

    def shown_markers(self) -> tuple[Marker, ...]:
        stage = self.config.stage(self.shown_stage) if self.shown_stage else None
        return stage.markers if stage else ()

    # ------------------------------------------------------------ one poll

    def followers(self) -> list[LogFollower]:
        out = list(self.watches.values())
        if self.train_log:
            out.append(self.train_log)
        if self.shown:
            out.append(self.shown)
        return out

    def _running(self) -> list[str]:
        return [name for name, status in self._statuses.items() if status == "running"]

    def request(self, followers: list[LogFollower]) -> dict:
        """The next snapshot's keyword arguments: artifact paths, log cursors, report globs, and
        the running servers' ports when they are due."""
        making = {name for s in self.config.stages if self._statuses.get(s.name) == "running" for name in s.makes}
        artifacts, logs = self.sizer.due(self.received_at, making), [f.cursor() for f in followers]
        if self.row_only:
            return {"artifacts": artifacts, "logs": logs, "processes": "stages"}
        return {"artifacts": artifacts, "logs": logs,
                "reports": self.config.ui.reports, "writers": True,
                "binaries": declared_binaries(self.config),
                **self.serving.request(self._running(), self.received_at or 0.0)}

    def apply(self, snap: Snapshot, followers: list[LogFollower], now: float) -> StateUpdate:
        """Fold in a snapshot taken with the cursors of `followers` (in that order)."""
        states = self._confirm_lost(self._keep_rc_while_relaunched(snap.states))
        snap = replace(snap, artifacts=self.sizer.merge(snap.artifacts, now), states=states)
        self.snapshot, self.received_at = snap, now
        self.disk_trend = self.disk.observe(snap)
        self.memory_trends = tuple(self.memory.observe(snap))
        self.runs_seen.observe(snap)
        ctx = self.detector_context(snap)
        update = StateUpdate(snap, [], ctx.budget, self._process_rows(snap), ctx.eval_reports[0])
        resolved = self._new_runs(snap, update, now)  # before the logs: a new run's lines start it clean
        watched = {id(f): name for name, f in self.watches.items()}
        for follower, chunk in zip(followers, snap.logs, strict=True):
            if follower is not self.shown and follower is not self.train_log and id(follower) not in watched:
                continue  # replaced while this snapshot was in flight (another log shown, a new run)
            tail = follower.consume(chunk)
            if follower is self.shown:  # (a log shown since the request is not this follower)
                update.log_lines, update.log_notice, update.log_source = tail.lines, tail.notice, follower
            elif follower is self.train_log:
                update.new_points = self._train_lines(tail.lines, update, tail.first_line)
                name = self.train_stage or ""  # set with train_log
                update.new_alerts += [self._run_alert(name, a.severity, f"{name}: {a.message}", a.code)
                                      for a in self.trainlog.drain_anomalies()]
                update.new_alerts += self._worse_than_reference() if update.new_points else []
            else:
                self._hits(self._stages[watched[id(follower)]], tail.hits, update)
        update.stages = [self._stage_view(s, snap, update) for s in self.config.stages]
        self._unread_runs.clear()
        update.disk_delta = self._disk_delta(snap, update.stages)
        update.new_alerts += self._findings(ctx)
        update.serving = tuple(self.serving.views.values())  # as the serving detector just read them
        resolved += self._resolve_gone(snap, now)
        self.raise_alerts(update.new_alerts)
        # The first poll shows the alerts whatever came before it (one raised beside the poll waits for it).
        update.alerts_changed = bool(update.new_alerts or resolved) or self.last_update is None
        update.projection, update.gpu_utilization = self._next_projection(update), self.gpu.utilization()
        update.disk_trend = self.disk_trend
        update.shown_stage, update.alerts, update.now = self.shown_stage, self.alerts, now
        update.shown_path = self.shown.path if self.shown else None
        update.shown_markers = self.shown_markers()
        self.last_update = update
        return update

    def _next_projection(self, update: StateUpdate) -> Projection | None:
        upcoming = next((self.config.stage(v.name) for v in update.stages if v.status in ("idle", "blocked")), None)
        return project(self.config, update.budget, upcoming) if upcoming else None

    def _train_lines(self, lines: list[str], update: StateUpdate, first_line: int | None) -> list[TrainPoint]:
        """The training curve's new points: of the log's last run only."""
        self.trainlog, restarted, points = newest_run_points(self.trainlog, lines, first_line)
        update.curve_reset |= restarted
        update.new_evals = self.trainlog.drain_evals()
        resumed = self.trainlog.resumed_from
        if resumed is not None and (restarted or resumed != self._curve_resumed_at):
            update.curve_resumed_at = resumed  # said once per run
        self._curve_resumed_at = resumed
        return points

    def _worse_than_reference(self) -> list[Alert]:
        worse = self.reference.check(self.trainlog.parser.points)
        name = self.train_stage or ""
        return [self._run_alert(name, "warning", f"{name}: {worse.problem().message}", CODE)] if worse else []

    def read_reference(self, reference: Reference | None, now: float, picked: bool = False) -> StateUpdate | None:
        """The followed run's reference (the last good run of its stage, or one the operator
        picked: then the run is compared anew), read beside the poll: drawn beside the curve, and
        the run compared with it at once."""
        self.reference.set(reference)
        if picked:
            self.reference.new_run()
        new = self._worse_than_reference()
        self.raise_alerts(new)
        update = self._beside_poll(new, now)
        return replace(update, reference_curve=self.reference.curve()) if update else None

    def _run_alert(self, stage: str, severity: Severity, text: str, code: str = "") -> Alert:
        """An alert about a stage's current run. An error offers its stage's log (`l`) and a
        restart of that stage (`x`, through restart's own dialog) whatever log is shown."""
        if severity != "error":
            return Alert(self._at(), severity, text, stage, code=code, run=self._run_of(stage))
        return run_error(self._at(), text, stage, self._run_of(stage), code)

    def _at(self) -> float:
        """When the snapshot being folded in was received (what its alerts are stamped with)."""
        return self.received_at or 0.0

    def unproven(self, stage: Stage) -> bool:
        """Whether a stage consumes the followed training run while that run's log has an
        error-level finding (the bar's `blocked`; the fire's preflight reads the log itself)."""
        train = self._stages.get(self.train_stage) if self.train_stage else None
        return (train is not None and train in training_sources(self.config, stage)
                and any(a.severity == "error" for a in self.trainlog.anomalies))

    def _keep_rc_while_relaunched(self, states: tuple[StageRecord, ...]) -> tuple[StageRecord, ...]:
        """A fire removes the last run's rc file a moment before it writes the new run's record:
        read in between, the last run (its process long gone) would look lost, and a restart
        under load flashed a finished run as running, then lost. It keeps the rc it was seen with."""
        known = self._rc_of_run
        kept = tuple(replace(r, rc=known[(r.stage, r.fired_at)]) if r.rc is None and not r.alive
                     and (r.stage, r.fired_at) in known else r for r in states)
        self._rc_of_run = {(r.stage, r.fired_at): r.rc for r in kept if r.rc is not None}
        return kept

    def _confirm_lost(self, states: tuple[StageRecord, ...]) -> tuple[StageRecord, ...]:
        """A chain seen gone without its rc reads as running until the next poll sees the same:
        one probe pass reads the process table and the rc files at different moments, and a
        chain that is being stopped can fall between them (a stop then flashed as "lost")."""
        lost = {(r.stage, r.fired_at) for r in states if r.status == "lost"}
        first_time = lost - self._lost_before
        self._lost_before = lost
        return tuple(replace(r, alive=True) if (r.stage, r.fired_at) in first_time else r for r in states)

    def seed_statuses(self, statuses: dict[str, str], looked_at: float | None = None) -> None:
        """The stages' statuses as an earlier watcher of this box last saw them (its ledger), and
        the box's time of its last look: a run it saw running, or one fired since it looked (a
        short run between two cron runs), that is over at the first poll is a run that ended."""
        known = {s.name for s in self.config.stages}
        self._statuses.update({name: status for name, status in statuses.items()
                               if name in known and status == "running" and name not in self._statuses})
        self._fired_unseen_after = looked_at

    def _ran_unseen(self, stage: str, rec: StageRecord, now: float) -> bool:
        """Whether this run started after the last look at the box: one this state did not see at
        its last poll (whoever fired it, however fast it ended); at the first poll, one fired after
        the last watcher's look (seed_statuses). A run's identity is its fired_at."""
        if stage in self._looked_runs:
            return self._looked_runs[stage] != rec.fired_at
        return self._statuses.get(stage) is None and self._fired_since_last_look(rec, now)

    def _fired_since_last_look(self, rec: StageRecord, now: float) -> bool:
        """Whether the run was fired after the last watcher's look, which was recent: a watcher
        back after a long gap does not tell again every run that ended meanwhile."""
        looked = self._fired_unseen_after
        return looked is not None and looked < rec.fired_at and now - looked <= UNSEEN_GAP_S

    def stage_statuses(self) -> dict[str, str]:
        """Each stage's status at the last poll (what a watcher leaves for the next one)."""
        return dict(self._statuses)

    def eval_to_check(self, evals: list[EvalRun]) -> EvalRun | None:
        """The newest eval run when it is not the one checked last (then taken as checked: its
        items are read once, by the caller, and handed to eval_checked)."""
        newest = newest_run(evals)
        checked = self.eval_checked[0] if self.eval_checked else None
        if newest is None or (checked and (checked.folder, checked.mtime) == (newest.folder, newest.mtime)):
            return None
        self.eval_checked = (newest, None)
        return newest

    def detector_context(self, snap: Snapshot) -> DetectorContext:
        """What the detectors read this poll: the snapshot, and what was read apart from the poll
        (environments, the newest eval's check) or kept across polls (the GPU watch)."""
        if self.row_only:  # only the stages' processes: not the table the process detectors judge
            snap = replace(snap, processes=())
        return DetectorContext.of(self.config, snap, environments=self.environments,
                                  eval_checked=self.eval_checked, gpu=self.gpu, disk_trend=self.disk_trend,
                                  memory_trends=self.memory_trends, checkpoints=tuple(self.checkpoint_lists.items()),
                                  serving=self.serving)

    def _findings(self, ctx: DetectorContext, only: tuple[str, ...] | None = None) -> list[Alert]:
        """Detector findings as alerts: once when they appear, again only if they go and come back.
        A detector that raises is its own internal_error finding: the poll goes on. only: these
        detectors alone (a read beside the poll); what the others found stands until the next poll."""
        findings = self.detectors.run(ctx, only or (ROW_DETECTORS if self.row_only else None))
        new = [f for f in findings if f.key not in self._standing]
        self._standing = {f.key for f in findings} | (self._standing if only else set())
        return [Alert(self._at(), f.severity, f.message, code=f.code, action=f.action,
                      hint="x fix" if f.action else "", finding=f.key) for f in new]

    # ------------------------------------------------------------ runs and the alerts' lifecycle

    def _run_of(self, stage: str) -> float | None:
        run = self.runs.get(stage)
        return run[0] if run else None

    def _new_runs(self, snap: Snapshot, update: StateUpdate, now: float) -> int:
        """A stage fired again starts clean: no marker, curve or log position of the run before
        (kept as its PreviousRun), and the old run's alerts resolved. How many were resolved."""
        resolved = 0
        for stage in self.config.stages:
            rec = snap.state(stage.name)
            if rec is None:
                continue
            run, before = (rec.fired_at, rec.pid, rec.start_time), self.runs.get(stage.name)
            self.runs[stage.name] = run
            if before is None or before == run:
                continue
            marker = self.last_markers.pop(stage.name, (None, "info"))[0]
            self._last_said.pop(stage.name, None)
            self._progress.pop(stage.name, None)
            self._disk.pop(stage.name, None)
            self.previous[stage.name] = PreviousRun(before[0], self._statuses.get(stage.name, "?"),
                                                    self._rcs.get(stage.name), marker)
            self.watches[stage.name] = self._watch(stage)
            self._unread_runs.add(stage.name)  # its log is read from the next poll on
            if stage.name == self.shown_stage and self.shown is not None:
                # The shown log starts again with the new run's file (the last run's is NAME.1).
                self.shown = LogFollower(self.shown.path, offset=0, catch_up_bytes=SHOWN_CATCH_UP)
                update.log_restarted = stage.name
            if stage.name == self.train_stage and self.train_log is not None:
                self.train_log = piece_follower(self.train_log.path, offset=0)
                self.trainlog, self._curve_resumed_at = TrainLogCheck(), None
                self.reference.new_run()
                update.curve_reset = True
            resolved += self._resolve(lambda a, name=stage.name, fired=rec.fired_at: a.stage == name and a.run != fired,
                                      now)
        return resolved

    def _resolve_gone(self, snap: Snapshot, now: float) -> int:
        """Alerts whose condition no longer holds: a finding absent now, a process to kill that is
        gone, a box that answers again."""
        def gone(a: Alert) -> bool:
            if a.finding is not None and a.finding not in self._standing:
                return True
            if a.action is not None and a.action.kind is ActionKind.KILL:
                return snap.same_process(a.action.pid, a.action.start_time) is None
            return a.code == "box_unreachable"
        return self._resolve(gone, now)

    def _resolve(self, condition, now: float) -> int:
        count = 0
        for i, a in enumerate(self.alerts):
            if a.active and condition(a):
                self.alerts[i] = replace(a, resolved_at=now)
                count += 1
        return count

    def active_alerts(self) -> list[Alert]:
        return [a for a in self.alerts if a.active]

    def preflight(self, name: str) -> Preflight | None:
        stage = self.config.stage(name)
        return preflight(self.config, self.snapshot, stage) if stage and self.snapshot else None

    def failed_poll(self, error: str, now: float) -> StateUpdate | None:
        """The box stopped answering: the outage alert (resolved by the next snapshot)."""
        return self.raise_alert(Alert(now, "error", f"box not answering: {error}", code="box_unreachable"), now)

    # ------------------------------------------------------------ helpers

    def _hits(self, stage: Stage, hits, update: StateUpdate) -> None:
        rec = self.snapshot.state(stage.name) if self.snapshot else None
        for hit in hits:
            chains = hit.marker in (CHAIN_DONE.name, DISK_MARKER_NAME)
            if chains and (rec is None or rec.said_by_chain(hit.line) is None):
                continue  # the stage's own text shaped like its chain's line (remote/box/chainline.py)
            if hit.marker == PROGRESS_MARKER_NAME:
                self._progress_hit(stage, hit.line)
                continue
            if hit.marker == DISK_MARKER_NAME:
                self._disk_hit(stage, hit.line)
                continue
            marker = _marker_of(stage, hit.marker)
            severity = marker.severity if marker else "info"
            self.last_markers[stage.name] = (hit.line[:60], severity)
            if hit.marker != CHAIN_DONE.name:
                self._last_said[stage.name] = hit.line[:200]  # what a died alert quotes
            if severity != "info":
                update.new_alerts.append(self._run_alert(stage.name, severity, f"{stage.name}: {hit.line[:200]}"
                                                         + oom_context(hit.marker, self.snapshot)))

    def _progress_hit(self, stage: Stage, line: str) -> None:
        progress = parse_line(line)
        if progress is None or (progress.kind == "step" and stage.ports):
            return  # a server's own command line ("$ llama-server ...") is no step of a long job
        self._progress[stage.name] = progress

    def _disk_hit(self, stage: Stage, line: str) -> None:
        reading = parse_disk_line(line)
        if reading is not None:
            start, end = self._disk.get(stage.name, (None, None))
            self._disk[stage.name] = (reading, end) if reading.phase == "start" else (start, reading)

    def _disk_delta(self, snap: Snapshot, views: list[StageView]) -> DiskDelta | None:
        disk = workspace_disk(snap)
        fired = {name: run[0] or 0.0 for name, run in self.runs.items()}
        return latest(self._disk, fired, {v.name for v in views if v.status == "running"},
                      disk.used if disk else None)

    def _stage_view(self, stage: Stage, snap: Snapshot, update: StateUpdate) -> StageView:
        rec = snap.state(stage.name)
        status: StageStatus = rec.status if rec else "idle"
        if status == "idle" and not self.row_only and (preflight(self.config, snap, stage, update.budget).blocked
                                                       or self.unproven(stage)):
            status = "blocked"
        before = self._statuses.get(stage.name)
        unseen = rec is not None and self._ran_unseen(stage.name, rec, snap.time)
        if unseen:
            before = "running"  # it ran between two looks: over already, it ended since
        # A new run already over is judged at the next poll, once its log is read: its end is one
        # alert, with its last words, beside the alerts of its own output.
        later = unseen and status != "running" and stage.name in self._unread_runs
        if not later:
            self._looked_runs[stage.name] = rec.fired_at if rec else None
        self._statuses[stage.name] = status
        self._rcs[stage.name] = rec.rc if rec else None
        if before is not None and before != status:
            self.sizer.refresh_all()  # what it made (or removed) is sized in the next poll
        death = self.runs_seen.explained(rec, cause_of_death(rec, snap)) if rec else None
        if before == "running" and rec is not None and not later:
            ended = self._ended(stage, rec, status, death)
            if ended:
                update.new_alerts.append(ended)
        marker, severity = self.last_markers.get(stage.name, (None, "info"))
        return StageView(stage.name, stage.key, status, rec.fired_at if rec else None, rec.pid if rec else None,
                         rec.rc if rec else None, marker, severity, self.previous.get(stage.name),
                         self._progress.get(stage.name) if status == "running" else None, death)

    def _ended(self, stage: Stage, rec, status: str, death: Death | None) -> Alert | None:
        """The alert for a run that was running at the last poll and is not now: why it died,
        when it did not end well, else its last marker line."""
        at, run = self._at(), rec.fired_at
        if status == "done":
            return Alert(at, "info", f"stage {stage.name} done", stage.name, run=run)
        if status == "stopped":
            said = death.detail if death and death.cause == "stopped" else "stopped by the operator"
            return Alert(at, "info", f"stage {stage.name} {said}", stage.name, run=run)
        if status not in ("failed", "lost", "orphaned") or self._said_by_fire(stage.name, run):
            return None
        rc = f" rc={rec.rc}" if rec.rc is not None else ""
        words = self._last_said.get(stage.name)  # its own last marker line: what it said before it died
        cause = death_line(death) if death and death.cause != "exit" else ""  # an exit says no more than its rc
        last = " · ".join(w for w in (cause, words or exit_words(death)) if w)
        said = f": {last}" if last else ""
        if stage.ports:  # a server that died on its own
            text = f"stage {stage.name}: pid {rec.pid} died ({rc.strip() or 'no rc'}){said}"
        else:
            text = f"stage {stage.name} {status}{rc}{said}"
        alert = self._run_alert(stage.name, "error", text, RUN_ENDED)
        if stage.checkpoints and stage.role == "train":  # recover from its last good state, not from step 0
            alert = replace(alert, action=FixAction.resume(stage.name),
                            hint="l log · x resume from its last good checkpoint · r restart from step 0")
        return alert

    def _said_by_fire(self, stage: str, run: float | None) -> bool:
        """Whether that run's failure is already an alert: its fire's (one failure, one alert)."""
        return any(a.active and a.code == FIRE_FAILED and a.stage == stage and a.run == run for a in self.alerts)

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

    def raise_alerts(self, alerts: list[Alert]) -> None:
        """Newest first; only the latest MAX_ALERTS are kept."""
        self.alerts = (list(reversed(alerts)) + self.alerts)[:MAX_ALERTS]

    # ------------------------------------------------------------ what is read beside the poll
    # Each returns what the panes show of it (None: nothing to show now), like apply does for a poll.

    def raise_alert(self, alert: Alert, now: float) -> StateUpdate | None:
        """An alert raised outside a poll (a failed fire, the box gone quiet). A failed fire's
        alert replaces a poll's alert of the same run's end: one failure, one alert, the one
        with the stage's last words."""
        if alert.code == FIRE_FAILED and alert.run is not None:
            self.alerts = [a for a in self.alerts if not (a.active and a.code == RUN_ENDED and a.stage == alert.stage
                                                          and a.run == alert.run)]
        self.raise_alerts([alert])
        return self._beside_poll([alert], now)

    def read_environments(self, environments: tuple[PythonPackages, ...], now: float) -> StateUpdate | None:
        """The training environments' packages, as read at a connect, judged at once."""
        self.environments = environments
        return self._judge(ENVIRONMENT_DETECTORS, now)

    def read_eval_items(self, run: EvalRun, result: RunCheck, now: float) -> StateUpdate | None:
        """`check eval` on a finished run's items, judged at once, unless a newer run came
        meanwhile (then this one's result is stale)."""
        if not (self.eval_checked and self.eval_checked[0] == run):
            return None
        self.eval_checked = (run, result)
        return self._judge(EVAL_DETECTORS, now)

    def checkpoints_due(self, now: float) -> list[Stage]:
        """The running train stages whose checkpoints are to be listed again (each once every
        CHECKPOINT_READ_S): asked for now, so a slow answer is not asked for twice."""
        snap = self.snapshot
        due = [s for s in self.config.stages if s.role == "train" and s.checkpoints and snap
               and (rec := snap.state(s.name)) is not None and rec.status == "running"
               and now - self._checkpoints_asked.get(s.name, float("-inf")) >= CHECKPOINT_READ_S]
        self._checkpoints_asked.update((s.name, now) for s in due)
        return due

    def watchers_due(self, now: float) -> bool:
        """Whether the box's watchers are to be read again (every WATCHERS_READ_S; asked for now)."""
        if now - self._watchers_asked < WATCHERS_READ_S:
            return False
        self._watchers_asked = now
        return True

    def read_watchers(self, shared: WatchShared) -> None:
        """Who watches the box (the status line says it) and what is acknowledged there."""
        self.watchers = shared

    def read_checkpoints(self, stage: str, listed: Checkpoints, now: float) -> StateUpdate | None:
        """A running training run's checkpoints, listed: whether its next one fits, judged at once."""
        self.checkpoint_lists[stage] = listed
        return self._judge(CHECKPOINT_DETECTORS, now)

    def read_nodes(self, findings: list[Finding], ended: list[str], now: float) -> StateUpdate | None:
        """A reading of the multi-node runs on their nodes: a rank that died is an alert (once: every
        node's box screen is handed the same findings); a run ended on every node resolves its."""
        resolved = self._resolve(lambda a: a.code == "rank_died" and a.action is not None
                                 and getattr(a.action, "stage", None) in ended, now)
        shown = {(a.code, a.text) for a in self.alerts}
        new = [Alert(now, f.severity, f.message, code=f.code, action=f.action, hint="x stop all" if f.action else "")
               for f in findings if (f.code, f.message) not in shown]
        self.raise_alerts(new)
        return self._beside_poll(new, now) if new or resolved else None

    def _judge(self, detectors: tuple[str, ...], now: float) -> StateUpdate | None:
        """These detectors on the last snapshot (before the first, the first poll judges everything)."""
        if self.snapshot is None:
            return None
        new = self._findings(self.detector_context(self.snapshot), detectors)
        self.raise_alerts(new)
        return self._beside_poll(new, now) if new else None

    def _beside_poll(self, new_alerts: list[Alert], now: float) -> StateUpdate | None:
        """The last poll's update with the alerts as they now stand and nothing new to append (no
        lines, points or restarts). None before the first poll: its update shows every alert."""
        if self.last_update is None:
            return None
        return replace(self.last_update, log_lines=[], log_notice=None, log_source=None, new_points=[], new_evals=[],
                       curve_reset=False, log_restarted=None, new_alerts=new_alerts, alerts_changed=True,
                       alerts=list(self.alerts), now=now)
