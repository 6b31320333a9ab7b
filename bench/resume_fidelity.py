"""A resumed run is the same run: a real tiny training run killed after a checkpoint and resumed
by the console, against the same seed run uninterrupted in the same process tree.

    python bench/resume_fidelity.py [--venv VENV] [--source SOURCE] [--max-steps 40] [--save-steps 10 3]

For each --save-steps S (the default's 3 puts checkpoints mid-epoch as well): in one workspace
the tiny pipeline's train stage runs --max-steps steps uninterrupted (the baseline); in another
the same command is SIGKILLed once it logged step 2S + S/2 + 1, past its second checkpoint, and
resumed as the console resumes it (the action layer's resume plan, `x` and the watcher's:
--resume-from the newest whole checkpoint C) to the end. Printed per step after C: the baseline's
loss and the resumed run's at full precision (each run's last checkpoint's trainer_state.json; the
log's lines carry 4 significant digits), their relative difference, and the logged values'; the
largest one (target <= 1e-5, the tiny
pipeline being deterministic on the CPU), and what the console's own check (training/fidelity.py,
first_divergence at [train] resume_tolerance) says of the resumed run against the dead one, and
against the baseline.

Both workspaces are made as the console makes one (tiny_training.py): --venv links an already
provisioned box venv instead of provisioning, --source hands the fetch stage a tiny base already
made. HOME is a temporary folder (the audit log of the resumes goes there). A measurement, not a
test.
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from harness import argument_parser
from populated import run
from tiny_training import (
    confirming_actions,
    fetched_workspace,
    home_in,
    losses,
    newest_history,
    points,
    tiny_config,
    train_command,
    trainer_pid,
)

from samai.console.core.config import Config
from samai.console.core.training.fidelity import first_divergence
from samai.remote.boxapi import Box
from samai.remote.local import LocalTransport
from samai.remote.model import StageRecord

TARGET = 1e-5



async def ended(box: Box, not_fired_at: float | None) -> StageRecord:
    """The train stage's run, once it ended (one fired at another time than not_fired_at)."""
    while True:
        rec = (await box.snapshot()).state("train")
        if rec is not None and rec.fired_at != not_fired_at and rec.rc is not None:
            return rec
        await asyncio.sleep(0.2)


async def killed_and_resumed(ws: Path, cfg: Config, kill_at: int) -> tuple[int, int]:
    """Fire the train stage, SIGKILL its trainer once it logged step kill_at, resume it as the
    console does and wait for the end: (the step it was killed after, the checkpoint's step)."""
    box = Box(LocalTransport(), str(ws), python=sys.executable)
    log = ws / cfg.stage("train").log
    try:
        actions = confirming_actions(box, cfg)
        fired = await actions.fire("train")
        if not fired.ok:
            raise SystemExit(f"train refused: {fired.message}")
        while max(losses(log.read_text(errors="replace")), default=0) < kill_at:
            await asyncio.sleep(0.05)
        pid = await trainer_pid(box)
        if pid is None:
            raise SystemExit("the train run ended before it could be killed: raise --max-steps")
        os.kill(pid, signal.SIGKILL)
        dead = await ended(box, None)
        killed_after = max(losses(log.read_text(errors="replace")))
        plan = await actions.plan_resume("train")
        if plan.blocked or not plan.checkpoint:
            raise SystemExit(f"no resume: {[c.text for c in plan.checks]}")
        resumed = await actions.confirm_and_run(plan)
        if not resumed.ok:
            raise SystemExit(f"the resume failed: {resumed.message}")
        rec = await ended(box, dead.fired_at)
        if rec.rc != 0:
            raise SystemExit(f"the resumed run ended rc={rec.rc}:\n{log.read_text(errors='replace')[-3000:]}")
        return killed_after, int(plan.checkpoint.rsplit("-", 1)[1])
    finally:
        await box.close()


def relative(value: float | None, baseline: float | None) -> float:
    """|value - baseline| / |baseline|; inf where either run did not log the step."""
    if value is None or baseline is None:
        return math.inf
    return abs(value - baseline) / max(abs(baseline), 1e-12)


async def scenario(folder: Path, venv: Path | None, source: Path | None, max_steps: int, save_steps: int) -> float:
    command = train_command(max_steps, save_steps)
    whole_ws, resumed_ws = folder / f"whole-{save_steps}", folder / f"resumed-{save_steps}"
    for ws in (whole_ws, resumed_ws):
        await (await fetched_workspace(ws, venv, source)).close()
        venv = venv or (ws / "venv")  # provisioned once
    whole_cfg, resumed_cfg = tiny_config(whole_ws, command), tiny_config(resumed_ws, command)

    box = Box(LocalTransport(), str(whole_ws), python=sys.executable)
    try:
        await run(box, whole_cfg, "train")
    finally:
        await box.close()
    kill_at = 2 * save_steps + save_steps // 2 + 1
    killed_after, checkpoint = await killed_and_resumed(resumed_ws, resumed_cfg, kill_at)

    log = resumed_ws / resumed_cfg.stage("train").log
    whole_text = (whole_ws / whole_cfg.stage("train").log).read_text(errors="replace")
    resumed_text, dead_text = log.read_text(errors="replace"), Path(f"{log}.1").read_text(errors="replace")
    logged_whole, logged_resumed = losses(whole_text), losses(resumed_text)
    (whole_at, whole), (resumed_at, resumed) = newest_history(whole_ws), newest_history(resumed_ws)
    print(f"\n--save-steps {save_steps}: killed after step {killed_after}, resumed from checkpoint-{checkpoint}, "
          f"{len(logged_resumed)} steps logged by the resumed run; the losses of both runs' last checkpoint "
          f"(checkpoint-{whole_at}, checkpoint-{resumed_at}) at full precision, and as logged (4 digits)")
    print(f"{'step':>5} {'uninterrupted':>20} {'resumed':>20} {'rel. diff':>10} {'logged':>10}")
    largest = 0.0 if whole_at == resumed_at else float("inf")
    for step in range(checkpoint + 1, max_steps + 1):
        full = relative(resumed.get(step), whole.get(step)) if step <= whole_at else None
        logged = relative(logged_resumed.get(step), logged_whole.get(step))
        largest = max(largest, logged if full is None else full)
        print(f"{step:>5} {whole.get(step, math.nan):>20.14g} {resumed.get(step, math.nan):>20.14g} "
              f"{'-' if full is None else f'{full:.2e}':>10} {logged:>10.2e}")
    tolerance = resumed_cfg.train.resume_tolerance
    against_dead = first_divergence(points(resumed_text), points(dead_text), tolerance, checkpoint)
    against_whole = first_divergence(points(resumed_text), points(whole_text), tolerance, checkpoint)
    print(f"largest relative difference: {largest:.2e} (target <= {TARGET:g})")
    for name, found in (("the dead run", against_dead), ("the uninterrupted run", against_whole)):
        print(f"the console's check against {name} (tolerance {tolerance:g}): "
              + ("same run" if found is None else found.finding().message))
    return largest


async def main(venv: Path | None, source: Path | None, max_steps: int, save_steps: list[int]) -> None:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="samai-fidelity-") as tmp:
        home_in(tmp)
        largest = [await scenario(Path(tmp), venv, source, max_steps, s) for s in save_steps]
    print(f"\nlargest relative difference over {len(save_steps)} resumes: {max(largest):.2e} "
          f"(target <= {TARGET:g}: {'met' if max(largest) <= TARGET else 'NOT met'}); "
          f"{time.monotonic() - started:.0f} s in all")


if __name__ == "__main__":
    parser = argument_parser(__doc__)
    parser.add_argument("--venv", type=Path, help="an already provisioned box venv to link instead of provisioning")
    parser.add_argument("--source", type=Path, help="a tiny base already made (a workspace's source/ after fetch)")
    parser.add_argument("--max-steps", type=int, default=40)
    parser.add_argument("--save-steps", type=int, nargs="+", default=[10, 3])
    args = parser.parse_args()
    asyncio.run(main(args.venv, args.source, args.max_steps, args.save_steps))
