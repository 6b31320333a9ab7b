"""A training run and the runs it resumed, read as one: the last run in a stage's log and, while
its TRAIN_RESUMED line names the step it continues from, the earlier generation's run (the
launcher keeps it as NAME.1, NAME.2 ..) up to that step. Their steps up to it made the weights
too; the steps after it were thrown away. The merge gate judges the whole lineage
(last_run_check); the curves pane shows it as one curve (earlier_points).

Each log file holds one run: the launcher starts each run's log afresh, its header the first line
(remote/box/chainline.py). A header-shaped line anywhere else is the stage's text: it hides none
of the run's steps (a NaN before it stays the run's)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from samai.remote.box.chainline import Header, read_header, said_by_chain

if TYPE_CHECKING:
    from samai.console.core.training.trainlog import TrainLogCheck, TrainLogResult, TrainPoint
    from samai.remote.boxapi import Box


async def last_run_check(box: Box, path: str) -> TrainLogResult:
    """check_trainlog over the run in a stage's log on the box, streamed, read on from the steps
    of the runs it resumed (each generation's, up to the step it was resumed from). A run that
    resumed nothing is read once; a resumed one a second time, after the runs it continues."""
    from samai.console.core.training.trainlog import TrainLogCheck

    check = TrainLogCheck()
    await read_run(box, path, check.feed)
    if check.resumed_from is None:
        return check.result()
    check = await _lineage_check(box, path, check.resumed_from)
    await read_run(box, path, check.feed)
    return check.result()


async def read_run(box: Box, path: str, feed: Callable[[list[str]], object]) -> Header | None:
    """A log file's run, streamed to `feed` in batches: every line but its header (its first
    line, when that is one, which is returned; None when it is not: a log written by other means,
    or by a launcher that wrote no header)."""
    from samai.console.core.checks import line_batches

    header, first = None, True
    async for batch in line_batches(box, path, pieces=True):
        if first and batch:
            first = False
            header = read_header(batch[0])
            if header is not None:
                batch = batch[1:]
        feed(batch)
    return header


async def _lineage_check(box: Box, path: str, step: int) -> TrainLogCheck:
    """A check fed the runs a run resumed from `step` continues, up to that step (oldest first)."""
    from samai.console.core.training.trainlog import TrainLogCheck

    check = TrainLogCheck()
    for older, cut in await _lineage(box, path, step):
        check.feed(until_step(older, cut))
    return check


async def _lineage(box: Box, path: str, step: int | None) -> list[tuple[list[str], int]]:
    """The runs the last run resumed, oldest first: each one's lines and the step resumed from."""
    from samai.console.core.training.history import LOG_GENERATIONS

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
    from samai.console.core.training.trainlog import TRAIN_RESUMED

    found = TRAIN_RESUMED.match(line)
    return int(found.group(1)) if found else step


@dataclass(frozen=True)
class KeptRun:
    """An earlier generation's run: its lines (its header aside) and the rc its chain wrote
    (None: none, or no line of its chain's, whatever the stage printed)."""

    lines: list[str]
    rc: int | None


async def kept_run(box: Box, path: str) -> KeptRun | None:
    """An earlier generation's run (None: no such file)."""
    from samai.console.core.checks import Unreadable
    from samai.console.core.training.history import DONE

    lines: list[str] = []
    try:
        header = await read_run(box, path, lines.extend)
    except Unreadable:
        return None
    nonce = header.nonce if header else ""
    ends = [m for m in (DONE.match(said_by_chain(line, nonce) or "") for line in lines) if m]
    return KeptRun(lines, int(ends[-1]["rc"]) if ends else None)


async def last_run_lines(box: Box, path: str) -> list[str] | None:
    """An earlier generation's run, its lines (None: no such file)."""
    run = await kept_run(box, path)
    return None if run is None else run.lines


def until_step(lines: list[str], cut: int) -> list[str]:
    """A run's lines up to its last of step `cut` (its steps read as check_trainlog reads them)."""
    from samai.console.core.training.trainlog import TrainLogCheck

    scratch = TrainLogCheck()
    for i, line in enumerate(lines):
        if any(p.step > cut for p in scratch.feed([line])):
            return lines[:i]
    return lines


async def earlier_points(box: Box, path: str, step: int) -> list[TrainPoint]:
    """The points of the runs a run resumed from `step` continues, oldest first (the curve before
    the resume point), as far as the kept generations reach."""
    return list((await _lineage_check(box, path, step)).result().points)


async def dead_run_points(box: Box, path: str, step: int) -> list[TrainPoint]:
    """The points the run a resumed run continues logged after `step`, the step it was resumed
    from (the generation before it, NAME.1): the steps the resumed run logs again."""
    from samai.console.core.training.trainlog import TrainLogCheck

    lines = await last_run_lines(box, f"{path}.1")
    check = TrainLogCheck()
    check.feed(lines or [])
    return [p for p in check.result().points if p.step > step]
