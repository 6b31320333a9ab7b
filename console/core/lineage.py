"""A training run and the runs it resumed, read as one: the last run in a stage's log and, while
its TRAIN_RESUMED line names the step it continues from, the earlier generation's last run (the
launcher keeps it as NAME.1, NAME.2 ..) up to that step. Their steps up to it made the weights
too; the steps after it were thrown away. The merge gate judges the whole lineage
(last_run_check); the curves pane shows it as one curve (earlier_points)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from samai.remote.follow import last_run
from samai.remote.model import RUN_HEADER

if TYPE_CHECKING:
    from samai.console.core.trainlog import TrainLogCheck, TrainLogResult, TrainPoint
    from samai.remote.boxapi import Box


async def last_run_check(box: Box, path: str) -> TrainLogResult:
    """check_trainlog over the last run in a stage's log on the box, streamed, read on from the
    steps of the runs it resumed (each generation's, up to the step it was resumed from). A run
    that resumed nothing is read once; a resumed one a second time, after the runs it continues."""
    from samai.console.core.trainlog import TrainLogCheck

    check, headers = TrainLogCheck(), 0
    async for batch in _batches(box, path):
        newest = last_run(batch)
        if newest is not None:
            check = TrainLogCheck()  # a new run: what came before it is another run's
            headers += sum(1 for line in batch if line.startswith(RUN_HEADER))
        check.feed(batch if newest is None else newest)
    if check.resumed_from is None:
        return check.result()
    check = await _lineage_check(box, path, check.resumed_from)
    seen = 0
    async for batch in _batches(box, path):
        start = 0
        for i, line in enumerate(batch):
            if line.startswith(RUN_HEADER):
                seen, start = seen + 1, i + 1
        if seen == headers:  # the last run's lines: after its header, or all of a batch past it
            check.feed(batch[start:])
    return check.result()


async def _lineage_check(box: Box, path: str, step: int) -> TrainLogCheck:
    """A check fed the runs a run resumed from `step` continues, up to that step (oldest first)."""
    from samai.console.core.trainlog import TrainLogCheck

    check = TrainLogCheck()
    for older, cut in await _lineage(box, path, step):
        check.feed(until_step(older, cut))
    return check


def _batches(box: Box, path: str):
    from samai.console.core.checks import line_batches

    return line_batches(box, path, pieces=True)


async def _lineage(box: Box, path: str, step: int | None) -> list[tuple[list[str], int]]:
    """The runs the last run resumed, oldest first: each one's lines and the step resumed from."""
    from samai.console.core.history import LOG_GENERATIONS

    found: list[tuple[list[str], int]] = []
    for n in range(1, LOG_GENERATIONS + 1):
        if step is None:
            break
        lines = await last_run_lines(box, f"{path}.{n}")
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


async def last_run_lines(box: Box, path: str) -> list[str] | None:
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


def until_step(lines: list[str], cut: int) -> list[str]:
    """A run's lines up to its last of step `cut` (its steps read as check_trainlog reads them)."""
    from samai.console.core.trainlog import TrainLogCheck

    scratch = TrainLogCheck()
    for i, line in enumerate(lines):
        if any(p.step > cut for p in scratch.feed([line])):
            return lines[:i]
    return lines


async def earlier_points(box: Box, path: str, step: int) -> list[TrainPoint]:
    """The points of the runs a run resumed from `step` continues, oldest first (the curve before
    the resume point), as far as the kept generations reach."""
    return list((await _lineage_check(box, path, step)).result().points)
