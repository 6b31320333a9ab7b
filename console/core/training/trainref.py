"""A training run against the last good run of its stage: both losses smoothed (a moving mean of
[train] compare_smooth logged points), the reference read at each of the current run's steps
(linear between its logged steps, never past its ends), and `worse_than_reference` once the
current run's smoothed loss is over [train] compare_factor times the reference's at
[train] compare_steps logged steps in a row.

The reference is the newest earlier run the box's launcher kept (NAME.1 .. NAME.5) that ended
with rc 0 and whose log has no error-level finding, or a log the operator names
(`check trainlog A --against B`). Its points are box text read as `check trainlog` reads them."""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from samai.console.core.problems import Problem

if TYPE_CHECKING:
    from samai.console.core.config import Train
    from samai.console.core.training.trainlog import TrainPoint
    from samai.remote.boxapi import Box

CODE = "worse_than_reference"
MIN_GAP = 0.05  # of the reference's first smoothed loss: a smaller excess is never worse


@dataclass(frozen=True)
class Reference:
    """The run a training run is compared with: where it was read, and its points."""

    label: str  # e.g. "logs/train.log.1"
    points: tuple[TrainPoint, ...]
    evals: tuple[tuple[int, float], ...] = ()  # its eval losses, (step, loss)


@dataclass(frozen=True)
class ReferenceCurve:
    """What the curves pane draws of the reference: its smoothed loss, and its grad_norm and
    learning rate as logged, each as (step, value)."""

    label: str = ""
    loss: tuple[tuple[int, float], ...] = ()
    grad_norm: tuple[tuple[int, float], ...] = ()
    learning_rate: tuple[tuple[int, float], ...] = ()
    eval_loss: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class Worse:
    """Where the current run first held worse than the reference for the steps it takes."""

    step: int
    current: float  # the current run's smoothed loss at step
    reference: float  # the reference's, at the same step
    steps: int  # logged steps in a row
    label: str
    rates: tuple[float, float] | None = None  # the two runs' learning rates there, when they differ

    @property
    def factor(self) -> float:
        return self.current / self.reference

    def problem(self) -> Problem:
        rates = f"; its learning rate is {self.rates[0]:.3g} against {self.rates[1]:.3g}" if self.rates else ""
        return Problem(CODE, "warning", f"smoothed loss {self.current:.4g} at step {self.step} is "
                       f"{self.factor:.1f}× the reference run's {self.reference:.4g} ({self.label}), "
                       f"{self.steps} logged steps in a row{rates}", step=self.step)

    def to_json(self) -> dict:
        return {"code": CODE, "severity": "warning", "step": self.step, "current": self.current,
                "reference": self.reference, "factor": self.factor, "steps": self.steps,
                "reference_run": self.label, "learning_rates": list(self.rates) if self.rates else None,
                "message": self.problem().message}


def smoothed(points: Sequence[TrainPoint], window: int) -> list[tuple[int, float]]:
    """(step, the mean of the last `window` finite losses) per point with a finite loss, steps rising."""
    out: list[tuple[int, float]] = []
    recent: list[float] = []
    for p in points:
        if p.loss is None or not math.isfinite(p.loss) or p.hidden_nan or (out and p.step <= out[-1][0]):
            continue
        recent = [*recent[-(window - 1):], p.loss] if window > 1 else [p.loss]
        out.append((p.step, sum(recent) / len(recent)))
    return out


def at_step(curve: list[tuple[int, float]], steps: list[int], step: int) -> float | None:
    """The curve at step: linear between its two logged steps around it; None outside them."""
    i = bisect.bisect_left(steps, step)
    if i == len(steps) or (i == 0 and steps[0] != step):
        return None
    if steps[i] == step:
        return curve[i][1]
    (s0, v0), (s1, v1) = curve[i - 1], curve[i]
    return v0 + (v1 - v0) * (step - s0) / (s1 - s0)


def compare(current: Sequence[TrainPoint], reference: Reference, train: Train) -> Worse | None:
    """The first step where the current run has been worse than the reference for
    train.compare_steps logged steps in a row; None while it has not. Worse is over
    compare_factor times the reference and, in absolute terms, over MIN_GAP of the reference's
    first smoothed loss: near the end of a run that learned, 0.003 against 0.002 is noise."""
    ref = smoothed(reference.points, train.compare_smooth)
    if not ref:
        return None
    ref_steps, gap = [s for s, _ in ref], MIN_GAP * abs(ref[0][1])
    streak = 0
    for step, value in smoothed(current, train.compare_smooth):
        theirs = at_step(ref, ref_steps, step)
        if theirs is None or theirs <= 0:
            continue  # past the reference's steps (or a loss of 0): nothing to compare with
        streak = streak + 1 if value > train.compare_factor * theirs and value - theirs > gap else 0
        if streak >= train.compare_steps:
            return Worse(step, value, theirs, streak, reference.label,
                         _rates(_rate_at(current, step), _rate_at(reference.points, step)))
    return None


def _rate_at(points: Sequence[TrainPoint], step: int) -> float | None:
    """The learning rate logged at step, or at the last step before it that logged one."""
    rate = None
    for p in points:
        if p.step > step:
            break
        if p.learning_rate is not None and math.isfinite(p.learning_rate):
            rate = p.learning_rate
    return rate


def _rates(ours: float | None, theirs: float | None) -> tuple[float, float] | None:
    """Both learning rates, when they differ by more than half again (a changed schedule)."""
    if ours is None or theirs is None or ours <= 0 or theirs <= 0 or max(ours, theirs) < 1.5 * min(ours, theirs):
        return None
    return ours, theirs


class ReferenceWatch:
    """The followed training run's reference, and whether worse_than_reference was said for the
    run: once per run, as soon as it holds (a warning stays until the run is over)."""

    def __init__(self, train: Train) -> None:
        self.train = train
        self.reference: Reference | None = None
        self.said = False

    def set(self, reference: Reference | None) -> None:
        self.reference = reference

    def new_run(self) -> None:
        self.said = False

    def check(self, points: Sequence[TrainPoint]) -> Worse | None:
        if self.said or self.reference is None:
            return None
        worse = compare(points, self.reference, self.train)
        self.said = worse is not None
        return worse

    def curve(self) -> ReferenceCurve:
        """The reference as the curves pane draws it beside the run's (empty: none)."""
        if self.reference is None:
            return ReferenceCurve()
        points = self.reference.points

        def logged(name: str) -> tuple[tuple[int, float], ...]:
            return tuple((p.step, v) for p in points if (v := getattr(p, name)) is not None and math.isfinite(v))

        return ReferenceCurve(self.reference.label, tuple(smoothed(points, self.train.compare_smooth)),
                              logged("grad_norm"), logged("learning_rate"), self.reference.evals)


async def last_good_run(box: Box, log: str, train: Train) -> Reference | None:
    """The last run that went well among a stage's kept generations: ended with rc 0, no
    error-level finding in its log, and not itself worse than the good run before it (a run
    that diverged without a NaN ends with rc 0 too). None when no run qualifies."""
    good: Reference | None = None
    for candidate in reversed(await _finished_runs(box, log)):  # oldest first
        if good is None or compare(candidate.points, good, train) is None:
            good = candidate
    return good


async def _finished_runs(box: Box, log: str) -> list[Reference]:
    """The kept generations (newest first) that ended with rc 0 and hold no error-level finding."""
    from samai.console.core.training.history import LOG_GENERATIONS
    from samai.console.core.training.lineage import kept_run
    from samai.console.core.training.trainlog import TrainLogCheck

    found = []
    for n in range(1, LOG_GENERATIONS + 1):
        run = await kept_run(box, f"{log}.{n}")
        if run is None:
            break  # the generations end here
        if run.rc != 0:
            continue  # failed, stopped, or cut (its chain's CHAIN_DONE, never a line the stage printed)
        check = TrainLogCheck()
        check.feed(run.lines)
        result = check.result()
        if result.points and not any(p.severity == "error" for p in result.problems):
            found.append(Reference(f"{log.rsplit('/', 1)[-1]}.{n}", result.points, tuple(check.drain_evals())))
    return found
