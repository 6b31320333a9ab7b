"""One time-ordered account of the box: every stage's runs (started, their marker and disk lines,
how they ended and why), the operator's stops, the audit log's actions, the GPUs' events, each
message the box's watchers sent (from their ledger on the box) and the console's alerts, raised
and resolved, each with its source.

A log line carries no time of its own: a run's start is its header's, its end its log file's
last write (CHAIN_DONE is the last line a chain writes; the runs and their ends are its chain's
lines, as history.py reads them, never a copy the stage printed), and the marker lines between are placed
in order right after their run's start, marked `approx` with the run's window. Everything here is
box text (or the audit log's, which holds box text): shown through visible(), never markup."""

from __future__ import annotations

import calendar
import json
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from samai.console.core.config import Config
from samai.console.core.training.history import RunRecord
from samai.remote.boxapi import Box, BoxError
from samai.remote.follow import missing_notice
from samai.remote.model import GpuEvent, Snapshot
from samai.remote.transport import TransportError

MAX_AUDIT_EVENTS = 20_000  # the newest audit events kept (from --since on); the older ones counted and said
MAX_AUDIT_LINE = 1 << 20  # an audit line longer than this is no entry of ours: skipped, counted and said
MAX_OPEN_INTENTS = 10_000  # intents awaiting their outcome (one whose outcome never came is forgotten past this)
# The kind of an event that says what the timeline does not show: at the cut, what was cut there (N older
# events), else at the end (the time it was read) what could not be read. Never an event left out silently.
NOT_SHOWN = "not_shown"


@dataclass(frozen=True)
class Event:
    time: float
    source: str  # "log", "record", "audit", "gpu", "watcher", "alert"
    kind: str  # started, marker, disk, ended, died, stopped, an action's name, raised, resolved, an Xid
    text: str
    stage: str = ""
    path: str = ""  # a log on the box to open at `line`
    line: int | None = None
    severity: str = "info"
    approx: bool = False  # a log line: its time told by its place in its run (which ended by `until`)
    until: float | None = None

    def to_json(self) -> dict:
        return {"time": self.time, "source": self.source, "kind": self.kind, "text": self.text,
                "stage": self.stage, "path": self.path, "line": self.line, "severity": self.severity,
                "approx": self.approx, "until": self.until}


def run_events(stage: str, runs: Iterable[RunRecord]) -> list[Event]:
    """A stage's runs as its logs hold them (console/core/training/history.py)."""
    out: list[Event] = []
    for run in runs:
        started = header_time(run.started)
        end = run.ended_at
        if started is not None:
            out.append(Event(started, "log", "started", f"{stage} started (pid {run.pid})", stage, run.path, None))
        if run.marks_left_out and started is not None:  # where its kept marks begin: the earlier ones are not
            out.append(Event(started, "log", NOT_SHOWN, f"{run.marks_left_out:,} earlier marker lines of this run "
                             f"not shown (its last {len(run.marks)} are)", stage, run.path, None, "warning"))
        for mark in run.marks:
            at_end = mark.name == "disk" and " end " in f" {mark.text} " and end is not None
            exact = at_end or (mark.name == "disk" and started is not None and " start " in f" {mark.text} ")
            at = end if at_end else started if exact else _between(run, started, mark.line)
            if at is None:
                continue
            out.append(Event(at, "log", "disk" if mark.name == "disk" else "marker", mark.text, stage, run.path,
                             mark.line, mark.severity, approx=not exact, until=None if exact else end))
        if run.rc is not None and end is not None:
            failed = run.rc != 0
            text = f"{stage} ended rc={run.rc}" + (f": {run.death}" if run.death else "")
            out.append(Event(end, "log", "died" if failed else "ended", text, stage, run.path, None,
                             "error" if failed else "info"))
    return out


def _between(run: RunRecord, started: float | None, line: int) -> float | None:
    """A line's time, as far as its place tells: between its run's start and its file's last
    write in proportion to its place among the run's lines (a log is written about evenly)."""
    if started is None:
        return None
    last = run.last_write if run.last_write is not None and run.last_write >= started else started
    share = min(1.0, max(0.0, (line - run.first_line) / max(1, run.lines)))
    return started + (last - started) * share


def header_time(started: str) -> float | None:
    """The epoch of a run header's time (2026-12-03T17:16:41Z, UTC); None for garbage."""
    try:
        return float(calendar.timegm(time.strptime(started, "%Y-%m-%dT%H:%M:%SZ")))
    except (ValueError, OverflowError):
        return None


def record_events(snap: Snapshot) -> list[Event]:
    """The operator's stops, as the box keeps them with each stage's current run."""
    return [Event(r.stopped_at, "record", "stopped", f"{r.stage} stopped" + (f" by {r.stopped_by}" if r.stopped_by
                                                                              else ""), r.stage, r.log)
            for r in snap.states if r.stopped_at is not None]


def gpu_events(events: Iterable[GpuEvent]) -> list[Event]:
    return [Event(e.time, "gpu", e.kind, f"GPU {e.gpu}: {e.kind}" + (f" {e.code}" if e.code else ""),
                  severity="error") for e in events]


def audit_events(path: Path, since: float | None = None, max_events: int = MAX_AUDIT_EVENTS) -> list[Event]:
    """The audit log's outcome lines (what was done, by whom, how it went), each at its intent's
    time when it has one (when the action began: a fire's outcome comes after its verify window);
    a line that is not one (torn, or not ours) is left out. The log is read whole, a line at a
    time, and only events from `since` on are kept: the newest `max_events` of them. What was not
    kept is said by a `not_shown` event where the cut is (and a line too long to read, or a log
    that cannot be read, by one at the end), never dropped silently."""
    kept: deque[Event] = deque(maxlen=max(1, max_events))
    began: dict[str, float] = {}  # an intent's time by its id, until its outcome comes
    older = too_long = 0
    unread = ""
    try:
        with open(path, "rb") as f:
            for raw in _bounded_lines(f):
                if raw is None:
                    too_long += 1
                    continue
                event = _audit_event(raw, began)
                if event is None or (since is not None and event.time < since):
                    continue
                older += len(kept) == kept.maxlen
                kept.append(event)
    except FileNotFoundError:
        pass
    except OSError as e:
        unread = f"the audit log could not be read to its end: {e.strerror or e}"
    out = list(kept)
    if older:
        out.insert(0, Event(min(e.time for e in out), "audit", NOT_SHOWN,
                            f"{older:,} older audit events not shown (the newest {len(out):,} are)",
                            severity="warning"))
    if too_long:
        unread = "; ".join(filter(None, [unread, f"{too_long:,} lines of the audit log over "
                                                 f"{MAX_AUDIT_LINE >> 20} MiB not read"]))
    if unread:
        out.append(Event(time.time(), "audit", NOT_SHOWN, unread, severity="warning"))
    return out


def _bounded_lines(f: BinaryIO) -> Iterator[bytes | None]:
    """A file's lines, each of at most MAX_AUDIT_LINE bytes held at once; None for a longer one
    (read past to its end, never held)."""
    while line := f.readline(MAX_AUDIT_LINE + 1):
        if len(line) <= MAX_AUDIT_LINE or line.endswith(b"\n"):
            yield line
            continue
        while line and not line.endswith(b"\n"):
            line = f.readline(MAX_AUDIT_LINE)
        yield None


def _audit_event(raw: bytes, began: dict[str, float]) -> Event | None:
    """An outcome line's event (None for any other line); an intent line's time kept in began,
    the oldest forgotten past MAX_OPEN_INTENTS (an intent whose outcome never came: a crash)."""
    try:
        entry = json.loads(raw.decode("utf-8", "replace"))
    except (ValueError, RecursionError):
        return None
    if not isinstance(entry, dict) or not _number(entry.get("time")):
        return None
    entry_id = entry.get("id")
    if entry.get("phase") == "intent" and isinstance(entry_id, str):
        began[entry_id] = float(entry["time"])
        while len(began) > MAX_OPEN_INTENTS:
            del began[next(iter(began))]
    if entry.get("phase") != "outcome":
        return None
    action, subject = str(entry.get("action") or "action"), str(entry.get("subject") or entry.get("target") or "")
    result = str(entry.get("result") or entry.get("verdict") or "")
    who = str(entry.get("user") or "")
    text = f"{action} {subject}" + (f" by {who}" if who else "") + (f": {result}" if result else "")
    at = began.pop(entry_id, None) if isinstance(entry_id, str) else None
    return Event(float(entry["time"]) if at is None else at, "audit", action, text[:300],
                 severity="error" if result == "error" else "info")


def alert_events(alerts: Iterable) -> list[Event]:
    """The console's alerts (console/core/state.py Alert): raised, and resolved when they were."""
    out = []
    for a in alerts:
        out.append(Event(a.time, "alert", "raised", a.text, a.stage or "", severity=a.severity))
        if a.resolved_at is not None:
            out.append(Event(a.resolved_at, "alert", "resolved", a.text, a.stage or ""))
    return out


def ledger_events(ledger: dict, unverified: str = "") -> list[Event]:
    """Each message the box's watchers sent, as their leader's ledger on the box keeps it: when it
    reached its first receiver, its kind (alert, repeat, resolved, recovery, ...), its title and the
    receivers that took it; and, where the ledger let older ones go, how many (a not_shown event
    before its oldest). A ledger written before ledgers kept every message says only the alerts
    still standing, each when it was first sent. Anyone on the box may write the ledger: its text
    is only shown (inert), and `unverified` (why this machine's watch key does not vouch for it)
    is said on each of its events."""
    from samai.console.core.watch.ledger import ledger_sent, ledger_told

    note = f" (unverified: the ledger {unverified})" if unverified else ""
    told = ledger_told(ledger)
    if told is None:
        return [Event(sent.first, "watcher", "sent", sent.text + note, sent.stage,
                      severity=sent.severity if sent.severity in ("info", "warning", "error") else "info")
                for sent in ledger_sent(ledger).values()]
    messages, dropped = told
    out = [Event(t.at, "watcher", t.kind, t.title + (f": {t.detail}" if t.detail else "")
                 + (f" (to {', '.join(t.to)})" if t.to else "") + note, t.stage, severity=t.severity)
           for t in messages]
    if dropped:
        at = messages[0].at if messages else time.time()
        out.insert(0, Event(at, "watcher", NOT_SHOWN, f"{dropped:,} earlier messages the watchers sent are not "
                            f"shown: the ledger on the box keeps the newest {len(messages):,}", severity="warning"))
    return out


def ledger_unverified(ledger: dict) -> str:
    """Why this machine's watch key does not vouch for the box's ledger ("" when it sealed it, or
    there is none). The key is read, never made: a console that never watched has none."""
    from samai.console.core.watch.trust import Trust, TrustError, key_path

    if not ledger:
        return ""
    if not key_path().exists():
        return "cannot be checked: this machine has no watch key"
    try:
        return Trust.load().open(ledger).why
    except TrustError as e:
        return f"cannot be checked: {e}"


def merged(*sources: Iterable[Event], since: float | None = None) -> list[Event]:
    """Every event in time order (a source's own order kept among equal times), from `since` on."""
    events = [e for source in sources for e in source if since is None or e.time >= since]
    return sorted(events, key=lambda e: e.time)


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1e11


async def read_timeline(box: Box, cfg: Config, audit: Path, *, since: float | None = None,
                        more: Iterable[Event] = ()) -> list[Event]:
    """Every stage's runs from its logs, the box's records and GPU events, what its watchers sent,
    and this machine's audit log, merged (with `more`: the TUI's own alerts)."""
    from samai.console.core.training.history import read_history

    snap = await box.snapshot(processes=False)
    runs, unread = [], []
    for stage in cfg.stages:
        log = cfg.path_of(stage.log)
        history, problems = await read_history(box, log, stage.markers)
        runs.append(run_events(stage.name, history))
        # What its runs leave out (a log not read, older runs not listed): said at the end, when it was read.
        # A stage never fired has no log: no run of it is left out.
        unread += [Event(snap.time, "log", NOT_SHOWN, problem, stage.name, severity="warning") for problem in problems
                   if problem != missing_notice(log)]
    try:
        ledger = (await box.watchers()).ledger
    except (BoxError, TransportError) as e:
        ledger = {}
        unread.append(Event(snap.time, "watcher", NOT_SHOWN, f"what the box's watchers sent was not read: {e}",
                            severity="warning"))
    return merged(*runs, record_events(snap), gpu_events(snap.gpus.events),
                  ledger_events(ledger, ledger_unverified(ledger)),
                  audit_events(audit, since, MAX_AUDIT_EVENTS), more, unread, since=since)


LINES_BEFORE = 20  # a log opened at a line shows this many lines before it
SCAN_READ = 1 << 20


async def line_start(box: Box, path: str, line: int) -> tuple[int, int]:
    """Where to open a log on the box so that its 1-based line `line` is LINES_BEFORE lines in:
    (the byte offset to read from, the line's index from there). The raw bytes' line breaks are
    counted (a decoded line may hold a replaced byte: its length says nothing of its bytes)."""
    wanted = max(0, line - 1 - LINES_BEFORE)  # line breaks before the first line shown
    offset = seen = 0
    while wanted:
        data = (await box.tail(path, offset=offset, max_bytes=SCAN_READ)).data
        if not data:
            break  # shorter than that now: from its start
        at = -1
        while seen < wanted:
            at = data.find(b"\n", at + 1)
            if at < 0:
                break
            seen += 1
        if seen == wanted:
            return offset + at + 1, LINES_BEFORE
        offset += len(data)
    return 0, line - 1
