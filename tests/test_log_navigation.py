"""Getting around the logs through the TUI, on the real local Box: the pane has focus at start,
a log not written yet says which key writes it, any file's alarms are marked, the picker (L),
back and forward ([ ]), copying a line (Y), and Tab completing a path from the box's listing."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from textual.widgets import Input, OptionList, Static

from samai.console.app import SamaiApp
from samai.console.core import config
from samai.console.screens.dialogs import LogPicker, PathDialog
from samai.remote.boxapi import Box, BoxError
from samai.remote.model import Listing
from samai.widgets.logview import LogView
from samai.widgets.logview.history import LogHistory, ShownLog
from samai.widgets.path_completion import complete
from tests.helpers import pilot_until

SIZE = (140, 45)

PIPE = """
pipeline = "nav"
[target]
poll_interval = 0.2
python = "{python}"
[workspace]
path = "{ws}"
[stages.hello]
key = "h"
command = "echo hello"
log = "logs/hello.log"
markers = [{{ name = "STEP_OK" }}]
[stages.other]
key = "t"
command = "echo other"
log = "logs/other.log"
"""


def _app(tmp_path: Path, ws: Path, **kwargs) -> SamaiApp:
    f = tmp_path / "nav.toml"
    f.write_text(PIPE.format(ws=ws, python=sys.executable))
    return SamaiApp(config.load(f), **kwargs)


def _rows(view: LogView) -> list[str]:
    return [view.render_line(y).text.rstrip() for y in range(view.scrollable_content_region.height)]


def _title(app: SamaiApp) -> str:
    return str(app.box_screen.query_one(LogView).border_title)


async def test_the_log_pane_has_focus_at_start_so_slash_filters_the_log(tmp_path, workspace):
    app = _app(tmp_path, workspace, poll=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot_until(pilot, lambda: isinstance(app.focused, LogView))
        await pilot.press("slash")
        view = app.box_screen.query_one(LogView)
        await pilot_until(pilot, lambda: isinstance(app.focused, Input) and app.focused.parent is view)


@pytest.mark.parametrize("readonly", [False, True])
async def test_a_stage_log_not_written_yet_says_which_key_writes_it_whole(tmp_path, workspace, readonly):
    app = _app(tmp_path, workspace, readonly=readonly)
    async with app.run_test(size=(60, 45)) as pilot:  # narrow: the notice is longer than the pane
        view = app.box_screen.query_one(LogView)
        await pilot_until(pilot, lambda: len(view.lines))
        notice = view.lines[0]
        if readonly:
            assert notice == "no log yet: hello has not run here (logs/hello.log)"
        else:
            assert notice == "no log yet — press h to fire hello (logs/hello.log)"
        shown = "".join(row.strip() for row in _rows(view))
        assert notice.replace(" ", "") in shown.replace(" ", "")  # wrapped over rows, nothing cut


@pytest.mark.slow
async def test_a_missing_file_opened_by_path_is_said_as_such(tmp_path, workspace):
    app = _app(tmp_path, workspace)
    async with app.run_test(size=SIZE) as pilot:
        await pilot_until(pilot, lambda: app.state.snapshot)
        await pilot.press("o")
        await pilot_until(pilot, lambda: isinstance(app.screen, PathDialog))
        await pilot.press(*"nope.log", "enter")
        view = app.box_screen.query_one(LogView)
        await pilot_until(pilot, lambda: len(view.lines))
        assert view.lines[0] == f"No such file on the box: {workspace}/nope.log"


@pytest.mark.slow
async def test_any_file_opened_by_path_marks_its_alarms_and_n_reaches_them(tmp_path, workspace):
    (workspace / "any.log").write_text("starting\nTraceback (most recent call last):\nok\n"
                                       "RuntimeError: CUDA out of memory.\nstep 3 loss nan\nfine\n")
    app = _app(tmp_path, workspace)
    async with app.run_test(size=SIZE) as pilot:
        await pilot_until(pilot, lambda: app.state.snapshot)
        await pilot.press("o")
        await pilot_until(pilot, lambda: isinstance(app.screen, PathDialog))
        await pilot.press(*"any.log", "enter")
        view = app.box_screen.query_one(LogView)
        await pilot_until(pilot, lambda: len(view.lines) == 6)
        assert view.marker_lines == [1, 3, 4]
        await pilot.press("g", "n")
        assert view.cursor_line == 1
        await pilot.press("n")
        assert view.cursor_line == 3


@pytest.mark.slow
async def test_picker_lists_stage_logs_and_recent_files_and_opens_one(tmp_path, workspace):
    (workspace / "a.log").write_text("from a\n")
    app = _app(tmp_path, workspace)
    async with app.run_test(size=SIZE) as pilot:
        await pilot_until(pilot, lambda: app.state.snapshot)
        await pilot.press("o")
        await pilot_until(pilot, lambda: isinstance(app.screen, PathDialog))
        await pilot.press(*"a.log", "enter")
        await pilot_until(pilot, lambda: "a.log" in _title(app))
        await pilot.press("L")
        picker = await pilot_until(pilot, lambda: isinstance(app.screen, LogPicker) and app.screen)
        options = picker.query_one(OptionList)
        prompts = [str(options.get_option_at_index(i).prompt) for i in range(options.option_count)]
        assert any("hello" in p and "logs/hello.log" in p for p in prompts)
        assert any("other" in p for p in prompts) and any("a.log" in p for p in prompts)
        assert "a.log" in prompts[options.highlighted]  # the one shown now
        await pilot.press("home", "enter")
        await pilot_until(pilot, lambda: app.box_screen.shown_stage == "hello")
        assert not isinstance(app.screen, LogPicker)


@pytest.mark.slow
async def test_brackets_go_back_and_forward_between_the_logs_shown(tmp_path, workspace):
    (workspace / "a.log").write_text("from a\n")
    app = _app(tmp_path, workspace)
    async with app.run_test(size=SIZE) as pilot:
        await pilot_until(pilot, lambda: app.state.snapshot)
        assert app.box_screen.shown_stage == "hello"
        await pilot.press("l")  # other
        await pilot_until(pilot, lambda: app.box_screen.shown_stage == "other")
        await pilot.press("o")
        await pilot_until(pilot, lambda: isinstance(app.screen, PathDialog))
        await pilot.press(*"a.log", "enter")
        await pilot_until(pilot, lambda: "a.log" in _title(app))
        await pilot.press("left_square_bracket")
        await pilot_until(pilot, lambda: app.box_screen.shown_stage == "other")
        await pilot.press("left_square_bracket")
        await pilot_until(pilot, lambda: app.box_screen.shown_stage == "hello")
        await pilot.press("right_square_bracket", "right_square_bracket")
        await pilot_until(pilot, lambda: "a.log" in _title(app) and app.box_screen.shown_stage is None)
        view = app.box_screen.query_one(LogView)
        await pilot_until(pilot, lambda: list(view.lines) == ["from a"])


@pytest.mark.slow
async def test_Y_copies_the_current_line_as_text(tmp_path, workspace):
    (workspace / "c.log").write_text("first\nERROR \x1b]0;pwned\x07 here\nlast\n")
    app = _app(tmp_path, workspace)
    async with app.run_test(size=SIZE) as pilot:
        await pilot_until(pilot, lambda: app.state.snapshot)
        await pilot.press("o")
        await pilot_until(pilot, lambda: isinstance(app.screen, PathDialog))
        await pilot.press(*"c.log", "enter")
        view = app.box_screen.query_one(LogView)
        await pilot_until(pilot, lambda: len(view.lines) == 3)
        await pilot.press("Y")  # following: the newest line
        assert app.clipboard == "last"
        await pilot.press("g", "n", "Y")  # the marker line n landed on, control characters inert
        assert app.clipboard == "ERROR \u241b]0;pwned\u2407 here"


@pytest.mark.slow
async def test_tab_completes_a_path_from_the_box_listing(tmp_path, workspace):
    (workspace / "logs").mkdir()
    (workspace / "logs" / "train-run.log").write_text("x\n")
    (workspace / "logs" / "train-old.log").write_text("x\n")
    (workspace / "logs" / "serve.log").write_text("x\n")
    app = _app(tmp_path, workspace)
    async with app.run_test(size=SIZE) as pilot:
        await pilot_until(pilot, lambda: app.state.snapshot)
        await pilot.press("o")
        dialog = await pilot_until(pilot, lambda: isinstance(app.screen, PathDialog) and app.screen)
        field = dialog.query_one(Input)
        await pilot.press(*"lo", "tab")
        await pilot_until(pilot, lambda: field.value == "logs/")
        await pilot.press("s", "tab")
        await pilot_until(pilot, lambda: field.value == "logs/serve.log")
        await pilot.press(*("backspace",) * len("serve.log"), "t", "tab")
        await pilot_until(pilot, lambda: field.value == "logs/train-")
        hint = str(dialog.query_one("#candidates", Static).render())
        assert "train-old.log" in hint and "train-run.log" in hint
        await pilot.press("r", "tab", "enter")
        await pilot_until(pilot, lambda: "logs/train-run.log" in _title(app))


async def test_box_lists_a_folder_in_the_workspace(box: Box, workspace: Path):
    (workspace / "sub").mkdir()
    (workspace / "f.txt").write_text("")
    assert {"f.txt", "sub/"} <= set((await box.list_dir(".")).names)
    assert await box.list_dir("sub") == Listing((), complete=True)
    with pytest.raises(BoxError, match="No such file"):
        await box.list_dir("missing")


def test_completion_from_a_listing() -> None:
    names = ["train.log", "train-2.log", "models/", ".hidden"]
    assert complete("tr", names) == ("train", ("train-2.log", "train.log"))
    assert complete("m", names) == ("models/", ())
    assert complete("/abs/x", names) == ("/abs/x", ())
    assert complete("", names) == ("", ("models/", "train-2.log", "train.log"))
    assert complete(".h", names) == (".hidden", ())
    assert complete("e", ["evil\x1b]0;x\x07.log", "e[b]x[/b].log"]) == ("e[b]x[/b].log", ())


def test_history_goes_back_and_forward_and_forgets_what_was_ahead() -> None:
    history = LogHistory(max_recent=2)
    a, b, c, f = ShownLog("/a", "a"), ShownLog("/b", "b"), ShownLog("/c", "c"), ShownLog("x.log")
    for log in (a, b, c):
        history.visit(log)
    assert history.back() == b and history.back() == a and history.back() is None
    assert history.forward() == b
    history.visit(f)  # c was ahead: gone
    assert history.forward() is None and history.back() == b
    history.visit(ShownLog("y.log"))
    history.visit(ShownLog("z.log"))
    history.visit(ShownLog("y.log"))
    assert history.recent_files == ("y.log", "z.log")


def test_the_probe_lists_at_most_max_entries_and_refuses_a_malformed_listing(workspace: Path):
    from samai.remote.box import probe

    for n in range(5):
        (workspace / f"f{n}").write_text("")
    reply = json.loads(probe.answer(json.dumps({"workspace": str(workspace), "listing": {"path": ".", "max": 3},
                                                "processes": False, "states": False})))
    assert len(reply["listing"]["entries"]) == 3 and reply["listing"]["complete"] is False
    for bad in ([], {"max": 3}, {"path": 7}, {"path": "a\0b"}, {"path": ".", "max": "3"}):
        reply = json.loads(probe.answer(json.dumps({"listing": bad})))
        assert "request.listing" in reply["error"]


async def test_the_box_lists_what_starts_with_the_name_typed_in_a_folder_of_many(box: Box, workspace: Path):
    many = workspace / "many"
    many.mkdir()
    for i in range(5000):
        (many / f"ckpt-{i:05d}").touch()
    (many / "target.log").touch()
    (many / ".hidden").touch()
    assert await box.list_dir("many", prefix="tar") == Listing(("target.log",), complete=True)
    assert await box.list_dir("many", prefix=".") == Listing((".hidden",), complete=True)
    cut = await box.list_dir("many", prefix="ckpt-")
    assert len(cut.names) == 1000 and not cut.complete and all(n.startswith("ckpt-") for n in cut.names)


@pytest.mark.slow
async def test_tab_finds_a_file_in_a_folder_of_thousands_and_says_when_the_listing_was_cut(tmp_path, workspace):
    folder = workspace / "runs"
    folder.mkdir()
    for i in range(20_000):  # the file is past the first thousand names in nearly any listing order
        (folder / f"ckpt-{i:05d}").touch()
    (folder / "train-final.log").write_text("x\n")
    app = _app(tmp_path, workspace)
    async with app.run_test(size=SIZE) as pilot:
        await pilot_until(pilot, lambda: app.state.snapshot)
        await pilot.press("o")
        dialog = await pilot_until(pilot, lambda: isinstance(app.screen, PathDialog) and app.screen)
        field = dialog.query_one(Input)
        await pilot.press(*"runs/tr", "tab")
        await pilot_until(pilot, lambda: field.value == "runs/train-final.log", 30)
        await pilot.press(*("backspace",) * len("train-final.log"), *"ckpt-0", "tab")
        hint = dialog.query_one("#candidates", Static)
        await pilot_until(pilot, lambda: "the box listed only the first 1000 names" in str(hint.render()), 30)
        assert field.value == "runs/ckpt-0"  # nothing assumed of the names past the cut
