"""An idle poll does as little as it can: panes handed what they show do nothing, the processes
table repaints only the lines that changed. What is shown must still follow the data."""

from __future__ import annotations

import pytest
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.content import Content
from textual.geometry import Region
from textual.widgets import Static

from samai.console.core.evals.runs import EvalRun
from samai.console.core.update import ProcessRow
from samai.widgets.evals import EvalTable
from samai.widgets.footer import KeysFooter
from samai.widgets.pane import Pane
from samai.widgets.processes import COLUMNS, ProcessPane, ProcessTable
from samai.widgets.stages import StagesBar
from samai.widgets.status import Connection, StatusBar
from tests import factories
from tests.helpers import pilot_until

NOW = 1_000_000.0


def _row(pid: int, cpu: float, command: str = "python train.py", started: float = NOW - 90) -> ProcessRow:
    p = factories.process(pid, start_time=started, cpu_percent=cpu, argv=command.split())
    return ProcessRow(p, None, cpu, ())


def _calls(monkeypatch, obj, name: str) -> list:
    """Record the calls to obj.name (still made)."""
    calls: list = []
    original = getattr(obj, name)

    def spy(*args, **kwargs):
        calls.append(args)
        return original(*args, **kwargs)

    monkeypatch.setattr(obj, name, spy)
    return calls


class Panes(App):
    def compose(self) -> ComposeResult:
        yield StatusBar()
        yield StagesBar()
        yield ProcessPane(id="patched")
        yield ProcessPane(id="fresh")
        yield EvalTable()


def _shown(pane: ProcessPane) -> list[str]:
    """The table as painted: header and rows, as text."""
    table = pane.table
    return [table.render_line(y).text for y in range(len(table.rows) + 1)]


def _styles(table: ProcessTable, y: int) -> list:
    return [segment.style for segment in table.render_line(y)]


def _line(table: ProcessTable, row: int) -> Region:
    """The region a refresh of that row's line repaints."""
    return Region(0, row + 1 - table.scroll_offset.y, max(table.virtual_size.width, table.size.width), 1)


async def test_a_pane_repaints_only_when_its_content_changes(monkeypatch) -> None:
    async with Panes().run_test(size=(120, 40)) as pilot:
        bar = pilot.app.query_one(StatusBar)
        updates = _calls(monkeypatch, bar, "update")
        bar.show(Connection("local", "box", "connected", 0.0, 0.012))
        bar.show(Connection("local", "box", "connected", 0.0, 0.012))
        assert len(updates) == 1
        bar.show(Connection("local", "box", "connected", 0.0, 0.013))
        await pilot.pause()
        assert len(updates) == 2
        assert "rtt 13 ms" in str(bar.render())


async def test_the_eval_table_is_rebuilt_only_when_the_runs_change(monkeypatch) -> None:
    async with Panes().run_test(size=(120, 40)) as pilot:
        table = pilot.app.query_one(EvalTable)
        clears = _calls(monkeypatch, table, "clear")
        runs = [EvalRun("r1", 20, 0.9, 0, 1, mtime=1.0)]
        table.show(runs)
        table.show(list(runs))
        assert len(clears) == 1 and table.row_count == 1
        table.show(runs + [EvalRun("r2", 20, 0.0, 19, 0, mtime=2.0)])
        assert len(clears) == 2 and table.row_count == 2
        assert str(table.get_cell_at((0, 2))).split("\n")[0] == "r2"  # a Text: never markup
        assert table.border_subtitle == "2 runs"


async def test_an_unchanged_poll_leaves_the_process_table_alone(monkeypatch) -> None:
    async with Panes().run_test(size=(120, 40)) as pilot:
        pane = pilot.app.query_one("#patched", ProcessPane)
        pane.show([_row(10, 5.0), _row(11, 1.0)], NOW)
        await pilot.pause()
        table = pane.table
        size = table.virtual_size
        refreshes = _calls(monkeypatch, table, "refresh")  # a new virtual size is a refresh too
        pane.show([_row(10, 5.0), _row(11, 1.0)], NOW)
        await pilot.pause()
        assert refreshes == [] and table.virtual_size == size


async def test_the_process_table_changed_in_place_shows_what_a_rebuild_shows(monkeypatch) -> None:
    async with Panes().run_test(size=(120, 40)) as pilot:
        patched = pilot.app.query_one("#patched", ProcessPane)
        fresh = pilot.app.query_one("#fresh", ProcessPane)
        patched.show([_row(10, 5.0), _row(11, 1.0), _row(12, 0.0)], NOW)
        await pilot.pause()
        assert patched.selected().pid == 10
        refreshes = _calls(monkeypatch, patched.table, "refresh")
        # 12 is gone, 13 is new, 11 now uses the most CPU and 10 the least, every elapsed time moved on.
        later = [_row(10, 0.5), _row(11, 7.0), _row(13, 2.0, "bash")]
        patched.show(later, NOW + 65)
        fresh.show(later, NOW + 65)
        await pilot.pause()
        assert refreshes and all(regions for regions in refreshes)  # lines, never the whole table
        assert _shown(patched) == _shown(fresh)
        assert [cells[1] for _, cells in patched.table.rows] == ["11", "13", "10"]
        assert "2m" in _shown(patched)[1] and "bash" in _shown(patched)[2]
        assert patched.selected().pid == 10 and patched.table.cursor_row == 2  # the cursor stayed on its process


async def test_a_value_wider_than_its_column_widens_it_as_before(monkeypatch) -> None:
    async with Panes().run_test(size=(120, 40)) as pilot:
        pane = pilot.app.query_one("#patched", ProcessPane)
        pane.show([_row(10, 5.0)], NOW)
        await pilot.pause()
        table = pane.table
        user, cpu = COLUMNS.index("user"), COLUMNS.index("cpu%")
        assert table.widths[cpu] == len("cpu%") and " 5.0  50M" in _shown(pane)[1]
        refreshes = _calls(monkeypatch, table, "refresh")
        pane.show([_row(10, 100.0)], NOW)
        await pilot.pause()
        assert table.widths[cpu] == len("100.0") and " 100.0 50M" in _shown(pane)[1]
        assert () in refreshes  # the whole table: every line moved
        pane.show([_row(10, 5.0)], NOW)
        await pilot.pause()
        assert table.widths[cpu] == len("100.0") and table.widths[user] == len("user")  # columns only grow
        assert " cpu%  rss" in _shown(pane)[0] and " 5.0   50M" in _shown(pane)[1]


async def test_the_process_table_paints_the_new_values_and_follows_the_theme() -> None:
    async with Panes().run_test(size=(120, 40)) as pilot:
        pane = pilot.app.query_one("#patched", ProcessPane)
        pane.show([_row(10, 5.0), _row(11, 1.0)], NOW)
        await pilot.pause()
        before = pane.table.render_line(2)
        assert " 1.0 " in before.text
        pane.show([_row(10, 5.0), _row(11, 2.5)], NOW)
        await pilot.pause()
        after = pane.table.render_line(2)
        assert " 2.5 " in after.text and " 1.0 " not in after.text
        pilot.app.theme = "textual-light"
        await pilot.pause()
        assert pane.table.render_line(2).text == after.text
        assert _styles(pane.table, 2) != [s.style for s in after]


async def test_a_changed_cell_repaints_its_line_only(monkeypatch) -> None:
    async with Panes().run_test(size=(120, 40)) as pilot:
        pane = pilot.app.query_one("#patched", ProcessPane)
        pane.sort = "pid"  # a new cpu% then moves no row
        pane.show([_row(10, 5.0), _row(11, 1.0), _row(12, 0.0)], NOW)
        await pilot.pause()
        table = pane.table
        refreshes = _calls(monkeypatch, table, "refresh")
        pane.show([_row(10, 5.0), _row(11, 3.0), _row(12, 0.0)], NOW)
        await pilot.pause()
        assert refreshes == [(_line(table, 1),)]
        assert " 3.0 " in table.render_line(2).text


@pytest.mark.slow
async def test_the_cursor_follows_keys_and_clicks_and_shows() -> None:
    async with Panes().run_test(size=(120, 40)) as pilot:
        pane = pilot.app.query_one("#patched", ProcessPane)
        pane.sort = "pid"
        pane.show([_row(pid, 1.0) for pid in range(10, 15)], NOW)
        table = pane.table
        table.focus()
        await pilot.pause()
        await pilot.press("down")
        assert table.cursor_row == 1 and pane.selected().pid == 11
        await pilot.press("up", "up")
        assert table.cursor_row == 0  # stops at the first row
        await pilot.press("end")
        assert table.cursor_row == 4
        await pilot.press("home")
        assert table.cursor_row == 0
        await pilot.click(table, offset=(3, 2))  # the second line under the header
        await pilot.pause()
        assert table.cursor_row == 1 and pane.selected().pid == 11
        # rows 1 and 3 are odd rows (same stripe), 0 and 2 even ones
        focused = _styles(table, 2)
        assert focused != _styles(table, 4) and focused != _styles(table, 1)
        pilot.app.set_focus(None)
        await pilot.pause()
        assert not table.has_focus
        blurred = _styles(table, 2)
        assert blurred != focused and blurred != _styles(table, 4) and blurred != _styles(table, 1)


@pytest.mark.slow
async def test_a_scrolled_table_keeps_its_header_and_its_cursor_in_view() -> None:
    async with Panes().run_test(size=(120, 40)) as pilot:
        pane = pilot.app.query_one("#patched", ProcessPane)
        pane.sort = "pid"
        pane.show([_row(pid, 1.0, "python " + "x" * 150) for pid in range(100, 160)], NOW)
        table = pane.table
        table.focus()
        await pilot.pause()
        header = table.render_line(0).text
        assert table.virtual_size.height == 61 and header.startswith(" stage pid user cpu% ")
        lines = table.scrollable_content_region.height
        assert lines < 61
        for keys in (["end"], ["up"] * 3, ["pageup"], ["pagedown"], ["home"], ["pagedown"]):
            await pilot.press(*keys)
            await pilot.pause()
            y = table.cursor_row + 1 - table.scroll_offset.y  # the cursor's line on screen
            assert 0 < y < lines and f" {100 + table.cursor_row} " in table.render_line(y).text
            assert table.render_line(0).text == header
        assert table.cursor_row == lines - 1  # a page down from the first row
        # the command is wider than the pane: it takes the rest of the line, cut, and nothing scrolls sideways
        assert table.render_line(1).text.rstrip().endswith("xxx…")
        assert table.virtual_size.width <= table.scrollable_content_region.width


class Follows(Static, can_focus=True):
    BINDINGS = [Binding("f", "app.count('follow')", "Follow")]


class Wraps(Static, can_focus=True):
    BINDINGS = [Binding("w", "app.count('wrap')", "Wrap")]


class FooterApp(App):
    BINDINGS = [Binding("q", "count('quit')", "Quit")]

    def __init__(self) -> None:
        super().__init__()
        self.ran: list[str] = []

    def compose(self) -> ComposeResult:
        yield Follows("follow", id="one")
        yield Wraps("wrap", id="two")
        yield KeysFooter()

    def action_count(self, what: str) -> None:
        self.ran.append(what)


async def test_the_footer_renders_only_when_its_keys_change() -> None:
    async with FooterApp().run_test(size=(80, 10)) as pilot:
        footer = pilot.app.query_one(KeysFooter)
        await pilot_until(pilot, lambda: footer.keys)
        keys = footer.keys
        assert {k[1] for k in keys} >= {"Quit", "Follow"}
        shown = str(footer.render())
        assert "q Quit" in shown and "f Follow" in shown
        pilot.app.screen.refresh_bindings()  # what a focus move or a screen resume does
        await pilot.pause()
        assert footer.keys is keys  # the same keys: not rendered again
        pilot.app.query_one("#two").focus()
        await pilot_until(pilot, lambda: footer.keys is not keys)
        descriptions = {k[1] for k in footer.keys}
        assert "Wrap" in descriptions and "Follow" not in descriptions
        first = footer.keys[0][1].lower()
        await pilot.click(KeysFooter, offset=(1, 0))  # a click on a key does what the key does
        await pilot_until(pilot, lambda: pilot.app.ran == [first])


def test_ages_tick_each_second_only_in_the_first_minute() -> None:
    from samai.console.core import units

    assert [units.age(s) for s in (None, 5, 59.9, 60, 61, 3599, 3600, 3661, 90_000)] == [
        "?", "5s", "59s", "1m", "1m", "59m", "1h00m", "1h01m", "1d01h"]


def test_a_running_stage_reads_the_same_through_a_minute() -> None:
    """Its time beside it ticks in seconds in its first minute only: an idle bar with a server up
    for hours repaints once a minute, not each second."""
    from samai.console.core.update import StageView
    from samai.widgets.stages import stage_item

    view = StageView("serve", "7", "running", NOW - 600, 4242, None, None)
    items = [stage_item(view, NOW + s) for s in range(0, 60, 7)]
    assert all(item.is_same(items[0]) for item in items) and items[0].plain.endswith("running 10m")
    fresh = StageView("train", "3", "running", NOW, 4243, None, None)
    assert stage_item(fresh, NOW + 5).plain.endswith("running 5s")
    assert not stage_item(fresh, NOW + 6).is_same(stage_item(fresh, NOW + 5))


class _PaneApp(App):
    CSS = "Pane { width: 30; }"

    def compose(self) -> ComposeResult:
        yield Pane()


async def test_a_pane_lays_out_only_when_its_height_at_its_width_changes(monkeypatch) -> None:
    app = _PaneApp()
    async with app.run_test(size=(60, 20)) as pilot:
        pane = app.query_one(Pane)
        pane.show_content(Content("a\nb"))
        await pilot.pause()
        layouts: list[bool] = []
        update = pane.update

        def spy(content, *, layout: bool = True) -> None:
            layouts.append(layout)
            update(content, layout=layout)

        monkeypatch.setattr(pane, "update", spy)
        shown = [("c\nd", False, 2), ("c\nd\ne", True, 3), ("x" * 50 + "\nd\ne", True, 4),  # it wraps at 30
                 ("y" * 50 + "\nd\ne", False, 4), ("z\nd\ne", True, 3)]
        for text, laid_out, height in shown:
            pane.show_content(Content(text))
            await pilot.pause()
            assert (layouts[-1], pane.size.height) == (laid_out, height), text
        pane.show_content(Content("z\nd\ne"))  # what it shows already: nothing at all
        assert len(layouts) == len(shown)
