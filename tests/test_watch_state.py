"""A run's end as the state raises it for the watcher and the TUI alike, over the recorded box
(tests/replay_transport.py): a run is new when its fired_at was not seen at the last poll, so a
run fired and over between two polls (whoever fired it, however fast it died) is an ended run,
told once, with its own last words; a console started after a run ended shows its death once,
standing, with its fix (the watcher sends it unless the ledger it trusts says it was sent)."""

from __future__ import annotations

from samai.console.core.alertbook import FIRE_FAILED, RUN_ENDED, run_error
from tests.replay_transport import ReplayConsole, ReplayTransport

TRAIN_LOG = "logs/train.log"
REFUSED = "TRAIN_REFUSED poison files from an earlier run in runs/train; clear them first\n"


def _fired_and_over(box: ReplayTransport, rc: int, log: str) -> float:
    """A new train run fired, its log written and the run over, all between two polls."""
    now = box.advance(30)
    box.remove("processes", pgid=4242)
    box.write_log(TRAIN_LOG, log)  # the fire rotates the log: the new run's file starts empty
    box.set_state("train", pid=4400, pgid=4400, start_time=now, fired_at=now, alive=False, rc=rc, group=())
    return now


def _ended(update) -> list:
    return [a for a in update.new_alerts if a.code == RUN_ENDED and a.stage == "train"]


async def test_a_run_fired_and_dead_between_two_polls_is_one_ended_alert_with_its_last_words(
        recorded_console: ReplayConsole, recorded_box: ReplayTransport) -> None:
    await recorded_console.poll()
    fired = _fired_and_over(recorded_box, 2, REFUSED)
    first = await recorded_console.poll()  # the new run's log is not read by this poll's snapshot
    assert not _ended(first)
    assert next(s for s in first.stages if s.name == "train").status == "failed"
    second = await recorded_console.poll()
    [ended] = _ended(second)
    assert ended.run == fired and ended.text.startswith("stage train failed rc=2: TRAIN_REFUSED poison files")
    [line] = [a for a in second.new_alerts if a.stage == "train" and a.code == ""]
    assert line.run == fired  # its marker line: the same run's, raised with it (the watcher folds it in)
    for _ in range(3):
        assert not _ended(await recorded_console.poll())


async def test_two_fast_deaths_in_a_row_are_two_ended_alerts(recorded_console: ReplayConsole,
                                                             recorded_box: ReplayTransport) -> None:
    await recorded_console.poll()
    runs = []
    for rc in (3, 4):
        runs.append(_fired_and_over(recorded_box, rc, f"crashed {rc}\n"))
        await recorded_console.poll()
        await recorded_console.poll()
    ended = [a for a in recorded_console.state.alerts if a.code == RUN_ENDED]
    assert sorted(a.run for a in ended) == runs
    assert sorted(a.text for a in ended) == ["stage train failed rc=3", "stage train failed rc=4"]


async def test_a_console_started_after_the_run_ended_shows_its_death_once_with_its_fix(
        recorded_console: ReplayConsole, recorded_box: ReplayTransport) -> None:
    fired = _fired_and_over(recorded_box, 2, REFUSED)
    [ended] = _ended(await recorded_console.poll())
    assert ended.run == fired and ended.text.startswith("stage train failed rc=2: TRAIN_REFUSED poison files")
    assert ended.action is not None and ended.action.kind == "resume"  # x: from its newest whole checkpoint
    for _ in range(3):
        assert not _ended(await recorded_console.poll())
    assert [a.run for a in recorded_console.state.active_alerts() if a.code == RUN_ENDED] == [fired]


async def test_a_fast_death_the_fire_said_is_one_alert_whichever_comes_first(
        recorded_console: ReplayConsole, recorded_box: ReplayTransport) -> None:
    """The TUI's rule stays: a fire that failed within its verify window is said by the fire, and
    the poll's alert of that run's end is the same alert, before or after it."""
    state = recorded_console.state
    await recorded_console.poll()
    fired = _fired_and_over(recorded_box, 2, "boom\n")
    said = run_error(recorded_box.probe["time"], "stage train failed: chain exited with rc=2 · boom", "train",
                     fired, FIRE_FAILED)
    state.raise_alert(said, recorded_box.probe["time"])  # the fire's, first
    for _ in range(3):
        assert not _ended(await recorded_console.poll())
    assert [a.code for a in state.active_alerts() if a.code in (RUN_ENDED, FIRE_FAILED)] == [FIRE_FAILED]
    fired = _fired_and_over(recorded_box, 3, "boom again\n")
    for _ in range(2):
        await recorded_console.poll()  # the poll's, first
    assert [a.run for a in state.active_alerts() if a.code == RUN_ENDED] == [fired]
    state.raise_alert(run_error(recorded_box.probe["time"], "stage train failed: rc=3", "train", fired, FIRE_FAILED),
                      recorded_box.probe["time"])
    assert [a.code for a in state.active_alerts() if a.code in (RUN_ENDED, FIRE_FAILED)] == [FIRE_FAILED]
