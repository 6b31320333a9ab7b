"""The console's view of the box: snapshots folded into what the panes show.

Data flows one way: Box snapshot → ConsoleState.apply → a StateUpdate the app hands to its
widgets. The state owns the log followers, so every byte of every watched log is read once
and every marker hit is seen once."""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass, field, replace

from samai.console.budget import DiskBudget, disk_budget
from samai.console.config import Config, Stage
from samai.console.detectors import declared_binaries, detect
from samai.console.preflight import Preflight, poison_artifacts, preflight
from samai.console.redact import redact
from samai.console.sizing import ArtifactSizer
from samai.console.trainlog import TrainLogParser, TrainPoint
from samai.remote.follow import MARKER_SCAN_READ, LogFollower
from samai.remote.model import Marker, Process, Report, Snapshot

MAX_ALERTS = 200
MARKER_HISTORY_LINES = 500  # how far back a stage log is scanned for markers at start-up


@dataclass(frozen=True)
class Alert:
    time: float
    severity: str  # info | warning | error
    text: str
    stage: str | None = None
    hint: str = ""  # the key that fixes it, e.g. "r restart"
    code: str = ""  # a detector's code, e.g. stale_server
    action: str = ""  # what `x` does about it: "kill PID START", "stop STAGE", "restart STAGE", "clean"

    def __post_init__(self) -> None:  # every alert, whatever raised it: no secrets on screen or kept
        object.__setattr__(self, "text", redact(self.text))


@dataclass(frozen=True)
class StageView:
    name: str
    key: str
    status: str  # idle | running | done | failed | lost | orphaned | blocked
    since: float | None  # fired_at of the recorded run
    pid: int | None
    rc: int | None
    last_marker: str | None
    last_marker_severity: str = "info"


@dataclass(frozen=True)
class EvalRun:
    """One eval run's summary, as the eval stage writes it (runs/eval/NAME/summary.json)."""

    name: str
    n: int
    accuracy: float | None
    empty_content: int
    truncated: int
    mtime: float = 0.0


def eval_run(report: Report) -> EvalRun | None:
    try:
        raw = json.loads(report.text)
        return EvalRun(posixpath.basename(posixpath.dirname(report.path)), int(raw["n"]),
                       None if raw.get("accuracy") is None else float(raw["accuracy"]),
                       int(raw.get("empty_content", 0)), int(raw.get("truncated", 0)), report.mtime)
    except (ValueError, KeyError, TypeError):
        return None


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
    new_alerts: list[Alert] = field(default_factory=list)


def _marker_of(stage: Stage, name: str) -> Marker | None:
    return next((m for m in stage.markers if m.name == name), None)


class ConsoleState:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.watches = {s.name: LogFollower(self.path_of(s.log), markers=s.markers, want_data=False,
                                            last_lines=MARKER_HISTORY_LINES, max_bytes=MARKER_SCAN_READ)
                        for s in config.stages}
        train = config.stage("train")
        self.train_log = LogFollower(self.path_of(train.log), offset=0) if train else None
        self.trainlog = TrainLogParser()
        self.sizer = ArtifactSizer([(a.name, a.path) for a in config.artifacts] + poison_artifacts(config))
        self.shown: LogFollower | None = None  # the log in the log pane
        self.shown_stage: str | None = None
        self.last_markers: dict[str, tuple[str, str]] = {}
        self.alerts: list[Alert] = []
        self.snapshot: Snapshot | None = None
        self.received_at: float | None = None
        self._cpu: dict[tuple[int, float], tuple[float, float]] = {}
        self._statuses: dict[str, str] = {}
        self._standing: set[tuple[str, str]] = set()

    def path_of(self, path: str) -> str:
        return path if path.startswith("/") else posixpath.join(self.config.workspace, path)

    # ------------------------------------------------------------ the log pane

    def show_log(self, path: str, stage: str | None = None) -> LogFollower:
        self.shown = LogFollower(self.path_of(path), last_lines=self.config.ui.tail_lines)
        self.shown_stage = stage
        return self.shown

    def show_stage_log(self, name: str) -> LogFollower:
        stage = self.config.stage(name)
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

    def request(self, followers: list[LogFollower]) -> dict:
        """The next snapshot's keyword arguments: artifact paths, log cursors, report globs."""
        making = {name for s in self.config.stages if self._statuses.get(s.name) == "running" for name in s.makes}
        return {"artifacts": self.sizer.due(self.received_at, making), "logs": [f.cursor() for f in followers],
                "reports": [self.config.ui.eval_reports], "writers": True,
                "binaries": declared_binaries(self.config)}

    def apply(self, snap: Snapshot, followers: list[LogFollower], now: float) -> StateUpdate:
        """Fold in a snapshot taken with the cursors of `followers` (in that order)."""
        snap = replace(snap, artifacts=self.sizer.merge(snap.artifacts, now))
        self.snapshot, self.received_at = snap, now
        update = StateUpdate(snap, [], disk_budget(self.config, snap), self._process_rows(snap),
                             [run for run in map(eval_run, snap.reports) if run])
        watched = {id(f): name for name, f in self.watches.items()}
        for follower, chunk in zip(followers, snap.logs, strict=True):
            tail = follower.consume(chunk)
            if follower is self.shown:
                update.log_lines, update.log_notice = tail.lines, tail.notice
            elif follower is self.train_log:
                update.new_points = self.trainlog.feed(tail.lines)
                update.new_alerts += [Alert(now, a.severity, f"train: {a.message}", "train", code=a.code,
                                            hint="r restart" if a.severity == "error" else "")
                                      for a in self.trainlog.drain_anomalies()]
            elif id(follower) in watched:
                self._hits(self.config.stage(watched[id(follower)]), tail.hits, update)
            # else: a log pane follower replaced while this snapshot was in flight
        update.stages = [self._stage_view(s, snap, update) for s in self.config.stages]
        update.new_alerts += self._findings(snap)
        self._keep(update.new_alerts)
        return update

    def _findings(self, snap: Snapshot) -> list[Alert]:
        """Detector findings as alerts: once when they appear, again only if they go and come back."""
        findings = detect(self.config, snap)
        new = [f for f in findings if f.key not in self._standing]
        self._standing = {f.key for f in findings}
        return [Alert(self.received_at, f.severity, f.message, code=f.code, action=f.action,
                      hint="x fix" if f.action else "") for f in new]

    def preflight(self, name: str) -> Preflight | None:
        stage = self.config.stage(name)
        return preflight(self.config, self.snapshot, stage) if stage and self.snapshot else None

    def failed_poll(self, error: str, now: float) -> Alert:
        alert = Alert(now, "error", f"box not answering: {error}")
        self._keep([alert])
        return alert

    # ------------------------------------------------------------ helpers

    def _hits(self, stage: Stage, hits, update: StateUpdate) -> None:
        for hit in hits:
            marker = _marker_of(stage, hit.marker)
            severity = marker.severity if marker else "info"
            self.last_markers[stage.name] = (hit.line[:60], severity)
            if severity != "info":
                hint = "r restart" if severity == "error" else ""
                update.new_alerts.append(Alert(self.received_at, severity, f"{stage.name}: {hit.line[:200]}",
                                               stage.name, hint))

    def _stage_view(self, stage: Stage, snap: Snapshot, update: StateUpdate) -> StageView:
        rec = snap.state(stage.name)
        status = rec.status if rec else "idle"
        if status == "idle" and preflight(self.config, snap, stage).blocked:
            status = "blocked"
        before = self._statuses.get(stage.name)
        self._statuses[stage.name] = status
        if before is not None and before != status:
            self.sizer.refresh_all()  # what it made (or removed) is sized in the next poll
        if before == "running" and status in ("failed", "lost", "orphaned"):
            rc = f" rc={rec.rc}" if rec and rec.rc is not None else ""
            update.new_alerts.append(Alert(self.received_at, "error", f"stage {stage.name} {status}{rc}", stage.name,
                                           "l log · r restart"))
        elif before == "running" and status == "done":
            update.new_alerts.append(Alert(self.received_at, "info", f"stage {stage.name} done", stage.name))
        marker, severity = self.last_markers.get(stage.name, (None, "info"))
        return StageView(stage.name, stage.key, status, rec.fired_at if rec else None, rec.pid if rec else None,
                         rec.rc if rec else None, marker, severity)

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

    def _keep(self, alerts: list[Alert]) -> None:
        self.alerts = (list(reversed(alerts)) + self.alerts)[:MAX_ALERTS]
