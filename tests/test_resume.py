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
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from samai.console.core import config, resume
from samai.console.core.actions import Actions, Decision
from samai.console.core.audit import AuditLog
from samai.console.core.fixes import FixAction
from samai.console.core.resume import NothingToResume
from samai.console.core.state import ConsoleState
from samai.remote import model
from samai.remote.boxapi import Box
from samai.remote.local import LocalTransport
from tests import factories
from tests.helpers import run_cli, wait_for
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


async def test_the_newest_fit_checkpoint_is_resumed_from_with_one_confirmed_plan(ws: Path, tmp_path: Path) -> None:
    cfg = config.load(ws / "samai.toml")
    box = Box(LocalTransport(), str(ws), python=sys.executable)
    shown = []

    async def confirm(plan):
        shown.append(plan)
        return Decision.confirmed(plan, "test")

    try:
        actions = Actions(box, cfg, AuditLog(tmp_path / "audit.jsonl"), readonly=False, confirm=confirm)
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
