"""A training run's curve as the curves pane draws it: bounded whatever the run's length, with its
spikes kept and its counts exact.

Every point is kept up to `limit`; past that, neighbouring points share a bucket (2, then 4, 8 …
points: the width doubles each time the buckets fill up again), and a bucket keeps only the
points that hold its extremes: the lowest and highest loss, grad_norm and learning rate, its
last point, and its NaN/inf points (at most 2). So a one-step spike survives a run of any
length, while memory and the cost of a draw stay those of `limit` buckets. A draw asks for
`columns(n)`: the same reduction over n equal ranges of steps (min/max downsampling, the M4
family that tsdownsample's MinMaxDownsampler implements; tests/test_curve.py checks the two
agree): a few points per screen column."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from samai.console.core.training.trainlog import TrainPoint

LIMIT = 2048  # buckets kept: a draw reads at most a few points each
MAX_BAD = 256  # NaN/inf points marked on the curve (all of them counted)
SERIES = ("loss", "grad_norm", "learning_rate")


def extremes(points: list[TrainPoint]) -> list[TrainPoint]:
    """The points that hold the lowest and highest finite value of each series, the last point
    and the NaN/inf points (at most 2 of them), in step order, each once: at most 9."""
    if len(points) <= 2:
        return points
    keep = {len(points) - 1}
    for name in SERIES:
        finite = [(v, i) for i, p in enumerate(points) if (v := getattr(p, name)) is not None and math.isfinite(v)]
        if finite:
            keep.update((min(finite)[1], max(finite)[1]))
    keep.update([i for i, p in enumerate(points) if p.bad][:2])
    return [points[i] for i in sorted(keep)]


@dataclass
class Curve:
    """The points of one run (in step order, as they are logged) for drawing; see the module."""

    limit: int = LIMIT
    count: int = 0  # points added, all of them
    bad_count: int = 0
    bad: list[tuple[int, float | None]] = field(default_factory=list)  # (step, the loss logged before it)
    last: TrainPoint | None = None
    _buckets: list[list[TrainPoint]] = field(default_factory=list)
    _width: int = 1  # points that go into one bucket now
    _filled: int = 0  # points added to the last bucket
    _last_loss: float | None = None  # the last finite loss added

    @classmethod
    def of(cls, points: Iterable[TrainPoint], limit: int = LIMIT) -> Curve:
        curve = cls(limit)
        curve.add(points)
        return curve

    def add(self, points: Iterable[TrainPoint]) -> None:
        for point in points:
            self._add(point)

    def _add(self, point: TrainPoint) -> None:
        self.count += 1
        self.last = point
        if point.bad:
            self.bad_count += 1
            if len(self.bad) < MAX_BAD:
                self.bad.append((point.step, self._last_loss))
        elif point.loss is not None and math.isfinite(point.loss):
            if self._last_loss is None:  # marks before the first finite loss take it
                self.bad = [(step, point.loss if loss is None else loss) for step, loss in self.bad]
            self._last_loss = point.loss
        if self._buckets and self._filled < self._width:
            bucket = self._buckets[-1]
            bucket.append(point)
            self._buckets[-1] = extremes(bucket)
            self._filled += 1
        else:
            self._buckets.append([point])
            self._filled = 1
        if len(self._buckets) > self.limit:
            self._compact()

    def _compact(self) -> None:
        """Neighbouring buckets merged in pairs: the width doubles, the extremes stay."""
        old, lone = self._buckets, len(self._buckets) % 2
        self._buckets = [extremes(old[i] + (old[i + 1] if i + 1 < len(old) else [])) for i in range(0, len(old), 2)]
        self._filled += 0 if lone else self._width  # the last bucket now holds its partner's points too
        self._width *= 2

    @property
    def points(self) -> list[TrainPoint]:
        """The points kept, in order: every point of a run of up to `limit` points."""
        return [p for bucket in self._buckets for p in bucket]

    @property
    def first_step(self) -> int | None:
        return self._buckets[0][0].step if self._buckets else None

    def columns(self, n: int) -> list[TrainPoint]:
        """The kept points reduced to the extremes of each of n equal ranges of steps (a draw's
        columns): at most 9n points, whatever the run's length."""
        points = self.points
        if n <= 0 or len(points) <= 2 * n:
            return points
        first, span = points[0].step, points[-1].step - points[0].step + 1
        out: list[TrainPoint] = []
        column: list[TrainPoint] = []
        at = 0
        for p in points:
            index = min(n - 1, max(0, (p.step - first) * n // span))
            if index != at and column:
                out.extend(extremes(column))
                column = []
            at = index
            column.append(p)
        out.extend(extremes(column))
        return out

    def prepended(self, earlier: list[TrainPoint]) -> Curve:
        """This run continued from an earlier one's points (a resume): one curve, counted whole."""
        curve = Curve.of(earlier + self.points, self.limit)
        curve.count = len(earlier) + self.count
        curve.bad_count = sum(1 for p in earlier if p.bad) + self.bad_count
        return curve
