"""One time-ordered account of the box: every stage's runs (started, their marker and disk lines,
how they ended and why), the operator's stops, the audit log's actions, the GPUs' events and the
console's alerts, raised and resolved, each with its source.

A log line carries no time of its own: a run's start is its header's, its end its log file's
last write (CHAIN_DONE is the last line a chain writes; the runs and their ends are its chain's
lines, as history.py reads them, never a copy the stage printed), and the marker lines between are placed
in order right after their run's start, marked `approx` with the run's window. Everything here is
box text (or the audit log's, which holds box text): shown through visible(), never markup."""

from __future__ import annotations

import calendar
import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from samai.console.core.config import Config
from samai.console.core.history import RunRecord
from samai.remote.boxapi import Box, BoxError
from samai.remote.model import GpuEvent, Snapshot
from samai.remote.transport import TransportError

MAX_AUDIT_BYTES = 4 << 20  # the newest part of the audit log read: months of actions


@dataclass(frozen=True)
class Event:
    time: float
    source: str  # "log", "record", "audit", "gpu", "alert"
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
    """A stage's runs as its logs hold them (console/core/history.py)."""
    out: list[Event] = []
    for run in runs:
        started = header_time(run.started)
        end = run.ended_at
        if started is not None:
            out.append(Event(started, "log", "started", f"{stage} started (pid {run.pid})", stage, run.path, None))
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


def audit_events(path: Path, max_bytes: int = MAX_AUDIT_BYTES) -> list[Event]:
    """The audit log's outcome lines (what was done, by whom, how it went), each at its intent's
    time when it has one (when the action began: a fire's outcome comes after its verify window);
    a line that is not one (torn, or not ours) is left out."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - max_bytes))
            data = f.read()
    except OSError:
        return []
    out, began = [], {}
    for raw in data.decode("utf-8", "replace").splitlines():
        try:
            entry = json.loads(raw)
        except ValueError:
            continue
        if not isinstance(entry, dict) or not _number(entry.get("time")):
            continue
        if entry.get("phase") == "intent" and isinstance(entry.get("id"), str):
            began[entry["id"]] = float(entry["time"])
        if entry.get("phase") != "outcome":
            continue
        action, subject = str(entry.get("action") or "action"), str(entry.get("subject") or entry.get("target") or "")
        result = str(entry.get("result") or entry.get("verdict") or "")
        who = str(entry.get("user") or "")
        text = f"{action} {subject}" + (f" by {who}" if who else "") + (f": {result}" if result else "")
        out.append(Event(began.get(str(entry.get("id")), float(entry["time"])), "audit", action, text[:300],
                         severity="error" if result == "error" else "info"))
    return out


def alert_events(alerts: Iterable) -> list[Event]:
    """The console's alerts (console/core/state.py Alert): raised, and resolved when they were."""
    out = []
    for a in alerts:
        out.append(Event(a.time, "alert", "raised", a.text, a.stage or "", severity=a.severity))
        if a.resolved_at is not None:
            out.append(Event(a.resolved_at, "alert", "resolved", a.text, a.stage or ""))
    return out


def ledger_events(ledger: dict) -> list[Event]:
    """What the box's watchers sent (their leader's ledger): each alert when it was first sent."""
    from samai.console.core.watch.policy import ledger_sent

    return [Event(sent.first, "watcher", "sent", sent.text, sent.stage, severity=sent.severity or "info")
            for sent in ledger_sent(ledger).values()]


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
    from samai.console.core.history import read_history

    snap = await box.snapshot(processes=False)
    runs = []
    for stage in cfg.stages:
        history, _problems = await read_history(box, cfg.path_of(stage.log), stage.markers)
        runs.append(run_events(stage.name, history))
    try:
        ledger = (await box.watchers()).ledger
    except (BoxError, TransportError):
        ledger = {}
    return merged(*runs, record_events(snap), gpu_events(snap.gpus.events), ledger_events(ledger),
                  audit_events(audit), more, since=since)


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
