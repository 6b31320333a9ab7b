"""The TUI through Pilot, against the real local Box and real processes."""

from __future__ import annotations

import json
import os
import signal
import stat
import sys
from pathlib import Path

import psutil
import pytest
from textual.widgets import Button, DataTable

from samai.console import prefs
from samai.console.app import SamaiApp
from samai.console.core import config
from samai.console.core.fixes import FixAction
from samai.console.screens.dialogs import ConfirmDialog, KillDialog
from samai.remote.boxapi import Box
from samai.widgets.logview import LogView
from samai.widgets.processes import ProcessPane
from samai.widgets.status import StatusBar
from tests.helpers import action_layer, collect_toasts, confirm_dialog, pilot_until, polls_after

SIZE = (140, 45)

PIPE = """
pipeline = "pilot"
[target]
poll_interval = 0.2
timeout = {timeout}
python = "{python}"
[workspace]
path = "{ws}"
[stages.hello]
key = "h"
command = "echo hello from the chain; echo STEP_OK; sleep 30"
markers = [{{ name = "STEP_OK" }}, {{ name = "BAD_THING", severity = "error" }}]
[stages.other]
key = "y"
command = "echo other"
[ui]
tail_lines = 50
"""


def _config(tmp_path: Path, ws: Path, python: str = sys.executable, timeout: float = 5.0) -> config.Config:
    f = tmp_path / "pilot.toml"
    f.write_text(PIPE.format(ws=ws, python=python, timeout=timeout))
    return config.load(f)




def _audit(isolated_dirs: Path) -> list[dict]:
    path = isolated_dirs / "xdg_state_home" / "samai" / "audit.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [e for e in lines if e["phase"] == "outcome"]  # each action's last word (its intent precedes it)


def _log_text(app: SamaiApp) -> str:
    return "\n".join(app.box_screen.query_one(LogView).lines)


@pytest.mark.slow
async def test_fire_asks_with_the_exact_command_cancel_first_then_fires(tmp_path, workspace, isolated_dirs):
    app = SamaiApp(_config(tmp_path, workspace))
    async with app.run_test(size=SIZE) as pilot:
        await pilot_until(pilot, lambda: app.state.snapshot)
        await pilot.press("h")
        dialog = await pilot_until(pilot, lambda: isinstance(app.screen, ConfirmDialog) and app.focused and app.screen)
        shown = " ".join(str(w.render()) for w in dialog.query("Static"))
        assert "echo hello from the chain; echo STEP_OK; sleep 30" in shown
        assert app.focused.id == "cancel"
        await pilot.press("enter")  # Enter on an unread dialog cancels
        await pilot_until(pilot, lambda: not isinstance(app.screen, ConfirmDialog))
        assert not (workspace / ".samai" / "state" / "hello.json").exists()

        await pilot.press("h")
        await pilot_until(pilot, lambda: isinstance(app.screen, ConfirmDialog) and app.focused)
        await confirm_dialog(pilot)
        state_file = workspace / ".samai" / "state" / "hello.json"
        await pilot_until(pilot, state_file.exists)
        await pilot_until(pilot, lambda: "hello from the chain" in _log_text(app))
        await pilot_until(pilot, lambda: "STEP_OK" in str(app.box_screen.query_one("#stages").render()))
        pid = json.loads(state_file.read_text())["pid"]
        assert psutil.Process(pid).is_running()
        await pilot_until(pilot, lambda: not app.busy)

        await pilot.press("s")  # stop the stage whose log is shown
        await pilot_until(pilot, lambda: isinstance(app.screen, ConfirmDialog) and app.focused)
        await confirm_dialog(pilot)
        await pilot_until(pilot, lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie")
        await pilot_until(pilot, lambda: not app.busy)
    actions = [(e["action"], e["confirmation"], e["result"]) for e in _audit(isolated_dirs)]
    assert actions == [("fire", "declined", "cancelled"), ("fire", "dialog", "done"), ("stop", "dialog", "done")]


@pytest.mark.slow
async def test_kill_dialog_defaults_to_cancel_and_term_kills(tmp_path, workspace, spawn, isolated_dirs,
                                                             monkeypatch):
    victim = spawn("sleep", "31.25")
    boots = []
    real_kill = Box.kill

    async def kill(self, *args, **kw):  # the real kill, its boot noted
        boots.append(kw.get("boot"))
        return await real_kill(self, *args, **kw)

    monkeypatch.setattr(Box, "kill", kill)
    app = SamaiApp(_config(tmp_path, workspace))
    async with app.run_test(size=SIZE) as pilot:
        await pilot_until(pilot, lambda: app.state.snapshot and app.state.snapshot.process(victim.pid))
        pane = app.box_screen.query_one(ProcessPane)
        pane.table.focus()
        await pilot.press("slash")
        await pilot.press(*"31\\.25", "enter")
        await pilot_until(pilot, lambda: pane.selected() and pane.selected().pid == victim.pid)
        await pilot.press("k")
        dialog = await pilot_until(pilot, lambda: isinstance(app.screen, KillDialog) and app.focused and app.screen)
        assert app.focused.id == "cancel"
        assert str(victim.pid) in str(dialog.query_one(".title").render())
        await pilot.press("enter")
        await pilot_until(pilot, lambda: not isinstance(app.screen, KillDialog))
        await pilot_until(pilot, lambda: _audit(isolated_dirs))  # the cancel's outcome: the action is over
        assert victim.poll() is None and boots == []

        await pilot.press("k")
        await pilot_until(pilot, lambda: isinstance(app.screen, KillDialog))
        app.screen.query_one("#TERM", Button).press()
        await pilot_until(pilot, lambda: victim.poll() is not None)
        await pilot_until(pilot, lambda: not app.busy)
    declined, entry = _audit(isolated_dirs)  # the cancel goes through the action layer too, and is recorded
    assert (declined["action"], declined["confirmation"], declined["result"]) == ("kill", "declined", "cancelled")
    assert (entry["action"], entry["pid"], entry["result"]) == ("kill", victim.pid, "done")
    assert boots == [app.state.snapshot.boot] and boots[0].id  # the start time's boot went with it


@pytest.mark.slow
async def test_readonly_dangerous_keys_do_nothing_and_say_why(tmp_path, workspace, spawn, isolated_dirs):
    victim = spawn("sleep", "32.5")
    app = SamaiApp(_config(tmp_path, workspace), readonly=True)
    said = collect_toasts(app)
    async with app.run_test(size=SIZE) as pilot:
        await pilot_until(pilot, lambda: app.state.snapshot and app.state.snapshot.process(victim.pid))
        enabled = {a.binding.action.split("(")[0] for a in app.active_bindings.values() if a.enabled}
        assert not enabled & {"fire", "kill", "stop", "restart", "clean", "fix"}
        for n, key in enumerate(("h", "k", "s", "r", "c", "x"), 1):
            await pilot.press(key)
            await pilot_until(pilot, lambda n=n: len([t for t in said if t.startswith("read-only: ")]) == n)
            assert not isinstance(app.screen, (ConfirmDialog, KillDialog))
        assert len([t for t in said if t.startswith("read-only: ") and "without --readonly" in t]) == 6, said
        assert "READ-ONLY" in str(app.box_screen.query_one(StatusBar).render())
        outcome = await action_layer(app).fire("hello")  # and the action layer refuses on its own
        assert outcome.status == "refused"
    assert victim.poll() is None
    assert not (workspace / ".samai" / "state" / "hello.json").exists()
    assert _audit(isolated_dirs) == []


@pytest.mark.slow
async def test_a_failing_stage_raises_an_alert_and_shows_its_tail(tmp_path, workspace):
    cfg_file = tmp_path / "f.toml"
    cfg_file.write_text(f'[target]\npoll_interval = 0.2\npython = "{sys.executable}"\n'
                        f'[workspace]\npath = "{workspace}"\n'
                        '[stages.boom]\nkey = "b"\ncommand = "echo BAD_THING happened; sleep 1; exit 3"\n'
                        'markers = [{ name = "BAD_THING", severity = "error" }]\n')
    app = SamaiApp(config.load(cfg_file))
    async with app.run_test(size=SIZE) as pilot:
        await pilot_until(pilot, lambda: app.state.snapshot)
        await pilot.press("b")
        await pilot_until(pilot, lambda: isinstance(app.screen, ConfirmDialog))
        await confirm_dialog(pilot)
        # One failure, one alert: the fire's (it failed within its verify window) or the poll's.
        await pilot_until(pilot, lambda: any("stage boom failed" in a.text and "rc=3" in a.text
                                             for a in app.state.alerts), 15)
        await polls_after(pilot, 2)
        texts = [a.text for a in app.state.alerts]
        assert len([t for t in texts if t.startswith("stage boom failed")]) == 1, texts
        assert any("BAD_THING happened" in t for t in texts)
        assert "BAD_THING" in str(app.box_screen.query_one("#alerts").render())
        assert "failed" in str(app.box_screen.query_one("#stages").render())


@pytest.mark.slow
async def test_stale_indicator_when_the_box_stops_answering(tmp_path, workspace):
    gate = tmp_path / "hang"
    wrapper = tmp_path / "box-python"
    wrapper.write_text(f'#!/bin/sh\nif [ -e "{gate}" ]; then exec sleep 60; fi\nexec "{sys.executable}" "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IEXEC)
    app = SamaiApp(_config(tmp_path, workspace, python=str(wrapper), timeout=1.0))
    async with app.run_test(size=SIZE) as pilot:
        await pilot_until(pilot, lambda: app.connection.state == "connected")
        gate.write_text("")  # new processes of the box's python hang...
        os.kill(app.state.snapshot.probe_pid, signal.SIGSTOP)  # ...and the running probe freezes
        await pilot_until(pilot, lambda: app.connection.stale, 10)
        assert app.screen.has_class("-stale")
        assert "STALE" in str(app.box_screen.query_one(StatusBar).render())
        await pilot.press("l")  # the screen keeps answering keys while the box is gone
        assert app.box_screen.query_one(LogView).border_title == "log · other"
        await pilot_until(pilot, lambda: app.connection.state == "lost", 10)
        gate.unlink()
        await pilot_until(pilot, lambda: app.connection.state == "connected" and not app.connection.stale, 40)
        assert not app.screen.has_class("-stale")
        assert any("not answering" in a.text for a in app.state.alerts)


@pytest.mark.slow
async def test_theme_switch_persists(tmp_path, workspace):
    app = SamaiApp(_config(tmp_path, workspace))
    async with app.run_test(size=SIZE) as pilot:
        assert app.theme == "samai-dark"
        app.theme = "samai-light"
        await pilot_until(pilot, lambda: prefs.load().get("theme") == "samai-light")
    again = SamaiApp(_config(tmp_path, workspace))
    assert again.theme == "samai-light"
    assert SamaiApp(_config(tmp_path, workspace), theme="samai-contrast").theme == "samai-contrast"


async def test_keys_can_be_remapped_from_the_config(tmp_path, workspace):
    f = tmp_path / "k.toml"
    f.write_text(f'[target]\npython = "{sys.executable}"\n[workspace]\npath = "{workspace}"\n'
                 '[stages.a]\nkey = "d"\ncommand = "true"\n[stages.b]\nkey = "e"\ncommand = "true"\n'
                 '[ui]\nkeys = {{ "app.next_log" = "ctrl+n" }}\n'.replace("{{", "{").replace("}}", "}"))
    app = SamaiApp(config.load(f))
    async with app.run_test(size=SIZE) as pilot:
        await pilot_until(pilot, lambda: app.box_screen.query_one(LogView).border_title == "log · a")  # at start
        await pilot.press("l")  # taken by the time press returns: what it would do is done
        assert app.box_screen.query_one(LogView).border_title == "log · a"
        await pilot.press("ctrl+n")
        # b, not a: had "l" gone to the next log as well, ctrl+n would have come back to a
        await pilot_until(pilot, lambda: app.box_screen.query_one(LogView).border_title == "log · b")


@pytest.mark.slow
@pytest.mark.parametrize("theme", ["samai-dark", "samai-light", "samai-contrast"])
async def test_help_lists_every_binding(tmp_path, workspace, theme):
    app = SamaiApp(_config(tmp_path, workspace), theme=theme)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("question_mark")
        await pilot_until(pilot, lambda: app.screen.__class__.__name__ == "HelpScreen")
        table = app.screen.query_one(DataTable)
        rows = [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]
        ids = {r[3] for r in rows}  # the id column shown
        assert {"app.kill", "app.stop", "app.restart", "app.open", "stage.hello", "stage.other"} <= ids
        assert {"log.filter", "log.follow", "log.next_marker", "log.save", "processes.filter",
                "processes.sort", "processes.all", "disk.largest"} <= ids  # the panes' keys too
        groups = [r[0] for r in rows if r[0]]  # each group named once, at its first row
        assert groups == ["console", "stages", "log pane", "processes pane", "disk pane", "GGUF screen",
                          "eval runs pane"]
        assert {"evals.diff", "app.timeline"} <= ids
        assert {"gguf.edit", "gguf.add", "gguf.filter", "gguf.close"} <= ids  # a screen of its own, listed too
        assert ["h", "Fire hello", "stage.hello"] in [r[1:] for r in rows]


@pytest.mark.slow
async def test_help_shows_remapped_keys_and_readonly_marks_what_is_off(tmp_path, workspace):
    f = tmp_path / "k.toml"
    f.write_text(f'[target]\npython = "{sys.executable}"\n[workspace]\npath = "{workspace}"\n'
                 '[stages.a]\nkey = "d"\ncommand = "true"\n[ui]\nkeys = { "app.kill" = "ctrl+k" }\n')
    app = SamaiApp(config.load(f), readonly=True)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("question_mark")
        await pilot_until(pilot, lambda: app.screen.__class__.__name__ == "HelpScreen")
        table = app.screen.query_one(DataTable)
        rows = {str(table.get_row_at(i)[3]): [str(c) for c in table.get_row_at(i)] for i in range(table.row_count)}
        assert rows["app.kill"][1] == "^k" and rows["app.kill"][2].endswith("(read-only: off)")
        assert not rows["app.help"][2].endswith("(read-only: off)")


@pytest.mark.slow
async def test_training_anomalies_and_detector_findings_become_alerts_and_x_fixes(tmp_path, workspace, spawn):
    port = _free_port()
    f = tmp_path / "alerts.toml"
    nan = "{'loss': 0.0, 'grad_norm': nan, 'learning_rate': 0.0001, 'epoch': 0.1}"
    f.write_text(f'[target]\npoll_interval = 0.2\npython = "{sys.executable}"\n[workspace]\npath = "{workspace}"\n'
                 f'[stages.train]\nkey = "t"\ncommand = "for i in 1 2 3; do echo \\"{nan}\\"; done; sleep 30"\n'
                 f'[stages.serve]\nkey = "v"\ncommand = "sleep 30"\nports = [{port}]\n')
    stray = spawn(sys.executable, "-c", f"import socket,time\ns=socket.socket()\ns.bind(('127.0.0.1',{port}))\n"
                  "s.listen()\ntime.sleep(60)")
    app = SamaiApp(config.load(f))
    async with app.run_test(size=SIZE) as pilot:
        await pilot_until(pilot, lambda: any(a.code == "stale_server" for a in app.state.alerts))
        await pilot.press("x")  # the newest alert with an action: the stale server on the serve port
        dialog = await pilot_until(pilot, lambda: isinstance(app.screen, KillDialog) and app.focused and app.screen)
        assert dialog.process.pid == stray.pid and app.focused.id == "cancel"
        await pilot.press("escape")
        await pilot_until(pilot, lambda: not app.busy and not isinstance(app.screen, KillDialog))

        await pilot.press("t")
        await pilot_until(pilot, lambda: isinstance(app.screen, ConfirmDialog) and app.focused)
        await confirm_dialog(pilot)
        await pilot_until(pilot, lambda: any(a.code == "hidden_nan" for a in app.state.alerts))
        assert "hidden" in str(app.box_screen.query_one("#alerts").render()).lower()
        nan = next(a for a in app.state.alerts if a.code == "hidden_nan")
        assert nan.action == FixAction.restart("train") and "x restart" in nan.hint
        await pilot_until(pilot, lambda: not app.busy and not isinstance(app.screen, ConfirmDialog))
        await pilot.press("x")  # now the newest: the training run's error, fixed by restarting train
        dialog = await pilot_until(pilot, lambda: isinstance(app.screen, ConfirmDialog) and app.focused and app.screen)
        assert dialog.plan.action == "restart" and dialog.plan.stage == "train" and app.focused.id == "cancel"
        await pilot.press("escape")
        await app.box.stop("train", grace=1)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
async def test_readonly_alerts_offer_no_key_that_changes_the_box(tmp_path, workspace, spawn):
    port = _free_port()
    f = tmp_path / "ro.toml"
    f.write_text(f'[target]\npoll_interval = 0.2\npython = "{sys.executable}"\n[workspace]\npath = "{workspace}"\n'
                 f'[stages.serve]\nkey = "v"\ncommand = "sleep 30"\nports = [{port}]\n')
    spawn(sys.executable, "-c", f"import socket,time\ns=socket.socket()\ns.bind(('127.0.0.1',{port}))\n"
          "s.listen()\ntime.sleep(60)")
    for readonly, hinted in ((False, True), (True, False)):
        app = SamaiApp(config.load(f), readonly=readonly)
        async with app.run_test(size=SIZE) as pilot:
            stale = await pilot_until(pilot, lambda app=app: next(
                (a for a in app.state.alerts if a.code == "stale_server"), None))
            assert stale.hint == "x fix"
            alerts = app.box_screen.query_one("#alerts")
            await pilot_until(pilot, lambda alerts=alerts: f"port {port}" in str(alerts.render()))
            assert ("[x fix]" in str(app.box_screen.query_one("#alerts").render())) is hinted
