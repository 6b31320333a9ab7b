"""What the recovery benchmarks share: a workspace of the built-in tiny pipeline with its base
fetched, a train command of a given length, the trainer's process to kill, and a run's logged
losses by step.

A workspace is made as the console makes one: the box venv provisioned through the Box (or a
link to an already provisioned one, --venv), the fetch stage fired (its pretrain of the tiny
base, once: --source hands it one already made, as tests/provisioned.py does).
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import replace
from pathlib import Path

from populated import run

from samai.console.core import config
from samai.console.core.actions import ActionPlan, Actions, Decision
from samai.console.core.audit import AuditLog
from samai.console.core.paths import audit_log
from samai.console.core.training.trainlog import TrainPoint, check_trainlog, parse_trainer_state
from samai.remote.boxapi import Box
from samai.remote.local import LocalTransport

CHECKPOINTS = "runs/train/checkpoints"


def home_in(folder: str) -> None:
    """HOME (the console's state, audit log and watcher key) in folder: never the user's."""
    os.environ["HOME"] = folder
    for name in ("XDG_STATE_HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME"):
        os.environ.pop(name, None)


def confirming_actions(box: Box, cfg: config.Config) -> Actions:
    """The action layer as `x` and the watcher use it, every plan confirmed (and audited) by the bench."""

    async def confirmed(plan: ActionPlan) -> Decision:
        return Decision.confirmed(plan, "bench")

    return Actions(box, cfg, AuditLog(audit_log()), readonly=False, confirm=confirmed)


def train_command(max_steps: int, save_steps: int, keep: int = 3) -> str:
    return ("venv/bin/python -m samai_box.stages.train --base models/base --data data/train.jsonl --out runs/train "
            f"--nan-patience 1 --max-steps {max_steps} --save-steps {save_steps} --save-total-limit {keep}")


def tiny_config(ws: Path, train: str, port: int = 18080) -> config.Config:
    """The built-in tiny pipeline on ws, its train stage running `train`."""
    cfg = config.load_builtin("tiny")
    stages = tuple(replace(s, command=train) if s.role.trains else
                   replace(s, command=s.command.replace("18080", str(port)), ports=(port,) if s.ports else ())
                   for s in cfg.stages)
    return replace(cfg, workspace=str(ws), stages=stages)


async def fetched_workspace(ws: Path, venv: Path | None, source: Path | None) -> Box:
    """ws made and its base fetched; the Box on it (close it)."""
    ws.mkdir(parents=True)
    cfg = tiny_config(ws, "true")
    box = Box(LocalTransport(), str(ws), python=sys.executable)
    if venv is not None:
        (ws / "venv").symlink_to(venv.resolve())
    else:
        await run(box, cfg, "provision")
    if source is not None:
        shutil.copytree(source, ws / "source", symlinks=True)
    await run(box, cfg, "fetch")
    return box


async def trainer_pid(box: Box) -> int | None:
    """The train stage's trainer (the python of samai_box.stages.train in the stage's group)."""
    snap = await box.snapshot(processes=True)
    rec = snap.state("train")
    if rec is None or rec.rc is not None:
        return None
    return next((p.pid for p in snap.processes if p.pid in rec.group and "samai_box.stages.train" in p.command), None)


def losses(log_text: str) -> dict[int, float]:
    """A run's logged loss by step (a resumed run's steps counted from its checkpoint)."""
    return {p.step: p.loss for p in points(log_text) if p.loss is not None}


def points(log_text: str) -> tuple[TrainPoint, ...]:
    return check_trainlog(log_text).points


def newest_history(ws: Path) -> tuple[int, dict[int, float]]:
    """The newest checkpoint's step and its trainer_state.json's losses by step: at full precision
    (the log's lines carry 4 significant digits), a resumed run's own steps after its checkpoint."""
    folders = sorted((ws / CHECKPOINTS).glob("checkpoint-*"), key=lambda p: int(p.name.rsplit("-", 1)[1]))
    state = (folders[-1] / "trainer_state.json").read_text()
    return (int(folders[-1].name.rsplit("-", 1)[1]),
            {p.step: p.loss for p in parse_trainer_state(state) if p.loss is not None})
