"""Processes and ports: one row per process, grouped by the stage whose process group it is
in, listening ports beside their owner; sortable, filterable with `/`."""

from __future__ import annotations

import re

from rich.cells import cell_len
from textual import on
from textual._styles_cache import StylesCache
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.coordinate import Coordinate
from textual.message import Message
from textual.widgets import DataTable, Input
from textual.widgets.data_table import RowKey

from samai.console import units
from samai.console.state import ProcessRow
from samai.remote.model import Process
from samai.widgets.pane import set_subtitle

COLUMNS = ("stage", "pid", "user", "cpu%", "rss", "elapsed", "ports", "command")
SORTS = ("cpu", "rss", "pid", "elapsed")


def _sort_key(sort: str):
    return {
        "cpu": lambda r: -r.cpu_percent,
        "rss": lambda r: -r.process.rss,
        "pid": lambda r: r.process.pid,
        "elapsed": lambda r: r.process.start_time,
    }[sort]


class ProcessTable(DataTable):
    """The processes pane's table. DataTable keys all it renders by a count of updates: one
    changed cell and it renders every visible line and cell anew (with a few cpu% values
    changing each poll, most of what an idle console does), and what it rendered before stays
    in its caches, never used again, until they fill. This one keeps each rendered line and
    cell by what decides its look, and `updated` lets go of what is no longer shown."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self._kept_now: dict[tuple, object] = {}  # rendered lines and cells used since the last update
        self._kept_before: dict[tuple, object] = {}  # and between the two updates before

    def updated(self) -> None:
        """Call after each batch of changes to the rows."""
        styles_cache = self._styles_cache  # what is on screen: repainted where refreshed, kept elsewhere
        self._styles_cache = StylesCache()
        self._clear_caches()  # DataTable's own: keyed by the count of updates, never hit again
        self._styles_cache = styles_cache
        self._kept_before, self._kept_now = self._kept_now, {}

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._kept_now, self._kept_before = {}, {}  # a theme or focus change: everything looks different

    def set_cells(self, changes) -> None:
        """update_cell for each (row key, column key, value), with the widths as they are, repainting
        only the cells that changed (update_cell repaints the whole table for each cell)."""
        cells = []
        for key, column, value in changes:
            row_key = RowKey(key)
            self._data[row_key][column] = value
            cells.append(Coordinate(self._row_locations.get(row_key), self._column_locations.get(column)))
        self._update_count += 1
        for cell in cells:
            self.refresh_coordinate(cell)

    def _kept(self, key: tuple, render):
        found = self._kept_now.get(key)
        if found is None:
            found = self._kept_before.get(key)
            if found is None:
                found = render()
            self._kept_now[key] = found
        return found

    def _render_line(self, y: int, x1: int, x2: int, base_style):
        try:
            row_key, _ = self._get_offsets(y)
            cells = tuple(self._data[row_key].values())
        except LookupError:  # the header, or below the last row
            return super()._render_line(y, x1, x2, base_style)
        key = ("line", y, x1, x2, self.size.width, row_key, cells,
               tuple(column.get_render_width(self) for column in self.ordered_columns), base_style,
               self.cursor_coordinate, self.hover_coordinate, self.cursor_type, self._show_hover_cursor,
               self.show_cursor, self._pseudo_class_state)
        return self._kept(key, lambda: super(ProcessTable, self)._render_line(y, x1, x2, base_style))

    def _render_cell(self, row_index: int, column_index: int, base_style, width: int, cursor: bool = False,
                     hover: bool = False):
        if row_index < 0 or column_index < 0:  # the header: a few cells, left to DataTable
            return super()._render_cell(row_index, column_index, base_style, width, cursor, hover)
        key = ("cell", row_index, column_index, self.get_cell_at(Coordinate(row_index, column_index)), base_style,
               width, cursor, hover, self.show_cursor, self.cell_padding, self._pseudo_class_state)
        return self._kept(key, lambda: super(ProcessTable, self)._render_cell(row_index, column_index, base_style,
                                                                              width, cursor, hover))


class ProcessPane(Vertical):
    DEFAULT_CSS = """
    ProcessPane { height: 1fr; }
    ProcessPane DataTable { height: 1fr; }
    ProcessPane Input { display: none; height: 3; }
    ProcessPane.-filtering Input { display: block; }
    """
    BINDINGS = [
        Binding("slash", "filter", "Filter", id="processes.filter"),
        Binding("S", "cycle_sort", "Sort", id="processes.sort"),
        Binding("a", "toggle_all", "All/kernel", id="processes.all"),
    ]

    class Selected(Message):
        def __init__(self, process: Process | None) -> None:
            super().__init__()
            self.process = process

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.rows: list[ProcessRow] = []
        self.sort = "cpu"
        self.show_kernel = False
        self.pattern: re.Pattern | None = None
        self.now = 0.0
        self._keys: list[str] = []  # the rows' keys, in the table's order
        self._shown: dict[str, tuple[str, ...]] = {}  # each row's cells, by key
        self._columns: list = []

    def compose(self) -> ComposeResult:
        table = ProcessTable(cursor_type="row", zebra_stripes=True)
        self._columns = table.add_columns(*COLUMNS)
        yield table
        yield Input(placeholder="filter processes (regex on command/user/stage; Enter applies, Esc clears)")

    @property
    def table(self) -> ProcessTable:
        return self.query_one(ProcessTable)

    def show(self, rows: list[ProcessRow], now: float) -> None:
        self.rows, self.now = rows, now
        self._render_rows()

    def selected(self) -> Process | None:
        table = self.table
        if not self._keys or table.cursor_row < 0 or table.cursor_row >= len(self._keys):
            return None
        key = self._keys[table.cursor_row]
        return next((r.process for r in self.rows if _key(r) == key), None)

    def visible(self) -> list[ProcessRow]:
        rows = [r for r in self.rows if self.show_kernel or r.process.argv]
        if self.pattern:
            rows = [r for r in rows if self.pattern.search(f"{r.stage or ''} {r.process.user} {r.process.command}")]
        by = _sort_key(self.sort)
        return sorted(rows, key=lambda r: (r.stage is None, r.stage or "", by(r)))

    def _render_rows(self) -> None:
        rows = self.visible()
        shown = {_key(r): self._cells(r) for r in rows}
        if not self._patch(shown):
            self._rebuild(shown)
        self._shown = shown
        set_subtitle(self, f"{len(rows)} shown · sort {self.sort}" + (" · filtered" if self.pattern else ""))

    def _cells(self, r: ProcessRow) -> tuple[str, ...]:
        p = r.process
        return (r.stage or "", str(p.pid), p.user[:10], f"{r.cpu_percent:.1f}", units.size(p.rss),
                units.age(self.now - p.start_time), ",".join(map(str, r.ports)), p.command[:200])

    def _patch(self, shown: dict[str, tuple[str, ...]]) -> bool:
        """Bring the table to `shown` row by row: remove the processes that are gone, add the new
        ones, change only the cells that differ, then put the rows in order. A poll changes a few
        cpu% and elapsed values; a rebuild would measure every cell again and repaint the table,
        its scroll bars and the layout. False where this cannot give what a rebuild would: a
        value wider than its column (a rebuild widens it; columns only grow)."""
        table = self.table
        old = self._shown
        changes = [(key, column, new) for key, cells in shown.items() if key in old
                   for column, new, was in zip(self._columns, cells, old[key], strict=True) if new != was]
        if any(cell_len(new) > table.columns[column].content_width for _, column, new in changes):
            return False
        order = {cells[1]: i for i, cells in enumerate(shown.values())}  # by pid, unique among live processes
        if len(order) != len(shown):
            return False
        if not changes and list(shown) == self._keys:
            return True  # nothing to do: no repaint
        keep = self.selected()
        for key in old.keys() - shown.keys():
            table.remove_row(key)
        for key, cells in shown.items():
            if key not in old:
                table.add_row(*cells, key=key)
        table.set_cells(changes)
        if list(shown) != self._keys:
            table.sort(self._columns[1], key=order.__getitem__)
            self._keys = list(shown)
            self._select(keep)
        table.updated()
        return True

    def _rebuild(self, shown: dict[str, tuple[str, ...]]) -> None:
        table = self.table
        keep = self.selected()
        table.clear()
        for key, cells in shown.items():
            table.add_row(*cells, key=key)
        self._keys = list(shown)
        self._select(keep)
        table.updated()

    def _select(self, process: Process | None) -> None:
        """Put the cursor back on the process it was on, else on the first row."""
        key = f"{process.pid}:{process.start_time}" if process else None
        row = self._keys.index(key) if key in self._keys else 0
        if row != self.table.cursor_row:
            self.table.move_cursor(row=row, animate=False, scroll=False)

    # ------------------------------------------------------------ keys

    def action_filter(self) -> None:
        self.add_class("-filtering")
        self.query_one(Input).focus()

    def action_cycle_sort(self) -> None:
        self.sort = SORTS[(SORTS.index(self.sort) + 1) % len(SORTS)]
        self._render_rows()

    def action_toggle_all(self) -> None:
        self.show_kernel = not self.show_kernel
        self._render_rows()

    @on(Input.Submitted)
    def _apply_filter(self, event: Input.Submitted) -> None:
        event.stop()
        text = event.value.strip()
        try:
            self.pattern = re.compile(text, 0 if any(c.isupper() for c in text) else re.I) if text else None
        except re.error as e:
            self.query_one(Input).border_title = f"bad regex: {e}"
            return
        self.remove_class("-filtering")
        self.table.focus()
        self._render_rows()

    def on_key(self, event) -> None:
        if event.key == "escape" and self.has_class("-filtering"):
            event.stop()
            self.query_one(Input).value = ""
            self.pattern = None
            self.remove_class("-filtering")
            self.table.focus()
            self._render_rows()


def _key(r: ProcessRow) -> str:
    return f"{r.process.pid}:{r.process.start_time}"
