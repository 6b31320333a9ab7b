"""Training curves: loss and grad_norm by step, with NaN/inf (and hidden NaN) steps marked."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from textual.color import Color
from textual.containers import Container

from samai.console.core.trainlog import TrainPoint

if TYPE_CHECKING:
    from textual_plotext import PlotextPlot


class CurvesPane(Container):
    """The pane; its plot is mounted just after the first paint, since plotext takes a tenth of
    the console's start-up to import and the first screen never has a point to plot."""

    DEFAULT_CSS = "CurvesPane { height: 1fr; min-height: 8; } CurvesPane > * { height: 1fr; }"

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.points: list[TrainPoint] = []
        self.plot: PlotextPlot | None = None

    def on_mount(self) -> None:
        self.call_after_refresh(self._mount_plot)

    async def _mount_plot(self) -> None:
        from textual_plotext import PlotextPlot

        self.plot = PlotextPlot()
        await self.mount(self.plot)
        self.app.theme_changed_signal.subscribe(self, lambda _theme: self._draw())
        self._draw()

    def _colour(self, name: str, fallback: str) -> tuple[int, int, int]:
        """A colour of the app's theme, so that the series follow a theme switch."""
        return Color.parse(getattr(self.app.current_theme, name, None) or fallback).rgb

    def add(self, points: list[TrainPoint]) -> None:
        if points:
            self.points.extend(points)
            self._draw()

    def reset(self) -> None:
        self.points = []
        self._draw()

    def _draw(self) -> None:
        if self.plot is None:
            return  # drawn once it is mounted
        plt = self.plot.plt
        plt.clear_data()
        plt.clear_figure()
        plt.title("loss · grad_norm by step" if self.points else "no training steps logged yet")
        good = [p for p in self.points if not p.bad]
        series = (("loss", [(p.step, p.loss) for p in good], self._colour("primary", "cyan")),
                  ("grad_norm", [(p.step, p.grad_norm) for p in good], self._colour("accent", "orange")))
        for name, values, colour in series:
            xy = [(x, y) for x, y in values if y is not None and math.isfinite(y)]
            if xy:
                plt.plot([x for x, _ in xy], [y for _, y in xy], label=name, color=colour, marker="braille")
        bad = [p.step for p in self.points if p.bad]
        if bad:
            finite = [p.loss for p in good if p.loss is not None] or [0.0]
            plt.scatter(bad, [max(finite)] * len(bad), label=f"NaN/inf ({len(bad)})",
                        color=self._colour("error", "red"), marker="x")
        plt.xlabel("step")
        self.border_subtitle = f"{len(self.points)} steps" + (f" · {len(bad)} bad" if bad else "")
        self.plot.refresh()
