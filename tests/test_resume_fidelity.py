"""A resumed run is the same run, and the console checks it on every resume (issue 48, item 1):
the resumed run's loss at each step its dead run logged after the checkpoint is the dead run's,
within [train] resume_tolerance; off by more, `resume_diverged` names the step and both values,
once per run. The dead run's steps are read from its kept log (NAME.1) beside the poll, by the
training feed, so the box screen, the watcher and doctor all say it."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from samai.console.core.training.fidelity import CODE, first_divergence
from samai.console.core.training.trainlog import TrainPoint
from tests import chainlog
from tests.replay_transport import ReplayConsole, ReplayTransport

STEP = "{{'loss': {loss}, 'grad_norm': 1.0, 'learning_rate': 0.0002, 'epoch': 0.1}}\n"
LOSSES = [round(2.0 - i / 37, 6) for i in range(16)]  # steps 1..16


def _run(pid: int, losses: list[float], resumed: int | None = None, rc: int | None = 137) -> str:
    said = f"TRAIN_RESUMED from runs/train/checkpoints/checkpoint-{resumed} (step {resumed})\n" if resumed else ""
    ended = "" if rc is None else chainlog.chain(f"CHAIN_DONE rc={rc}", pid) + "\n"
    return (chainlog.header("train", pid, f"2026-12-02T0{pid}:00:00Z") + "\n" + said
            + "".join(STEP.format(loss=x) for x in losses) + ended)


def _points(losses: dict[int, float]) -> list[TrainPoint]:
    return [TrainPoint(step, loss) for step, loss in sorted(losses.items())]


@given(st.lists(st.floats(0.01, 10.0), min_size=2, max_size=40), st.data())
@settings(max_examples=200, deadline=None)
def test_the_first_step_off_beyond_the_tolerance_is_found_and_none_within_it(losses, data) -> None:
    steps = dict(enumerate(losses, 1))
    resumed_from = data.draw(st.integers(0, len(losses) - 1), label="resumed from")
    tolerance = data.draw(st.sampled_from([1e-5, 1e-3, 1e-1]), label="tolerance")
    dead = _points(steps)
    within = _points({s: x * (1 + tolerance / 2) for s, x in steps.items() if s > resumed_from})
    assert first_divergence(within, dead, tolerance, resumed_from) is None
    off = data.draw(st.sampled_from(sorted(s for s in steps if s > resumed_from)), label="off at")
    drifted = _points({s: x * (1 + 3 * tolerance) if s >= off else x for s, x in steps.items() if s > resumed_from})
    found = first_divergence(drifted, dead, tolerance, resumed_from)
    assert found is not None and found.step == off and math.isclose(found.dead, steps[off])
    assert f"at step {off}" in found.finding().message and found.finding().code == CODE


def test_steps_the_dead_run_did_not_log_or_that_are_not_finite_are_not_compared() -> None:
    dead = _points({9: 1.0, 10: float("nan"), 12: 1.2})
    assert first_divergence(_points({10: 5.0, 11: 7.0, 12: 1.2}), dead, 1e-5, 8) is None
    assert first_divergence(_points({8: 9.0}), _points({8: 1.0}), 1e-5, 8) is None  # at the checkpoint: not after it


def _resumed(box: ReplayTransport, losses_after: list[float]) -> None:
    """The dead run (steps 1..16, SIGKILLed) kept as train.log.1; the running one resumed from step 10."""
    box.write_log("logs/train.log.1", _run(1, LOSSES))
    box.write_log("logs/train.log", _run(2, losses_after, resumed=10, rc=None))


async def test_a_resume_that_logs_the_dead_runs_losses_again_is_quiet(recorded_console: ReplayConsole,
                                                                       recorded_box: ReplayTransport) -> None:
    _resumed(recorded_box, LOSSES[10:])  # steps 11..16, the same losses
    await recorded_console.look()
    await recorded_console.look()
    assert not recorded_console.active(CODE)


async def test_a_resume_that_drifts_is_one_warning_naming_the_step_and_both_values(
        recorded_console: ReplayConsole, recorded_box: ReplayTransport) -> None:
    after = LOSSES[10:]
    after[2] = round(after[2] * 1.01, 6)  # step 13: 1 % off
    _resumed(recorded_box, after)
    await recorded_console.look()
    await recorded_console.look()
    [alert] = recorded_console.active(CODE)
    assert alert.severity == "warning" and alert.stage == "train"
    assert f"at step 13 its loss is {after[2]:.6g}, the run it continues logged {LOSSES[12]:.6g}" in alert.text
    recorded_box.write_log("logs/train.log", STEP.format(loss=9.0), append=True)  # more steps: said once per run
    await recorded_console.look()
    assert len([a for a in recorded_console.state.alerts if a.code == CODE]) == 1
