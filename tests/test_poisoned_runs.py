"""Merge is gated on evidence: the console reads the training run's own log through the Box, and
an error-level finding blocks the merge even when final/ and TRAIN_DONE are there. Real files, a
real Box on this machine, the real action layer; the real Trainer runs are in test_pipeline."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

from samai.console.core import config, paths
from samai.console.core.actions import ActionPlan, Actions, Decision
from samai.console.core.audit import AuditLog
from samai.console.core.fixes import FixAction
from samai.remote.boxapi import Box
from samai.remote.local import LocalTransport
from tests import chainlog

TRAIN_OK = "TRAIN_DONE runs/train/final after 80 steps in 9 s\n"


def header(pid: int) -> str:
    return chainlog.header("train", pid) + "\n"


def v5(loss: float, grad_norm: float, step: int) -> str:
    return f"{{'loss': '{loss:.4g}', 'grad_norm': '{grad_norm:.4g}', 'learning_rate': '0.001', 'epoch': '{step / 4}'}}"


def dead_gradients_log() -> str:
    """The issue's second run: grad_norm 0 and a flat loss from step 4 on, ended "done"."""
    lines = [v5(3.5 - 0.4 * i, 2.0, i + 1) for i in range(3)] + [v5(2.3, 0.0, i + 4) for i in range(77)]
    return "\n".join(lines) + "\n" + TRAIN_OK


def healthy_log() -> str:
    return "\n".join(v5(3.5 * 0.95 ** i, 1.5, i + 1) for i in range(40)) + "\n" + TRAIN_OK


def finished_run(ws: Path, log: str) -> config.Config:
    """A workspace whose train stage left final/, TRAIN_DONE and this log: all merge's files are there."""
    cfg = replace(config.load_builtin("tiny"), workspace=str(ws))
    for folder in ("models/base", "runs/train/final", "logs"):
        (ws / folder).mkdir(parents=True, exist_ok=True)
    (ws / "models/base/model.safetensors").write_bytes(b"\0" * 4096)
    (ws / "runs/train/final/adapter_model.safetensors").write_bytes(b"\0" * 4096)
    (ws / "runs/train/TRAIN_DONE").write_text("80 steps in 9 s\n")
    log_path = ws / cfg.stage("train").log
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_text(log)
    return cfg


async def _confirm(plan: ActionPlan) -> Decision:
    return Decision.confirmed(plan, "test")


async def test_merge_is_blocked_by_the_training_logs_findings_not_passed_by_its_files(workspace: Path) -> None:
    cfg = finished_run(workspace, dead_gradients_log())
    box = Box(LocalTransport(), str(workspace), python=sys.executable)
    try:
        actions = Actions(box, cfg, AuditLog(paths.audit_log()), readonly=False, confirm=_confirm)
        plan = await actions.plan_fire("merge")
        assert any(c.severity == "ok" and "needs adapter" in c.text for c in plan.checks)  # the files are there
        errors = [c.text for c in plan.checks if c.severity == "error"]
        assert any("train's log, last run: dead_gradients" in t and "grad_norm exactly 0" in t for t in errors), errors
        assert any("train's log, last run: not_learning" in t for t in errors), errors
        assert plan.blocked
        outcome = await actions.fire("merge")
        assert not outcome.ok and outcome.status == "refused"
        assert not (workspace / cfg.stage("merge").log).exists()  # nothing ran
        restart = await actions.plan_restart("merge")
        assert restart.blocked and any("dead_gradients" in c.text for c in restart.checks)
    finally:
        await box.close()


async def test_a_healthy_run_lets_merge_fire_and_a_missing_log_does_not(workspace: Path) -> None:
    cfg = finished_run(workspace, healthy_log())
    box = Box(LocalTransport(), str(workspace), python=sys.executable)
    try:
        actions = Actions(box, cfg, AuditLog(paths.audit_log()), readonly=False, confirm=_confirm)
        plan = await actions.plan_fire("merge")
        assert any(c.severity == "ok" and "train's log, last run: 40 steps, no error-level finding" in c.text
                   for c in plan.checks), plan.checks
        assert not any(c.severity == "error" and "train's log" in c.text for c in plan.checks)
        (workspace / cfg.stage("train").log).unlink()
        plan = await actions.plan_fire("merge")
        assert any(c.severity == "error" and "train's log cannot be read" in c.text for c in plan.checks)
        log = workspace / cfg.stage("train").log
        Path(f"{log}.1").write_text(header(1) + dead_gradients_log())  # as the launcher keeps the run before
        log.write_text(header(2) + healthy_log())
        plan = await actions.plan_fire("merge")  # only the last run counts
        assert not plan.blocked and any("40 steps, no error-level finding" in c.text for c in plan.checks)
        Path(f"{log}.1").write_text(header(1) + healthy_log())
        log.write_text(header(2) + dead_gradients_log())
        assert (await actions.plan_fire("merge")).blocked
        convert = await actions.plan_fire("convert")  # it consumes no training stage's artifact
        assert not any("train's log" in c.text for c in convert.checks)
    finally:
        await box.close()


def _train_stage():
    """The box's train stage as a module: stdlib at import time, its ML stack imported in main()."""
    from samai.remote.box.stages import train

    return train


def test_the_train_stage_judges_how_a_run_ended() -> None:
    train = _train_stage()
    nan = float("nan")
    assert train.why_not_healthy([(3.0, 2.0), (2.0, 1.5), (1.0, 0.9)]) is None
    assert "last logged step is sick" in train.why_not_healthy([(3.0, 2.0), (0.0, nan)])  # hidden NaN at the end
    assert "last logged step is sick" in train.why_not_healthy([(3.0, 2.0), (2.9, 0.0)])
    assert train.why_not_healthy([]) == "no training step was logged"
    assert [train.sick_step(*s) for s in ((1.0, 0.0), (1.0, nan), (nan, 1.0), (0.0, 1.0), (1.0, 1.0), (1.0, None))] \
        == [True, True, True, True, False, False]


# ---------------------------------------------------------------- what the screen says at start-up


def _bar_of(app) -> str:
    return str(app.box_screen.query_one("#stages").render())


@pytest.mark.slow
async def test_the_bar_shows_merge_blocked_by_the_runs_findings_and_the_curve_holds_the_last_run_only(workspace):
    """The console started on a stage's logs of two runs: the curve and the alerts are the last
    run's; merge is marked blocked while that run's log has an error-level finding."""
    from samai.console.app import SamaiApp
    from samai.widgets.curves import CurvesPane
    from tests.helpers import pilot_until, polls_after

    cfg = finished_run(workspace, header(2) + healthy_log())
    Path(f"{workspace / cfg.stage('train').log}.1").write_text(header(1) + dead_gradients_log())
    cfg = replace(cfg, target=replace(cfg.target, poll_interval=0.2, python=sys.executable))
    log = workspace / cfg.stage("train").log
    app = SamaiApp(cfg)
    async with app.run_test(size=(160, 45)) as pilot:
        curve = app.box_screen.query_one(CurvesPane)
        await pilot_until(pilot, lambda: len(curve.points) == 40 and "merge" in _bar_of(app))
        await polls_after(pilot, 2)
        assert len(curve.points) == 40 and curve.points[0].loss == 3.5  # the healthy run, from its first step
        assert not [a.text for a in app.state.alerts if a.stage == "train" and a.severity == "error"]
        assert "merge ○ idle" in _bar_of(app)

        log.rename(f"{log}.1")  # a third run, as the launcher starts it, whose gradients die: merge is blocked
        log.write_text(header(3) + dead_gradients_log())
        dead = await pilot_until(pilot, lambda: next((a for a in app.state.alerts if a.code == "dead_gradients"), None))
        assert dead.action == FixAction.restart("train") and "l log · x restart" == dead.hint
        await pilot_until(pilot, lambda: "merge ■ blocked" in _bar_of(app))
        assert len(curve.points) == 80  # the third run's own steps, the healthy run's gone from the curve
