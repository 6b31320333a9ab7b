"""Preflight from evidence, not file presence: a stage that consumes what a training stage made
(merge needs the adapter) fires only if the console's own reading of that training run's log
finds no error-level anomaly. `final/` and TRAIN_DONE say that a run ended; the log says whether
it learned (a run that diverged or whose gradients died used to leave both behind). A stage's log
holds one run as the launcher writes it (earlier runs go to NAME.1 ..), but one written by other
means may hold several: only its last run (after the last run header) is judged, with the runs
it resumed (its TRAIN_RESUMED line names the step it continues from): their steps up to that
step made the weights too, the steps after it were thrown away."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import TYPE_CHECKING

from samai.console.core.config import Config, Stage
from samai.console.core.preflight import Check
from samai.remote.boxapi import Box, BoxError
from samai.remote.follow import last_run
from samai.remote.model import RUN_HEADER
from samai.remote.transport import TransportError

if TYPE_CHECKING:
    from samai.console.core.trainlog import TrainLogResult

TRAINING_MARKERS = frozenset({"TRAIN_DONE", "TRAIN_NAN"})  # a stage of another role that has them trains too
SHOWN_FINDINGS = 3


def training_sources(cfg: Config, stage: Stage) -> list[Stage]:
    """The training stages (role train, or a training run's markers) that make an artifact this stage needs."""
    return [s for s in cfg.stages
            if s.name != stage.name and set(s.makes) & set(stage.needs)
            and (s.role == "train" or TRAINING_MARKERS & {m.name for m in s.markers})]


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


async def last_run_check(box: Box, path: str) -> TrainLogResult:
    """check_trainlog over the last run in a stage's log on the box, streamed, read on from the
    steps of the runs it resumed (each generation's, up to the step it was resumed from)."""
    from samai.console.core.trainlog import TrainLogCheck

    headers, step = await _last_run_of(box, path)
    check = TrainLogCheck()
    for older, cut in await _lineage(box, path, step):
        check.feed(_until_step(older, cut))
    seen = 0
    async for batch in _batches(box, path):
        start = 0
        for i, line in enumerate(batch):
            if line.startswith(RUN_HEADER):
                seen, start = seen + 1, i + 1
        if seen == headers:  # the last run's lines: after its header, or all of a batch past it
            check.feed(batch[start:])
    return check.result()


def _batches(box: Box, path: str):
    from samai.console.core.checks import line_batches

    return line_batches(box, path, pieces=True)


async def _last_run_of(box: Box, path: str) -> tuple[int, int | None]:
    """How many run headers the log holds, and the step its last run resumed from (its
    TRAIN_RESUMED line; None: it resumed nothing)."""
    headers, step = 0, None
    async for batch in _batches(box, path):
        for line in batch:
            if line.startswith(RUN_HEADER):
                headers, step = headers + 1, None
            elif line.startswith("TRAIN_RESUMED"):
                step = _resumed_step(line, step)
    return headers, step


async def _lineage(box: Box, path: str, step: int | None) -> list[tuple[list[str], int]]:
    """The runs the last run resumed, oldest first: each one's lines and the step resumed from."""
    from samai.console.core.history import LOG_GENERATIONS

    found: list[tuple[list[str], int]] = []
    for n in range(1, LOG_GENERATIONS + 1):
        if step is None:
            break
        lines = await _last_run_lines(box, f"{path}.{n}")
        if lines is None:
            break  # rotated away: the resumed run's own steps are what is left to judge
        found.append((lines, step))
        step = None
        for line in lines:
            step = _resumed_step(line, step) if line.startswith("TRAIN_RESUMED") else step
    return found[::-1]


def _resumed_step(line: str, step: int | None) -> int | None:
    from samai.console.core.trainlog import TRAIN_RESUMED

    found = TRAIN_RESUMED.match(line)
    return int(found.group(1)) if found else step


async def _last_run_lines(box: Box, path: str) -> list[str] | None:
    """An earlier generation's last run, its lines (None: no such file)."""
    from samai.console.core.checks import Unreadable

    lines: list[str] = []
    try:
        async for batch in _batches(box, path):
            newest = last_run(batch)
            lines = list(newest) if newest is not None else lines + batch
    except Unreadable:
        return None
    return lines


def _until_step(lines: list[str], cut: int) -> list[str]:
    """A run's lines up to its last of step `cut` (its steps read as check_trainlog reads them)."""
    from samai.console.core.trainlog import TrainLogCheck

    scratch = TrainLogCheck()
    for i, line in enumerate(lines):
        if any(p.step > cut for p in scratch.feed([line])):
            return lines[:i]
    return lines


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
