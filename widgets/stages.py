"""The stages bar: each stage with its key, state, elapsed time and last marker."""

from __future__ import annotations

import time

from textual.content import Content

from samai.console.core import units
from samai.console.core.state import StageView
from samai.remote.visible import visible
from samai.widgets.pane import Pane

STATUS_STYLE = {
    "idle": ("○", "$foreground 60%"),
    "running": ("●", "$primary bold"),
    "done": ("✓", "$success"),
    "failed": ("✗", "$error bold"),
    "lost": ("?", "$error"),
    "orphaned": ("!", "$error"),
    "blocked": ("■", "$warning"),
    "stopped": ("◼", "$foreground 60%"),
}
SAID = {"stopped": "stopped by the operator"}  # a deliberate stop is no failure: no rc shown
SEVERITY_STYLE = {"info": "$success", "warning": "$warning", "error": "$error bold"}


class StagesBar(Pane):
    DEFAULT_CSS = "StagesBar { height: auto; max-height: 6; padding: 0 1; }"

    def show(self, views: list[StageView], now: float | None = None) -> None:
        now = now or time.time()
        parts: list = []
        for v in views:
            glyph, style = STATUS_STYLE.get(v.status, ("·", ""))
            parts += [(f"[{visible(v.key)}]", "bold $accent"), " ", (v.name, "bold"), " ",
                      (f"{glyph} {SAID.get(v.status, v.status)}", style)]
            if v.since and v.status == "running":
                parts.append(f" {units.duration(now - v.since)}")
            elif v.rc is not None and v.status not in ("done", "stopped"):
                parts.append(f" rc={v.rc}")
            if v.last_marker and not (v.status == "stopped" and v.last_marker.startswith("CHAIN_DONE")):
                # a line of the stage's log: plain text, control characters as stand-ins (a stop's own
                # CHAIN_DONE rc=143 would read as a failure)
                parts += [" · ", (visible(v.last_marker[:32]), SEVERITY_STYLE.get(v.last_marker_severity, ""))]
            parts.append("   ")
        self.show_content(Content.assemble(*parts) if parts else Content("no stages configured"))
