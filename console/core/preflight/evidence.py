"""Preflight from evidence, not file presence: a stage that consumes what a training stage made
(merge needs the adapter) fires only if the console's own reading of that training run's log
finds no error-level anomaly. `final/` and TRAIN_DONE say that a run ended; the log says whether
it learned (a run that diverged or whose gradients died used to leave both behind). A stage's log
holds one run as the launcher writes it (earlier runs go to NAME.1 ..), but one written by other
means may hold several: only its last run (after the last run header) is judged, with the runs
it resumed (console/core/training/lineage.py)."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import TYPE_CHECKING

from samai.console.core.config import Config, Stage
from samai.console.core.preflight import Check
from samai.console.core.training.lineage import last_run_check
from samai.remote.boxapi import Box, BoxError
from samai.remote.transport import TransportError

if TYPE_CHECKING:
    from samai.console.core.training.trainlog import TrainLogResult

TRAINING_MARKERS = frozenset({"TRAIN_DONE", "TRAIN_NAN"})  # a stage of another role that has them trains too
SHOWN_FINDINGS = 3


def training_sources(cfg: Config, stage: Stage) -> list[Stage]:
    """The training stages (role train, or a training run's markers) that make an artifact this stage needs."""
    return [s for s in cfg.stages
            if s.name != stage.name and set(s.makes) & set(stage.needs)
            and (s.role.trains or TRAINING_MARKERS & {m.name for m in s.markers})]


async def training_evidence(box: Box, cfg: Config, stage: Stage) -> tuple[Check, ...]:
    """One check per training stage this stage consumes: an error (which blocks the fire) for
    each error-level finding in its log, or for a log that cannot be read."""
    from samai.console.core.checks import Unreadable

    checks = []
    for source in training_sources(cfg, stage):
        path = str(PurePosixPath(cfg.workspace, source.log))
        try:
            result = await last_run_check(box, path)
        except (Unreadable, BoxError, TransportError) as e:
            checks.append(Check("error", f"{source.name}'s log cannot be read, so its run is unproven: {e}"))
            continue
        checks.extend(run_verdict(source.name, result))
    return tuple(checks)


def run_verdict(name: str, result: TrainLogResult) -> list[Check]:
    """The preflight checks a training run's findings make: one error (a blocker) per error-level
    finding, shown up to SHOWN_FINDINGS; else one ok line."""
    errors = [a for a in result.problems if a.severity == "error"]
    if not errors:
        return [Check("ok", f"{name}'s log, last run: {result.steps} steps, no error-level finding")]
    checks = [Check("error", f"{name}'s log, last run: {a.code}: {a.message}") for a in errors[:SHOWN_FINDINGS]]
    if len(errors) > SHOWN_FINDINGS:
        more = len(errors) - SHOWN_FINDINGS
        checks.append(Check("error", f"{name}'s log, last run: {more} more error-level findings (check trainlog)"))
    return checks
