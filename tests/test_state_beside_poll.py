"""What is read beside the poll is folded into the state through its methods, each returning the
StateUpdate the panes are handed (issue 30, item 1): the training environments, an eval run's
items, a reading of the multi-node runs, a failed fire, the box gone quiet. Judged at once, shown
once, nothing of the last poll appended twice. Fast: snapshots built here, no process started."""

from __future__ import annotations

from dataclasses import replace

from samai.console.core import config
from samai.console.core.evalcheck import check_eval
from samai.console.core.fixes import FixAction
from samai.console.core.problems import Finding
from samai.console.core.state import ConsoleState, run_error
from tests.replay_transport import ReplayConsole, ReplayTransport
from tests.test_detector_registry import CONFIG, ENVS, SPLIT, box_snapshot

TRAIN_LOG = "logs/train.log"
STEPS = "".join(f"{{'loss': {2.3 - i / 10:.4f}, 'grad_norm': 1.5, 'learning_rate': 0.0002, 'epoch': {i / 10}}}\n"
                for i in range(1, 4))


def polled(state: ConsoleState, now: float = 100.0):
    snap = box_snapshot()
    return state.apply(snap, [], now)


def _codes(alerts) -> list[str]:
    return [a.code for a in alerts]


def _cfg() -> config.Config:
    return config.parse(CONFIG, "(test)")


def test_environments_read_after_a_poll_are_judged_at_once_and_shown_once() -> None:
    state = ConsoleState(_cfg())
    first = polled(state)
    assert "torchao_beside_peft" not in _codes(first.new_alerts)  # not read yet
    shown = state.read_environments(ENVS, 101.0)
    assert shown is not None and _codes(shown.new_alerts) == ["torchao_beside_peft"]
    assert shown.alerts_changed and shown.alerts == state.alerts and shown.now == 101.0
    assert shown.new_alerts[0].action == FixAction.uninstall("venv/bin/python", "torchao")
    # the same reading again, and the next poll, raise it no second time
    assert state.read_environments(ENVS, 102.0) is None
    assert "torchao_beside_peft" not in _codes(polled(state, 103.0).new_alerts)
    assert len(state.active_alerts()) == len({(a.code, a.text) for a in state.active_alerts()})


def test_a_read_beside_the_poll_leaves_the_other_detectors_findings_standing() -> None:
    state = ConsoleState(_cfg())
    first = polled(state)
    standing = {a.code for a in first.new_alerts}
    assert {"shared_writer", "gpu_ecc"} <= standing
    state.read_environments(ENVS, 101.0)  # only the environments' detector ran
    again = polled(state, 102.0)
    assert not set(_codes(again.new_alerts)) & standing  # none of the first poll's raised twice
    assert {"shared_writer", "gpu_ecc"} <= {a.code for a in state.active_alerts()}


def test_environments_read_before_any_poll_wait_for_the_first_poll_which_shows_every_alert() -> None:
    state = ConsoleState(_cfg())
    assert state.read_environments(ENVS, 50.0) is None
    assert state.raise_alert(run_error(50.0, "fire failed", "train", None), 50.0) is None
    first = polled(state)
    assert "torchao_beside_peft" in _codes(first.new_alerts)
    assert first.alerts_changed and "fire failed" in [a.text for a in first.alerts]


def test_an_eval_runs_items_are_judged_at_once_unless_a_newer_run_came_meanwhile() -> None:
    state = ConsoleState(_cfg())
    first = polled(state)
    run = state.eval_to_check(first.evals)
    assert run is not None
    shown = state.read_eval_items(run, check_eval(SPLIT), 101.0)
    assert shown is not None and {"fake_zero", "truncation", "empty_content"} <= set(_codes(shown.new_alerts))
    assert all(a.text.startswith("eval split: ") for a in shown.new_alerts)
    # a result for a run that is no longer the newest is stale: nothing raised, nothing shown
    state2 = ConsoleState(_cfg())
    first2 = polled(state2)
    old = state2.eval_to_check(first2.evals)
    assert old is not None
    state2.eval_checked = (replace(old, mtime=old.mtime + 1), None)  # a newer run was taken meanwhile
    assert state2.read_eval_items(old, check_eval(SPLIT), 101.0) is None
    assert "fake_zero" not in _codes(state2.active_alerts())


async def test_a_read_beside_the_poll_appends_nothing_of_the_last_poll_again(
        recorded_console: ReplayConsole, recorded_box: ReplayTransport) -> None:
    recorded_console.state.show_stage_log("train")
    recorded_box.write_log(TRAIN_LOG, "=== samai chain train: pid 4242 started\n" + STEPS)
    update = await recorded_console.poll()
    assert update.log_lines and update.new_points and update.log_source is recorded_console.state.shown
    shown = recorded_console.state.raise_alert(run_error(update.now + 1, "merge failed: exit 1", "merge", None),
                                               update.now + 1)
    assert shown is not None
    assert not shown.log_lines and shown.log_source is None and not shown.new_points
    assert not shown.curve_reset and shown.log_restarted is None and shown.log_notice is None
    assert shown.alerts[0].text == "merge failed: exit 1" and shown.stages == update.stages
    assert shown.budget == update.budget and shown.processes == update.processes


def test_a_rank_that_died_is_raised_once_and_resolved_when_the_run_ended_on_every_node() -> None:
    state = ConsoleState(_cfg())
    polled(state)
    died = Finding("rank_died", "error", "rank 1 on node b died (exit 1) while 1 rank runs",
                   FixAction.stop("train"))
    shown = state.read_nodes([died], [], 101.0)
    assert shown is not None and _codes(shown.new_alerts) == ["rank_died"]
    assert shown.new_alerts[0].hint == "x stop all"
    assert state.read_nodes([died], [], 102.0) is None  # the same reading: nothing new to show
    ended = state.read_nodes([], ["train"], 103.0)
    assert ended is not None and not ended.new_alerts and ended.alerts_changed
    assert not state.active_alerts() or "rank_died" not in _codes(state.active_alerts())
    assert state.read_nodes([], ["train"], 104.0) is None  # resolved already
