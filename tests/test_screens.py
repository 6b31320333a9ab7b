"""Snapshot tests: the main screen and the dialogs at a fixed size, from a recorded box."""

from __future__ import annotations

from pathlib import Path

from samai.console import replay
from samai.console.app import SamaiApp
from samai.console.core.actions import FirePlan, kill_plans
from samai.console.core.preflight import preflight
from samai.console.screens.dialogs import ConfirmDialog, KillDialog
from tests.helpers import pilot_until

RECORDING = replay.load(Path(__file__).parent / "data" / "recorded_box.json")
NOW = RECORDING["probe"]["time"]
SIZE = (150, 48)


def _app(theme: str = "samai-dark") -> SamaiApp:
    return SamaiApp(replay.recorded_config(RECORDING), poll=False, clock=lambda: NOW, theme=theme)


async def _replay(pilot) -> None:
    await pilot_until(pilot, lambda: pilot.app.screen is pilot.app.box_screen)  # pushed
    await pilot.pause()  # and its panes mounted
    replay.show(pilot.app, RECORDING)
    await pilot.pause()


def test_main_screen(snap_compare) -> None:
    assert snap_compare(_app(), terminal_size=SIZE, run_before=_replay)


def test_main_screen_light_theme(snap_compare) -> None:
    assert snap_compare(_app("samai-light"), terminal_size=SIZE, run_before=_replay)


def test_fire_dialog(snap_compare) -> None:
    async def run_before(pilot) -> None:
        await _replay(pilot)
        app = pilot.app
        stage = app.config.stage("merge")
        plan = FirePlan("local", "stage merge", stage.command, (f"log {stage.log}",))
        pre = preflight(app.config, app.state.snapshot, stage)
        app.push_screen(ConfirmDialog(plan, pre.checks))
        await pilot.pause()

    assert snap_compare(_app(), terminal_size=SIZE, run_before=run_before)


def test_kill_dialog(snap_compare) -> None:
    async def run_before(pilot) -> None:
        await _replay(pilot)
        snap = pilot.app.state.snapshot
        proc = snap.process(4242)
        pilot.app.push_screen(KillDialog(proc, kill_plans("local", snap, proc.pid, proc.start_time, snap.boot, 5.0)))
        await pilot.pause()

    assert snap_compare(_app(), terminal_size=SIZE, run_before=run_before)
