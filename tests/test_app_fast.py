"""The box screen over the recorded box (tests/replay_transport.py): the panes as a poll fills
them and as the box changes, in a fraction of a second, with no process started."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from samai.console.app import SamaiApp
from samai.console.core import config
from samai.remote.boxapi import Box
from samai.widgets.alerts import AlertsPane
from samai.widgets.processes import ProcessPane
from samai.widgets.stages import StagesBar
from tests.helpers import pilot_until, polls_after
from tests.replay_transport import ReplayTransport

SIZE = (150, 48)


@pytest.fixture
def app(recorded_box: ReplayTransport) -> SamaiApp:
    """The console on the recorded box, polled every 50 ms by its own poll loop, as a live box."""
    cfg = replace(config.load_builtin("tiny"), workspace=recorded_box.workspace)
    cfg = replace(cfg, target=replace(cfg.target, poll_interval=0.05))
    recorded_box.clock = time.time
    return SamaiApp(cfg, open_box=lambda _cfg: Box(recorded_box, recorded_box.workspace))


def _plain(widget) -> str:
    return str(widget.render())


async def test_the_panes_show_the_recorded_box_and_a_stale_server_alert_resolves_when_it_is_gone(
        app: SamaiApp, recorded_box: ReplayTransport) -> None:
    async with app.run_test(size=SIZE) as pilot:
        alerts = app.box_screen.query_one(AlertsPane)
        await pilot_until(pilot, lambda: "port 18080 (stage serve) is held by pid 5100" in _plain(alerts))
        assert "train ● running" in _plain(app.box_screen.query_one(StagesBar))
        rows = {key.split(":")[0] for key, _ in app.box_screen.query_one(ProcessPane).table.rows}
        assert {"4242", "4250", "5100"} <= rows and "9999" not in rows  # the probe itself is left out
        assert "hidden_nan" in {a.code for a in app.state.active_alerts()}  # the train log's NaN step

        recorded_box.remove("processes", pid=5100)  # someone stopped the old llama-server
        recorded_box.remove("listeners", pid=5100)
        await pilot_until(pilot, lambda: not [a for a in app.state.active_alerts() if a.code == "stale_server"])
        await pilot_until(pilot, lambda: "(resolved " in _plain(alerts))
        await polls_after(pilot, 2)
        assert "5100" not in {key.split(":")[0] for key, _ in app.box_screen.query_one(ProcessPane).table.rows}
        # Nothing ran on the box but the probe and the read-only listing of the running run's checkpoints.
        assert app.connection.state == "connected" and {m for m, _ in recorded_box.runs} <= {"checkpoints", "watchers"}


async def test_the_box_going_quiet_is_one_alert_naming_its_box_once(recorded_box: ReplayTransport) -> None:
    """The outage alert reaches the alerts pane through the panes' protocol, as a poll's alerts do,
    and with [boxes] it says whose box it is once (the pane names it; the screen adds nothing)."""
    from samai.console.core.config import BoxSpec

    cfg = replace(config.load_builtin("tiny"), workspace=recorded_box.workspace)
    cfg = replace(cfg, target=replace(cfg.target, poll_interval=0.05))
    cfg = replace(cfg, boxes=(BoxSpec("gpu1", cfg.target, recorded_box.workspace),))
    recorded_box.clock = time.time
    app = SamaiApp(cfg, box="gpu1", open_box=lambda _cfg: Box(recorded_box, recorded_box.workspace))
    async with app.run_test(size=SIZE) as pilot:
        alerts = app.box_screen.query_one(AlertsPane)
        await pilot_until(pilot, lambda: "gpu1: port 18080" in _plain(alerts))
        recorded_box.down = "connection lost"
        await pilot_until(pilot, lambda: "box not answering" in _plain(alerts))
        shown = _plain(alerts)
        assert "gpu1: box not answering: " in shown and "gpu1: gpu1:" not in shown
        assert app.connection.state == "lost"
        recorded_box.down = None
        await pilot_until(pilot, lambda: app.connection.state == "connected")
        await pilot_until(pilot, lambda: "(resolved " in _plain(alerts) and "box not answering" in _plain(alerts))


async def test_an_idle_status_line_holds_still_from_poll_to_poll(app: SamaiApp) -> None:
    """The round trip is said at most every RTT_EVERY_S and the snapshot's age only once it is
    late: a line that changed at each poll would be repainted each second by an idle console."""
    from samai.console.screens.box import LATE_POLLS, RTT_EVERY_S

    async with app.run_test(size=SIZE) as pilot:
        bar = app.box_screen.status_bar
        await pilot_until(pilot, lambda: " rtt " in _plain(bar))
        started, said, rtts = time.monotonic(), {_plain(bar)}, set()
        for _ in range(20):
            await polls_after(pilot, 1)
            said.add(_plain(bar))
            rtts.add(app.state.snapshot.rtt)
        assert len(rtts) > 1 and len(said) <= 1 + (time.monotonic() - started) // RTT_EVERY_S, said
        assert not [line for line in said if " old" in line]

        app.workers.cancel_group(app.box_screen, "poll")  # the box stops answering
        await pilot_until(pilot, lambda: " old" in _plain(bar), timeout=LATE_POLLS * 0.05 + 5)
