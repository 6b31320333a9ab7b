"""The curve the pane draws (console/core/training/curve.py): exact up to its limit, bounded past it with
every spike kept, counts exact, and its per-column reduction the min/max downsampling that
tsdownsample's MinMaxDownsampler does."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tsdownsample import MinMaxDownsampler

from samai.console.core.training.curve import Curve
from samai.console.core.training.trainlog import TrainPoint

VALUES = st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=32), st.none())


def run(losses: list[float], start: int = 1) -> list[TrainPoint]:
    return [TrainPoint(step=start + i, loss=loss, grad_norm=1.0) for i, loss in enumerate(losses)]


def test_every_point_is_kept_up_to_the_limit() -> None:
    points = run([1.0 / s for s in range(1, 65)])
    curve = Curve.of(points, limit=64)
    assert curve.points == points and curve.count == 64 and curve.last == points[-1]


@pytest.mark.parametrize("spike_at", [0, 1, 4999, 77_777, 199_999])
def test_a_one_step_spike_survives_a_long_run_and_memory_stays_bounded(spike_at: int) -> None:
    rng = np.random.default_rng(spike_at)
    losses = list(1.0 + 0.01 * rng.standard_normal(200_000))
    losses[spike_at] = 50.0
    losses[(spike_at + 1000) % len(losses)] = -3.0
    curve = Curve.of(run(losses), limit=256)
    kept = curve.points
    assert len(kept) <= 9 * 256 and curve.count == 200_000 and curve.last.step == 200_000
    assert 50.0 in [p.loss for p in kept] and -3.0 in [p.loss for p in kept]
    assert [p.step for p in kept] == sorted(p.step for p in kept)
    drawn = curve.columns(80)
    assert len(drawn) <= 9 * 80 and 50.0 in [p.loss for p in drawn] and -3.0 in [p.loss for p in drawn]


@given(values=st.lists(st.tuples(VALUES, VALUES), max_size=600), limit=st.integers(2, 40), n=st.integers(1, 30))
@settings(max_examples=300, deadline=None)
def test_any_run_keeps_its_extremes_its_last_point_and_exact_counts(values, limit: int, n: int) -> None:
    points = [TrainPoint(step=i, loss=a, grad_norm=b) for i, (a, b) in enumerate(values)]
    curve = Curve.of(points, limit=limit)
    kept = curve.points
    assert curve.count == len(points) and curve.bad_count == sum(p.bad for p in points)
    assert len(kept) <= 9 * limit + 9 and (not points or kept[-1] == points[-1])
    for name in ("loss", "grad_norm"):
        finite = [v for p in points if (v := getattr(p, name)) is not None and math.isfinite(v)]
        shown = [getattr(p, name) for p in curve.columns(n)]
        if finite:
            assert min(finite) in shown and max(finite) in shown
    assert len(curve.columns(n)) <= max(9 * n, len(kept))


@pytest.mark.parametrize(("length", "columns"), [(100, 5), (4000, 80), (10_000, 200), (960, 160)])
def test_the_columns_are_tsdownsamples_min_max(length: int, columns: int) -> None:
    y = np.random.default_rng(length).random(length)
    picked = set(MinMaxDownsampler().downsample(y, n_out=2 * columns).tolist())
    curve = Curve.of([TrainPoint(step=i, loss=float(v)) for i, v in enumerate(y)], limit=length)
    drawn = curve.columns(columns)
    steps = {p.step for p in drawn}
    last_of_each = {min(length - 1, ((c + 1) * length - 1) // columns) for c in range(columns)}
    assert picked <= steps and steps - picked <= last_of_each


def test_the_nan_marks_are_bounded_counted_and_sit_on_the_loss_before_them() -> None:
    points = run([math.nan, 2.0, math.inf, 1.5] + [1.0] * 10 + [math.nan] * 300)
    curve = Curve.of(points, limit=16)
    assert curve.bad_count == 302 and len(curve.bad) == 256
    assert curve.bad[:2] == [(1, 2.0), (3, 2.0)]  # the first before any finite loss takes the first one after
    assert curve.bad[2] == (15, 1.0)


def test_a_resumed_run_continues_the_earlier_points_and_counts_them() -> None:
    earlier = run([3.0, 2.0, 1.0])
    curve = Curve.of(run([0.9, 0.8], start=4)).prepended(earlier)
    assert [p.step for p in curve.points] == [1, 2, 3, 4, 5] and curve.count == 5
