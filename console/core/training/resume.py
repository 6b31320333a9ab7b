"""Which checkpoint a dead training run resumes from: the newest that is whole, finite and
before the first anomaly its log shows; and why each newer one was passed over.

Pure: the box's judgement of each checkpoint (remote/box/checkpoints.py) and the first anomalous
step of the run's log (the NaN guard's and `check trainlog`'s reading) come in, a choice goes out.
The action layer turns it into a plan (actions.plan_resume), `doctor` into a `resume_available`
finding, the TUI into the `x` of a dead run's alert. And which checkpoints may go when the next
one would not fit (pruned): all but the newest few, never the one a resume would take."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import TYPE_CHECKING

from samai.remote.model import Checkpoint, Checkpoints

if TYPE_CHECKING:
    from samai.console.core.config import Config, Stage
    from samai.remote.boxapi import Box


PRUNE_KEEP = 2  # a prune keeps the newest this many checkpoints (and the one a resume would take)


class NothingToResume(ValueError):
    """No checkpoint of the stage is fit to resume from (or the named one is not): why, in one line."""


class NothingToPrune(ValueError):
    """No checkpoint of the stage may be deleted: why, in one line."""


@dataclass(frozen=True)
class Passed:
    """A checkpoint not taken, and why."""

    name: str
    why: str


@dataclass(frozen=True)
class ResumeChoice:
    folder: str  # the stage's checkpoints folder, workspace-relative
    chosen: Checkpoint | None
    passed: tuple[Passed, ...]  # the newer ones (or the named one) passed over, newest first
    first_anomaly: int | None  # the first step the log shows sick, if any
    left_out: str = ""  # the older checkpoints the box did not judge (beyond its newest 200), said; '' if none

    @property
    def path(self) -> str:
        """The chosen checkpoint's folder, workspace-relative ('' when none was chosen)."""
        return posixpath.join(self.folder, self.chosen.name) if self.chosen else ""

    def why_none(self) -> str:
        """Why there is nothing to resume from, in one line."""
        if not self.passed:
            return f"no checkpoint in {self.folder}: the run kept none yet (a restart starts from step 0)"
        said = "; ".join(f"{p.name}: {p.why}" for p in self.passed[:3])
        return f"no checkpoint of {self.folder} is fit to resume from ({said})" + (
            f"; {self.left_out}" if self.left_out else "")


def judged(ck: Checkpoint, first_anomaly: int | None, writing: bool = False) -> str:
    """Why this checkpoint cannot be resumed from ('' when it can). writing: its run still runs,
    so one written a moment ago may be a save under way (a dead run's is as whole as it looks)."""
    if ck.name != f"checkpoint-{ck.step}":  # the reply is read as untrusted: its name becomes a path
        return "not a checkpoint-STEP folder of its own step"
    if not ck.complete:
        return (ck.problems[0] if ck.problems else "incomplete")[:160]
    if writing and ck.settling:
        return "written a moment ago while its run still runs: a save may be under way"
    if ck.finite is False:
        return f"its weights hold NaN or inf ({', '.join(ck.nonfinite[:2])})"[:160]
    if ck.finite is None:
        return "its weights could not be read for NaN" + (f": {ck.problems[0]}"[:120] if ck.problems else "")
    if first_anomaly is not None and ck.step >= first_anomaly:
        return f"written at step {ck.step}, after the log's first anomaly at step {first_anomaly}"
    return ""


@dataclass(frozen=True)
class RunAnomaly:
    """One run in a training stage's log: when it started (its header's time), its first sick step."""

    started: float
    first_anomaly: int | None


def writer_anomaly(ck: Checkpoint, runs: list[RunAnomaly]) -> int | None:
    """The first anomaly of the run that wrote this checkpoint: the newest that started before it
    was written (a later run that wrote no checkpoint says nothing about it)."""
    before = [r for r in runs if r.started <= ck.mtime]
    return before[-1].first_anomaly if before else None


def choose(found: Checkpoints, runs: list[RunAnomaly], named: str | None = None,
           writing: bool = False) -> ResumeChoice:
    """The newest fit checkpoint (or the named one, if it is fit). runs: the log's, oldest first;
    writing: the run that writes them still runs."""
    passed: list[Passed] = []
    for ck in found.checkpoints:  # newest first
        if named is not None and ck.name != named:
            continue
        anomaly = writer_anomaly(ck, runs)
        why = judged(ck, anomaly, writing)
        if not why:
            return ResumeChoice(found.folder, ck, tuple(passed), anomaly, found.left_out())
        passed.append(Passed(ck.name, why))
    if named is not None and not passed:
        passed.append(Passed(named, f"not among the newest {len(found.checkpoints)} the box judged" if found.unjudged
                             else f"no such checkpoint in {found.folder}"))
    return ResumeChoice(found.folder, None, tuple(passed), None, found.left_out())


def first_anomaly_step(problems) -> int | None:
    """The earliest step of the log's anomalies that have one (NaN, spikes, dead gradients)."""
    steps = [p.step for p in problems if getattr(p, "step", None) is not None]
    return min(steps) if steps else None


async def resume_choice(box: Box, cfg: Config, stage: Stage, named: str | None = None, *,
                        writing: bool = False) -> ResumeChoice:
    """The checkpoint a dead run of this train stage would resume from: the box's judgement of
    each, against the first anomaly of the stage's last run in its log. writing: its run still
    runs (a restart from a checkpoint stops it first)."""
    if not stage.role.resumable or not stage.checkpoints:
        raise NothingToResume(f"stage {stage.name} keeps no checkpoints (a train stage declares "
                              f'checkpoints = "FOLDER" in [stages.{stage.name}])')
    if named is not None:  # checkpoint-1200, or its path in the workspace as doctor gives it
        head, named = posixpath.split(named.rstrip("/"))
        if head not in ("", stage.checkpoints.rstrip("/")):
            raise NothingToResume(f"{head}/{named} is not in {stage.checkpoints}, the folder of {stage.name}'s "
                                  "checkpoints")
    found, runs = await judged_checkpoints(box, cfg, stage)
    return choose(found, runs, named, writing)


async def judged_checkpoints(box: Box, cfg: Config, stage: Stage) -> tuple[Checkpoints, list[RunAnomaly]]:
    """The stage's checkpoints as the box judges them, and its log's runs with their first anomaly."""
    from samai.console.core.checks import Unreadable

    found = await box.checkpoints(stage.checkpoints or "")
    try:
        runs = await run_anomalies(box, str(PurePosixPath(cfg.workspace, stage.log)))
    except Unreadable as e:
        raise NothingToResume(f"{stage.name}'s log cannot be read, so its first anomaly is unknown: {e}") from None
    return found, runs


@dataclass(frozen=True)
class PruneChoice:
    folder: str
    deleted: tuple[Checkpoint, ...]  # oldest last, as listed
    kept: tuple[Checkpoint, ...]
    resume: Checkpoint | None  # the one a resume would take now (always kept)
    left_out: str = ""  # the older checkpoints the box did not list (so neither judged nor deleted), said

    def paths(self) -> tuple[str, ...]:
        return tuple(posixpath.join(self.folder, c.name) for c in self.deleted)


def prunable(found: Checkpoints, resume: Checkpoint | None, keep: int = PRUNE_KEEP) -> PruneChoice:
    """Every checkpoint but the newest `keep` and the one a resume would take."""
    kept = [c for i, c in enumerate(found.checkpoints) if i < keep or c == resume]
    return PruneChoice(found.folder, tuple(c for c in found.checkpoints if c not in kept), tuple(kept), resume,
                       found.left_out())


async def prune_choice(box: Box, cfg: Config, stage: Stage, keep: int = PRUNE_KEEP, *,
                       writing: bool = False) -> PruneChoice:
    """Which of this train stage's checkpoints a prune deletes, judged now (the resume choice
    read as `x` on a dead run would read it). writing: its run still runs."""
    if not stage.role.resumable or not stage.checkpoints:
        raise NothingToPrune(f"stage {stage.name} keeps no checkpoints")
    try:
        found, runs = await judged_checkpoints(box, cfg, stage)
    except NothingToResume as e:
        raise NothingToPrune(f"{e}: which checkpoint a resume would take is unknown, so none is deleted") from None
    choice = prunable(found, choose(found, runs, writing=writing).chosen, keep)
    if not choice.deleted:
        raise NothingToPrune(f"{stage.name} keeps {len(found.checkpoints)} checkpoint(s) in {found.folder}: "
                             f"none older than the newest {keep} to delete")
    return choice


async def run_anomalies(box: Box, log: str) -> list[RunAnomaly]:
    """Each run in a training stage's log and its kept generations, oldest first, with its first
    anomalous step (check trainlog's reading, streamed). A generation not there is no problem.
    Each file is one run, started at its header's time (its first line, lineage.read_run): a
    header-shaped line the stage printed after a NaN starts no run, so the NaN stays before
    every checkpoint written after it."""
    from samai.console.core.checks import Unreadable
    from samai.console.core.training.history import LOG_GENERATIONS
    from samai.console.core.training.lineage import read_run
    from samai.console.core.training.trainlog import TrainLogCheck

    runs: list[RunAnomaly] = []
    for path in [f"{log}.{n}" for n in range(LOG_GENERATIONS, 0, -1)] + [log]:
        check = TrainLogCheck()
        try:
            header = await read_run(box, path, check.feed)
        except Unreadable as e:
            if path == log or "No such file" not in str(e):
                raise
            continue
        started = header_time(header.started) if header else 0.0
        runs.append(RunAnomaly(started, first_anomaly_step(check.result().problems)))
    return [r for r in runs if r.started or r.first_anomaly is not None]


def header_time(text: str) -> float:
    """A run header's UTC time (2026-12-02T10:00:00Z) as epoch seconds; 0 when it is not one."""
    import calendar
    import time

    try:
        return float(calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%SZ")))
    except ValueError:
        return 0.0
