"""The alerts and their lifecycle: raised (newest first, bounded), resolved when their condition
goes, and the one-failure-one-alert rule between a failed fire and the poll that sees it end.
Every feed and the state's own poll write into one book; the panes, the watcher and the fleet
rows read it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from samai.console.core.fixes import FixAction
from samai.console.core.redact import redact
from samai.remote.model import Severity

MAX_ALERTS = 200
RUN_ENDED = "run_ended"  # the alert of a run that ended badly (ConsoleState's stage views)
FIRE_FAILED = "fire_failed"  # the alert of a fire whose chain failed at once (the box screen's fire)


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


def run_error(at: float, text: str, stage: str, run: float | None, code: str = "") -> Alert:
    """An error about a stage's run: `l` opens that stage's log, `x` restarts it (through
    restart's own dialog), whatever log the pane shows."""
    return Alert(at, "error", text, stage, "l log · x restart", code=code, action=FixAction.restart(stage),
                 run=run)


class AlertBook:
    """The alerts as they stand, newest first (at most MAX_ALERTS kept)."""

    def __init__(self) -> None:
        self.alerts: list[Alert] = []

    def raise_all(self, alerts: list[Alert]) -> None:
        """Raised in this order (the last is the newest)."""
        self.alerts = (list(reversed(alerts)) + self.alerts)[:MAX_ALERTS]

    def raise_failed_fire(self, alert: Alert) -> None:
        """A failed fire's alert replaces a poll's alert of the same run's end: one failure, one
        alert, the one with the stage's last words."""
        if alert.code == FIRE_FAILED and alert.run is not None:
            self.alerts = [a for a in self.alerts if not (a.active and a.code == RUN_ENDED
                                                          and a.stage == alert.stage and a.run == alert.run)]
        self.raise_all([alert])

    def resolve(self, condition: Callable[[Alert], bool], now: float) -> int:
        """The active alerts that meet the condition resolved now; how many."""
        count = 0
        for i, a in enumerate(self.alerts):
            if a.active and condition(a):
                self.alerts[i] = replace(a, resolved_at=now)
                count += 1
        return count

    def active(self) -> list[Alert]:
        return [a for a in self.alerts if a.active]

    def said_by_fire(self, stage: str, run: float | None) -> bool:
        """Whether that run's failure is already an alert: its fire's (one failure, one alert)."""
        return any(a.active and a.code == FIRE_FAILED and a.stage == stage and a.run == run for a in self.alerts)

    def standing(self, code: str, text: str) -> bool:
        """Whether an alert of this code and text stands (raised once, however often it is read)."""
        return any(a.code == code and a.text == redact(text) for a in self.alerts)
