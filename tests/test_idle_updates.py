"""An idle poll does as little as it can: panes handed what they show do nothing, the processes
table changes only the rows and cells that changed. What is shown must still follow the data."""

from __future__ import annotations

from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.coordinate import Coordinate
from textual.widgets import Static
from textual.widgets._footer import FooterKey

from samai.console.state import EvalRun, ProcessRow
from samai.remote.model import Process
from samai.widgets.evals import EvalTable
from samai.widgets.footer import KeysFooter
from samai.widgets.processes import COLUMNS, ProcessPane
from samai.widgets.stages import StagesBar
from samai.widgets.status import Connection, StatusBar

NOW = 1_000_000.0


def _row(pid: int, cpu: float, command: str = "python train.py", started: float = NOW - 90) -> ProcessRow:
    p = Process(pid, 1, pid, pid, "root", started, "S", 1.0, cpu, 50_000_000, "python", tuple(command.split()))
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
    return [table.render_line(y).text for y in range(table.row_count + 1)]


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
        assert table.get_row_at(0)[0] == "r2" and table.border_subtitle == "2 runs"


async def test_an_unchanged_poll_leaves_the_process_table_alone(monkeypatch) -> None:
    async with Panes().run_test(size=(120, 40)) as pilot:
        pane = pilot.app.query_one("#patched", ProcessPane)
        rows = [_row(10, 5.0), _row(11, 1.0)]
        pane.show(rows, NOW)
        await pilot.pause()
        table = pane.table
        touched = [_calls(monkeypatch, table, name) for name in
                   ("clear", "add_row", "remove_row", "update_cell", "sort", "refresh")]
        pane.show([_row(10, 5.0), _row(11, 1.0)], NOW)
        await pilot.pause()
        assert touched == [[]] * len(touched)


async def test_the_process_table_changed_in_place_shows_what_a_rebuild_shows(monkeypatch) -> None:
    async with Panes().run_test(size=(120, 40)) as pilot:
        patched = pilot.app.query_one("#patched", ProcessPane)
        fresh = pilot.app.query_one("#fresh", ProcessPane)
        patched.show([_row(10, 5.0), _row(11, 1.0), _row(12, 0.0)], NOW)
        await pilot.pause()
        patched.table.move_cursor(row=1)  # on 11
        clears = _calls(monkeypatch, patched.table, "clear")
        # 12 is gone, 13 is new, 11 now uses the most CPU, every elapsed time moved on.
        later = [_row(10, 0.5), _row(11, 7.0), _row(13, 2.0, "bash")]
        patched.show(later, NOW + 65)
        fresh.show(later, NOW + 65)
        await pilot.pause()
        assert clears == []  # changed row by row, not rebuilt
        assert [patched.table.get_row_at(i) for i in range(3)] == [fresh.table.get_row_at(i) for i in range(3)]
        assert patched.table.get_row_at(0)[1] == "11" and patched.table.get_row_at(0)[5] == "2m"
        assert patched.selected().pid == 11  # the cursor stayed on its process
        assert _shown(patched) == _shown(fresh)


async def test_a_value_wider_than_its_column_widens_it_as_before(monkeypatch) -> None:
    async with Panes().run_test(size=(120, 40)) as pilot:
        pane = pilot.app.query_one("#patched", ProcessPane)
        pane.show([_row(10, 5.0)], NOW)
        await pilot.pause()
        user = pane.table.columns[pane._columns[COLUMNS.index("user")]]
        cpu = pane.table.columns[pane._columns[COLUMNS.index("cpu%")]]
        narrow = cpu.content_width
        pane.show([_row(10, 100.0)], NOW)
        await pilot.pause()
        assert cpu.content_width > narrow and pane.table.get_row_at(0)[3] == "100.0"
        pane.show([_row(10, 5.0)], NOW)
        await pilot.pause()
        assert cpu.content_width == len("100.0") and user.content_width == len("user")  # columns only grow


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
        assert [s.style for s in pane.table.render_line(2)] != [s.style for s in after]


class Focusable(Static, can_focus=True):
    def __init__(self, key: str, description: str, **kw) -> None:
        super().__init__(description, **kw)
        self._bindings.bind(key, "app.bell", description)


class FooterApp(App):
    BINDINGS = [Binding("q", "quit", "Quit")]

    def compose(self) -> ComposeResult:
        yield Focusable("f", "Follow", id="one")
        yield Focusable("w", "Wrap", id="two")
        yield KeysFooter()


def _keys(app: App) -> list[FooterKey]:
    return list(app.query(FooterKey))


async def test_the_footer_recomposes_only_when_its_keys_change() -> None:
    async with FooterApp().run_test(size=(80, 10)) as pilot:
        await pilot.pause()
        keys = _keys(pilot.app)
        assert {k.description for k in keys} >= {"Quit", "Follow"}
        pilot.app.screen.refresh_bindings()  # what a focus move or a screen resume does
        await pilot.pause()
        assert _keys(pilot.app) == keys  # the same widgets: not composed again
        pilot.app.query_one("#two").focus()
        await pilot.pause()
        descriptions = {k.description for k in _keys(pilot.app)}
        assert "Wrap" in descriptions and "Follow" not in descriptions


def test_ages_tick_each_second_only_in_the_first_minute() -> None:
    from samai.console import units

    assert [units.age(s) for s in (None, 5, 59.9, 60, 61, 3599, 3600, 3661, 90_000)] == [
        "?", "5s", "59s", "1m", "1m", "59m", "1h00m", "1h01m", "1d01h"]


async def test_a_changed_cell_repaints_itself_only(monkeypatch) -> None:
    async with Panes().run_test(size=(120, 40)) as pilot:
        pane = pilot.app.query_one("#patched", ProcessPane)
        pane.sort = "pid"  # a new cpu% then moves no row
        pane.show([_row(10, 5.0), _row(11, 1.0), _row(12, 0.0)], NOW)
        await pilot.pause()
        refreshes = _calls(monkeypatch, pane.table, "refresh")
        pane.show([_row(10, 5.0), _row(11, 3.0), _row(12, 0.0)], NOW)
        await pilot.pause()
        assert refreshes and all(regions for regions in refreshes)  # regions, never the whole table
        cpu = pane.table._get_cell_region(Coordinate(1, COLUMNS.index("cpu%")))
        assert {region for (region,) in refreshes} == {cpu.translate(-pane.table.scroll_offset)}
        assert pane.table.get_row_at(1)[3] == "3.0"
