"""What the watcher sends, and when: pure rules over the state's alerts, no I/O.

One message per alert, keyed by its identity (not its text: a finding whose numbers change is
the same finding); again after `repeat_after` while it stands and nobody acknowledged it; its
resolution when it goes. A run's end is one message: the lines of its own output that raised
alerts (its markers) are lines of its death message, not messages of their own.

The hourly cap is kept per lane: each error-level alert the console judged itself (a death,
serve_hung, a failed recovery, the outage) has a lane of its code and stage, and everything else
(warnings, what a stage's own output raised, repeats, resolutions) shares one. So nothing of
lower severity, and nothing a stage can print, spends the budget of a death. What a lane holds
back is counted exactly; the notice that the cap holds and the summary go at most once an hour."""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

from samai.console.core import units
from samai.console.core.alertbook import FIRE_FAILED, RUN_ENDED, Alert
from samai.console.core.config import SEVERITIES, Notify
from samai.console.core.watch.ledger import MAX_TITLES, HeldBack, LedgerRead, Sent
from samai.remote.safe_text import visible

MAX_TEXT = 600  # characters of box text in one line of a message
MAX_TITLE = 250
MAX_LINES = 40  # lines of one message's body
HOUR_S = 3600.0
OUTAGE_CODE = "box_unreachable"  # the state's outage alert: the watcher's own outage rule says it instead
REST = "rest"  # the lane of every message but the error-level ones the console judged itself
FOLD_POLLS = 3  # a running run's output alert waits this many polls for the run's death to fold into
MAX_FOLDED = 8  # output lines shown in one death message

Kind = Literal["alert", "repeat", "resolved", "capped", "suppressed", "unreachable", "reachable", "recovery"]
META: frozenset[str] = frozenset({"capped", "suppressed"})  # the cap's own words: never capped


def plain(text: str, limit: int = MAX_TEXT) -> str:
    """Box text as a message carries it: one line, no control or invisible characters, bounded."""
    one = visible(" ".join(str(text).split()))
    return one if len(one) <= limit else one[: limit - 1] + "…"


@dataclass(frozen=True)
class Message:
    """What a receiver gets. Its title and each line of its body are made inert and bounded here,
    whatever built them: no text reaches a receiver any other way."""

    key: str  # the alert's identity ("" for the watcher's own messages)
    kind: Kind
    severity: str
    title: str
    body: str
    lane: str = REST  # the hourly cap's lane it spends (see the module's doc)
    stage: str = ""  # the stage it is about, where it is about one

    def __post_init__(self) -> None:
        lines = self.body.split("\n")
        body = [plain(line) for line in lines[:MAX_LINES]]
        if len(lines) > MAX_LINES:
            body.append(f"… and {len(lines) - MAX_LINES} more lines")
        object.__setattr__(self, "title", plain(self.title, MAX_TITLE))
        object.__setattr__(self, "body", "\n".join(body))


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


def from_run_output(alert: Alert) -> bool:
    """Whether a stage run's own output raised it (a marker line, the training log's anomalies):
    text the stage chose, which its death message carries and which never spends a death's lane."""
    return (alert.stage is not None and alert.run is not None and alert.finding is None
            and alert.code not in (RUN_ENDED, FIRE_FAILED, OUTAGE_CODE))


def lane_of(alert: Alert) -> str:
    if alert.severity == "error" and not from_run_output(alert):
        return f"error|{alert.code}|{alert.stage or ''}"
    return REST


def at_least(severity: str, minimum: str) -> bool:
    return SEVERITIES.index(severity) >= SEVERITIES.index(minimum) if severity in SEVERITIES else False


def clock(t: float) -> str:
    return units.local_time(t, "%Y-%m-%d %H:%M:%S %Z")


@dataclass
class NotifyPolicy:
    settings: Notify
    box: str  # the box's name as the operator opens it (`--box NAME`); "" for the config's one box
    open_hint: str = "samai-console"  # the command that opens this box's console
    sent: dict[str, Sent] = field(default_factory=dict)  # the alerts sent and still standing
    windows: dict[str, deque[float]] = field(default_factory=dict)  # each lane: when its messages of the last hour went
    held_back: HeldBack = field(default_factory=HeldBack)
    _seen: set[str] = field(default_factory=set)  # the identities this watcher's own state raised
    _waiting: dict[str, int] = field(default_factory=dict)  # output alerts waiting for their run's end: polls waited

    def due(self, alerts: list[Alert], acked: set[str], now: float, runs: dict[str, float] | None = None,
            running: frozenset[str] = frozenset(), *, wait: bool = True, only_errors: bool = False) -> list[Message]:
        """The messages these alerts (the state's, newest first) call for now. runs: each stage's
        last run (fired_at), for the run alerts an earlier watcher sent (a run's end is an alert
        only to the watcher that saw it end: to the next one it stands while that run is the last).
        running: the stages running now, whose output alerts wait a few polls for a death to fold
        into (wait=False: none waits, as when the watcher ends). only_errors: a watcher beside a
        leader it cannot vouch for sends only the error-level alerts the console judged itself."""
        runs = runs or {}
        standing: dict[str, Alert] = {}
        for a in alerts:
            if a.active and a.code != OUTAGE_CODE and at_least(a.severity, self.settings.min_severity) and not (
                    only_errors and lane_of(a) == REST):
                standing.setdefault(alert_identity(a), a)  # the newest of one identity
        self._seen |= standing.keys()
        self._waiting = {k: n for k, n in self._waiting.items() if k in standing}
        out = [m for key, was in list(self.sent.items())
               if key not in standing and not self._inherited_standing(key, was, runs)
               and not (only_errors and was.severity != "error")
               for m in self._resolution(key, now)]
        folded = self._fold(standing, now)
        for key, a in reversed(standing.items()):  # oldest first
            was = self.sent.get(key)
            if was is None:
                if wait and self._waits(key, a, runs, running):
                    continue
                out.append(self._alert_message(key, a, "alert", folded.get(key, [])))
                self.sent[key] = Sent(now, now, plain(a.text, 120), a.severity, a.stage or "", a.run)
            elif not was.folded and key not in acked and now - was.last >= self.settings.repeat_after:
                out.append(self._alert_message(key, a, "repeat"))
                was.last = now
        return self.capped(out, now)

    def _fold(self, standing: dict[str, Alert], now: float) -> dict[str, list[str]]:
        """The output alerts of runs whose death is about to be sent, as lines of that death's
        message (recorded as sent: never a message of their own). Death key -> lines, oldest first."""
        deaths = {(a.stage, a.run): key for key, a in standing.items() if a.code == RUN_ENDED and key not in self.sent}
        folded: dict[str, list[str]] = {}
        for key, a in reversed(standing.items()):
            death = deaths.get((a.stage, a.run))
            if death is not None and key not in self.sent and from_run_output(a):
                folded.setdefault(death, []).append(a.text)
                self.sent[key] = Sent(now, now, plain(a.text, 120), a.severity, a.stage or "", a.run, folded=True)
                self._waiting.pop(key, None)
        return folded

    def _waits(self, key: str, a: Alert, runs: dict[str, float], running: frozenset[str]) -> bool:
        """Whether an output alert of a run still running waits (a few polls) for that run's end."""
        if not (from_run_output(a) and a.stage in running and runs.get(a.stage or "") == a.run):
            return False
        waited = self._waiting.get(key, 0)
        if waited >= FOLD_POLLS:
            return False
        self._waiting[key] = waited + 1
        return True

    def _inherited_standing(self, key: str, was: Sent, runs: dict[str, float]) -> bool:
        """An earlier watcher's run alert this one never saw: standing while its run is the stage's last."""
        return key not in self._seen and was.run is not None and runs.get(was.stage) == was.run

    def adopt(self, ledger: LedgerRead) -> None:
        """The box's last leader's ledger, when this watcher's key sealed it: what it sent and still
        stands is not sent again (its resolution is, when it goes), and its hour's messages count.
        What this watcher sent itself stays (it may have sent while another led)."""
        if not ledger.trusted:
            return
        self.sent = {**ledger.sent, **self.sent}
        for lane, times in ledger.windows.items():  # the fuller count of the two (they may be one)
            if len(times) > len(self.windows.get(lane, ())):
                self.windows[lane] = deque(times[-self.settings.max_per_hour:])
        if ledger.held.count >= self.held_back.count:
            self.held_back = ledger.held

    def ledger(self) -> dict:
        """What the next leader adopts (its sent alerts apart: ledger.sealed_ledger bounds them)."""
        return {"windows": {lane: list(times) for lane, times in self.windows.items() if times},
                "held": self.held_back.to_json()}

    @property
    def held(self) -> int:
        """Messages the hourly cap holds back now."""
        return self.held_back.count

    def capped(self, messages: list[Message], now: float) -> list[Message]:
        """What the hour's cap lets through, lane by lane: the first one held back is said once;
        what was held back is counted in one message, at most once an hour."""
        for lane in list(self.windows):
            window = self.windows[lane]
            while window and now - window[0] >= HOUR_S:
                window.popleft()
            if not window:
                del self.windows[lane]
        held = self.held_back
        out: list[Message] = []
        if held.count and held.summary_at is not None and now >= held.summary_at:
            out.append(self._summary(now))
        for m in messages:
            window = self.windows.setdefault(m.lane, deque())
            if m.kind in META or len(window) < self.settings.max_per_hour:
                out.append(m)
                if m.kind not in META:
                    window.append(now)
                continue
            out += self._hold(m, window, now)
        return out

    def _hold(self, m: Message, window: deque[float], now: float) -> list[Message]:
        held = self.held_back
        held.count += 1
        if len(held.titles) < MAX_TITLES:
            held.titles.append(m.title)
        held.since = held.since if held.since is not None else now
        if held.summary_at is None:
            last = held.last_summary if held.last_summary is not None else float("-inf")
            held.summary_at = max(window[0] + HOUR_S, last + HOUR_S)
        if held.said:
            return []
        held.said = True  # beyond the cap, once: the operator knows more is coming
        return [Message("", "capped", "warning", self._title("notifications held back"),
                        f"{self.settings.max_per_hour} messages of one kind were sent in the last hour, the most "
                        f"[notify] max_per_hour allows. Further ones are counted and summed up at "
                        f"{clock(held.summary_at)}.\n{self._open_line()}")]

    def _summary(self, now: float) -> Message:
        held, self.held_back = self.held_back, HeldBack(last_summary=now)
        shown = "\n".join(f"- {t}" for t in held.titles)
        more = f"\n- … and {held.count - len(held.titles)} more" if held.count > len(held.titles) else ""
        since = f" since {clock(held.since)}" if held.since is not None else ""
        return Message("", "suppressed", "warning", self._title(f"{held.count} held back"),
                       f"{held.count} messages were held back by the hourly cap{since}:\n{shown}{more}\n"
                       f"{self._open_line()}")

    def _alert_message(self, key: str, a: Alert, kind: Kind, folded: list[str] | None = None) -> Message:
        again = "still active: " if kind == "repeat" else ""
        lines = [f"{a.severity} at {clock(a.time)}" + (f" on box {self.box}" if self.box else ""),
                 f"stage: {a.stage}" if a.stage else "", plain(a.text)]
        said = [line for line in folded or () if plain(line, 120) not in plain(a.text)]  # the title quotes one
        if said:
            lines.append("its output before it ended:")
            lines += [f"- {line}" for line in said[-MAX_FOLDED:]]
            if len(said) > MAX_FOLDED:
                lines.append(f"- … and {len(said) - MAX_FOLDED} more lines")
        if a.action is not None:
            lines.append(f"fix: {self._open_line(bare=True)} and press x: {a.action}")
        else:
            lines.append(self._open_line())
        if kind == "repeat":
            lines.append("Press A on the console's alerts to acknowledge it and stop the repeats.")
        return Message(key, kind, a.severity, self._title(again + plain(a.text, 120)),
                       "\n".join(line for line in lines if line), lane_of(a) if kind == "alert" else REST,
                       a.stage or "")

    def _resolution(self, key: str, now: float) -> list[Message]:
        was = self.sent.pop(key)
        if was.folded:  # said inside its run's death message: that one's resolution says it
            return []
        return [Message(key, "resolved", "info", self._title("resolved: " + was.text),
                        f"resolved at {clock(now)} (raised at {clock(was.first)}).", stage=was.stage)]

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
                       f"{plain(error)}\nThe watcher keeps asking, and says when it answers again.",
                       f"error|{OUTAGE_CODE}|")

    def answered(self, now: float) -> Message | None:
        since, said, self.since, self.said = self.since, self.said, None, False
        if not said or since is None:
            return None
        return Message("", "reachable", "info", f"samai {self.box or 'box'}: reachable again",
                       f"it answers again at {clock(now)}, after {_minutes(now - since)} without an answer.")


def _minutes(seconds: float) -> str:
    minutes = seconds / 60
    return f"{minutes:.0f} min" if minutes >= 1 else f"{seconds:.0f} s"
