"""Training curves: loss (left axis) and grad_norm (right axis) by step, NaN/inf (and hidden
NaN) steps marked on the loss curve, the last step's values as numbers in the title; under
them, on a box with GPUs, the GPUs' recent utilization (a stalled step shows as a dip)."""

from __future__ import annotations

import asyncio
import math
from importlib import import_module
from typing import TYPE_CHECKING

from textual import work
from textual.app import ComposeResult
from textual.color import Color
from textual.containers import Container
from textual.content import Content
from textual.widget import Widget

from samai.console.core.training.curve import Curve
from samai.console.core.training.trainref import ReferenceCurve
from samai.widgets.pane import inert

if TYPE_CHECKING:
    from textual_plotext import PlotextPlot

    from samai.console.core.training.feed import TrainingView
    from samai.console.core.training.trainlog import TrainPoint
    from samai.console.core.update import StateUpdate

LEVELS = " ▁▂▃▄▅▆▇█"  # a poll's utilization as one cell, 0 % to 100 %
UTIL_LABEL = "GPU util "


def util_cells(series: list[float | None], width: int) -> str:
    """The last `width` polls' utilization as one cell each (`?` where unknown)."""
    cells = []
    for value in series[-width:] if width > 0 else []:
        if value is None:
            cells.append("?")
        else:
            cells.append(LEVELS[round(min(max(value, 0.0), 100.0) / 100 * (len(LEVELS) - 1))])
    return "".join(cells)


class GpuUtilLine(Widget):
    """The mean utilization over the GPUs, a cell per poll, the newest on the right and as a number."""

    DEFAULT_CSS = "GpuUtilLine { height: 1; display: none; } GpuUtilLine.-shown { display: block; }"

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.series: list[float | None] = []

    def show(self, series: list[float | None]) -> None:
        self.set_class(bool(series), "-shown")
        if series != self.series:
            self.series = list(series)
            self.refresh()

    def render(self) -> Content:
        last = self.series[-1] if self.series else None
        now = "  ?%" if last is None else f" {last:3.0f}%"
        width = self.size.width - len(UTIL_LABEL) - len(now)
        return Content.assemble((UTIL_LABEL, "$foreground 60%"), (util_cells(self.series, width), "$success"),
                                (now, "bold"))


class CurvesPane(Container):
    """The pane; its plot is mounted when its screen says (after the first frame), since plotext
    takes a tenth of the console's start-up to import and the first screen has no point to plot."""

    DEFAULT_CSS = ("CurvesPane { height: 1fr; min-height: 8; } CurvesPane > * { height: 1fr; } "
                   "CurvesPane > GpuUtilLine { height: 1; }")

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.curve = Curve()  # bounded at any run length: a draw costs the same at step 100 and 100,000
        self.before: list[TrainPoint] = []  # the last run's points, kept at a reset: a resume continues them
        self.resumed_at: int | None = None  # the step the shown run resumed from (marked on the curve)
        self.reference = ReferenceCurve()  # the last good run's, drawn beside this run's
        self.evals: list[tuple[int, float]] = []  # the run's eval losses, (step, loss)
        self.plot: PlotextPlot | None = None
        self.plot_asked = False  # its worker started: the plot is mounted once

    def compose(self) -> ComposeResult:
        yield GpuUtilLine()

    def on_mount(self) -> None:
        if self.points:  # given before it was mounted
            self.mount_plot()

    def mount_plot(self) -> None:
        """Mount the plot (once): when its screen says (after its first frame), or when there is
        something to draw."""
        if not self.plot_asked and self.is_attached:
            self.plot_asked = True
            self._mount_plot()

    def show_update(self, update: StateUpdate) -> None:
        from samai.console.core.feeds.nodes import NodesView
        from samai.console.core.gpus.feed import GpuHistory
        from samai.console.core.training.feed import TrainingView

        training = update.view(TrainingView)
        if training is not None:
            self.show_training(training)
        nodes = update.view(NodesView)
        if nodes is not None:  # a multi-node run: its nodes in the title, rank 0's curve whichever box it runs on
            self.border_title = inert(f"training · {nodes.marks}") if nodes.marks else "training"
            if nodes.curve is not None:
                self.show(nodes.curve)
        gpus = update.view(GpuHistory)
        if gpus is not None:
            self.show_gpu_util(gpus.utilization)

    def show_training(self, view: TrainingView) -> None:
        if view.reset:
            self.reset()  # a new training run: its curve alone, unless it resumed the last one
        if view.resumed_at is not None:
            self.resumed_at = view.resumed_at
            self.show_before(self.before)
        if view.before is not None:
            self.show_before(view.before)
        if view.reference is not None:
            self.reference = view.reference
            self._draw()
        if view.new_evals:
            self.evals.extend(view.new_evals)
            if not view.new_points:
                self._draw()
        self.add(view.new_points)

    @property
    def points(self) -> list[TrainPoint]:
        """The points kept: every one of a run of up to curve.LIMIT, then its extremes."""
        return self.curve.points

    def show_before(self, points: list[TrainPoint]) -> None:
        """The earlier runs' points a resumed run continues (up to its resume step, before the
        steps shown): one curve. Steps already shown are not added twice."""
        if self.resumed_at is None:
            return
        first = self.curve.first_step
        earlier = [p for p in points if p.step <= self.resumed_at and (first is None or p.step < first)]
        if earlier:
            self.curve = self.curve.prepended(earlier)
            self._draw()

    def show_gpu_util(self, series: list[float | None]) -> None:
        """The GPUs' mean utilization by poll, oldest first (empty: no GPU, the line is hidden)."""
        self.query_one(GpuUtilLine).show(series)

    # A worker given the method (@work), not a coroutine: cancelled before it starts (the app
    # leaving), it leaves no coroutine never awaited.
    @work(name="plot", group="plot", exit_on_error=False)
    async def _mount_plot(self) -> None:
        plotext = await asyncio.to_thread(import_module, "textual_plotext")  # a tenth of the start-up to import
        self.plot = plotext.PlotextPlot()
        await self.mount(self.plot, before=self.query_one(GpuUtilLine))
        self.app.theme_changed_signal.subscribe(self, lambda _theme: self._draw())
        self._draw()

    def _colour(self, name: str, fallback: str) -> tuple[int, int, int]:
        """A colour of the app's theme, so that the series follow a theme switch."""
        return Color.parse(getattr(self.app.current_theme, name, None) or fallback).rgb

    def add(self, points: list[TrainPoint]) -> None:
        if points:
            self.curve.add(points)
            self._draw()

    def reset(self) -> None:
        self.before, self.resumed_at, self.evals = self.points or self.before, None, []
        self.show([])

    def show(self, points: list[TrainPoint]) -> None:
        """These points in place of those shown (a curve read elsewhere, whole)."""
        self.curve = Curve.of(points)
        self._draw()

    def _draw(self) -> None:
        if self.plot is None:
            self.mount_plot()  # which draws
            return
        plt = self.plot.plt
        plt.clear_data()
        plt.clear_figure()
        plt.title(last_values(self.curve.last))
        # A few points per column of the plot, its extremes kept: a curve of any length costs the same.
        good = [p for p in self.curve.columns(max(8, self.plot.size.width)) if not p.bad]
        # Two y axes: a grad_norm of 18 beside a loss under 1 would flatten the loss on a shared one.
        series = (("loss", "left", [(p.step, p.loss) for p in good], self._colour("primary", "cyan")),
                  ("grad_norm", "right", [(p.step, p.grad_norm) for p in good], self._colour("accent", "orange")))
        for name, side, values, colour in (*series, *self._extra_series(good)):
            xy = [(x, y) for x, y in values if _finite(y)]
            if xy:
                plt.plot([x for x, _ in xy], [y for _, y in xy], label=name, color=colour, marker="braille",
                         yside=side)
        curve, bad = self.curve, self.curve.bad
        if bad:  # on the loss curve, where the run was when it went bad
            plt.scatter([step for step, _ in bad], [loss or 0.0 for _, loss in bad],
                        label=f"NaN/inf ({curve.bad_count})", color=self._colour("error", "red"), marker="x",
                        yside="left")
        if self.resumed_at is not None and curve.count:
            plt.vline(self.resumed_at, self._colour("warning", "yellow"))
        plt.xlabel("step")
        self.border_subtitle = (f"{curve.count} steps" + (f" · {curve.bad_count} bad" if bad else "")
                                + (f" · resumed at step {self.resumed_at}" if self.resumed_at is not None else ""))
        self.plot.refresh()


    def _extra_series(self, good: list[TrainPoint]) -> list[tuple[str, str, list, tuple[int, int, int]]]:
        """The learning rate, scaled to the grad_norm axis (its own scale is 1e4 times smaller), the
        eval losses, and the reference run's smoothed loss up to the current run's last step."""
        out = []
        last = self.curve.last.step if self.curve.last else None
        ref = self.reference

        def upto(series: tuple[tuple[int, float], ...]) -> list[tuple[int, float]]:
            return [(s, v) for s, v in series if last is None or s <= last]

        rates = [(p.step, p.learning_rate) for p in good if p.learning_rate is not None and _finite(p.learning_rate)]
        top = max([r for _, r in rates] + [r for _, r in upto(ref.learning_rate)], default=0.0)
        if top > 0:  # one scale for both runs' rates: a raised one shows as higher
            norms = [p.grad_norm for p in good if p.grad_norm is not None and _finite(p.grad_norm)]
            scale = (max(norms) if norms else 1.0) / top
            out.append((f"lr (max {top:.2g})", "right", [(s, r * scale) for s, r in rates],
                        self._colour("secondary", "green")))
            if ref.learning_rate:
                out.append(("reference lr", "right", [(s, r * scale) for s, r in upto(ref.learning_rate)],
                            self._colour("foreground", "grey")))
        if self.evals:
            out.append(("eval_loss", "left", list(self.evals), self._colour("warning", "yellow")))
        for name, side, series in (("loss", "left", ref.loss), ("grad_norm", "right", ref.grad_norm),
                                   ("eval_loss", "left", ref.eval_loss)):
            if upto(series):
                out.append((f"reference {name} ({ref.label})" if name == "loss" else f"reference {name}", side,
                            upto(series), self._colour("foreground", "white")))
        return out


def last_values(last: TrainPoint | None) -> str:
    """The title: the last logged step's loss and grad_norm as numbers (nan when they are)."""
    if last is None:
        return "no training steps logged yet"
    return f"step {last.step}: loss {_number(last.loss)} · grad_norm {_number(last.grad_norm)}"


def _number(value: float | None) -> str:
    return "—" if value is None else f"{value:.4g}"


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)
