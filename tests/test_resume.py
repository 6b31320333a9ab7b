"""Resume instead of restart (issue 31, part 2): the newest checkpoint that is whole, finite and
before the log's first anomaly is the one a dead run continues from, through the action layer
(one confirmed plan naming it and why newer ones were passed over, the poison cleared, the
disk its next checkpoint needs checked), from the command line (`fire train --resume`), from
`doctor` (`resume_available`) and from the dead run's alert (`x`).

The train stage here is a script that records the command line it was given: what is tested
is the console's choice and plan. The Trainer's own resume runs in the tiny pipeline's tests."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from samai.console.core import config
from samai.console.core.actions import Actions, Decision
from samai.console.core.audit import AuditLog
from samai.console.core.fixes import FixAction
from samai.console.core.state import ConsoleState
from samai.console.core.training import resume
from samai.console.core.training.feed import TrainingFeed
from samai.console.core.training.resume import NothingToResume
from samai.remote import model
from samai.remote.boxapi import Box
from samai.remote.local import LocalTransport
from tests import factories
from tests.helpers import confirm_dialog, run_cli, wait_for
from tests.test_checkpoints import FOLDER, checkpoint

STEP = "{{'loss': {loss}, 'grad_norm': {grad}, 'learning_rate': 0.0002, 'epoch': {epoch}}}\n"
RECORDER = "import sys\nopen('argv.json', 'w').write(__import__('json').dumps(sys.argv[1:]))\n"


def config_text(ws: Path) -> str:
    return f'''
[workspace]
path = "{ws}"
[stages.sft]
key = "t"
role = "train"
command = "{sys.executable} recorder.py --out runs/train"
log = "logs/train.log"
checkpoints = "{FOLDER}"
poison = ["runs/train/TRAIN_NAN"]
'''


@pytest.fixture
def ws(workspace: Path) -> Path:
    """A dead run: checkpoints at steps 4, 8 and 12, its log sick from step 10 on, its NaN marker left."""
    (workspace / "recorder.py").write_text(RECORDER)
    for step in (4, 8, 12):
        checkpoint(workspace, step)
    lines = [STEP.format(loss=2.0 - i / 20, grad=1.2, epoch=i / 10) for i in range(1, 10)]
    lines += [STEP.format(loss="nan", grad="nan", epoch=i / 10) for i in range(10, 16)]
    (workspace / "logs").mkdir()
    (workspace / "logs" / "train.log").write_text("=== samai chain sft: pid 1 started 2026-12-02T00:00:00Z\n"
                                                  + "".join(lines) + "CHAIN_DONE rc=3\n")
    (workspace / "runs" / "train" / "TRAIN_NAN").write_text("after 15 steps: nan\n")
    (workspace / "samai.toml").write_text(config_text(workspace))
    return workspace


def confirming(ws: Path, tmp_path: Path) -> tuple[Box, Actions, list]:
    """The action layer on this workspace's box, confirming every plan (each kept in the list)."""
    shown: list = []

    async def confirm(plan):
        shown.append(plan)
        return Decision.confirmed(plan, "test")

    box = Box(LocalTransport(), str(ws), python=sys.executable)
    cfg = config.load(ws / "samai.toml")
    return box, Actions(box, cfg, AuditLog(tmp_path / "audit.jsonl"), readonly=False, confirm=confirm), shown


async def test_the_newest_fit_checkpoint_is_resumed_from_with_one_confirmed_plan(ws: Path, tmp_path: Path) -> None:
    box, actions, shown = confirming(ws, tmp_path)
    try:
        with pytest.raises(NothingToResume, match="checkpoint-12: written at step 12, after the log's first"):
            await actions.plan_resume("sft", "checkpoint-12")
        with pytest.raises(NothingToResume, match="is not in runs/train/checkpoints"):
            await actions.plan_resume("sft", "../elsewhere/checkpoint-4")
        assert (await actions.plan_resume("sft", f"{FOLDER}/checkpoint-4")).checkpoint == f"{FOLDER}/checkpoint-4"
        outcome = await actions.resume("sft", grace=2)
        assert outcome.ok, outcome.message
        [plan] = shown
        assert plan.action == "resume" and plan.checkpoint == f"{FOLDER}/checkpoint-8"
        assert plan.chain.endswith(f"--resume-from {FOLDER}/checkpoint-8")
        assert f"resume from {FOLDER}/checkpoint-8 (step 8," in plan.details[0]
        assert "passed over checkpoint-12: written at step 12, after the log's first anomaly at step 10" in plan.details
        assert "runs/train/TRAIN_NAN" in plan.command and any("next checkpoint needs about" in c.text
                                                               for c in plan.checks)
        argv = wait_for(lambda: (ws / "argv.json").exists() and json.loads((ws / "argv.json").read_text()))
        assert argv == ["--out", "runs/train", "--resume-from", f"{FOLDER}/checkpoint-8"]
        assert not (ws / "runs" / "train" / "TRAIN_NAN").exists()  # the poison cleared
        audit = (tmp_path / "audit.jsonl").read_text()
        assert '"action": "resume"' in audit and "checkpoint-8" in audit

        for step in (4, 8, 12):  # none left whole: why (the caller offers the restart)
            (ws / FOLDER / f"checkpoint-{step}" / "scheduler.pt").unlink()
        with pytest.raises(NothingToResume, match="checkpoint-12: missing scheduler.pt; checkpoint-8: missing"):
            await actions.plan_resume("sft")
    finally:
        await box.close()


def test_the_command_line_resumes_refuses_with_the_reason_and_doctor_offers_it(ws: Path) -> None:
    cfg = str(ws / "samai.toml")
    refused = run_cli("--config", cfg, "fire", "sft", "--resume", "checkpoint-12", "--yes")
    assert refused.returncode == 1 and "cannot resume sft: " in refused.stderr
    assert "after the log's first anomaly at step 10" in refused.stderr and not (ws / "argv.json").exists()
    # a dead run on record (its chain said it died): doctor names the checkpoint it would resume from
    fired = run_cli("--config", cfg, "fire", "sft", "--yes")
    assert fired.returncode == 0, fired.stderr
    wait_for(lambda: (ws / "argv.json").exists())
    (ws / "recorder.py").write_text("raise SystemExit('giving up: no rows in train.jsonl')\n")
    run_cli("--config", cfg, "fire", "sft", "--yes")
    wait_for(lambda: (ws / ".samai" / "state" / "sft.rc").exists())
    out = json.loads(run_cli("--config", cfg, "doctor", "--json").stdout)
    [resume] = [f for f in out["findings"] if f["code"] == "resume_available"]
    assert resume["checkpoint"] == f"{FOLDER}/checkpoint-8" and resume["action"] == "resume sft"
    [died] = out["deaths"]
    assert died["stage"] == "sft" and died["cause"] == "exit" and "giving up: no rows" in died["detail"]
    (ws / "recorder.py").write_text(RECORDER)
    done = run_cli("--config", cfg, "fire", "sft", "--resume", "--yes")
    assert done.returncode == 0, done.stderr
    argv = wait_for(lambda: (ws / "argv.json").exists() and json.loads((ws / "argv.json").read_text()))
    assert argv[-2:] == ["--resume-from", f"{FOLDER}/checkpoint-8"]


def test_a_dead_training_runs_alert_offers_the_resume_and_a_stop_does_not() -> None:
    text = config_text(Path("/ws")).replace(f"{sys.executable} recorder.py", "python train.py")
    state = ConsoleState(config.parse(text, "(test)"))
    proc = factories.process(4242)
    state.apply(factories.snapshot(processes=[proc], states=[factories.running(proc, "sft")]), [], 1.0)
    died = state.apply(factories.snapshot(states=[factories.stage_record("sft", rc=1)]), [], 2.0)
    [alert] = [a for a in died.new_alerts if a.stage == "sft"]
    assert alert.action == FixAction.resume("sft") and "x resume from its last good checkpoint" in alert.hint
    assert FixAction.resume("sft").call == ("action_resume", ("sft",)) and str(FixAction.resume("sft")) == "resume sft"


CHECKPOINTS = st.lists(st.builds(lambda step, complete, finite, age: model.Checkpoint(
    f"checkpoint-{step}", step, 1000.0 - age, 10, 5, complete, finite=finite, problems=() if complete else ("x",)),
    st.integers(0, 50), st.booleans(), st.sampled_from([True, False, None]), st.integers(0, 100)),
    max_size=8, unique_by=lambda c: c.step)
RUNS = st.lists(st.builds(resume.RunAnomaly, st.floats(0, 1000), st.one_of(st.none(), st.integers(0, 60))),
                max_size=4).map(lambda rs: sorted(rs, key=lambda r: r.started))


@settings(max_examples=300, deadline=None, database=None)
@given(CHECKPOINTS, RUNS)
def test_the_choice_is_the_newest_fit_checkpoint_and_every_newer_one_says_why(cks, runs) -> None:
    found = model.Checkpoints("ck", tuple(sorted(cks, key=lambda c: c.step, reverse=True)))
    choice = resume.choose(found, runs)
    fit = [c for c in found.checkpoints if not resume.judged(c, resume.writer_anomaly(c, runs))]
    assert choice.chosen == (fit[0] if fit else None)
    newer = [c for c in found.checkpoints if choice.chosen is None or c.step > choice.chosen.step]
    assert [p.name for p in choice.passed] == [c.name for c in newer] and all(p.why for p in choice.passed)
    assert choice.path == (f"ck/{choice.chosen.name}" if choice.chosen else "")
    if choice.chosen is None:
        assert choice.why_none()


def test_a_checkpoint_written_a_moment_ago_is_passed_over_only_while_its_run_still_runs() -> None:
    """A dead run writes nothing more: its newest checkpoint is as whole as it looks, however
    recent (the tiny run's last three were all under a second old when it was killed)."""
    fresh = model.Checkpoint("checkpoint-20", 20, 1000.0, 10, 8, True, settling=True, finite=True,
                             problems=("written 1 s ago: a save may still be under way",))
    settled = model.Checkpoint("checkpoint-16", 16, 990.0, 10, 8, True, finite=True)
    found = model.Checkpoints("ck", (fresh, settled))
    assert resume.choose(found, []).chosen == fresh
    running = resume.choose(found, [], writing=True)
    assert running.chosen == settled and "a save may be under way" in running.passed[0].why


@settings(max_examples=200, deadline=None, database=None)
@given(CHECKPOINTS, st.integers(0, 4), st.integers(0, 10))
def test_a_prune_keeps_the_newest_few_and_the_resumes_and_deletes_only_the_rest(cks, keep, pick) -> None:
    found = model.Checkpoints("ck", tuple(sorted(cks, key=lambda c: c.step, reverse=True)))
    chosen = found.checkpoints[pick] if pick < len(found.checkpoints) else None
    choice = resume.prunable(found, chosen, keep)
    assert set(choice.deleted) | set(choice.kept) == set(found.checkpoints)
    assert not set(choice.deleted) & set(choice.kept)
    assert chosen is None or chosen in choice.kept
    assert set(found.checkpoints[:keep]) <= set(choice.kept)
    assert choice.paths() == tuple(f"ck/{c.name}" for c in choice.deleted)


async def test_the_prune_plan_deletes_the_old_checkpoints_never_the_one_a_resume_takes(ws: Path,
                                                                                      tmp_path: Path) -> None:
    """Steps 4, 8, 12 and 16; the log sick from step 10: a resume takes checkpoint-8, so a prune to
    the newest two (16, 12) keeps 8 too, and deletes only 4."""
    checkpoint(ws, 16)
    box, actions, shown = confirming(ws, tmp_path)
    try:
        outcome = await actions.prune("sft", keep=2)
        assert outcome.ok, outcome.message
        [plan] = shown
        assert plan.action == "prune" and plan.paths == (f"{FOLDER}/checkpoint-4",)
        assert "kept checkpoint-8 (step 8): a resume would take it" in plan.details
        assert "kept checkpoint-16 (step 16)" in plan.details and "rm -rf -- " in plan.command
        assert sorted(p.name for p in (ws / FOLDER).iterdir()) == ["checkpoint-12", "checkpoint-16", "checkpoint-8"]
        assert '"action": "prune"' in (tmp_path / "audit.jsonl").read_text()
        with pytest.raises(resume.NothingToPrune, match="none older than the newest 3"):
            await actions.plan_prune("sft", keep=3)
    finally:
        await box.close()


# ---------------------------------------------------------------- the next checkpoint: will it fit?

MB = 1 << 20


def _listed(*sizes: int) -> model.Checkpoints:
    return model.Checkpoints(FOLDER, tuple(model.Checkpoint(f"checkpoint-{4 * (len(sizes) - i)}", 4 * (len(sizes) - i),
                                                             1000.0, size, 8, True, finite=None)
                                           for i, size in enumerate(sizes)))


def _running_state(free: int) -> tuple[ConsoleState, model.Snapshot]:
    text = config_text(Path("/ws")).replace(f"{sys.executable} recorder.py", "python train.py")
    text += "[budget]\nreserve_gb = 0.5\n"
    state = ConsoleState(config.parse(text, "(test)"))
    proc = factories.process(4242)
    snap = factories.snapshot(processes=[proc], states=[factories.running(proc, "sft")],
                              disks=[factories.disk(free=free)])
    return state, snap


def test_a_running_runs_next_checkpoint_that_will_not_fit_is_an_alert_whose_fix_is_the_prune() -> None:
    state, snap = _running_state(free=300 * MB)
    state.apply(snap, [], 1.0)
    training = state.feed(TrainingFeed)
    assert training is not None
    (listing,) = [r for r in training.reads(1.0) if r.what == "sft's checkpoints"]
    assert not [r for r in training.reads(2.0) if "checkpoints" in r.what]  # not again before CHECKPOINT_READ_S
    shown = state.fold_read(training, listing, _listed(400 * MB, 390 * MB, 100 * MB), 3.0)
    assert shown is not None
    [alert] = [a for a in shown.new_alerts if a.code == "checkpoint_wont_fit"]
    assert alert.severity == "error" and alert.action == FixAction.prune("sft")
    assert "about 419.4 MB, as its last ones" in alert.text and "will not fit" in alert.text
    assert "older than the newest 2" in alert.text and alert.hint == "x fix"
    # the disk freed (the prune ran): the next poll resolves it; room but under the reserve: a warning
    state.apply(factories.snapshot(processes=snap.processes, states=snap.states,
                                   disks=[factories.disk(free=600 * MB)]), [], 4.0)
    assert not [a for a in state.active_alerts() if a.code == "checkpoint_wont_fit" and a.severity == "error"]
    [warning] = [a for a in state.active_alerts() if a.code == "checkpoint_wont_fit"]
    assert warning.severity == "warning" and "less than the disk reserve" in warning.text
    state.apply(factories.snapshot(processes=snap.processes, states=snap.states,
                                   disks=[factories.disk(free=2000 * MB)]), [], 5.0)
    assert not [a for a in state.active_alerts() if a.code == "checkpoint_wont_fit"]


def test_a_run_that_is_not_running_has_no_next_checkpoint() -> None:
    state, snap = _running_state(free=10 * MB)
    state.apply(factories.snapshot(states=[factories.stage_record("sft", rc=1)], disks=snap.disks), [], 1.0)
    training = state.feed(TrainingFeed)
    assert training is not None and not [r for r in training.reads(1.0) if "checkpoints" in r.what]
    assert not [a for a in state.active_alerts() if a.code == "checkpoint_wont_fit"]


@pytest.mark.slow
async def test_the_prune_from_the_alert_deletes_the_old_checkpoints_and_keeps_the_resumes(ws: Path) -> None:
    """A running run whose next checkpoint will not fit in a small quota (capacity_gb): the alert,
    `x`, the prune's dialog naming what it keeps, and the old checkpoints gone from the box."""
    from samai.console.app import SamaiApp
    from samai.console.screens.dialogs import ConfirmDialog
    from tests.helpers import pilot_until

    checkpoint(ws, 16)
    size = sum(f.stat().st_size for f in (ws / FOLDER / "checkpoint-16").iterdir())
    text = config_text(ws).replace("recorder.py", "-c 'import time; time.sleep(60)'")
    (ws / "samai.toml").write_text(text + f"[budget]\ncapacity_gb = {size * 0.5 / 1e9:.9f}\nreserve_gb = 0\n")
    cfg = config.load(ws / "samai.toml")
    box = Box(LocalTransport(), str(ws), python=sys.executable)
    try:
        assert (await box.fire("sft", cfg.stage("sft").command, "logs/train.log")).ok
    finally:
        await box.close()
    app = SamaiApp(replace(cfg, target=replace(cfg.target, poll_interval=0.3)))
    async with app.run_test(size=(150, 45)) as pilot:
        alert = await pilot_until(pilot, lambda: next((a for a in app.state.active_alerts()
                                                       if a.code == "checkpoint_wont_fit"), None))
        assert alert.severity == "error" and alert.action == FixAction.prune("sft")
        await pilot.press("x")
        dialog = await pilot_until(pilot, lambda: isinstance(app.screen, ConfirmDialog) and app.screen)
        assert dialog.plan.action == "prune" and dialog.plan.paths == (f"{FOLDER}/checkpoint-4",)
        assert "kept checkpoint-8 (step 8): a resume would take it" in dialog.plan.details
        await confirm_dialog(pilot)
        await pilot_until(pilot, lambda: not (ws / FOLDER / "checkpoint-4").exists())
        assert sorted(p.name for p in (ws / FOLDER).iterdir()) == ["checkpoint-12", "checkpoint-16", "checkpoint-8"]
