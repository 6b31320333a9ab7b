"""What the feeds read beside the poll is folded into the state (ConsoleState.fold_read), each
read returning the StateUpdate the panes are handed: the training environments, an eval run's
items, a reading of the multi-node runs; and a failed fire, the box gone quiet. Judged at once,
shown once, nothing of the last poll appended twice. Fast: snapshots built here, no process started."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

from samai.console.core import config
from samai.console.core.alertbook import run_error
from samai.console.core.evals.check import check_eval
from samai.console.core.evals.feed import EvalsFeed
from samai.console.core.feeds import Feed, Surroundings
from samai.console.core.feeds.environments import EnvironmentsFeed
from samai.console.core.feeds.nodes import NodesFeed
from samai.console.core.fixes import FixAction
from samai.console.core.problems import Finding
from samai.console.core.state import ConsoleState
from samai.console.core.training.feed import TrainingView
from samai.console.core.update import StateUpdate
from tests.replay_transport import ReplayConsole, ReplayTransport, log_lines, new_points
from tests.test_detector_registry import CONFIG, ENVS, SPLIT, box_snapshot

TRAIN_LOG = "logs/train.log"
STEPS = "".join(f"{{'loss': {2.3 - i / 10:.4f}, 'grad_norm': 1.5, 'learning_rate': 0.0002, 'epoch': {i / 10}}}\n"
                for i in range(1, 4))


def polled(state: ConsoleState, now: float = 100.0, connected: bool = False):
    snap = box_snapshot()
    return state.apply(snap, [], now, connected=connected)


def read_beside(state: ConsoleState, kind: type[Feed], reading: object, now: float) -> StateUpdate | None:
    """The feed's one read due now, answered with `reading`, folded in (None: nothing to show)."""
    feed = state.feed(kind)
    assert feed is not None
    (read,) = feed.reads(now)
    return state.fold_read(feed, read, reading, now)


class Nodes:
    """The app's connections to the nodes, as the nodes feed reads them once it has a reading."""

    def __init__(self, cfg: config.Config) -> None:
        self.config, self.curve = cfg, SimpleNamespace(version=None, points=[])

    def marks(self) -> str:
        return ""


def with_nodes(cfg: config.Config) -> ConsoleState:
    state = ConsoleState(cfg, around=Surroundings(nodes=lambda: Nodes(cfg)))  # type: ignore[arg-type,return-value]
    nodes = state.feed(NodesFeed)
    assert nodes is not None
    nodes.enabled = True  # (its config has no multi-node stage: the reading is handed in here)
    return state


def _codes(alerts) -> list[str]:
    return [a.code for a in alerts]


def _cfg() -> config.Config:
    return config.parse(CONFIG, "(test)")


def test_environments_read_after_a_poll_are_judged_at_once_and_shown_once() -> None:
    state = ConsoleState(_cfg())
    first = polled(state, connected=True)
    assert "torchao_beside_peft" not in _codes(first.new_alerts)  # not read yet
    shown = read_beside(state, EnvironmentsFeed, ENVS, 101.0)
    assert shown is not None and _codes(shown.new_alerts) == ["torchao_beside_peft"]
    assert shown.alerts_changed and shown.alerts == state.alerts and shown.now == 101.0
    assert shown.new_alerts[0].action == FixAction.uninstall("venv/bin/python", "torchao")
    # the same reading again (read again after an uninstall), and the next poll, raise it no second time
    environments = state.feed(EnvironmentsFeed)
    assert environments is not None
    environments.refresh()
    assert read_beside(state, EnvironmentsFeed, ENVS, 102.0) is None
    assert "torchao_beside_peft" not in _codes(polled(state, 103.0).new_alerts)
    assert len(state.active_alerts()) == len({(a.code, a.text) for a in state.active_alerts()})


def test_a_read_beside_the_poll_leaves_the_other_detectors_findings_standing() -> None:
    state = ConsoleState(_cfg())
    first = polled(state, connected=True)
    standing = {a.code for a in first.new_alerts}
    assert {"shared_writer", "gpu_ecc"} <= standing
    read_beside(state, EnvironmentsFeed, ENVS, 101.0)  # only the environments' detector ran
    again = polled(state, 102.0)
    assert not set(_codes(again.new_alerts)) & standing  # none of the first poll's raised twice
    assert {"shared_writer", "gpu_ecc"} <= {a.code for a in state.active_alerts()}


def test_an_alert_raised_before_any_poll_waits_for_the_first_poll_which_shows_every_alert() -> None:
    state = ConsoleState(_cfg())
    assert state.feed(EnvironmentsFeed).reads(50.0) == []  # type: ignore[union-attr]  # due at a connect
    assert state.raise_alert(run_error(50.0, "fire failed", "train", None), 50.0) is None
    first = polled(state, connected=True)
    assert first.alerts_changed and "fire failed" in [a.text for a in first.alerts]
    shown = read_beside(state, EnvironmentsFeed, ENVS, 101.0)
    assert shown is not None and "torchao_beside_peft" in _codes(shown.new_alerts)


def test_an_eval_runs_items_are_judged_at_once_unless_a_newer_run_came_meanwhile() -> None:
    state = ConsoleState(_cfg())
    polled(state)
    shown = read_beside(state, EvalsFeed, check_eval(SPLIT), 101.0)
    assert shown is not None and {"fake_zero", "truncation", "empty_content"} <= set(_codes(shown.new_alerts))
    assert all(a.text.startswith("eval split: ") for a in shown.new_alerts)
    assert state.feed(EvalsFeed).reads(102.0) == []  # type: ignore[union-attr]  # checked once
    # a result for a run that is no longer the newest is stale: nothing raised
    state2 = ConsoleState(_cfg())
    polled(state2)
    evals = state2.feed(EvalsFeed)
    assert evals is not None
    (read,) = evals.reads(101.0)
    assert evals.checked is not None
    evals.checked = (replace(evals.checked[0], mtime=evals.checked[0].mtime + 1), None)  # a newer run meanwhile
    state2.fold_read(evals, read, check_eval(SPLIT), 101.0)
    assert "fake_zero" not in _codes(state2.active_alerts())


async def test_a_read_beside_the_poll_appends_nothing_of_the_last_poll_again(
        recorded_console: ReplayConsole, recorded_box: ReplayTransport) -> None:
    recorded_console.cursor.show_stage_log("train")
    recorded_box.write_log(TRAIN_LOG, "=== samai chain train: pid 4242 started\n" + STEPS)
    update = await recorded_console.poll()
    assert log_lines(update) and new_points(update) and update.log.source is recorded_console.cursor.follower
    shown = recorded_console.state.raise_alert(run_error(update.now + 1, "merge failed: exit 1", "merge", None),
                                               update.now + 1)
    assert shown is not None and shown.beside
    assert shown.log is None and not new_points(shown) and shown.view(TrainingView) is None
    assert shown.alerts[0].text == "merge failed: exit 1" and shown.stages == update.stages
    assert shown.budget == update.budget and shown.processes == update.processes


def test_a_rank_that_died_is_raised_once_and_resolved_when_the_run_ended_on_every_node() -> None:
    state = with_nodes(_cfg())
    polled(state)
    died = Finding("rank_died", "error", "rank 1 on node b died (exit 1) while 1 rank runs",
                   FixAction.stop("train"))
    shown = read_beside(state, NodesFeed, ([died], []), 101.0)
    assert shown is not None and _codes(shown.new_alerts) == ["rank_died"]
    assert shown.new_alerts[0].hint == "x stop all"
    again = read_beside(state, NodesFeed, ([died], []), 102.0)  # the same reading: nothing new raised
    assert again is None or not again.new_alerts
    ended = read_beside(state, NodesFeed, ([], ["train"]), 103.0)
    assert ended is not None and not ended.new_alerts and ended.alerts_changed
    assert "rank_died" not in _codes(state.active_alerts())
    resolved = read_beside(state, NodesFeed, ([], ["train"]), 104.0)  # resolved already
    assert resolved is None or not resolved.new_alerts
