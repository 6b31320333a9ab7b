"""The disk budget: used / free / capacity, the declared artifacts at their real sizes, the
next stage's projected peak against free space, and what could be reclaimed."""

from __future__ import annotations

from textual.content import Content

from samai.console import units
from samai.console.budget import DiskBudget, Projection
from samai.remote.visible import visible
from samai.widgets.pane import Pane

BAR_WIDTH = 16


def usage_bar(used: int, total: int, adds: int = 0, width: int = BAR_WIDTH) -> list:
    if total <= 0:
        return [("?" * width, "$foreground 50%")]
    cells_used = min(width, round(width * used / total))
    cells_add = min(width - cells_used, round(width * adds / total))
    style = "$error" if used / total > 0.9 else "$warning" if used / total > 0.75 else "$success"
    return [("█" * cells_used, style), ("▒" * cells_add, "$accent"), ("·" * (width - cells_used - cells_add),
                                                                         "$foreground 40%")]


class DiskPane(Pane):
    """`toggle_largest` swaps the artifact list for the workspace's largest users, biggest first.
    The probe sizes only the declared artifacts, so those are what it can rank (and it says so)."""

    DEFAULT_CSS = "DiskPane { height: auto; padding: 0 1; }"
    largest = False  # showing the largest users instead of the artifacts in pipeline order
    _last: tuple[DiskBudget, Projection | None] | None = None

    def toggle_largest(self) -> None:
        self.largest = not self.largest
        if self._last is not None:
            self.show(*self._last)

    def on_click(self) -> None:
        self.toggle_largest()

    def show(self, budget: DiskBudget, next_stage: Projection | None = None) -> None:
        self._last = (budget, next_stage)
        if self.largest:
            self.show_content(Content.assemble(*largest_users(budget)))
            return
        adds = next_stage.adds if next_stage else 0
        parts: list = [*usage_bar(budget.used, budget.capacity, adds),
                       f" {units.size(budget.used)} used · {units.size(budget.free)} free of "
                       f"{units.size(budget.capacity)}\n"]
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


def largest_users(budget: DiskBudget, limit: int = 10) -> list:
    """The declared artifacts present, biggest first, with their share of what the disk holds."""
    present = sorted((a for a in budget.artifacts if a.actual is not None), key=lambda a: a.actual, reverse=True)
    parts: list = [("largest users", "bold"), (" · declared artifacts only (the probe sizes no other folders)\n",
                                                 "$foreground 60%")]
    for a in present[:limit]:
        share = f"{100 * a.actual / budget.used:.0f}%" if budget.used else ""
        parts += [f"  {visible(a.name):<12} {units.size(a.actual):>9} {share:>4}  ",
                  (visible(a.path), "$foreground 60%"), "\n"]
    if not present:
        parts.append(("  no declared artifact is on the disk yet\n", "$foreground 50%"))
    parts += [f"in all {units.size(sum(a.actual for a in present))} of {units.size(budget.used)} used"]
    return parts
