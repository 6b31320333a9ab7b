"""What the screen says is current and right (issue 14, items 3-6 and 8): real fires through the
local Box and the real TUI (Pilot), each test asserting what the operator sees."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

import psutil
import pytest

from samai.console.app import SamaiApp
from samai.console.core import config
from samai.console.core.actions import operator
from samai.console.screens.dialogs import ConfirmDialog
from samai.widgets.curves import CurvesPane
from samai.widgets.logview import LogView
from tests.helpers import collect_toasts, confirm_dialog, pilot_until, polls_after, run_cli

pytestmark = pytest.mark.slow  # every test here takes seconds: real processes, sockets or an app, waited on

SIZE = (140, 45)

HEAD = """
pipeline = "run-state"
[target]
poll_interval = 0.2
timeout = 5.0
python = "{python}"
[workspace]
path = "{ws}"
[ui]
tail_lines = 50
"""

STEP = "{{'loss': {loss}, 'grad_norm': 0.5, 'learning_rate': 0.0001, 'epoch': 0.1}}"


def _config(tmp_path: Path, ws: Path, stages: str) -> config.Config:
    f = tmp_path / "run-state.toml"
    f.write_text(HEAD.format(ws=ws, python=sys.executable) + stages)
    return config.load(f)




def _plain(widget) -> str:
    return str(widget.render())


def _bar(app: SamaiApp) -> str:
    return _plain(app.box_screen.query_one("#stages"))


async def _fire_in_tui(pilot, app: SamaiApp, key: str) -> None:
    await pilot_until(pilot, lambda: not app.busy)
    await pilot.press(key)
    await pilot_until(pilot, lambda: isinstance(app.screen, ConfirmDialog) and app.focused)
    await confirm_dialog(pilot)
    await pilot_until(pilot, lambda: not isinstance(app.screen, ConfirmDialog) and not app.busy)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- a new run starts clean


async def test_a_refire_shows_no_old_marker_and_only_the_new_runs_curve(tmp_path, workspace):
    script = workspace / "run.sh"
    script.write_text("".join(f'echo "{STEP.format(loss=loss)}"\n' for loss in (1.0, 1.1, 1.0)) + "echo FIRST_DONE\n")
    app = SamaiApp(_config(tmp_path, workspace, """
[stages.train]
key = "t"
command = "sh run.sh"
markers = [{ name = "FIRST_DONE" }]
"""))
    async with app.run_test(size=SIZE) as pilot:
        await pilot_until(pilot, lambda: app.state.snapshot)
        await _fire_in_tui(pilot, app, "t")
        await pilot_until(pilot, lambda: "done" in _bar(app) and "CHAIN_DONE rc=0" in _bar(app))
        await pilot_until(pilot, lambda: len(app.box_screen.query_one(CurvesPane).points) == 3)
        first = json.loads((workspace / ".samai" / "state" / "train.json").read_text())["fired_at"]

        # The second run: one step far above the first run's losses, then it runs on without a marker.
        script.write_text(f'echo "{STEP.format(loss=500.0)}"\nsleep 30\n')
        await _fire_in_tui(pilot, app, "t")
        await pilot_until(pilot, lambda: app.state.stages.runs.get("train", (first,))[0] != first)
        curve = app.box_screen.query_one(CurvesPane)
        await pilot_until(pilot, lambda: [p.loss for p in curve.points] == [500.0])
        await pilot_until(pilot, lambda: "running" in _bar(app))
        await polls_after(pilot, 3)  # a few polls: nothing of the first run comes back
        bar = _bar(app)
        assert "running" in bar and "CHAIN_DONE" not in bar and "FIRST_DONE" not in bar
        assert [p.loss for p in curve.points] == [500.0]
        shown = "\n".join(app.box_screen.query_one(LogView).lines)  # the log pane starts again with the new run's file
        assert "FIRST_DONE" not in shown and "a new run of train started" in shown and "train.log.1" in shown
        assert not [a.text for a in app.state.alerts if "jump" in a.text or "spike" in a.code]
        previous = app.state.stages.previous["train"]  # the earlier run is kept as history
        assert previous.status == "done" and previous.last_marker.startswith("CHAIN_DONE rc=0")


# ---------------------------------------------------------------- a log pane shows its file only


async def test_the_log_pane_after_start_shows_only_the_file_its_title_names(tmp_path, workspace):
    (workspace / "logs").mkdir()
    (workspace / "logs" / "provision.log").write_text("".join(f"provision line {i}\n" for i in range(20)))
    cfg_stages = """
[stages.provision]
key = "p"
command = "echo provisioning"
[stages.serve]
key = "v"
command = "echo serve line one; echo serve line two; sleep 30"
"""
    cfg = _config(tmp_path, workspace, cfg_stages)
    assert run_cli("--config", str(tmp_path / "run-state.toml"), "fire", "serve", "--yes").returncode == 0
    app = SamaiApp(cfg)
    async with app.run_test(size=SIZE) as pilot:
        log = app.box_screen.query_one(LogView)
        screen = app.box_screen
        await pilot_until(pilot, lambda: screen.shown_stage == "serve" and "serve line two" in "\n".join(log.lines))
        await polls_after(pilot, 2)  # a few more polls
        assert "log · serve" in str(log.border_title)
        lines = "\n".join(log.lines)
        assert "provision line" not in lines and "serve line one" in lines


# ---------------------------------------------------------------- alerts resolve


async def test_an_alert_resolves_when_its_stray_listener_goes_and_x_says_so(tmp_path, workspace, spawn):
    port = _free_port()
    stray = spawn(sys.executable, "-c", f"import socket,time\ns=socket.socket()\ns.bind(('127.0.0.1',{port}))\n"
                  "s.listen()\nprint('up', flush=True)\ntime.sleep(60)", stdout=-1, text=True)
    assert stray.stdout.readline() == "up\n"
    app = SamaiApp(_config(tmp_path, workspace, f"""
[stages.serve]
key = "v"
command = "sleep 30"
ports = [{port}]
"""))
    async with app.run_test(size=SIZE) as pilot:
        notes = collect_toasts(app)
        pane = app.box_screen.query_one("#alerts")
        alert = await pilot_until(pilot, lambda: next((a for a in app.state.alerts if a.code == "stale_server"), None))
        assert alert.active and "1 warning" in str(pane.border_subtitle)

        stray.kill()
        stray.wait(10)
        await pilot_until(pilot, lambda: not app.state.active_alerts())
        resolved = next(a for a in app.state.alerts if a.code == "stale_server")
        assert resolved.resolved_at is not None
        await pilot_until(pilot, lambda: "1 warning" not in str(pane.border_subtitle))
        assert str(pane.border_subtitle) == "no errors or warnings · 1 resolved" and "(resolved " in _plain(pane)

        await pilot.press("x")
        when = time.strftime("%H:%M:%S", time.localtime(resolved.resolved_at))
        await pilot_until(pilot, lambda: any(f"already resolved at {when}" in n for n in notes))
        assert not any("is gone or is another process" in n for n in notes)


# ---------------------------------------------------------------- the right fix


TRAIN_AND_MERGE = """
[artifacts.adapter]
path = "out/final"
[stages.train]
key = "t"
command = "mkdir -p out/final && echo weights > out/final/adapter.bin && touch out/TRAIN_DONE && echo TRAIN_DONE"
makes = ["adapter"]
poison = ["out/final", "out/TRAIN_DONE", "out/TRAIN_NAN"]
markers = [{ name = "TRAIN_DONE" }, { name = "TRAIN_NAN", severity = "error" }]
[stages.merge]
key = "m"
command = "echo merged"
needs = ["adapter"]
"""


async def test_no_poison_alert_after_a_good_train_and_restart_says_in_red_what_it_deletes(tmp_path, workspace):
    app = SamaiApp(_config(tmp_path, workspace, TRAIN_AND_MERGE))
    async with app.run_test(size=SIZE) as pilot:
        await pilot_until(pilot, lambda: app.state.snapshot)
        await _fire_in_tui(pilot, app, "t")
        await pilot_until(pilot, lambda: "✓ done" in _bar(app))

        def sized() -> bool:  # the poison paths measured since the run ended: a detector could see them
            found = {a.name: a for a in app.state.snapshot.artifacts}
            return all(found.get(f"poison:train:{p}") and found[f"poison:train:{p}"].exists
                       for p in ("out/final", "out/TRAIN_DONE"))

        await pilot_until(pilot, sized)
        await polls_after(pilot, 2)
        assert not [a for a in app.state.alerts if a.code == "poison_files"]
        assert "earlier run" not in _plain(app.box_screen.query_one("#alerts"))

        await pilot.press("r")  # restart train: its preflight clears final/, which merge needs
        dialog = await pilot_until(pilot, lambda: isinstance(app.screen, ConfirmDialog) and app.focused and app.screen)
        checks = [c for c in dialog.checks if c.severity == "error"]
        assert any("out/final" in c.text and "adapter" in c.text and "merge" in c.text for c in checks)
        shown = " ".join(_plain(w) for w in dialog.query("Static"))
        assert "✗ deletes out/final" in shown
        assert "anyway" in str(dialog.query_one("#confirm").label)
        await pilot.press("escape")
        await pilot_until(pilot, lambda: not isinstance(app.screen, ConfirmDialog) and not app.busy)
    assert (workspace / "out" / "final" / "adapter.bin").exists()


# ---------------------------------------------------------------- stopped, and died


async def test_a_stopped_stage_shows_stopped_by_the_operator(tmp_path, workspace):
    app = SamaiApp(_config(tmp_path, workspace, """
[stages.serve]
key = "v"
command = "echo serving; sleep 30"
"""))
    async with app.run_test(size=SIZE) as pilot:
        await pilot_until(pilot, lambda: app.state.snapshot)
        await _fire_in_tui(pilot, app, "v")
        await pilot_until(pilot, lambda: "running" in _bar(app))
        await pilot.press("s")
        await pilot_until(pilot, lambda: isinstance(app.screen, ConfirmDialog) and app.focused)
        await confirm_dialog(pilot)
        await pilot_until(pilot, lambda: "stopped by the operator" in _bar(app))
        await polls_after(pilot, 2)
        bar = _bar(app)
        assert "stopped by the operator" in bar and "failed" not in bar and "rc=143" not in bar
        assert not [a for a in app.state.alerts if a.severity == "error"]
        by = operator("stop")  # this console's user@host: who stopped it, as its cause of death says
        assert any(a.text.startswith(f"stage serve stopped by {by} from the console at ") for a in app.state.alerts)
    snap = run_cli("--config", str(tmp_path / "run-state.toml"), "snapshot", "--json")
    assert snap.returncode == 0 and "stopped" in snap.stdout


SERVER = ("import os,socket,sys,time\ns=socket.socket()\ns.bind(('127.0.0.1',int(sys.argv[1])))\ns.listen()\n"
          "open('server.pid','w').write(str(os.getpid()))\nprint('SERVING on', sys.argv[1], flush=True)\n"
          "time.sleep(60)\n")


async def test_a_server_killed_from_outside_is_a_died_alert_and_l_opens_its_log(tmp_path, workspace):
    port = _free_port()
    (workspace / "server.py").write_text(SERVER)
    app = SamaiApp(_config(tmp_path, workspace, f"""
[stages.provision]
key = "p"
command = "echo provisioning"
[stages.serve]
key = "v"
command = "{sys.executable} server.py {port}"
ports = [{port}]
markers = [{{ name = "SERVING" }}]
"""))
    async with app.run_test(size=SIZE) as pilot:
        await pilot_until(pilot, lambda: app.state.snapshot)
        await _fire_in_tui(pilot, app, "v")
        await pilot_until(pilot, lambda: "SERVING" in _bar(app) and "running" in _bar(app))
        pid = int((workspace / "server.pid").read_text())
        os.kill(pid, signal.SIGKILL)  # the OOM killer's way
        await pilot_until(pilot, lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie")
        died = await pilot_until(pilot, lambda: next((a for a in app.state.alerts if "died" in a.text), None))
        assert died.text.startswith("stage serve: pid ") and "died (rc=137): signal: killed by SIGKILL" in died.text
        assert " · SERVING on" in died.text  # and its last words
        assert died.stage == "serve" and "l log" in died.hint
        assert "died (rc=137)" in _plain(app.box_screen.query_one("#alerts"))

        await pilot.press("l")  # the alert's log: serve's, not the next stage's (provision)
        log = app.box_screen.query_one(LogView)
        assert app.box_screen.shown_stage == "serve" and "log · serve" in str(log.border_title)
        await pilot_until(pilot, lambda: "SERVING on" in "\n".join(log.lines))
        await pilot.press("l")  # after that, `l` goes on to the next stage's log as before
        assert app.box_screen.shown_stage == "provision"
