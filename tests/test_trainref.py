"""A training run against the last good run (console/core/training/trainref.py): smoothing and step
alignment, worse_than_reference only after N logged steps in a row, the last good run found
among the kept generations of a real box's log, any points fuzzed, and `check trainlog --against`."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from textual.widgets import DataTable

from samai.console.app import SamaiApp
from samai.console.core import config
from samai.console.core.config import Train
from samai.console.core.training.feed import TrainingFeed
from samai.console.core.training.trainlog import TrainPoint
from samai.console.core.training.trainref import Reference, at_step, compare, last_good_run, smoothed
from samai.console.screens.dialogs import RunsScreen
from samai.remote.boxapi import Box
from samai.widgets.curves import CurvesPane
from tests import chainlog
from tests.helpers import pilot_until, run_cli
from tests.replay_transport import ReplayTransport

TRAIN = Train(compare_factor=1.5, compare_steps=3, compare_smooth=1)


def points(losses: dict[int, float]) -> tuple[TrainPoint, ...]:
    return tuple(TrainPoint(step, loss) for step, loss in losses.items())


def reference(losses: dict[int, float]) -> Reference:
    return Reference("train.log.1", points(losses))


def test_the_reference_is_read_between_its_steps_and_never_past_its_ends() -> None:
    curve = smoothed(points({10: 2.0, 20: 1.0, 40: 0.5}), 1)
    steps = [s for s, _ in curve]
    assert at_step(curve, steps, 10) == 2.0 and at_step(curve, steps, 15) == pytest.approx(1.5)
    assert at_step(curve, steps, 30) == pytest.approx(0.75)
    assert at_step(curve, steps, 5) is None and at_step(curve, steps, 41) is None


def test_smoothing_skips_what_is_not_a_loss_and_averages_the_window() -> None:
    got = smoothed((TrainPoint(1, 4.0), TrainPoint(2, math.nan), TrainPoint(3, 0.0, grad_norm=math.inf),
                    TrainPoint(4, 2.0), TrainPoint(4, 9.0), TrainPoint(5, None), TrainPoint(6, 0.0)), 2)
    assert got == [(1, 4.0), (4, 3.0), (6, 1.0)]  # NaN, hidden NaN, a repeated step and no loss left out


def test_worse_only_after_the_steps_in_a_row_naming_the_step_and_both_values() -> None:
    ref = reference({s: 1.0 for s in range(10, 110, 10)})
    once = points({10: 1.0, 20: 2.0, 30: 1.0, 40: 2.0, 50: 2.0, 60: 1.0})  # never 3 in a row
    assert compare(once, ref, TRAIN) is None
    worse = compare(points({10: 1.0, 20: 1.6, 30: 1.7, 40: 1.8, 50: 1.9}), ref, TRAIN)
    assert worse is not None and (worse.step, worse.current, worse.reference, worse.steps) == (40, 1.8, 1.0, 3)
    problem = worse.problem()
    assert problem.code == "worse_than_reference" and problem.step == 40
    assert "1.8 at step 40" in problem.message and "1.8× the reference run's 1 (train.log.1)" in problem.message
    assert worse.rates is None and "learning rate" not in problem.message  # neither run logged one


def test_past_the_reference_s_last_step_nothing_is_compared() -> None:
    ref = reference({10: 1.0, 20: 1.0})
    assert compare(points({30: 9.0, 40: 9.0, 50: 9.0, 60: 9.0}), ref, TRAIN) is None


FLOATS = st.floats(allow_nan=True, allow_infinity=True) | st.none()


@given(st.lists(st.builds(TrainPoint, st.integers(-5, 10**6), FLOATS, FLOATS), max_size=60),
       st.lists(st.builds(TrainPoint, st.integers(-5, 10**6), FLOATS), max_size=60),
       st.integers(1, 8), st.integers(1, 5))
@settings(max_examples=300, deadline=None)
def test_any_points_compare_without_raising(current, ref, smooth, steps) -> None:
    worse = compare(current, Reference("r", tuple(ref)), Train(1.5, steps, smooth))
    if worse is not None:
        assert worse.current > 1.5 * worse.reference > 0 and math.isfinite(worse.current)
        json.dumps(worse.to_json())


def trainer_log(losses: list[float], rc: int = 0, lr: float = 2e-4) -> str:
    """A training log as the box's launcher keeps it: a run header, the Trainer's dicts, its end."""
    rows = [f"{{'loss': {loss}, 'grad_norm': 1.0, 'learning_rate': {lr}, 'epoch': {i / 10}}}"
            for i, loss in enumerate(losses, 1)]
    return chainlog.run_log("train", 1, rows, rc, started="2026-12-03T00:00:00Z")


async def test_the_last_good_run_is_the_newest_kept_one_that_ended_well(box: Box, workspace: Path) -> None:
    logs = workspace / "logs"
    logs.mkdir()
    (logs / "train.log").write_text(trainer_log([3.0, 2.0]))  # the run being compared: not its own reference
    (logs / "train.log.1").write_text(trainer_log([3.0, 2.5], rc=143))  # stopped
    (logs / "train.log.2").write_text(trainer_log([3.0, float("nan"), 1.0]))  # ended 0 with a NaN: no
    (logs / "train.log.3").write_text(trainer_log([3.0, 1.5, 1.0]))
    (logs / "train.log.4").write_text(trainer_log([9.0, 9.0]))
    found = await last_good_run(box, str(logs / "train.log"), TRAIN)
    assert found is not None and found.label == "train.log.3" and [p.loss for p in found.points] == [3.0, 1.5, 1.0]
    (logs / "train.log.3").unlink()  # the generations end at the first one missing
    assert await last_good_run(box, str(logs / "train.log"), TRAIN) is None


async def test_a_run_that_diverged_without_a_nan_is_no_reference(box: Box, workspace: Path) -> None:
    """It ended with rc 0 and its log has no NaN: only the run before it shows it went wrong."""
    logs = workspace / "logs"
    logs.mkdir()
    (logs / "train.log").write_text(trainer_log([3.0]))
    (logs / "train.log.1").write_text(trainer_log([3.0, 7.0, 6.5, 6.0, 5.5]))  # lr too high: rc 0 all the same
    (logs / "train.log.2").write_text(trainer_log([3.0, 2.0, 1.5, 1.2, 1.0]))
    found = await last_good_run(box, str(logs / "train.log"), TRAIN)
    assert found is not None and found.label == "train.log.2"


def test_an_excess_too_small_for_the_curve_s_scale_is_not_worse() -> None:
    """Near the end of a run that learned, 0.003 against 0.002 is 1.5x, and noise."""
    ref = reference({1: 0.3, 10: 0.01, 20: 0.002, 30: 0.002, 40: 0.002, 50: 0.002})
    assert compare(points({20: 0.0035, 30: 0.0035, 40: 0.0035, 50: 0.0035}), ref, TRAIN) is None


def test_check_trainlog_against_a_reference(tmp_path: Path, workspace: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[workspace]\npath = "{workspace}"\n[train]\ncompare_steps = 3\ncompare_smooth = 1\n')
    (workspace / "good.log").write_text(trainer_log([2.0 - i * 0.1 for i in range(12)]))
    (workspace / "same.log").write_text(trainer_log([2.0 - i * 0.1 + 0.05 for i in range(12)]))
    (workspace / "hot.log").write_text(trainer_log([2.0 - i * 0.1 if i < 4 else 3.5 for i in range(12)], lr=2e-2))
    ok = run_cli("--config", str(cfg), "check", "trainlog", "same.log", "--against", "good.log", "--json")
    assert ok.returncode == 0, ok.stderr
    assert not [a for a in json.loads(ok.stdout)["anomalies"] if a["code"] == "worse_than_reference"]
    bad = run_cli("--config", str(cfg), "check", "trainlog", "hot.log", "--against", "good.log", "--json")
    assert bad.returncode == 1, bad.stderr
    [worse] = [a for a in json.loads(bad.stdout)["anomalies"] if a["code"] == "worse_than_reference"]
    assert worse["step"] == 7 and worse["current"] == 3.5 and worse["reference"] == pytest.approx(1.4)
    assert worse["learning_rates"] == [0.02, 0.0002] and "its learning rate is 0.02 against 0.0002" in worse["message"]
    text = run_cli("--config", str(cfg), "check", "trainlog", "hot.log", "--against", "good.log").stdout
    assert "worse_than_reference" in text and "at step 7" in text
    refused = run_cli("--config", str(cfg), "check", "eval", "x.jsonl", "--against", "good.log")
    assert refused.returncode == 2 and "only for check trainlog" in refused.stderr


async def test_the_console_compares_the_followed_run_with_the_last_good_one(recorded_box: ReplayTransport) -> None:
    """The recorded box's running train stage (losses 2.31, 2.04, a hidden NaN, 1.73, 1.51) and its
    log's kept generation from a run that went well (1.0, 0.9, ..): the alert, and the pane's reference."""
    recorded_box.write_log("logs/train.log.1", trainer_log([1.0, 0.9, 0.8, 0.7, 0.6, 0.5]).replace(
        "\nCHAIN_DONE", "\n{'eval_loss': 0.8, 'epoch': 0.6}\nCHAIN_DONE"))
    recorded_box.write_log("logs/train.log", "{'eval_loss': 1.9, 'eval_runtime': 0.1, 'epoch': 0.5}\n", append=True)
    tiny = config.load_builtin("tiny")
    cfg = replace(tiny, workspace=recorded_box.workspace, target=replace(tiny.target, poll_interval=0.05),
                  train=TRAIN)
    app = SamaiApp(cfg, open_box=lambda _cfg: Box(recorded_box, recorded_box.workspace))
    async with app.run_test(size=(150, 48)) as pilot:
        alert = await pilot_until(pilot, lambda: next((a for a in app.state.active_alerts()
                                                       if a.code == "worse_than_reference"), None))
        assert alert.severity == "warning" and alert.stage == "train"
        assert "1.734 at step 4 is 2.5× the reference run's 0.7 (train.log.1)" in alert.text, alert.text
        pane = app.box_screen.query_one(CurvesPane)
        assert pane.reference.label == "train.log.1" and pane.reference.loss[:2] == ((1, 1.0), (2, 0.9))
        assert pane.reference.learning_rate[0] == (1, 2e-4) and pane.reference.grad_norm[0] == (1, 1.0)
        assert pane.reference.eval_loss == ((6, 0.8),)
        await pilot_until(pilot, lambda: pane.evals == [(5, 1.9)])  # at the last step logged before it


def test_eval_losses_are_read_at_their_step_or_the_last_one_before() -> None:
    from samai.console.core.training.trainlog import TrainLogCheck

    check = TrainLogCheck()
    check.feed(["{'loss': 2.0, 'grad_norm': 1.0, 'learning_rate': 0.1, 'epoch': 0.1}",
                "{'eval_loss': 1.5, 'eval_runtime': 0.2, 'epoch': 0.1}",
                "{'eval_loss': nan, 'epoch': 0.1}", "{'eval_loss': 'low', 'epoch': 0.1}",
                "{'eval_loss': 1.25, 'step': 40}"])
    assert check.drain_evals() == [(1, 1.5), (40, 1.25)] and check.drain_evals() == []
    assert [p.step for p in check.result().points] == [1]  # an eval is no training step


async def test_a_run_picked_in_h_becomes_the_reference(recorded_box: ReplayTransport) -> None:
    recorded_box.write_log("logs/train.log.1", trainer_log([1.0, 0.9, 0.8, 0.7, 0.6]))
    recorded_box.write_log("logs/train.log.2", trainer_log([9.0, 9.0, 9.0, 9.0, 9.0]))
    tiny = config.load_builtin("tiny")
    cfg = replace(tiny, workspace=recorded_box.workspace, target=replace(tiny.target, poll_interval=0.05),
                  train=TRAIN)
    app = SamaiApp(cfg, open_box=lambda _cfg: Box(recorded_box, recorded_box.workspace))
    async with app.run_test(size=(150, 48)) as pilot:
        pane = app.box_screen.query_one(CurvesPane)
        await pilot_until(pilot, lambda: pane.reference.label == "train.log.1")  # the last one that went well
        # the running stage's log: H lists its runs
        await pilot_until(pilot, lambda: app.box_screen.shown_stage == "train")
        await pilot.press("H")
        screen = await pilot_until(pilot, lambda: isinstance(app.screen, RunsScreen) and app.screen)
        screen.query_one(DataTable).move_cursor(row=2)  # newest first: the log, .1, then .2
        await pilot.press("enter")
        await pilot_until(pilot, lambda: pane.reference.label == "train.log.2")
        assert [p.loss for p in app.state.feed(TrainingFeed).reference.reference.points] == [9.0] * 5
