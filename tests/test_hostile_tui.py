"""Text from the box in the TUI: markup never interpreted, control characters never raw.

Each test puts hostile text where the box can: a file name written by two processes, a stage's
command and output, a process's argv, log lines, an eval run's folder name, a probe's error.
The app must keep running and show that text literally, with ESC and friends as stand-ins."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from textual.command import CommandPalette
from textual.content import Content
from textual.widgets import Button, DataTable, OptionList

from samai.console.app import SamaiApp
from samai.console.core import config
from samai.console.screens.dialogs import ConfirmDialog, HelpScreen, PathDialog
from samai.remote.safe_text import visible
from samai.widgets.logview import LogView
from samai.widgets.processes import ProcessDetail, ProcessPane
from tests.helpers import pilot_until, polls_after

SIZE = (160, 50)
# Tags Textual and Rich would act on or choke on: a link, a closing tag with no opening, an
# action, an unclosed tag, a variable, an escaped bracket; and a terminal title change (OSC).
MARKUP = r"[link=a:b]L[/x] [@click=app.quit]Q[/] [b B [$v] \[e] [/link]"
OSC = "\x1b]0;pwned\x07\x1b[2J"
HOSTILE = MARKUP + " " + OSC
SHOWN = visible(HOSTILE)  # what the operator must see: the markup as typed, ESC as ␛
NAME = f"[b]run[link=a:b] [@click=app.quit]Q [$v] {OSC}"  # a file name: no "/"


DEFAULT_STAGES = '[stages.hello]\nkey = "h"\ncommand = "sleep 30"\n'


def _config(tmp_path: Path, ws: Path, stages: str = DEFAULT_STAGES, python: str = sys.executable) -> config.Config:
    f = tmp_path / "hostile.toml"
    f.write_text(f'[target]\npoll_interval = 0.2\ntimeout = 5\npython = "{python}"\n'
                 f'[workspace]\npath = "{ws}"\n{stages}')
    return config.load(f)


async def _until(pilot, predicate, timeout: float = 30.0):
    """pilot_until, saying on failure which screen and toasts the app showed."""
    try:
        return await pilot_until(pilot, predicate, timeout)
    except AssertionError as e:
        raise AssertionError(f"{e}; on {pilot.app.screen!r}, toasts {_toasts(pilot.app)}") from None


def _toasts(app: SamaiApp) -> list[str]:
    return [str(t.render()) for t in app.screen.query("Toast")]


def _plain(widget) -> str:
    return str(widget.render())


def _assert_inert(text: str) -> None:
    assert "\x1b" not in text and "\x07" not in text, f"raw control characters reach the terminal: {text!r}"


def _writer(spawn, path: Path):
    """A real process in its own group holding path open for writing; started when it says so."""
    code = "import sys,time\nf=open(sys.argv[1],'ab')\nprint('ready',flush=True)\ntime.sleep(60)"
    proc = spawn(sys.executable, "-c", code, str(path), stdout=subprocess.PIPE, start_new_session=True, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


@pytest.mark.slow
@pytest.mark.parametrize("readonly", [False, True], ids=["readwrite", "readonly"])
async def test_shared_writer_alert_on_a_markup_file_name_is_shown_literally(tmp_path, workspace, spawn,
                                                                           readonly):
    # A name cannot hold "/": the closing tag [/x] spans a folder and its file.
    folder = workspace / "[link=a:b]dl[@click=app.quit]Q[b [$v] \\[e] ["
    folder.mkdir()
    target = folder / f"x] {OSC}.part"
    _writer(spawn, target)
    _writer(spawn, target)
    app = SamaiApp(_config(tmp_path, workspace), readonly=readonly)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        alert = await _until(pilot, lambda: next((a for a in app.state.alerts if a.code == "shared_writer"), None))
        shown_path = visible(str(target))
        assert str(target) in alert.text
        pane = await _until(pilot, lambda: shown_path in _plain(app.box_screen.query_one("#alerts"))
                            and _plain(app.box_screen.query_one("#alerts")))
        _assert_inert(pane)
        toast = await _until(pilot, lambda: next((t for t in _toasts(app) if shown_path in t), None))
        _assert_inert(toast)
        await polls_after(pilot, 2)  # more polls: the same finding, the app still up
        assert app.is_running and [a.code for a in app.state.alerts].count("shared_writer") == 1


@pytest.mark.slow
async def test_a_failed_fire_toast_shows_the_stage_output_literally(tmp_path, workspace):
    command = f"printf '%s\\n' {shlex.quote(HOSTILE)}; echo [/x]; exit 3"
    stages = f'[stages.boom]\nkey = "b"\ncommand = {json.dumps(command)}\n'
    app = SamaiApp(_config(tmp_path, workspace, stages))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await _until(pilot, lambda: app.state.snapshot)
        await pilot.press("b")
        dialog = await _until(pilot, lambda: isinstance(app.screen, ConfirmDialog) and app.screen)
        confirm = await _until(pilot, lambda: next(iter(dialog.query("#confirm").results(Button)), None))
        confirm.press()
        # The fire's own toast carries the output's tail; the stage_failed alert's toast may come
        # first with only the last line ("[/x]"): both are inert.
        await _until(pilot, lambda: next((t for t in _toasts(app) if SHOWN in t), None))
        for shown in _toasts(app):
            _assert_inert(shown)
        await _until(pilot, lambda: not app.busy)
        assert app.is_running


@pytest.mark.slow
async def test_the_fire_dialog_shows_a_markup_command_literally(tmp_path, workspace):
    command = f"echo {shlex.quote(HOSTILE)} [/x]"
    stages = f'[stages.boom]\nkey = "b"\ncommand = {json.dumps(command)}\nlog = {json.dumps("logs/[/x].log")}\n'
    app = SamaiApp(_config(tmp_path, workspace, stages))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await _until(pilot, lambda: app.state.snapshot)
        await pilot.press("b")
        dialog = await _until(pilot, lambda: isinstance(app.screen, ConfirmDialog) and app.screen)
        shown = "\n".join(_plain(w) for w in dialog.query("Static"))
        assert visible(command) in shown
        assert "log logs/[/x].log" in shown
        _assert_inert(shown)
        await pilot.press("escape")
        await _until(pilot, lambda: not isinstance(app.screen, ConfirmDialog))
        await _until(pilot, lambda: not app.busy)
        assert app.is_running


@pytest.mark.slow
async def test_the_path_and_help_dialogs_show_markup_literally(tmp_path, workspace):
    url = "local"
    app = SamaiApp(_config(tmp_path, workspace))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await pilot.press("question_mark")
        help_screen = await _until(pilot, lambda: isinstance(app.screen, HelpScreen) and app.screen)
        assert "[ui.keys]" in _plain(help_screen.query_one("Label"))
        table = help_screen.query_one(DataTable)
        assert any("Fire hello" in str(table.get_cell_at((r, 2))) for r in range(table.row_count))  # the "what" column
        await pilot.press("escape")
        await _until(pilot, lambda: not isinstance(app.screen, HelpScreen))
        dialog = PathDialog(f"open {MARKUP}", value=url)
        app.push_screen(dialog)
        await _until(pilot, lambda: app.screen is dialog and dialog.query("Label"))
        assert MARKUP in _plain(dialog.query_one("Label"))
        await pilot.press("escape")
        assert app.is_running


@pytest.mark.slow
async def test_the_command_palette_shows_a_markup_command_literally(tmp_path, workspace):
    command = f"[ -f x ] || echo {shlex.quote(HOSTILE)} [/x]"
    log = "logs/[b]run[/y].log"
    stages = f'[stages.hello]\nkey = "h"\ncommand = {json.dumps(command)}\nlog = {json.dumps(log)}\n'
    app = SamaiApp(_config(tmp_path, workspace, stages))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await pilot.press("ctrl+p")
        palette = await _until(pilot, lambda: isinstance(app.screen, CommandPalette) and app.screen)
        options = palette.query_one(OptionList)

        def prompts() -> str:
            return "\n".join(str(options.get_option_at_index(i).prompt) for i in range(options.option_count))

        shown = await _until(pilot, lambda: "Fire hello" in prompts() and prompts())
        assert visible(command) in shown
        assert log in shown
        _assert_inert(shown)
        await pilot.press("escape")
        assert app.is_running


@pytest.mark.slow
async def test_a_process_with_markup_and_escapes_in_its_argv_is_shown_literally(tmp_path, workspace, spawn):
    victim = spawn(sys.executable, "-c", "import time; time.sleep(60)", MARKUP, OSC)
    app = SamaiApp(_config(tmp_path, workspace))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        pane = app.box_screen.query_one(ProcessPane)
        key = await _until(pilot, lambda: next((k for k, _ in pane.table.rows if k.startswith(f"{victim.pid}:")),
                                               None))
        pane.table.focus()
        await _until(pilot, lambda: pane.table.has_focus)
        # In one go (a poll re-sorts the rows): the row as painted (its command cut to the pane's
        # width), and the whole command line under the table once the row is selected.
        row = pane.table.index(key)
        cells = pane.table.rows[row][1]
        assert visible(f"{MARKUP} {OSC}") in cells[-1]
        pane.table.move_cursor(row)
        line = pane.table.render_line(row + 1 - pane.table.scroll_offset.y).text
        assert f" {cells[-1][:20]}" in line
        detail = await _until(pilot, lambda: (text := _plain(pane.query_one(ProcessDetail))) and MARKUP in text
                              and text)
        assert f"{MARKUP} {visible(OSC)}" in detail and f"pid {victim.pid}" in detail
        _assert_inert(detail)
        for cells in (c for _, c in pane.table.rows):
            _assert_inert(" ".join(cells))
        # The filter prompt's own error (the operator's regex, with markup in it) is not parsed either.
        await pilot.press("slash")
        await pilot.press(*"(?P<[/x]>)")
        await pilot.press("enter")
        prompt = pane.query_one("Input")
        await _until(pilot, lambda: prompt.border_title)
        assert "[/x]" in Content.from_markup(prompt.border_title).plain
        assert app.is_running


@pytest.mark.slow
async def test_log_lines_markers_and_a_markup_file_name_are_shown_literally(tmp_path, workspace):
    stages = ('[stages.hello]\nkey = "h"\ncommand = "sleep 30"\n'
              'markers = [{ name = "BAD", severity = "error" }]\n')
    (workspace / "logs").mkdir()
    (workspace / "logs" / "hello.log").write_text(f"BAD {HOSTILE}\n")
    opened = workspace / f"{NAME}.log"
    opened.write_text(f"first {HOSTILE}\nsecond [/x]\n")
    app = SamaiApp(_config(tmp_path, workspace, stages))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        view = app.box_screen.query_one(LogView)
        # The stage log's marker: the stages bar, the alerts pane and an error toast.
        await _until(pilot, lambda: any(a.text.startswith("hello: BAD") for a in app.state.alerts))
        stages_bar = await _until(pilot, lambda: "BAD" in _plain(app.box_screen.query_one("#stages"))
                                  and _plain(app.box_screen.query_one("#stages")))
        assert visible(f"BAD {HOSTILE}")[:32] in stages_bar
        _assert_inert(stages_bar)
        alerts = _plain(app.box_screen.query_one("#alerts"))
        assert f"BAD {SHOWN}" in alerts
        _assert_inert(alerts)
        toast = await _until(pilot, lambda: next((t for t in _toasts(app) if "BAD" in t), None))
        assert f"BAD {SHOWN}" in toast
        _assert_inert(toast)
        await _until(pilot, lambda: any("BAD" in line for line in view.lines))
        # A file whose name is markup, opened in the log pane: its title and its lines.
        await pilot.press("o")
        await _until(pilot, lambda: isinstance(app.screen, PathDialog))
        app.screen.query_one("Input").value = str(opened)
        await pilot.press("enter")
        await _until(pilot, lambda: any("second" in line for line in view.lines))
        assert view.border_title == Content(f"file · {visible(str(opened))}").markup  # it reads back as markup
        rows = "\n".join(view.render_line(y).text for y in range(view.size.height))
        assert f"first {SHOWN}" in rows and "second [/x]" in rows
        _assert_inert(rows)
        assert app.is_running


@pytest.mark.slow
async def test_an_eval_run_named_with_markup_is_shown_literally(tmp_path, workspace):
    run = workspace / "runs" / "eval" / NAME
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({"n": 10, "accuracy": 0.5}))
    app = SamaiApp(_config(tmp_path, workspace))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        table = app.box_screen.query_one("#evals", DataTable)
        await _until(pilot, lambda: table.row_count)
        await polls_after(pilot, 2)  # the row as later polls leave it
        name = str(table.get_cell_at((0, 2))).split("\n")[0]  # the run column: its name, then its counts
        assert name == visible(run.name)
        assert app.is_running


async def test_a_probe_error_with_markup_is_shown_literally_in_the_status_bar(tmp_path, workspace):
    broken = tmp_path / "box-python"
    broken.write_text(f"#!/bin/sh\nprintf '%s\\n' {shlex.quote(HOSTILE)} >&2\nexit 1\n")
    broken.chmod(0o755)
    app = SamaiApp(_config(tmp_path, workspace, python=str(broken)))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        box = app.box_screen
        status = await _until(pilot, lambda: app.connection.error and "[/x]" in _plain(box.query_one("#status"))
                              and _plain(app.box_screen.query_one("#status")))
        assert MARKUP[:40] in status
        _assert_inert(status)
        assert app.is_running
