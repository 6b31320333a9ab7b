"""Whether a resumed run is the same run: at every step its dead run logged after the checkpoint
it resumed from, the resumed run's loss must be the dead run's, within [train] resume_tolerance
(relative). A resume that restored the weights but not the optimizer, the scheduler, the RNG or
the data order drifts from its first steps (accelerate #2016: a mid-epoch resume reset the
sampler's epoch). Pure: the points are read elsewhere (lineage.dead_run_points, the live curve)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from samai.console.core.problems import Finding
from samai.console.core.training.trainlog import TrainPoint

CODE = "resume_diverged"


@dataclass(frozen=True)
class Divergence:
    step: int
    resumed: float  # the resumed run's loss at step
    dead: float  # the dead run's, at the same step
    resumed_from: int

    def finding(self) -> Finding:
        return Finding(CODE, "warning", f"the run resumed from step {self.resumed_from} is not the same run: at step "
                       f"{self.step} its loss is {self.resumed:.6g}, the run it continues logged {self.dead:.6g} "
                       f"there (optimizer, scheduler, RNG or data order not restored?)")


def first_divergence(resumed: Sequence[TrainPoint], dead: Sequence[TrainPoint], tolerance: float,
                     resumed_from: int) -> Divergence | None:
    """The first step both runs logged (after resumed_from) where their losses differ by more than
    tolerance, relative to the dead run's; None while none does. A step with no finite loss in
    either run is not compared (a NaN is the anomaly checks' to say)."""
    logged = {p.step: p.loss for p in dead if p.step > resumed_from and _finite(p.loss)}
    for p in resumed:
        was = logged.get(p.step)
        if was is None or not _finite(p.loss):
            continue
        assert p.loss is not None  # (_finite)
        if abs(p.loss - was) > tolerance * max(abs(was), 1e-12):
            return Divergence(p.step, p.loss, was, resumed_from)
    return None


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)
