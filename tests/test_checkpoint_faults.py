"""A half-written checkpoint is never taken (issue 48, item 2), with real kills of a real Trainer.

The tiny pipeline's train stage (the HF Trainer with a peft LoRA, on the CPU) is SIGKILLed by its
own fault hook (SAMAI_FAULT_SAVE, remote/box/stages/wholesave.py) at every point of a checkpoint
save: half of each file written and each file whole, half of the completeness record and the
record whole, the folder renamed into place, the old checkpoint moved aside and deleted. After
each kill the box's judgement lists only whole checkpoints (no folder of the save cut short is a
checkpoint-STEP), the console's resume (the action layer's plan, as `x` and the watcher make it)
takes the newest whole one, which is the save's own once it was renamed into place and the one
before it until then, so at most one checkpoint interval is lost; the resumed run continues from
it (the Trainer loads it: TRAIN_RESUMED, its next step is the one after), and is itself killed at
the next point. save_total_limit is 1, the hardest case: every save deletes the one before it.
The chain ends with a resume that runs to the end."""

from __future__ import annotations

import asyncio
import re
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from samai.console.core.actions import Actions
from samai.console.core.audit import AuditLog
from samai.console.core.config import Config
from samai.remote.boxapi import Box
from samai.remote.local import LocalTransport
from tests.pipeline_helpers import LONG, confirm, free_port, run_stage, tiny, with_command

pytestmark = [LONG, pytest.mark.slow]

SAVE_STEPS, MAX_STEPS = 2, 12
FOLDER = "runs/train/checkpoints"
COMMAND = ("venv/bin/python -m samai_box.stages.train --base models/base --data data/train.jsonl --out runs/train "
           f"--nan-patience 1 --max-steps {MAX_STEPS} --save-steps {SAVE_STEPS} --save-total-limit 1")
# The points of one save with an older checkpoint to delete: 8 files (each half, then whole), the
# record (half, whole), the rename, the old one moved aside and deleted.
POINTS_A_SAVE = 21
KILLED = re.compile(r"^SAMAI_FAULT_SAVE point (\d+) step (\d+): (.+): SIGKILL$", re.M)
PROGRESS = re.compile(rf"^train (\d+)/{MAX_STEPS} ", re.M)


def with_fault(cfg: Config, point: int | None) -> Config:
    env = (("SAMAI_FAULT_SAVE", str(point)),) if point is not None else ()
    return replace(cfg, stages=tuple(replace(s, env=env) if s.name == "train" else s for s in cfg.stages))


def in_place(what: str, step: int) -> bool:
    """Whether the save of this step was renamed into place when the run was killed at this point
    (the points after the rename delete the old checkpoint)."""
    return what == f"checkpoint-{step} renamed into place" or what.endswith((" moved aside", " deleted"))


async def ended(box: Box, fired_at: float | None, timeout: float = 300):
    """The train stage's run fired after fired_at, once its chain has ended."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rec = (await box.snapshot(processes=True)).state("train")
        if rec and rec.fired_at != fired_at and rec.rc is not None:
            return rec
        await asyncio.sleep(0.5)
    raise AssertionError(f"the train run did not end within {timeout} s")


async def test_a_run_killed_at_every_point_of_its_save_resumes_from_the_newest_whole_checkpoint(
        tiny_ws: Path, tmp_path: Path) -> None:
    cfg = with_command(tiny(tiny_ws, free_port()), "train", COMMAND)
    log = tiny_ws / cfg.stage("train").log
    box = Box(LocalTransport(), str(tiny_ws), python=sys.executable)
    audit = AuditLog(tmp_path / "audit.jsonl")
    kills: list[tuple[int, int, str, int]] = []  # (point, step, what, the step resumed from)
    try:
        assert "FETCH_DONE" in await run_stage(box, cfg, "fetch")
        # The first run is killed as its first checkpoint is renamed into place; each resumed run
        # then at the next point of its own first save (one with an older checkpoint to delete).
        points = [19, *range(1, POINTS_A_SAVE + 1), None]
        first = Actions(box, with_fault(cfg, points[0]), audit, readonly=False, confirm=confirm)
        plan = await first.plan_fire("train")
        assert not plan.blocked, [c.text for c in plan.checks]
        fired = await first.confirm_and_run(plan)
        assert fired.ok, fired.message
        rec, resumed_from = await ended(box, None), 0
        for point, next_point in zip(points, points[1:], strict=False):
            text = log.read_text(errors="replace")
            assert rec.rc == 137, text[-3000:]
            [(said_point, step, what)] = KILLED.findall(text)
            assert int(said_point) == point, text[-3000:]
            step = int(step)
            assert resumed_from < step <= resumed_from + SAVE_STEPS, (resumed_from, step)  # its first save
            found = await box.checkpoints(FOLDER)
            assert found.checkpoints, what
            for ck in found.checkpoints:  # never a checkpoint-STEP folder of a save cut short
                assert ck.complete and ck.finite, (what, ck.name, ck.problems)
            newest_whole = found.checkpoints[0].step
            expected = step if in_place(what, step) else step - SAVE_STEPS
            assert newest_whole == expected, (what, [c.name for c in found.checkpoints])

            actions = Actions(box, with_fault(cfg, next_point), audit, readonly=False, confirm=confirm)
            plan = await actions.plan_resume("train")  # the console's choice, as `x` and the watcher make it
            assert plan.checkpoint == f"{FOLDER}/checkpoint-{expected}", (what, plan.details)
            assert step - expected <= SAVE_STEPS  # at most one checkpoint interval lost
            kills.append((point, step, what, expected))
            outcome = await actions.confirm_and_run(plan)
            assert outcome.ok, outcome.message
            rec, resumed_from = await ended(box, rec.fired_at), expected
            text = log.read_text(errors="replace")
            resumed = rf"^TRAIN_RESUMED from \S+/{FOLDER}/checkpoint-{expected} \(step {expected}\)$"
            assert re.search(resumed, text, re.M), text[-3000:]
            assert int(PROGRESS.findall(text)[0]) == expected + 1, text[-3000:]  # the Trainer went on from it
        assert rec.rc == 0 and "TRAIN_DONE" in log.read_text(), log.read_text()[-3000:]
    finally:
        await box.stop("train", grace=2)
        await box.close()
    whats = {what.replace(f"checkpoint-{step - SAVE_STEPS}", "the older one").replace(f"checkpoint-{step}", "this one")
             for _, step, what, _ in kills}
    assert len(kills) == POINTS_A_SAVE + 1 and len(whats) >= 20, sorted(whats)
    assert any(w.startswith("half of optimizer.pt") for w in whats) and "samai_complete.json written" in whats
    assert sorted(p.name for p in (tiny_ws / FOLDER).iterdir()) == [f"checkpoint-{MAX_STEPS}"]  # nothing left over
