"""A resumed run is one run (issue 31, part 2): its steps continue the global steps of the run it
resumed, and the merge gate judges the steps that made its weights: the resumed run's, and the
earlier run's up to the checkpoint it resumed from (not the steps after it, thrown away). Logs
written here as the launcher keeps them (the earlier run in train.log.1), read through the box."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from samai.console.core.preflight.evidence import run_verdict
from samai.console.core.training.feed import TrainingView
from samai.console.core.training.lineage import last_run_check, until_step
from samai.console.core.training.trainlog import TrainLogCheck
from tests import chainlog
from tests.replay_transport import new_points

STEP = "{{'loss': {loss}, 'grad_norm': {grad}, 'learning_rate': 0.0002, 'epoch': 0.1}}\n"


def header(pid: int) -> str:
    return chainlog.header("train", pid, f"2026-12-02T0{pid}:00:00Z") + "\n"


def _run(pid: int, losses: list[str], resumed: int | None = None, rc: int | None = 137) -> str:
    said = f"TRAIN_RESUMED from runs/train/checkpoints/checkpoint-{resumed} (step {resumed})\n" if resumed else ""
    ended = "" if rc is None else chainlog.chain(f"CHAIN_DONE rc={rc}", pid) + "\n"
    return header(pid) + said + "".join(STEP.format(loss=x, grad="nan" if x == "nan" else 1.1)
                                        for x in losses) + ended


def healthy(n: int) -> list[str]:
    return [f"{2.0 - i / 50:.3f}" for i in range(n)]


@pytest.fixture
def logs(workspace: Path) -> Path:
    folder = workspace / "logs"
    folder.mkdir()
    return folder


async def test_a_resumed_run_is_judged_with_the_steps_it_continues_and_not_those_thrown_away(box, logs) -> None:
    # steps 1..9 healthy, 10..15 NaN, killed; resumed from checkpoint-8: steps 9..20 healthy
    (logs / "train.log.1").write_text(_run(1, healthy(9) + ["nan"] * 6))
    (logs / "train.log").write_text(_run(2, healthy(12), resumed=8, rc=0))
    result = await last_run_check(box, str(logs / "train.log"))
    assert result.steps == 8 + 12 and [p.step for p in result.points] == list(range(1, 21))
    assert not [p for p in result.problems if p.severity == "error"]
    assert run_verdict("train", result)[0].text == "train's log, last run: 20 steps, no error-level finding"


async def test_a_run_resumed_from_past_its_first_nan_carries_the_nan_into_the_gate(box, logs) -> None:
    (logs / "train.log.1").write_text(_run(1, healthy(9) + ["nan"] * 6))
    (logs / "train.log").write_text(_run(2, healthy(8), resumed=12, rc=0))
    result = await last_run_check(box, str(logs / "train.log"))
    errors = [p for p in result.problems if p.severity == "error"]
    assert errors and errors[0].step == 10, result.problems  # the resumed run alone looks healthy
    assert run_verdict("train", result)[0].severity == "error"


async def test_a_lineage_of_two_resumes_and_one_rotated_away(box, logs) -> None:
    (logs / "train.log.2").write_text(_run(1, healthy(6)))
    (logs / "train.log.1").write_text(_run(2, healthy(6), resumed=4))  # steps 5..10, killed
    (logs / "train.log").write_text(_run(3, healthy(5), resumed=8, rc=0))  # 9..13
    result = await last_run_check(box, str(logs / "train.log"))
    assert [p.step for p in result.points] == list(range(1, 14))
    (logs / "train.log.2").unlink()
    (logs / "train.log.1").unlink()  # the runs it resumed are gone: its own steps, numbered from 9
    result = await last_run_check(box, str(logs / "train.log"))
    assert [p.step for p in result.points] == list(range(9, 14))


async def test_a_log_that_resumed_nothing_is_its_last_run_as_before(box, logs) -> None:
    (logs / "train.log.1").write_text(_run(1, ["nan"] * 8))  # an earlier run, not resumed: not judged
    (logs / "train.log").write_text(_run(2, healthy(4), rc=None))
    result = await last_run_check(box, str(logs / "train.log"))
    assert [p.step for p in result.points] == [1, 2, 3, 4] and not result.problems


async def test_a_header_the_run_printed_after_its_nan_hides_nothing_from_the_gate(box, logs) -> None:
    """Issue 46, item 3: a run header printed by the stage (a copy of its own, an earlier run's,
    one with no nonce) is its text: the NaN before it stays in the run the merge gate judges."""
    forged = [header(2).strip(), header(1).strip(), "=== samai chain train: pid 9 started 2026-12-02T09:00:00Z"]
    for copy in forged:
        (logs / "train.log").write_text(_run(2, healthy(4) + ["nan"], rc=None) + copy + "\n"
                                        + "".join(STEP.format(loss=x, grad=1.1) for x in healthy(6)))
        result = await last_run_check(box, str(logs / "train.log"))
        errors = [p for p in result.problems if p.severity == "error"]
        assert errors and errors[0].step == 5 and len(result.points) == 11, (copy, result.problems)
        assert run_verdict("train", result)[0].severity == "error"


def test_the_resume_line_numbers_the_next_steps_and_a_garbled_one_is_no_resume() -> None:
    check = TrainLogCheck()
    points = check.feed(["TRAIN_RESUMED from runs/train/checkpoints/checkpoint-40 (step 40)",
                         STEP.format(loss=1.0, grad=1.0).strip(), STEP.format(loss=0.9, grad=1.0).strip()])
    assert [p.step for p in points] == [41, 42]
    other = TrainLogCheck()
    assert [p.step for p in other.feed(["TRAIN_RESUMED from x (step forty)", STEP.format(loss=1, grad=1)])] == [1]


@settings(max_examples=150, deadline=None, database=None)
@given(st.lists(st.sampled_from([STEP.format(loss=1.0, grad=1.0).strip(), STEP.format(loss="nan", grad="nan"),
                                 "TRAIN_RESUMED from c (step 3)", "{'loss': 1e400}", "x" * 300, "\x00\udcff"]))
       | st.lists(st.text(max_size=40)), st.integers(-5, 50))
def test_a_run_cut_at_any_step_is_a_prefix_whose_steps_reach_no_further(lines: list[str], cut: int) -> None:
    kept = until_step(lines, cut)
    assert kept == lines[:len(kept)]
    assert all(p.step <= cut for p in TrainLogCheck().feed(kept))


@pytest.mark.slow
async def test_the_curve_of_a_resumed_run_goes_on_from_the_run_it_resumed_with_the_resume_marked(
        workspace: Path, logs: Path) -> None:
    """The console started after the resume: the pane reads the earlier run's steps up to the
    resume point from its rotated log, and shows one curve, steps 1..20, resumed at step 8."""
    from samai.console.app import SamaiApp
    from samai.console.core import config
    from samai.widgets.curves import CurvesPane
    from tests.helpers import pilot_until

    (logs / "train.log.1").write_text(_run(1, healthy(9) + ["nan"] * 6))
    (logs / "train.log").write_text(_run(2, healthy(12), resumed=8, rc=None))
    (workspace / "samai.toml").write_text(f'[workspace]\npath = "{workspace}"\n[stages.train]\nkey = "t"\n'
                                          'role = "train"\ncommand = "true"\nlog = "logs/train.log"\n')
    app = SamaiApp(config.load(workspace / "samai.toml"))
    async with app.run_test(size=(150, 45)) as pilot:
        pane = app.box_screen.query_one(CurvesPane)
        await pilot_until(pilot, lambda: len(pane.points) == 20)
        assert [p.step for p in pane.points] == list(range(1, 21)) and not any(p.bad for p in pane.points)
        assert pane.resumed_at == 8 and "resumed at step 8" in str(pane.border_subtitle)


async def test_the_resume_step_is_said_to_the_panes_once_per_run(recorded_console, recorded_box) -> None:
    recorded_box.write_log("logs/train.log", header(1) + "TRAIN_RESUMED from c/checkpoint-8 (step 8)\n"
                           + STEP.format(loss=1, grad=1))
    first = await recorded_console.poll()
    assert first.view(TrainingView).resumed_at == 8 and [p.step for p in new_points(first)] == [9]
    recorded_box.write_log("logs/train.log", STEP.format(loss=1, grad=1), append=True)
    again = await recorded_console.poll()
    assert again.view(TrainingView).resumed_at is None and [p.step for p in new_points(again)] == [10]
