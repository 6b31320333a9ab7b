"""What the TUI shows carries no secret: the fire dialog of a stage whose command and env hold
one of each shape, and a real process whose command line holds them, in the processes pane
(its row and its detail strip) and in its kill dialog. Real app, real local box, real processes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from textual.command import CommandList
from textual.widgets import Static

from samai.console.app import SamaiApp
from samai.console.core import config
from samai.console.screens.dialogs import ConfirmDialog, KillDialog
from samai.console.screens.fleet import FleetScreen
from samai.widgets.processes import ProcessDetail, ProcessPane
from tests.helpers import pilot_until, run_cli
from tests.test_redact_shapes import SECRET_COMMANDS, SECRETS, secret_stage_toml

pytestmark = pytest.mark.slow  # every test here takes seconds: real processes, sockets or an app, waited on

SIZE = (150, 45)


def _app(tmp_path: Path, workspace: Path) -> SamaiApp:
    f = tmp_path / "shown.toml"
    f.write_text(f'[target]\npoll_interval = 0.2\npython = "{sys.executable}"\n[workspace]\npath = "{workspace}"\n'
                 + secret_stage_toml("leaky", "j"))
    return SamaiApp(config.load(f))


def _shown(screen) -> str:
    """Every text the screen's widgets render."""
    return "\n".join(str(w.render()) for w in screen.query(Static))


def _leaked(text: str) -> list[str]:
    return [s for s in SECRETS if s in text]


async def test_the_fire_dialog_shows_the_plan_without_its_secrets(tmp_path: Path, workspace: Path) -> None:
    app = _app(tmp_path, workspace)
    async with app.run_test(size=SIZE) as pilot:
        await pilot_until(pilot, lambda: app.state.snapshot)
        await pilot.press("j")
        dialog = await pilot_until(pilot, lambda: isinstance(app.screen, ConfirmDialog) and app.focused and app.screen)
        text = _shown(dialog)
        assert "sshpass -p *** ssh -p 2222 op@gpu-box" in text and "env HF_TOKEN=***" in text  # the plan, shown
        assert _leaked(text) == []
        await pilot.press("escape")
        await pilot_until(pilot, lambda: not isinstance(app.screen, ConfirmDialog))


async def test_a_process_whose_command_line_holds_secrets_is_shown_without_them(tmp_path: Path, workspace: Path,
                                                                                spawn) -> None:
    words = [w for command, _ in SECRET_COMMANDS for w in command.split()[1:]]  # its argv: every shape
    victim = spawn(sys.executable, "-c", "import time; time.sleep(60.75)", "--token", "Pr0cT0kenSecret", *words)
    app = _app(tmp_path, workspace)
    async with app.run_test(size=SIZE) as pilot:
        await pilot_until(pilot, lambda: app.state.snapshot and app.state.snapshot.process(victim.pid))
        pane = app.box_screen.query_one(ProcessPane)
        pane.table.focus()
        await pilot.press("slash")
        await pilot.press(*"sleep\\(60\\.75", "enter")
        await pilot_until(pilot, lambda: pane.selected() and pane.selected().pid == victim.pid)
        (row,) = [cells for key, cells in pane.table.rows]
        detail = str(app.box_screen.query_one(ProcessDetail).render())
        assert "--token ***" in row[-1] and "--token ***" in detail
        assert _leaked(" ".join(row) + detail) == [] and "Pr0cT0kenSecret" not in " ".join(row) + detail

        await pilot.press("k")
        dialog = await pilot_until(pilot, lambda: isinstance(app.screen, KillDialog) and app.focused and app.screen)
        text = _shown(dialog)
        assert "--token ***" in text and _leaked(text) == [] and "Pr0cT0kenSecret" not in text
        await pilot.press("escape")
        await pilot_until(pilot, lambda: not isinstance(app.screen, KillDialog) and not app.busy)
    assert victim.poll() is None


async def test_every_toast_and_the_palette_show_no_secret(tmp_path: Path, workspace: Path) -> None:
    app = _app(tmp_path, workspace)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        # whoever calls: an error quoting a pre-signed donor URL, a worker's failure, a stage's output
        for command, _ in SECRET_COMMANDS:
            app.notify(f"gguf extract: cannot read {command.removeprefix('true ')}", severity="error")
        toasts = await pilot_until(pilot, lambda: "\n".join(str(t.render()) for t in app.screen.query("Toast")))
        assert "***" in toasts and "gguf extract" in toasts and _leaked(toasts) == []
        await pilot.press("ctrl+p")
        await pilot.press(*"Fire leaky")
        await pilot_until(pilot, lambda: "leaky" in _palette_hits(app))  # the command it would leak on show
        assert _leaked(app.export_screenshot()) == []


def _palette_hits(app) -> str:
    """The command palette's hits, as text ("" while it shows none)."""
    lists = app.screen.query(CommandList)
    hits = lists.first() if lists else None
    return "\n".join(str(hits.get_option_at_index(i).prompt) for i in range(hits.option_count)) if hits else ""


def test_the_cli_text_shows_no_secret_and_json_keeps_the_box_exact(tmp_path: Path, workspace: Path, spawn) -> None:
    # argv[0] as a tool's command line, where the listeners' and the top processes' columns show it
    victim = spawn("curl -u op:cUrlPa55word", "-c", "import socket, time; s = socket.socket(); "
                   "s.bind(('127.0.0.1', 0)); s.listen(); print('up', flush=True); time.sleep(60)",
                   executable=sys.executable, stdout=subprocess.PIPE, text=True)
    assert victim.stdout.readline() == "up\n"
    f = tmp_path / "cli.toml"
    f.write_text(f'[workspace]\npath = "{workspace}"\n' + secret_stage_toml("leaky", "j", "exit 3"))
    text = run_cli("--config", str(f), "snapshot")
    assert text.returncode == 0 and f"pid {victim.pid} curl -u op:***" in text.stdout, text.stdout
    assert _leaked(text.stdout) == []
    exact = run_cli("--config", str(f), "snapshot", "--json")
    assert "cUrlPa55word" in exact.stdout  # --json is the box's record, exact
    fired = run_cli("--config", str(f), "fire", "leaky", "--yes")  # its failure's report quotes the stage's tail
    assert _leaked(fired.stdout + fired.stderr) == [], fired.stderr


async def test_a_target_url_with_a_password_is_shown_masked(tmp_path: Path) -> None:
    f = tmp_path / "boxes.toml"
    f.write_text(f'[boxes.a]\nurl = "ssh://op:Hunter2Pa55@127.0.0.1:1"\nworkspace = "{tmp_path / "a"}"\n'
                 f'[boxes.b]\nurl = "local"\nworkspace = "{tmp_path / "b"}"\n'
                 '[stages.hello]\nkey = "h"\ncommand = "echo hi"\n')
    app = SamaiApp(config.load(f), box="a")
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await pilot_until(pilot, lambda: app.connection.error)  # refused: no password in an ssh URL
        assert "op:***@127.0.0.1" in app.export_screenshot()  # the status bar's target
        assert "Hunter2Pa55" not in app.export_screenshot() + app.connection.target
        app.action_fleet()
        fleet = await pilot_until(pilot, lambda: isinstance(app.screen, FleetScreen) and app.screen)
        await pilot_until(pilot, lambda: fleet.fleet.watch("a").row.error)
        assert fleet.fleet.watch("a").row.url == "ssh://op:***@127.0.0.1:1"
        assert "Hunter2Pa55" not in app.export_screenshot()
        await pilot.press("ctrl+p")
        await pilot.press(*"Switch to box")
        await pilot_until(pilot, lambda: "box a" in _palette_hits(app))  # the box whose URL it would leak
        assert "Hunter2Pa55" not in app.export_screenshot()
    text = run_cli("--config", str(f), "snapshot", "--all-boxes")
    assert "op:***@" in text.stdout and "Hunter2Pa55" not in text.stdout + text.stderr
