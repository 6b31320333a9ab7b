"""See it coming (issue 31, part 3): the workspace's fill rate over the last polls, the time until
full at that rate in the disk pane, and an alert while a running stage would fill it soon; a
running stage's memory growing towards its cgroup's limit or the box's RAM, likewise. Fast:
snapshots built here, the state polled as the app polls it; the probe's own memory reading once."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from textual.app import App, ComposeResult

from samai.console.core import config
from samai.console.core.disk.feed import DiskView
from samai.console.core.disk.trends import ALERT_S, DiskWatch
from samai.console.core.feeds.memory import MemoryFeed
from samai.console.core.state import ConsoleState
from samai.widgets.disk import DiskPane
from tests import factories

GB, MB = 10**9, 10**6
CFG = '[workspace]\npath = "/ws"\n[stages.train]\nkey = "t"\ncommand = "sleep 1"\n'


def at(t: float, used: int, total: int = 100 * GB, running: bool = True):
    proc = factories.process(4242)
    states = [factories.running(proc, "train")] if running else []
    disk = factories.disk(free=total - used, total=total, used=used)
    return factories.snapshot(processes=[proc], states=states, disks=[disk], time=factories.NOW + t)


def test_the_rate_and_the_time_until_full_over_the_window() -> None:
    watch = DiskWatch()
    assert watch.observe(at(0, 40 * GB)) is None  # one reading: no rate yet
    assert watch.observe(at(5, 40 * GB + 500 * MB)) is None  # nor over five seconds
    trend = watch.observe(at(30, 43 * GB))
    assert trend is not None and round(trend.rate) == 100 * MB and trend.free == 57 * GB
    assert round(trend.full_in or 0) == 570 and trend.text == "filling 100.0 MB/s · full in 9m30s"
    assert watch.observe(at(30, 43 * GB)) == trend  # the same poll again (a replay): no new reading
    steady = DiskWatch()
    for t in range(0, 60, 10):
        got = steady.observe(at(t, 40 * GB + t * 1000))  # a few KB a second: breathing, not filling
    assert got is not None and got.full_in is None and got.rate == 0.0


def test_a_running_stage_that_would_fill_the_disk_soon_is_one_alert_until_it_slows() -> None:
    state = ConsoleState(config.parse(CFG, "(test)"))
    used = 40 * GB
    codes = []
    for t in range(0, 100, 10):  # 100 MB/s, about 55 GB free: full in about nine minutes
        used += 1 * GB
        update = state.apply(at(t, used), [], factories.NOW + t)
        codes += [a.code for a in update.new_alerts if a.code == "disk_filling"]
    assert codes == ["disk_filling"]  # raised once, standing while it holds
    [alert] = [a for a in state.active_alerts() if a.code == "disk_filling"]
    assert alert.severity == "warning" and "while train runs to be full within 15m00s" in alert.text
    trend = update.view(DiskView).trend
    assert round(trend.rate) == 100 * MB and "filling 100.0 MB/s" in trend.text
    for t in range(100, 200, 10):  # faster: full within five minutes, said again as an error
        used += 3 * GB
        state.apply(at(t, used), [], factories.NOW + t)
    assert [a.severity for a in state.active_alerts() if a.code == "disk_filling"] == ["error"]
    for t in range(200, 360, 10):  # it stops writing: the rate falls over the window, the alert resolves
        state.apply(at(t, used), [], factories.NOW + t)
    assert not [a for a in state.active_alerts() if a.code == "disk_filling"]


def test_no_alert_while_nothing_runs_whatever_the_rate() -> None:
    state = ConsoleState(config.parse(CFG, "(test)"))
    for t in range(0, 60, 10):
        update = state.apply(at(t, 40 * GB + t * GB, running=False), [], factories.NOW + t)
    trend = update.view(DiskView).trend
    assert trend is not None and trend.full_in is not None
    assert not [a for a in state.alerts if a.code == "disk_filling"]


class _Pane(App):
    def compose(self) -> ComposeResult:
        yield DiskPane()


async def test_the_disk_pane_shows_the_trend() -> None:
    state = ConsoleState(config.parse(CFG, "(test)"))
    for t in (0, 20, 40):
        update = state.apply(at(t, 40 * GB + t * 2 * GB), [], factories.NOW + t)
    app = _Pane()
    async with app.run_test(size=(80, 20)) as pilot:
        pane = app.query_one(DiskPane)
        pane.show_update(update)
        await pilot.pause()
        shown = str(pane.render())
        assert "trend: filling 2.0 GB/s · full in" in shown


@settings(max_examples=200, deadline=None, database=None)
@given(st.lists(st.tuples(st.floats(-1e6, 1e6), st.integers(0, 10**15), st.integers(0, 10**15)), max_size=12))
def test_any_readings_give_a_trend_or_none_never_a_crash(readings) -> None:
    watch = DiskWatch()
    for t, used, free in readings:
        disk = factories.disk(free=free, total=used + free, used=used)
        trend = watch.observe(factories.snapshot(disks=[disk], time=factories.NOW + t))
        assert trend is None or (trend.full_in is None or trend.full_in >= 0) and trend.text
    assert ALERT_S > 0


def test_a_stage_whose_memory_would_reach_its_cgroup_limit_soon_is_an_alert_until_it_levels() -> None:
    from samai.remote.model import Memory

    state = ConsoleState(config.parse(CFG, "(test)"))
    mem = Memory(total=32 * GB, available=20 * GB, cgroup="/train", limit=8 * GB)

    def poll(t: float, rss: int):
        proc = factories.process(4242, rss=rss)
        snap = factories.snapshot(processes=[proc], states=[factories.running(proc, "train")], memory=mem,
                                  time=factories.NOW + t)
        return state.apply(snap, [], factories.NOW + t)

    for t in range(0, 60, 10):  # 20 MB/s from 6 GB: the 8 GB limit in under two minutes
        poll(t, 6 * GB + t * 20 * MB)
    [alert] = [a for a in state.active_alerts() if a.code == "memory_filling"]
    assert "stage train's memory grows fast enough to reach its memory cgroup's limit (/train) (8.0 GB)" in alert.text
    trends = state.feed(MemoryFeed).trends
    assert [t.stage for t in trends] == ["train"] and trends[0].full_in < 120
    for t in range(60, 260, 10):  # it levels off: resolved
        poll(t, 6 * GB + 60 * 20 * MB)
    assert not [a for a in state.active_alerts() if a.code == "memory_filling"]
    assert Memory(total=32 * GB, limit=2**63).ceiling == 32 * GB and Memory(total=16 * GB).ceiling == 16 * GB


async def test_the_probe_reads_the_boxs_memory_and_its_limit(box) -> None:
    snap = await box.snapshot()
    assert snap.memory.total > 0 and 0 < snap.memory.available <= snap.memory.total
    assert snap.memory.ceiling > 0
