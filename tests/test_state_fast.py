"""ConsoleState over the recorded box (tests/replay_transport.py): what the panes and the alerts
get from each poll, in milliseconds, with no process started. The box changes between polls
as a real one would: a log grows or rotates, a server goes, the disk fills, a run ends."""

from __future__ import annotations

import os
import time

from samai.console.core.actions import Actions, Decision
from samai.console.core.alertbook import FIRE_FAILED, RUN_ENDED, run_error
from samai.console.core.audit import AuditLog
from samai.console.core.fixes import FixAction
from samai.console.core.runs import UNSEEN_GAP_S
from samai.console.core.training.feed import TrainingView
from samai.remote.transport import TransportError
from tests import factories
from tests.replay_transport import ReplayConsole, ReplayTransport, log_lines, new_points, view

TRAIN_LOG = "logs/train.log"
CLEAN_STEPS = "".join(f"{{'loss': {2.3 - i / 10:.4f}, 'grad_norm': 1.5, 'learning_rate': 0.0002, 'epoch': {i / 10}}}\n"
                      for i in range(1, 4))
NAN_STEP = "{'loss': 0.0, 'grad_norm': nan, 'learning_rate': 0.00018, 'epoch': 0.4}\n"


def _codes(alerts) -> list[str]:
    return [a.code for a in alerts]


async def test_the_recorded_box_is_polled_in_milliseconds_through_one_probe(
        recorded_console: ReplayConsole, recorded_box: ReplayTransport) -> None:
    started = time.perf_counter()
    for _ in range(5):
        update = await recorded_console.poll()
    assert time.perf_counter() - started < 2.0  # a real probe costs a process start per connect and /proc walks
    assert recorded_box.polls == 5 and recorded_box.streams == 1 and not recorded_box.runs
    statuses = {s.name: s.status for s in update.stages}
    assert statuses["provision"] == "done" and statuses["train"] == "running" and statuses["merge"] == "blocked"
    shown = {row.process.pid: row for row in update.processes}
    assert 9999 not in shown and shown[4250].stage == "train" and shown[5100].ports == (18080,)
    assert [a.name for a in update.budget.artifacts][:2] == ["venv", "base"]


async def test_a_nan_appended_to_the_train_log_is_one_error_alert_on_the_next_poll(
        recorded_console: ReplayConsole, recorded_box: ReplayTransport) -> None:
    recorded_box.write_log(TRAIN_LOG, "=== samai chain train: pid 4242 started\n" + CLEAN_STEPS)
    first = await recorded_console.poll()
    assert [p.loss for p in new_points(first)] == [2.2, 2.1, 2.0]
    assert not recorded_console.active(stage="train")
    recorded_box.write_log(TRAIN_LOG, NAN_STEP, append=True)
    second = await recorded_console.poll()
    nan = [a for a in second.new_alerts if a.stage == "train"]
    assert _codes(nan) == ["hidden_nan"] and nan[0].severity == "error" and second.alerts_changed
    assert nan[0].run == recorded_box.probe["states"][2]["fired_at"]  # about this run: a new one resolves it
    assert nan[0].action == FixAction.restart("train") and "grad_norm" in nan[0].text
    third = await recorded_console.poll()  # nothing new in the log: raised once, still standing
    assert not third.new_alerts and _codes(recorded_console.active(stage="train")) == ["hidden_nan"]


async def test_a_new_train_run_resolves_the_last_runs_alerts_and_restarts_the_curve(
        recorded_console: ReplayConsole, recorded_box: ReplayTransport) -> None:
    await recorded_console.poll()
    assert _codes(recorded_console.active(stage="train")) == ["hidden_nan"]  # the recording's NaN step
    recorded_box.write_log(TRAIN_LOG, "=== samai chain train: pid 4300 started\n" + CLEAN_STEPS)
    now = recorded_box.advance(60)
    recorded_box.set_state("train", pid=4300, pgid=4300, start_time=now, fired_at=now, group=(4300,))
    update = await recorded_console.poll()
    assert view(update, TrainingView).reset and not new_points(update)  # its log is read from the next poll on
    assert not recorded_console.active(stage="train") and update.alerts_changed
    assert [p.loss for p in new_points(await recorded_console.poll())] == [2.2, 2.1, 2.0]
    old = next(a for a in recorded_console.state.alerts if a.code == "hidden_nan")
    assert old.resolved_at == now
    train = next(s for s in update.stages if s.name == "train")
    assert train.since == now and train.previous is not None and train.previous.status == "running"


async def test_a_stale_server_is_killed_through_the_action_layer_and_its_alerts_resolve(
        recorded_console: ReplayConsole, recorded_box: ReplayTransport, tmp_path) -> None:
    await recorded_console.poll()
    stale = recorded_console.active("stale_server")
    assert len(stale) == 1 and "pid 5100" in stale[0].text and stale[0].severity == "warning"
    action = stale[0].action
    assert action is not None and action.kind == "kill" and action.pid == 5100
    assert _codes(recorded_console.active("reasoning_split")) == ["reasoning_split"]  # the same llama-server

    async def yes(plan):
        return Decision.confirmed(plan, "test")

    actions = Actions(recorded_console.box, recorded_console.state.config, AuditLog(tmp_path / "audit.jsonl"),
                      readonly=False, confirm=yes)
    outcome = await actions.kill(action.pid, action.start_time)
    assert outcome.ok, outcome
    assert [(m, r["pid"]) for m, r in recorded_box.runs if m == "kill"] == [("kill", 5100)]
    update = await recorded_console.poll()
    assert update.alerts_changed and not update.new_alerts
    assert not recorded_console.active("stale_server") and not recorded_console.active("reasoning_split")
    assert all(a.resolved_at is not None for a in recorded_console.state.alerts if a.code == "stale_server")


async def test_the_disk_reserve_alert_comes_with_a_full_disk_and_resolves_when_space_is_freed(
        recorded_console: ReplayConsole, recorded_box: ReplayTransport) -> None:
    await recorded_console.poll()
    assert not recorded_console.active("disk_reserve")
    disk = recorded_box.probe["disks"][0]
    disk.update(free=100_000_000, used=disk["total"] - 100_000_000)  # 0.1 GB: the tiny pipeline keeps 0.5
    update = await recorded_console.poll()
    full = [a for a in update.new_alerts if a.code == "disk_reserve"]
    assert len(full) == 1 and full[0].severity == "error" and "reserve of 500" in full[0].text
    assert update.budget.free == 100_000_000
    assert not (await recorded_console.poll()).new_alerts  # the same condition: the same alert, not a new one
    disk.update(free=30_000_000_000, used=disk["total"] - 30_000_000_000)
    freed = await recorded_console.poll()
    assert freed.alerts_changed and not recorded_console.active("disk_reserve")


async def test_a_rotated_log_is_said_and_read_on_without_a_line_lost_or_twice(
        recorded_console: ReplayConsole, recorded_box: ReplayTransport) -> None:
    recorded_console.cursor.show_stage_log("train")
    lines = list(log_lines(await recorded_console.poll()))
    assert lines[-1].startswith("step 5/40")
    path = recorded_box.path(TRAIN_LOG)
    with open(path, "a") as f:
        f.write("written before the rotation\n")
    os.rename(path, f"{path}.1")
    recorded_box.write_log(TRAIN_LOG, "the first line of the new file\n")
    notices = []
    for _ in range(4):  # the old file to its end, then (once it stayed there a poll) the new one
        update = await recorded_console.poll()
        lines += log_lines(update)
        notices += [update.log.notice] if update.log and update.log.notice else []
        if "the first line of the new file" in lines:
            break
    assert lines[-2:] == ["written before the rotation", "the first line of the new file"]
    assert len(lines) == len(set(lines))
    assert notices == [f"{path}: rotated (now {path}.1); reading the rest of it first",
                       f"{path}: the old file is read to its end; reading the new one from its start"]


async def test_a_stage_that_fails_is_an_error_quoting_its_last_marker_line(
        recorded_console: ReplayConsole, recorded_box: ReplayTransport) -> None:
    await recorded_console.poll()
    recorded_box.write_log(TRAIN_LOG, "TRAIN_NAN: 5 steps in a row, stopping\n", append=True)
    marker = await recorded_console.poll()
    said = [a for a in marker.new_alerts if a.stage == "train" and a.code == ""]
    assert len(said) == 1 and said[0].text.startswith("train: TRAIN_NAN") and said[0].severity == "error"
    recorded_box.set_state("train", alive=False, rc=1, group=())
    recorded_box.remove("processes", pgid=4242)
    ended = await recorded_console.poll()
    failed = [a for a in ended.new_alerts if a.text.startswith("stage train failed")]
    assert len(failed) == 1 and failed[0].text == "stage train failed rc=1: TRAIN_NAN: 5 steps in a row, stopping"
    assert failed[0].action == FixAction.resume("train")  # a training run keeps checkpoints: resumed, not redone
    assert next(s for s in ended.stages if s.name == "train").status == "failed"


def _fire_failed(state, now: float):
    run = next(s for s in state.snapshot.states if s.stage == "train").fired_at
    return run_error(now, "stage train failed: chain exited with rc=2 · cannot reach it", "train", run, FIRE_FAILED)


def _ends(box: ReplayTransport, **fields) -> None:
    box.set_state("train", **{"alive": False, "rc": 2, "group": (), **fields})
    box.remove("processes", pgid=4242)


async def test_a_fires_failure_replaces_the_polls_alert_of_the_same_runs_end(
        recorded_console: ReplayConsole, recorded_box: ReplayTransport) -> None:
    """A fire whose chain fails within its verify window is said by the fire (with the stage's
    last words) and may be seen ending by a poll first: one failure, one alert."""
    state = recorded_console.state
    await recorded_console.poll()
    _ends(recorded_box, death={"cause": "exit", "detail": "exit status 2: EVAL_RC=2 nothing asked",
                               "evidence": ["EVAL_RC=2 nothing asked"]})
    ended = await recorded_console.poll()
    (said,) = [a for a in ended.new_alerts if a.stage == "train" and a.code == RUN_ENDED]
    assert said.text == "stage train failed rc=2: EVAL_RC=2 nothing asked"  # an exit's words, not "exit: …"
    fired = _fire_failed(state, ended.now)
    assert state.raise_alert(fired, ended.now) is not None
    assert [a for a in state.active_alerts() if a.code in (RUN_ENDED, FIRE_FAILED)] == [fired]


async def test_a_poll_that_sees_a_failed_fires_run_end_adds_no_second_alert(
        recorded_console: ReplayConsole, recorded_box: ReplayTransport) -> None:
    state = recorded_console.state
    first = await recorded_console.poll()
    state.raise_alert(_fire_failed(state, first.now), first.now)
    _ends(recorded_box)
    later = await recorded_console.poll()
    assert not [a for a in later.new_alerts if a.code == RUN_ENDED]
    assert next(s for s in later.stages if s.name == "train").status == "failed"
    assert [a.code for a in state.active_alerts() if a.code in (RUN_ENDED, FIRE_FAILED)] == [FIRE_FAILED]


async def test_a_chain_gone_without_its_rc_is_lost_only_once_two_polls_agree(
        recorded_console: ReplayConsole, recorded_box: ReplayTransport) -> None:
    await recorded_console.poll()
    recorded_box.set_state("train", alive=False, rc=None, group=())
    recorded_box.remove("processes", pgid=4242)
    first = await recorded_console.poll()  # one probe pass may fall between a stop's kill and its rc file
    assert next(s for s in first.stages if s.name == "train").status == "running"
    assert "stage_lost" not in _codes(first.new_alerts)
    second = await recorded_console.poll()
    assert next(s for s in second.stages if s.name == "train").status == "lost"
    lost = [a for a in second.new_alerts if a.code == "stage_lost"]
    assert len(lost) == 1 and lost[0].action == FixAction.restart("train") and "pid 4242" in lost[0].text


async def test_a_refire_caught_halfway_keeps_the_last_runs_end(
        recorded_console: ReplayConsole, recorded_box: ReplayTransport) -> None:
    """A fire removes the last run's rc file a moment before it writes the new run's record: polls
    in between see the ended run without its rc, and must not see it running again (nor lost);
    the new run's 'previous' is how the last one ended."""
    state = recorded_console.state
    await recorded_console.poll()
    _ends(recorded_box, rc=3)
    assert next(s for s in (await recorded_console.poll()).stages if s.name == "train").status == "failed"
    recorded_box.set_state("train", rc=None)  # what the next fire's prepare does before it records the new run
    for _ in range(2):
        recorded_box.advance(1)
        view = next(s for s in (await recorded_console.poll()).stages if s.name == "train")
        assert (view.status, view.rc, view.pid) == ("failed", 3, 4242)
    assert not recorded_console.active("stage_lost")
    now = recorded_box.advance(1)
    recorded_box.set_state("train", pid=4300, pgid=4300, start_time=now, fired_at=now, alive=True, group=(4300,))
    await recorded_console.poll()
    assert state.stages.previous["train"].status == "failed" and state.stages.previous["train"].rc == 3


async def test_a_box_that_stops_answering_is_one_alert_resolved_by_its_next_answer(
        recorded_console: ReplayConsole, recorded_box: ReplayTransport) -> None:
    await recorded_console.poll()
    recorded_box.down = "connection lost"
    try:
        await recorded_console.poll()
        raise AssertionError("a poll of a box that does not answer returned")
    except TransportError as e:
        shown = recorded_console.state.failed_poll(str(e), recorded_box.probe["time"])
    assert shown is not None and shown.alerts_changed and shown.log is None and not new_points(shown)
    [alert] = shown.new_alerts
    assert alert.code == "box_unreachable" and "connection lost" in alert.text and shown.alerts[0] == alert
    assert _codes(recorded_console.active("box_unreachable")) == ["box_unreachable"]
    recorded_box.down = None
    back = await recorded_console.poll()
    assert back.alerts_changed and not recorded_console.active("box_unreachable")
    assert recorded_box.streams == 2  # the probe that failed is never asked again: a new one answers


async def test_a_server_started_by_the_serve_stage_is_no_stale_server(
        recorded_console: ReplayConsole, recorded_box: ReplayTransport) -> None:
    server = recorded_box.probe["processes"][4]
    assert server["pid"] == 5100
    recorded_box.add("states", factories.stage_record("serve", 5100, alive=True, pgid=5100,
                                                      start_time=server["start_time"], fired_at=server["start_time"],
                                                      log=str(recorded_box.path("logs/serve.log"))))
    update = await recorded_console.poll()
    assert "stale_server" not in _codes(update.new_alerts)
    assert "reasoning_split" in _codes(update.new_alerts)  # whoever started it, it splits <think>
    assert next(s for s in update.stages if s.name == "serve").status == "running"


async def test_a_consoles_first_look_shows_the_last_runs_death_whenever_it_died(
        recorded_console: ReplayConsole, recorded_box: ReplayTransport) -> None:
    """Seeded with the box's time of the last watcher's look: a run fired after it and already
    over is news at once; whenever it was fired, a console's first look shows each stage's last
    run that died, standing, with its fix (a console opened after a death knows it; a watcher
    sends it unless the ledger it trusts says it was sent)."""
    fired = recorded_box.probe["states"][2]["fired_at"]
    _ends(recorded_box)
    for looked_at in (fired - 30, fired + 30, fired - UNSEEN_GAP_S - 1, None):
        console = ReplayConsole(recorded_box, recorded_console.state.config)
        console.state.seed_statuses({}, looked_at)
        update = await console.poll()
        said = [a for a in update.new_alerts if a.code == RUN_ENDED and a.stage == "train"]
        assert [a.text for a in said] == ["stage train failed rc=2"], (looked_at, said)
        assert said[0].action == FixAction.resume("train")
        await console.close()
