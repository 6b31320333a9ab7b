"""Alerts: what the console noticed, the active ones first (newest first), then those whose
condition has gone, dimmed with when they resolved, each with the key that deals with it."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from textual.content import Content
from textual.widgets import Static

from samai.console.core import units
from samai.remote.safe_text import visible

if TYPE_CHECKING:
    from samai.console.core.alertbook import Alert
    from samai.console.core.update import StateUpdate

STYLE = {"info": "$success", "warning": "$warning", "error": "$error bold"}
RESOLVED = "$foreground 50%"
SHOWN = 50
READONLY_HINTS = ("l ",)  # the hints a read-only console keeps: reading a log changes nothing


def _clock(t: float) -> str:
    return units.local_time(t)


class AlertsPane(Static):
    """With `readonly`, no hint offers a key that would change the box (only `l log` stays)."""

    DEFAULT_CSS = "AlertsPane { height: 1fr; padding: 0 1; overflow-y: auto; }"

    def __init__(self, *, readonly: bool = False, box_name: str | None = None, id: str | None = None) -> None:
        """box_name: with several boxes, each alert says whose box it is about."""
        super().__init__(id=id)
        self.readonly = readonly
        self.box_name = box_name

    def show_update(self, update: StateUpdate) -> None:
        if update.alerts_changed:
            self.show(update.alerts)

    def _hint(self, alert: Alert) -> str:
        parts = alert.hint.split(" · ") if alert.hint else []
        return " · ".join(p for p in parts if not self.readonly or p.startswith(READONLY_HINTS))

    def show(self, alerts: list[Alert]) -> None:
        if self.box_name:
            alerts = [replace(a, text=f"{self.box_name}: {a.text}") for a in alerts]
        active = [a for a in alerts if a.active]
        resolved = [a for a in alerts if not a.active]
        self.border_subtitle = _count(active, resolved)
        if not alerts:
            self.update(Content.styled("nothing to report", "$foreground 60%"))
            return
        parts: list = []
        for a in (active + resolved)[:SHOWN]:
            # An alert's text quotes the box (paths, log lines): plain text, control characters as stand-ins.
            resolved_at = a.resolved_at  # None while the alert is active (Alert.active)
            if resolved_at is None:
                parts += [_clock(a.time) + " ", (f"{a.severity:<7} ", STYLE[a.severity]), visible(a.text)]
                hint = self._hint(a)
                if hint:
                    parts += ["  ", (f"[{hint}]", "$accent")]
            else:
                parts.append((f"{_clock(a.time)} {a.severity:<7} {visible(a.text)}  "
                              f"(resolved {_clock(resolved_at)})", RESOLVED))
            parts.append("\n")
        self.update(Content.assemble(*parts[:-1]))


def _count(active: list[Alert], resolved: list[Alert]) -> str:
    """The active errors and warnings: what still needs the operator."""
    errors = sum(1 for a in active if a.severity == "error")
    warnings = sum(1 for a in active if a.severity == "warning")
    said = [f"{errors} error{'s' * (errors != 1)}"] if errors else []
    said += [f"{warnings} warning{'s' * (warnings != 1)}"] if warnings else []
    if not said and (active or resolved):
        said = ["no errors or warnings"]
    if resolved:
        said.append(f"{len(resolved)} resolved")
    return " · ".join(said)
