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
    DEFAULT_CSS = "DiskPane { height: auto; padding: 0 1; }"

    def show(self, budget: DiskBudget, next_stage: Projection | None = None) -> None:
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
