"""What the watcher sends, and when: pure rules over the state's alerts, no I/O.

One message per alert, keyed by its identity (not its text: a finding whose numbers change is
the same finding); again after `repeat_after` while it stands and nobody acknowledged it; its
resolution when it goes. At most `max_per_hour`: the first message held back says so once, and
what was held back is counted in one message when the hour has room again."""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field
from typing import Literal, TypeGuard

from samai.console.core import units
from samai.console.core.config import SEVERITIES, Notify
from samai.console.core.state import Alert
from samai.remote.safe_text import visible

MAX_TEXT = 600  # characters of box text in one message
HOUR_S = 3600.0
OUTAGE_CODE = "box_unreachable"  # the state's outage alert: the watcher's own outage rule says it instead

Kind = Literal["alert", "repeat", "resolved", "capped", "suppressed", "unreachable", "reachable", "recovery"]


@dataclass(frozen=True)
class Message:
    key: str  # the alert's identity ("" for the watcher's own messages)
    kind: Kind
    severity: str
    title: str
    body: str


def plain(text: str, limit: int = MAX_TEXT) -> str:
    """Box text as a message carries it: one line, no control or invisible characters, bounded."""
    one = visible(" ".join(str(text).split()))
    return one if len(one) <= limit else one[: limit - 1] + "…"


_NUMBERS = re.compile(r"\d+(?:[.,:]\d+)*")


def alert_identity(alert: Alert) -> str:
    """What makes two alerts the same one for a receiver. A stage run's alert is that run's (its
    code, or its text without numbers for a marker line); a finding is its code and its message
    without numbers (a disk figure that moves is the same finding); the outage is one."""
    if alert.code == OUTAGE_CODE:
        return OUTAGE_CODE
    parts = [alert.code or "marker", alert.stage or "", f"{alert.run:.3f}" if alert.run is not None else ""]
    if not alert.code or alert.finding is not None or alert.stage is None:
        parts.append(_NUMBERS.sub("#", alert.text)[:200])
    return "|".join(parts)


def at_least(severity: str, minimum: str) -> bool:
    return SEVERITIES.index(severity) >= SEVERITIES.index(minimum) if severity in SEVERITIES else False


def clock(t: float) -> str:
    return units.local_time(t, "%Y-%m-%d %H:%M:%S %Z")


@dataclass
class Sent:
    """One alert as sent: when first and last, and what it said (for its resolution)."""

    first: float
    last: float
    text: str  # what it said, for its resolution
    severity: str
    stage: str = ""  # a stage run's alert: the run it is about (it stands while that run is the stage's last)
    run: float | None = None

    def to_json(self) -> dict[str, object]:
        return {"first": self.first, "last": self.last, "text": self.text, "severity": self.severity,
                "stage": self.stage, "run": self.run}


def _number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


def ledger_sent(ledger: dict) -> dict[str, Sent]:
    """The ledger's sent alerts, each checked (anyone may have written the file)."""
    out: dict[str, Sent] = {}
    raw = ledger.get("sent")
    for key, v in (raw.items() if isinstance(raw, dict) else ()):
        if isinstance(key, str) and isinstance(v, dict) and _number(v.get("first")) and _number(v.get("last")):
            run = v.get("run")
            out[key] = Sent(float(v["first"]), float(v["last"]), str(v.get("text", ""))[:200],
                            str(v.get("severity", "")), str(v.get("stage") or "")[:100],
                            float(run) if _number(run) else None)
    return out


@dataclass
class NotifyPolicy:
    settings: Notify
    box: str  # the box's name as the operator opens it (`--box NAME`); "" for the config's one box
    open_hint: str = "samai-console"  # the command that opens this box's console
    sent: dict[str, Sent] = field(default_factory=dict)  # the alerts sent and still standing
    _window: deque[float] = field(default_factory=deque)  # when each message of the last hour went
    _held: list[str] = field(default_factory=list)  # the titles held back by the cap
    _capped_said: bool = False
    _seen: set[str] = field(default_factory=set)  # the identities this watcher's own state raised

    def due(self, alerts: list[Alert], acked: set[str], now: float,
            runs: dict[str, float] | None = None) -> list[Message]:
        """The messages these alerts (the state's, newest first) call for now. runs: each stage's
        last run (fired_at), for the run alerts an earlier watcher sent (a run's end is an alert
        only to the watcher that saw it end: to the next one it stands while that run is the last)."""
        standing: dict[str, Alert] = {}
        for a in alerts:
            if a.active and a.code != OUTAGE_CODE and at_least(a.severity, self.settings.min_severity):
                standing.setdefault(alert_identity(a), a)  # the newest of one identity
        self._seen |= standing.keys()
        out = [self._resolution(key, now) for key, was in list(self.sent.items())
               if key not in standing and not self._inherited_standing(key, was, runs or {})]
        for key, a in reversed(standing.items()):  # oldest first
            was = self.sent.get(key)
            if was is None:
                out.append(self._alert_message(key, a, "alert"))
                self.sent[key] = Sent(now, now, plain(a.text, 120), a.severity, a.stage or "", a.run)
            elif key not in acked and now - was.last >= self.settings.repeat_after:
                out.append(self._alert_message(key, a, "repeat"))
                was.last = now
        return self.capped(out, now)

    def _inherited_standing(self, key: str, was: Sent, runs: dict[str, float]) -> bool:
        """An earlier watcher's run alert this one never saw: standing while its run is the stage's last."""
        return key not in self._seen and was.run is not None and runs.get(was.stage) == was.run

    def adopt(self, ledger: dict) -> None:
        """The box's last leader's ledger as this one's own: what it sent and still stands is
        not sent again (its resolution is, when it goes), and its hour's messages count."""
        self.sent = ledger_sent(ledger)
        window = ledger.get("window")
        times = [t for t in (window if isinstance(window, list) else []) if _number(t)]
        self._window = deque(sorted(float(t) for t in times)[-self.settings.max_per_hour:])
        held = ledger.get("held")
        self._held = [str(t)[:200] for t in (held if isinstance(held, list) else [])][:1000]

    def ledger(self, limit: int = 500) -> dict:
        """What the next leader adopts."""
        newest = sorted(self.sent.items(), key=lambda kv: kv[1].last, reverse=True)[:limit]
        return {"sent": {k: v.to_json() for k, v in newest}, "window": list(self._window), "held": self._held}

    @property
    def held(self) -> int:
        """Messages the hourly cap holds back now."""
        return len(self._held)

    def capped(self, messages: list[Message], now: float) -> list[Message]:
        """What the hour's cap lets through: the first one held back is said once; what was held
        back is counted in one message when the hour has room again."""
        while self._window and now - self._window[0] >= HOUR_S:
            self._window.popleft()
        out: list[Message] = []
        if self._held and len(self._window) < self.settings.max_per_hour:
            out.append(self._suppressed())
            self._window.append(now)
        for m in messages:
            if len(self._window) < self.settings.max_per_hour:
                out.append(m)
                self._window.append(now)
                continue
            self._held.append(m.title)
            if not self._capped_said:  # beyond the cap, once: the operator knows more is coming
                self._capped_said = True
                until = clock(self._window[0] + HOUR_S)
                out.append(Message("", "capped", "warning", self._title("notifications held back"),
                                   f"{self.settings.max_per_hour} messages were sent in the last hour, the most "
                                   f"[notify] max_per_hour allows. Further alerts are counted and summed up "
                                   f"at {until}.\n{self._open_line()}"))
        return out

    def _suppressed(self) -> Message:
        held, self._held, self._capped_said = self._held, [], False
        shown = "\n".join(f"- {t}" for t in held[:10]) + (f"\n- … and {len(held) - 10} more" if len(held) > 10 else "")
        return Message("", "suppressed", "warning", self._title(f"{len(held)} more suppressed"),
                       f"{len(held)} more messages were held back by the hourly cap:\n{shown}\n{self._open_line()}")

    def _alert_message(self, key: str, a: Alert, kind: Kind) -> Message:
        again = "still active: " if kind == "repeat" else ""
        lines = [f"{a.severity} at {clock(a.time)}" + (f" on box {self.box}" if self.box else ""),
                 f"stage: {a.stage}" if a.stage else "", plain(a.text)]
        if a.action is not None:
            lines.append(f"fix: {self._open_line(bare=True)} and press x: {a.action}")
        else:
            lines.append(self._open_line())
        if kind == "repeat":
            lines.append("Press A on the console's alerts to acknowledge it and stop the repeats.")
        return Message(key, kind, a.severity, self._title(again + plain(a.text, 120)),
                       "\n".join(line for line in lines if line))

    def _resolution(self, key: str, now: float) -> Message:
        was = self.sent.pop(key)
        return Message(key, "resolved", "info", self._title("resolved: " + was.text),
                       f"resolved at {clock(now)} (raised at {clock(was.first)}).")

    def _title(self, text: str) -> str:
        return f"samai {self.box}: {text}" if self.box else f"samai: {text}"

    def _open_line(self, *, bare: bool = False) -> str:
        command = f"{self.open_hint} --box {self.box}" if self.box else self.open_hint  # the console of this box
        return f"run `{command}`" if bare else f"Open it with `{command}`."


@dataclass
class OutageWatch:
    """A box that does not answer for `after` seconds is one message, and its return another."""

    box: str
    after: float
    since: float | None = None  # the first failed poll of this outage
    said: bool = False

    def failed(self, error: str, now: float) -> Message | None:
        if self.since is None:
            self.since = now
        if self.said or now - self.since < self.after:
            return None
        self.said = True
        where = f"box {self.box}" if self.box else "the box"
        return Message("", "unreachable", "error", f"samai {self.box or 'box'}: unreachable for "
                       f"{_minutes(now - self.since)}", f"{where} has not answered since {clock(self.since)}: "
                       f"{plain(error)}\nThe watcher keeps asking, and says when it answers again.")

    def answered(self, now: float) -> Message | None:
        since, said, self.since, self.said = self.since, self.said, None, False
        if not said or since is None:
            return None
        return Message("", "reachable", "info", f"samai {self.box or 'box'}: reachable again",
                       f"it answers again at {clock(now)}, after {_minutes(now - since)} without an answer.")


def _minutes(seconds: float) -> str:
    minutes = seconds / 60
    return f"{minutes:.0f} min" if minutes >= 1 else f"{seconds:.0f} s"
