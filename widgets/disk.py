"""The disk budget: used / free / capacity, the declared artifacts at their real sizes, the
next stage's projected peak against free space, and what could be reclaimed."""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.content import Content
from textual.message import Message

from samai.console.core import units
from samai.remote.safe_text import visible
from samai.widgets.pane import Pane

if TYPE_CHECKING:
    from samai.console.core.disk.budget import DiskBudget, Projection
    from samai.console.core.disk.delta import DiskDelta
    from samai.console.core.disk.trends import DiskTrend
    from samai.console.core.update import StateUpdate
    from samai.remote.model import DiskUsers

BAR_WIDTH = 16


def cells(part: int, total: int, room: int, width: int = BAR_WIDTH) -> int:
    """The cells of a bar `width` wide that part of total takes, within the room left: whatever
    the box says (a negative or absurd figure), never more than the room, never fewer than none."""
    return max(0, min(room, round(width * part / total)))


def usage_bar(used: int, total: int, adds: int = 0, width: int = BAR_WIDTH) -> list:
    if total <= 0:
        return [("?" * width, "$foreground 50%")]
    cells_used = cells(used, total, width, width)
    cells_add = cells(adds, total, width - cells_used, width)
    style = "$error" if used / total > 0.9 else "$warning" if used / total > 0.75 else "$success"
    return [("█" * cells_used, style), ("▒" * cells_add, "$accent"), ("·" * (width - cells_used - cells_add),
                                                                         "$foreground 40%")]


class DiskPane(Pane):
    """`toggle_largest` swaps the artifact list for the workspace's largest users, biggest first
    (the disk feed measures them while asked: `Toggled` says so; its view hands the result in)."""

    DEFAULT_CSS = "DiskPane { height: auto; padding: 0 1; }"
    largest = False  # showing the largest users instead of the artifacts in pipeline order
    _last: tuple[DiskBudget, Projection | None, DiskDelta | None, DiskTrend | None] | None = None
    _users: DiskUsers | str | None = None  # the last measure, or why it failed; None: not yet
    _measured_at: float | None = None

    class Toggled(Message):
        def __init__(self, largest: bool) -> None:
            super().__init__()
            self.largest = largest

    def toggle_largest(self) -> None:
        self.largest = not self.largest
        self.post_message(self.Toggled(self.largest))
        if self._last is not None:
            self.show(*self._last)

    def on_click(self) -> None:
        self.toggle_largest()

    def show_update(self, update: StateUpdate) -> None:
        from samai.console.core.disk.feed import DiskView

        view = update.view(DiskView)
        if view is None:
            if not update.beside:  # (a poll of a fleet row's state has no projection)
                self.show(update.budget)
            return
        if view.users is not None:
            self._users, self._measured_at = view.users.found, view.users.measured_at
        self.show(update.budget, view.projection, view.delta, view.trend)

    def show(self, budget: DiskBudget, next_stage: Projection | None = None, delta: DiskDelta | None = None,
             trend: DiskTrend | None = None) -> None:
        """`delta`: what the last fired stage did to the disk, from its log's SAMAI_DISK lines;
        `trend`: how fast it fills over the last polls."""
        self._last = (budget, next_stage, delta, trend)
        if self.largest:
            self.show_content(Content.assemble(*largest_users(self._users, self._measured_at)))
            return
        adds = next_stage.adds if next_stage else 0
        parts: list = [*usage_bar(budget.used, budget.capacity, adds),
                       f" {units.size(budget.used)} used · {units.size(budget.free)} free of "
                       f"{units.size(budget.capacity)}\n"]
        if trend is not None and trend.rate:
            parts += [("trend: ", "$foreground 60%"), (trend.text, "$error bold" if trend.soon else ""), "\n"]
        if delta is not None:
            parts += [("last stage: ", "$foreground 60%"), visible(delta.text), "\n"]
        for a in budget.artifacts:
            if a.actual is None:
                parts += [(f"  {visible(a.name):<12} {'—':>9}", "$foreground 50%"),
                          (f"  (expect {units.size(a.expected)})\n", "$foreground 50%")]
                continue
            tag = ("  reclaimable", "$accent") if a.reclaimable else ("  intermediate", "$foreground 60%") \
                if a.intermediate else ("", "")
            parts += [f"  {visible(a.name):<12} {units.size(a.actual):>9}", tag, "\n"]
        if next_stage:
            if next_stage.fits:
                verdict = ("fits", "$success")
            elif next_stage.fits_after_cleaning:
                verdict = ("fits after cleaning", "$warning")
            else:
                verdict = ("DOES NOT FIT", "$error bold")
            parts += [f"next: {visible(next_stage.stage)} +{units.size(next_stage.adds)} at peak → ",
                      f"{units.size(next_stage.free_at_peak)} free  ", verdict, "\n"]
        parts += ["reclaimable: ", (units.size(budget.reclaimable), "$accent bold" if budget.reclaimable else "")]
        self.show_content(Content.assemble(*parts))


def largest_users(users: DiskUsers | str | None, measured_at: float | None, limit: int = 10) -> list:
    """The workspace's largest entries, biggest first, with their share of the workspace."""
    head: list = [("largest users of the workspace", "bold")]
    if users is None or measured_at is None:
        return [*head, (" · measuring…", "$foreground 60%")]
    when = units.local_time(measured_at)
    if isinstance(users, str):
        return [*head, (f" · not measured at {when}: ", "$error"), visible(users)]
    cut = "" if users.complete else " · the walk ran out of time: sizes are at least these"
    parts = [*head, (f" · measured {when}{cut}\n", "$foreground 60%")]
    for u in users.top[:limit]:
        share = f"{100 * u.allocated / users.allocated:.0f}%" if users.allocated else ""
        parts += [(f"  {visible(u.path)[:40]:<40}", "" if u.complete else "$warning"),
                  f" {units.size(u.allocated):>9} {share:>4}\n"]
    if not users.top:
        parts.append(("  the workspace is empty\n", "$foreground 50%"))
    parts.append(f"in all {units.size(users.allocated)} in {users.entries} entries")
    return parts
