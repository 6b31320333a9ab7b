"""The leader's ledger: what it sent and what it saw, left on the box for the next leader (a
restart, a cron run, another watcher) and for the timeline. Read like every file from the box:
each number bounded before any arithmetic, each text cut short (and made inert where it is said),
and its "sent" believed only when this watcher's key sealed it (trust.py).

"sent" holds the alerts sent and still standing (what not to send again); "told" every message
the watchers sent, the newest MAX_TOLD (with "told_dropped", how many older ones it no longer
holds): when, its kind, severity and title, its stage, and the receivers that took it (by name)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from samai.console.core.watch.trust import MAX_SEALED, Opened, Trust, contents
from samai.remote.model import watch_time

MAX_SENT = 300  # alerts kept in the ledger, the most recent
MAX_TOLD = 200  # messages sent kept in the ledger, the newest
MAX_TO = 10  # receivers named for one message
TOLD_KINDS = frozenset({"alert", "repeat", "resolved", "capped", "suppressed", "unreachable", "reachable", "recovery"})
MAX_KEY = 400
MAX_TITLES = 10  # titles of held-back messages the summary shows (its count is kept whole)
FUTURE_S = 86400.0  # a time this far past now was not written by a watcher's clock


@dataclass
class Sent:
    """One alert as sent: when first and last, and what it said (for its resolution)."""

    first: float
    last: float
    text: str  # what it said, for its resolution
    severity: str
    stage: str = ""  # a stage run's alert: the run it is about (it stands while that run is the stage's last)
    run: float | None = None
    folded: bool = False  # said as a line of its run's death message: it resolves with it, unsaid

    def to_json(self) -> dict[str, object]:
        return {"first": self.first, "last": self.last, "text": self.text, "severity": self.severity,
                "stage": self.stage, "run": self.run, "folded": self.folded}


@dataclass
class Told:
    """One message the watchers sent: when it first reached a receiver, what it was (its title,
    and for a recovery the first line of its body) and which receivers took it (their names, such
    as "ntfy #1": never a URL)."""

    at: float
    kind: str
    severity: str
    title: str
    stage: str = ""
    detail: str = ""
    to: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        return {"at": self.at, "kind": self.kind, "severity": self.severity, "title": self.title,
                "stage": self.stage, "detail": self.detail, "to": self.to}


@dataclass
class HeldBack:
    """What the hourly cap held back since its last summary: counted whole, a few titles kept."""

    count: int = 0
    titles: list[str] = field(default_factory=list)
    since: float | None = None  # the first one held back
    summary_at: float | None = None  # when they are summed up (an hour after the last summary at least)
    said: bool = False  # the notice that the cap holds was sent
    last_summary: float | None = None

    def to_json(self) -> dict[str, object]:
        return {"count": self.count, "titles": self.titles, "since": self.since, "summary_at": self.summary_at,
                "said": self.said, "last_summary": self.last_summary}


@dataclass
class LedgerRead:
    """A ledger as this watcher may use it. What only adds messages (the stages seen running) is
    taken from any ledger; what holds messages back (sent, the hour's count, the recoveries done,
    the time of the last look) only from one this watcher's key sealed."""

    trusted: bool
    why: str  # why it is not trusted ("" when it is, or when there is none)
    sent: dict[str, Sent] = field(default_factory=dict)
    windows: dict[str, list[float]] = field(default_factory=dict)
    held: HeldBack = field(default_factory=HeldBack)
    statuses: dict[str, str] = field(default_factory=dict)
    box_at: float | None = None
    recoveries: object = None  # RecoveryBook.of reads it
    told: list[Told] = field(default_factory=list)
    told_dropped: int = 0


def _time(value: object, now: float) -> float | None:
    t = watch_time(value)
    return t if t is not None and t <= now + FUTURE_S else None


def _text(value: object, limit: int) -> str:
    return value[:limit] if isinstance(value, str) else ""


def read_sent(raw: object, now: float) -> dict[str, Sent]:
    """The ledger's sent alerts, each checked (anyone may have written the file)."""
    out: dict[str, Sent] = {}
    for key, v in list(raw.items())[:MAX_SENT * 2] if isinstance(raw, dict) else ():
        if not (isinstance(key, str) and len(key) <= MAX_KEY and isinstance(v, dict)):
            continue
        first, last = _time(v.get("first"), now), _time(v.get("last"), now)
        if first is None or last is None:
            continue
        run = watch_time(v.get("run"))
        out[key] = Sent(first, max(first, last), _text(v.get("text"), 200), _text(v.get("severity"), 20),
                        _text(v.get("stage"), 100), run, v.get("folded") is True)
    return out


def ledger_sent(raw: dict) -> dict[str, Sent]:
    """What a ledger on the box says was sent, unverified: for a view of the box's history (the
    timeline), never to decide what this watcher sends."""
    return read_sent(contents(raw).get("sent"), float("inf"))


def read_told(raw: object, now: float) -> list[Told]:
    """The ledger's messages sent, each checked (anyone may have written the file), oldest first."""
    out: list[Told] = []
    for v in raw[-MAX_TOLD:] if isinstance(raw, list) else ():
        at = _time(v.get("at"), now) if isinstance(v, dict) else None
        if at is None:
            continue
        kind, severity, to = v.get("kind"), v.get("severity"), v.get("to")
        out.append(Told(at, kind if isinstance(kind, str) and kind in TOLD_KINDS else "sent",
                        severity if isinstance(severity, str) and severity in ("info", "warning", "error") else "info",
                        _text(v.get("title"), 300), _text(v.get("stage"), 100), _text(v.get("detail"), 300),
                        [_text(r, 40) for r in to[:MAX_TO] if isinstance(r, str)] if isinstance(to, list) else []))
    return sorted(out, key=lambda t: t.at)


def told_dropped(raw: object) -> int:
    return raw if type(raw) is int and 0 <= raw < 2**53 else 0


def ledger_told(raw: dict) -> tuple[list[Told], int] | None:
    """Every message a ledger on the box says the watchers sent, and how many older ones it no
    longer holds, unverified (for the timeline); None for a ledger that keeps no such list (one
    written before ledgers did: its `sent` is all it says)."""
    data = contents(raw)
    if "told" not in data:
        return None
    return read_told(data.get("told"), float("inf")), told_dropped(data.get("told_dropped"))


def _windows(raw: object, now: float) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for lane, times in list(raw.items())[:100] if isinstance(raw, dict) else ():
        if isinstance(lane, str) and len(lane) <= MAX_KEY and isinstance(times, list):
            kept = sorted(t for t in (_time(x, now) for x in times[:1000]) if t is not None)
            out[lane] = kept[-200:]
    return out


def _held(raw: object, now: float) -> HeldBack:
    if not isinstance(raw, dict):
        return HeldBack()
    count = raw.get("count")
    titles = raw.get("titles")
    return HeldBack(count if type(count) is int and 0 <= count < 2**53 else 0,
                    [_text(t, 200) for t in titles[:MAX_TITLES]] if isinstance(titles, list) else [],
                    _time(raw.get("since"), now), _time(raw.get("summary_at"), now + FUTURE_S),
                    raw.get("said") is True, _time(raw.get("last_summary"), now))


def _statuses(raw: object) -> dict[str, str]:
    return {k: v for k, v in list(raw.items())[:200] if isinstance(k, str) and len(k) <= 100 and isinstance(v, str)
            and len(v) <= 20} if isinstance(raw, dict) else {}


def read_ledger(raw: dict, trust: Trust, now: float) -> LedgerRead:
    """The box's ledger (as the watchers' folder gave it), bounded, and trusted as far as its seal says."""
    if not raw:
        return LedgerRead(False, "")
    opened: Opened = trust.open(raw)
    data = opened.data
    read = LedgerRead(opened.trusted, opened.why, statuses=_statuses(data.get("statuses")))
    if opened.trusted:
        read.sent = read_sent(data.get("sent"), now)
        read.windows = _windows(data.get("windows"), now)
        read.held = _held(data.get("held"), now)
        read.box_at = watch_time(data.get("box_at"))
        read.recoveries = data.get("recoveries")
        read.told, read.told_dropped = read_told(data.get("told"), now), told_dropped(data.get("told_dropped"))
    return read


def sealed_ledger(trust: Trust, data: dict, sent: dict[str, Sent], told: list[Told] | None = None,
                  dropped: int = 0) -> dict:
    """The ledger to leave on the box: `data`, the newest sent alerts and the newest messages
    sent, as many as its bound allows (the oldest give way first, the messages counted in
    told_dropped; the box reads the file whole or not at all)."""
    newest = sorted(sent.items(), key=lambda kv: kv[1].last, reverse=True)[:MAX_SENT]
    kept = [t.to_json() for t in (told or [])[-MAX_TOLD:]]
    dropped += len(told or []) - len(kept)
    while True:
        sealed = trust.seal({**data, "sent": {k: v.to_json() for k, v in newest}, "told": kept,
                             "told_dropped": dropped})
        if len(json.dumps(sealed)) <= MAX_SEALED or not (newest or kept):
            return sealed
        newest = newest[: len(newest) * 3 // 4]
        cut = len(kept) - len(kept) * 3 // 4
        kept, dropped = kept[cut:], dropped + cut
