"""The stages bar: each stage with its key, state, elapsed time, progress and last marker.

The stages are laid out as whole items, left to right, a new line only between two items
(never inside one: `[7] serve ■` on one line and `blocked` on the next reads as two things).
The running stage stands out: its item is on a tinted background."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from rich.cells import cell_len
from textual.content import Content
from textual.geometry import Size
from textual.widget import Widget

from samai.console.core import units
from samai.remote.safe_text import visible

if TYPE_CHECKING:
    from samai.console.core.update import StageView, StateUpdate

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
RUNNING_STYLE = "on $primary 20%"
GAP = "   "


def stage_item(v: StageView, now: float) -> Content:
    """One stage as one unbreakable item."""
    glyph, style = STATUS_STYLE.get(v.status, ("·", ""))
    parts: list = [(f"[{visible(v.key)}]", "bold $accent"), " ", (v.name, "bold"), " ",
                   (f"{glyph} {SAID.get(v.status, v.status)}", style)]
    if v.since and v.status == "running":
        parts.append(f" {units.age(now - v.since)}")  # minutes after the first: an idle bar repaints once a minute
        if v.progress is not None:  # the box's words (a build step): plain text, control characters as stand-ins
            parts += [" · ", (visible(v.progress.text), "bold")]
    elif v.rc is not None and v.status not in ("done", "stopped"):
        parts.append(f" rc={v.rc}")
    if v.death is not None and v.status != "stopped":  # the box's words: plain text, cut short
        parts += [" · ", (visible(v.death.line[:48]), "$error")]
    if v.last_marker and not (v.status == "stopped" and v.last_marker.startswith("CHAIN_DONE")):
        # a line of the stage's log: plain text, control characters as stand-ins (a stop's own
        # CHAIN_DONE rc=143 would read as a failure)
        parts += [" · ", (visible(v.last_marker[:32]), SEVERITY_STYLE.get(v.last_marker_severity, ""))]
    item = Content.assemble(*parts)
    return item.stylize(RUNNING_STYLE) if v.status == "running" else item


def flow(items: list[Content], width: int) -> list[Content]:
    """The items in lines of at most `width` cells, GAP between two on a line; an item wider
    than a line has one to itself, cut with an ellipsis."""
    lines: list[Content] = []
    line: Content | None = None
    for item in items:
        if item.cell_length > width:
            item = item.truncate(max(width, 1), ellipsis=True)
        if line is not None and line.cell_length + len(GAP) + item.cell_length <= width:
            line = line + GAP + item
            continue
        if line is not None:
            lines.append(line)
        line = item
    if line is not None:
        lines.append(line)
    return lines


class StagesBar(Widget):
    DEFAULT_CSS = "StagesBar { height: auto; max-height: 6; padding: 0 1; }"

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.items: list[Content] = []

    def show_update(self, update: StateUpdate) -> None:
        self.show(update.stages, update.now)

    def show(self, views: list[StageView], now: float | None = None) -> None:
        now = now or time.time()
        items = [stage_item(v, now) for v in views]
        if len(items) == len(self.items) and all(a.is_same(b) for a, b in zip(items, self.items, strict=True)):
            return  # a repaint is the costliest thing an idle console does
        width = self.content_size.width
        before = len(flow(self.items, width)) if width else -1
        self.items = items
        # a layout pass (the whole screen) only when the bar's height changes
        self.refresh(layout=not width or len(flow(items, width)) != before)

    def render(self) -> Content:
        if not self.items:
            return Content("no stages configured")
        return Content("\n").join(flow(self.items, self.content_size.width or _longest(self.items)))

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return max(1, len(flow(self.items, width))) if self.items else 1


def _longest(items: list[Content]) -> int:
    return max(cell_len(item.plain) for item in items)
