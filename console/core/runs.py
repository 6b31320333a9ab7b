"""The stages' runs as the polls see them: each stage's current run and the one before it, its
status, the marker lines of its log (its last words, its progress, its disk lines), why it died,
and the alert of a run that ended: once, whoever fired it, however fast it ended, and for a
console that opens after it ended, the death of each stage's last run, standing, with its fix."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from samai.console.core.alertbook import RUN_ENDED, Alert, AlertBook, run_error
from samai.console.core.config import CHAIN_DONE, Config, Stage
from samai.console.core.death import RunWatch, cause_of_death, death_line, exit_words
from samai.console.core.disk.budget import workspace_disk
from samai.console.core.disk.delta import (
    DISK_MARKER,
    DISK_MARKER_NAME,
    DiskDelta,
    DiskReading,
    latest,
    parse_disk_line,
    start_in_head,
)
from samai.console.core.fixes import FixAction
from samai.console.core.gpus.findings import oom_context
from samai.console.core.progress import PROGRESS_MARKER, PROGRESS_MARKER_NAME, Progress, parse_line
from samai.console.core.update import PreviousRun, StageStatus, StageView
from samai.remote.follow import MARKER_SCAN_READ, LogFollower
from samai.remote.model import Death, LogChunk, Marker, MarkerHit, Severity, Snapshot, StageRecord

UNSEEN_GAP_S = 3600.0  # a run fired since the last watcher looked is news if that look was this recent
MARKER_HISTORY_LINES = 500  # how far back a stage log is scanned for markers at start-up
HEAD_BYTES = 4096  # a log's first bytes: the run's header and the chain's SAMAI_DISK start line after it
HEAD_TRIES = 3  # a head that could not be read is asked again at the next polls, this many times in all
ENDED_BADLY = ("failed", "lost", "orphaned")


def _marker_of(stage: Stage, name: str) -> Marker | None:
    return next((m for m in stage.markers if m.name == name), None)


def _of_an_earlier_run(stage: str, fired_at: float) -> Callable[[Alert], bool]:
    return lambda a: a.stage == stage and a.run != fired_at


@dataclass(frozen=True)
class LogHead:
    """The start of a run's log, to be read beside the poll: the watch began past it (a log longer
    than the lines it scans at start) and the chain's start line was not among what it read."""

    stage: str
    fired_at: float  # the run it is of
    path: str
    tries: int = 1


class StageRuns:
    def __init__(self, config: Config, book: AlertBook, at: Callable[[], float]) -> None:
        self.config, self.book, self._at = config, book, at
        self.watches = {s.name: self._watch(s) for s in config.stages}
        self.runs: dict[str, tuple] = {}  # each stage's current run: (fired_at, pid, start_time)
        self.previous: dict[str, PreviousRun] = {}
        self.last_markers: dict[str, tuple[str, str]] = {}
        self.seen = RunWatch()  # each run's last RSS and the GPUs' holders: evidence when it dies
        self._statuses: dict[str, str] = {}
        self._rcs: dict[str, int | None] = {}
        self._fired_unseen_after: float | None = None  # a watcher's: the box time of the last watcher's look
        # Each stage's run (fired_at; None: no record) at the last poll: a run not among them ran since.
        self._looked_runs: dict[str, float | None] = {}
        self._unread_runs: set[str] = set()  # stages whose new run's log this poll's snapshot did not read
        self._last_said: dict[str, str] = {}  # each stage's last marker line of this run, CHAIN_DONE aside
        self._progress: dict[str, Progress] = {}  # each stage's last progress line of this run
        self._disk: dict[str, tuple[DiskReading | None, DiskReading | None]] = {}  # this run's (start, end)
        self._heads: dict[str, LogHead] = {}  # the logs whose head is to be read for this run's start line
        self._lost_before: set[tuple[str, float]] = set()  # runs seen lost by the last poll
        self._rc_of_run: dict[tuple[str, float], int] = {}  # the rc each run was last seen with

    def _watch(self, stage: Stage) -> LogFollower:
        # Progress and disk lines come back as hits of more markers: the watch still moves no log bytes.
        return LogFollower(self.config.path_of(stage.log), markers=(*stage.markers, PROGRESS_MARKER, DISK_MARKER),
                           want_data=False, last_lines=MARKER_HISTORY_LINES, max_bytes=MARKER_SCAN_READ)

    def run_of(self, stage: str) -> float | None:
        run = self.runs.get(stage)
        return run[0] if run else None

    def running(self) -> list[str]:
        return [name for name, status in self._statuses.items() if status == "running"]

    def status(self, stage: str) -> str | None:
        return self._statuses.get(stage)

    # ------------------------------------------------------------ what a poll's records mean

    def settled(self, states: tuple[StageRecord, ...], *, one_look: bool = False) -> tuple[StageRecord, ...]:
        """The poll's records as the runs are: a lost run is confirmed by the next poll (one look,
        doctor's, has none: it takes the records as they are)."""
        kept = self._keep_rc_while_relaunched(states)
        return kept if one_look else self._confirm_lost(kept)

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

    def new_runs(self, snap: Snapshot, now: float) -> tuple[set[str], int]:
        """A stage fired again starts clean: no marker or log position of the run before (kept as
        its PreviousRun), and the old run's alerts resolved. The stages with a new run, and how
        many alerts were resolved."""
        self.seen.observe(snap)
        new, resolved = set(), 0
        for stage in self.config.stages:
            rec = snap.state(stage.name)
            if rec is None:
                continue
            run, before = (rec.fired_at, rec.pid, rec.start_time), self.runs.get(stage.name)
            self.runs[stage.name] = run
            if before is None or before == run:
                continue
            new.add(stage.name)
            marker = self.last_markers.pop(stage.name, (None, "info"))[0]
            for kept in (self._last_said, self._progress, self._disk, self._heads):
                kept.pop(stage.name, None)
            self.previous[stage.name] = PreviousRun(before[0], self._statuses.get(stage.name, "?"),
                                                    self._rcs.get(stage.name), marker)
            self.watches[stage.name] = self._watch(stage)
            self._unread_runs.add(stage.name)  # its log is read from the next poll on
            resolved += self.book.resolve(_of_an_earlier_run(stage.name, rec.fired_at), now)
        return new, resolved

    # ------------------------------------------------------------ its log's marker lines

    def read(self, stage: Stage, chunk: LogChunk, snap: Snapshot) -> list[Alert]:
        """A poll's read of a stage's marker watch: its hits (the alerts of those above info). When
        the watch's first read of this run began past the file's start (it scans the last
        MARKER_HISTORY_LINES lines) without the chain's start line, the log's head is due."""
        watch = self.watches[stage.name]
        first = watch.offset is None
        alerts = self.hits(stage, watch.consume(chunk).hits, snap)
        rec = snap.state(stage.name)
        if first and chunk.error is None and chunk.offset > 0 and rec is not None and rec.nonce \
                and self._disk.get(stage.name, (None, None))[0] is None:
            self._heads[stage.name] = LogHead(stage.name, rec.fired_at, watch.path)
        return alerts

    def heads_due(self) -> list[LogHead]:
        """The logs whose head is to be read now (each taken once: asked again only if it fails)."""
        due, self._heads = list(self._heads.values()), {}
        return due

    def head_unread(self, head: LogHead) -> None:
        """A head that could not be read: asked again at the next poll, HEAD_TRIES times in all."""
        if head.tries < HEAD_TRIES and self.run_of(head.stage) == head.fired_at:
            self._heads.setdefault(head.stage, replace(head, tries=head.tries + 1))

    def head_read(self, head: LogHead, data: bytes, snap: Snapshot) -> None:
        """The first bytes of a run's log: its start line, when the chain wrote it for this run."""
        rec = snap.state(head.stage)
        if rec is None or rec.fired_at != head.fired_at or self.run_of(head.stage) != head.fired_at:
            return  # fired again since: that run's watch reads its own log
        start, end = self._disk.get(head.stage, (None, None))
        if start is None:
            self._disk[head.stage] = (start_in_head(data, rec.nonce), end)

    def hits(self, stage: Stage, hits: Iterable[MarkerHit], snap: Snapshot) -> list[Alert]:
        """A stage log's marker lines of this poll; the alerts of those above info."""
        rec, out = snap.state(stage.name), []
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
                out.append(self.alert(stage.name, severity, f"{stage.name}: {hit.line[:200]}"
                                      + oom_context(hit.marker, snap)))
        return out

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

    def disk_delta(self, snap: Snapshot, views: list[StageView]) -> DiskDelta | None:
        """What the last fired stage did to the disk, from its SAMAI_DISK lines."""
        disk = workspace_disk(snap)
        fired = {name: run[0] or 0.0 for name, run in self.runs.items()}
        return latest(self._disk, fired, {v.name for v in views if v.status == "running"},
                      disk.used if disk else None)

    def alert(self, stage: str, severity: Severity, text: str, code: str = "") -> Alert:
        """An alert about a stage's current run. An error offers its stage's log (`l`) and a
        restart of that stage (`x`, through restart's own dialog) whatever log is shown."""
        if severity != "error":
            return Alert(self._at(), severity, text, stage, code=code, run=self.run_of(stage))
        return run_error(self._at(), text, stage, self.run_of(stage), code)

    # ------------------------------------------------------------ each stage's view, and its end

    def view(self, stage: Stage, snap: Snapshot, blocked: Callable[[Stage], bool]) -> tuple[StageView, Alert | None]:
        """The stage as the bar shows it, and the alert of its run's end when this poll saw it end."""
        rec = snap.state(stage.name)
        status: StageStatus = rec.status if rec else "idle"
        if status == "idle" and blocked(stage):
            status = "blocked"
        before = self._statuses.get(stage.name)
        first_look = stage.name not in self._looked_runs and before is None
        unseen = rec is not None and self._ran_unseen(stage.name, rec, snap.time)
        if unseen:
            before = "running"  # it ran between two looks: over already, it ended since
        # A new run already over is judged at the next poll, once its log is read: its end is one
        # alert, with its last words, beside the alerts of its own output.
        later = unseen and status != "running" and stage.name in self._unread_runs
        if not later:
            self._looked_runs[stage.name] = rec.fired_at if rec else None
        self._unread_runs.discard(stage.name)
        self._statuses[stage.name] = status
        self._rcs[stage.name] = rec.rc if rec else None
        death = self.seen.explained(rec, cause_of_death(rec, snap)) if rec else None
        ended = None
        if rec is not None and not later and (before == "running" or (first_look and status in ENDED_BADLY)):
            # ... or, at a console's first look, its last run's death: standing, with its fix (a
            # console opened after a death knows it; a watcher sends it unless its ledger did).
            ended = self._ended(stage, rec, status, death)
        marker, severity = self.last_markers.get(stage.name, (None, "info"))
        view = StageView(stage.name, stage.key, status, rec.fired_at if rec else None, rec.pid if rec else None,
                         rec.rc if rec else None, marker, severity, self.previous.get(stage.name),
                         self._progress.get(stage.name) if status == "running" else None, death)
        return view, ended

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

    def _ended(self, stage: Stage, rec: StageRecord, status: str, death: Death | None) -> Alert | None:
        """The alert for a run that ended: why it died, when it did not end well, else its last marker line."""
        at, run = self._at(), rec.fired_at
        if status == "done":
            return Alert(at, "info", f"stage {stage.name} done", stage.name, run=run)
        if status == "stopped":
            said = death.detail if death and death.cause == "stopped" else "stopped by the operator"
            return Alert(at, "info", f"stage {stage.name} {said}", stage.name, run=run)
        if status not in ENDED_BADLY or self.book.said_by_fire(stage.name, run):
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
        alert = self.alert(stage.name, "error", text, RUN_ENDED)
        if stage.checkpoints and stage.role.resumable:  # recover from its last good state, not from step 0
            alert = replace(alert, action=FixAction.resume(stage.name),
                            hint="l log · x resume from its last good checkpoint · r restart from step 0")
        return alert

    # ------------------------------------------------------------ what a watcher leaves for the next

    def seed_statuses(self, statuses: dict[str, str], looked_at: float | None = None) -> None:
        """The stages' statuses as an earlier watcher of this box last saw them (its ledger), and
        the box's time of its last look: a run it saw running, or one fired since it looked (a
        short run between two cron runs), that is over at the first poll is a run that ended."""
        known = {s.name for s in self.config.stages}
        self._statuses.update({name: status for name, status in statuses.items()
                               if name in known and status == "running" and name not in self._statuses})
        self._fired_unseen_after = looked_at

    def statuses(self) -> dict[str, str]:
        """Each stage's status at the last poll (what a watcher leaves for the next one)."""
        return dict(self._statuses)
