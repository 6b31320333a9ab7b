"""Processes and ports: one row per process, grouped by the stage whose process group it is
in, listening ports beside their owner; sortable, filterable with `/`.

The table is its own Line API widget, not a DataTable: each poll changes a few cells (cpu%, the
ages of young processes), and DataTable re-renders a changed line from scratch (row styles, every
cell of the row formatted again through Rich): about 0.7 ms a line, most of what an idle console
spends. Here a line is a few strings in one style, kept by what it shows, and an update repaints
only the lines whose cells changed."""

from __future__ import annotations

import re
from collections.abc import Sequence

from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style
from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.cache import LRUCache
from textual.containers import Vertical
from textual.content import Content
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.widgets import Input

from samai.console.core import units
from samai.console.core.state import ProcessRow
from samai.remote.model import Process
from samai.remote.visible import visible
from samai.widgets.pane import set_subtitle

COLUMNS = ("stage", "pid", "user", "cpu%", "rss", "elapsed", "ports", "command")
SORTS = ("cpu", "rss", "pid", "elapsed")

Row = tuple[str, tuple[str, ...]]  # a row's key and its cells


def _sort_key(sort: str):
    return {
        "cpu": lambda r: -r.cpu_percent,
        "rss": lambda r: -r.process.rss,
        "pid": lambda r: r.process.pid,
        "elapsed": lambda r: r.process.start_time,
    }[sort]


class ProcessTable(ScrollView, can_focus=True):
    """Rows of text cells under a header that stays on top, with a row cursor; it looks like a
    DataTable with zebra stripes and a row cursor (the same theme variables)."""

    ALLOW_SELECT = False
    BINDINGS = [
        Binding("up", "cursor_by(-1)", "Cursor up", show=False),
        Binding("down", "cursor_by(1)", "Cursor down", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown", "page(1)", "Page down", show=False),
        Binding("home,ctrl+home", "cursor_to(0)", "First row", show=False),
        Binding("end,ctrl+end", "cursor_to(-1)", "Last row", show=False),
    ]
    COMPONENT_CLASSES = {
        "process-table--header",
        "process-table--even-row",
        "process-table--odd-row",
        "process-table--cursor",
    }
    DEFAULT_CSS = """
    ProcessTable {
        background: $surface;
        color: $foreground;
        &:focus {
            background-tint: $foreground 5%;
            & > .process-table--cursor {
                background: $block-cursor-background;
                color: $block-cursor-foreground;
                text-style: $block-cursor-text-style;
            }
            & > .process-table--header { background-tint: $foreground 5%; }
        }
        &:dark > .process-table--even-row { background: $surface-darken-1 40%; }
        & > .process-table--header { text-style: bold; background: $panel; color: $foreground; }
        &:ansi > .process-table--header { background: ansi_bright_blue; color: ansi_default; }
        & > .process-table--even-row { background: $surface-lighten-1 50%; }
        & > .process-table--cursor {
            background: $block-cursor-blurred-background;
            color: $block-cursor-blurred-foreground;
            text-style: $block-cursor-blurred-text-style;
        }
    }
    """

    def __init__(self, labels: Sequence[str], **kw) -> None:
        super().__init__(**kw)
        self._labels = tuple(labels)
        self._widths = [cell_len(label) for label in self._labels]  # only grow
        self._rows: list[Row] = []
        self._cursor = 0
        self._styles: dict[str, Style] = {}  # by look; until the theme, the focus or the CSS change
        # By cells, look, scroll x and width: a screenful and more, bounded so that the lines of ages
        # ticking by in the first minute of a process do not pile up.
        self._lines: LRUCache[tuple, Strip] = LRUCache(256)

    def on_mount(self) -> None:
        self._set_virtual_size()  # the header's

    # ------------------------------------------------------------ data

    @property
    def rows(self) -> Sequence[Row]:
        return self._rows

    @property
    def cursor_row(self) -> int:
        return self._cursor

    @property
    def cursor_key(self) -> str | None:
        return self._rows[self._cursor][0] if self._cursor < len(self._rows) else None

    @property
    def widths(self) -> list[int]:
        """Each column's width in cells, without the padding."""
        return list(self._widths)

    def index(self, key: str) -> int | None:
        return next((i for i, (k, _) in enumerate(self._rows) if k == key), None)

    def set_rows(self, rows: Sequence[Row]) -> None:
        """Show `rows`, repainting only the lines whose cells changed (a wider value: all)."""
        old, self._rows = self._rows, list(rows)
        changed = [i for i in range(max(len(old), len(rows))) if i >= len(old) or i >= len(rows)
                   or old[i][1] != rows[i][1]]
        grew = [self._grow(rows[i][1]) for i in changed if i < len(rows)]  # every row: no short cut
        if any(grew):
            self._lines.clear()
            self.refresh()
        else:
            for i in changed:
                self._refresh_row(i)
        self._set_virtual_size()
        if self._cursor >= len(rows):
            self.move_cursor(len(rows) - 1, scroll=False)

    def _grow(self, cells: tuple[str, ...]) -> bool:
        """Widen the columns to fit `cells`; True if any grew."""
        grew = False
        for i, cell in enumerate(cells):
            if (width := cell_len(cell)) > self._widths[i]:
                self._widths[i], grew = width, True
        return grew

    def _table_width(self) -> int:
        return sum(self._widths) + 2 * len(self._widths)  # a cell of padding each side

    def _set_virtual_size(self) -> None:
        size = Size(self._table_width(), len(self._rows) + 1)
        if size != self.virtual_size:  # a new size is a layout pass (and an equal one is skipped anyway)
            self.virtual_size = size

    def _refresh_row(self, row: int) -> None:
        y = row + 1  # under the header
        if 0 < y - self.scroll_offset.y < self.scrollable_content_region.height:
            self.refresh_line(y)

    # ------------------------------------------------------------ cursor

    def move_cursor(self, row: int, scroll: bool = True) -> None:
        row = max(0, min(row, len(self._rows) - 1))
        if row != self._cursor:
            old, self._cursor = self._cursor, row
            self._refresh_row(old)
            self._refresh_row(row)
        if scroll:
            self._scroll_to_row(row)

    def _scroll_to_row(self, row: int) -> None:
        """Scroll the least that shows `row` below the header."""
        lines = self.scrollable_content_region.height - 1
        if row < self.scroll_y:
            self.scroll_to(y=row, animate=False, force=True)
        elif row >= self.scroll_y + lines:
            self.scroll_to(y=row - lines + 1, animate=False, force=True)

    def action_cursor_by(self, rows: int) -> None:
        self.move_cursor(self._cursor + rows)

    def action_page(self, pages: int) -> None:
        self.move_cursor(self._cursor + pages * max(1, self.scrollable_content_region.height - 1))

    def action_cursor_to(self, row: int) -> None:
        self.move_cursor(row if row >= 0 else len(self._rows) + row)

    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)
        if offset is not None and offset.y > 0 and (row := offset.y - 1 + self.scroll_offset.y) < len(self._rows):
            self.move_cursor(row)

    # ------------------------------------------------------------ painting

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._restyle()

    def on_focus(self) -> None:
        self._restyle()  # also where CSS restyles only the cursor on focus: no style update then

    def on_blur(self) -> None:
        self._restyle()

    def _restyle(self) -> None:
        self._styles.clear()
        self._lines.clear()
        self.refresh()

    def _style(self, look: str) -> Style:
        """The style of a look ("header", "even", "cursor-odd", ...), as DataTable combines them."""
        if not self._styles:
            component = self.get_component_rich_style
            cursor = component("process-table--cursor")
            even, odd = component("process-table--even-row"), component("process-table--odd-row")
            self._styles = {"base": self.rich_style, "header": component("process-table--header"), "even": even,
                            "odd": odd, "cursor-even": even + cursor, "cursor-odd": odd + cursor}
        return self._styles[look]

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        width = self.size.width
        row = y + scroll_y - 1
        if y == 0:
            cells, look = self._labels, "header"
        elif row < len(self._rows):
            cells = self._rows[row][1]
            look = ("cursor-" if row == self._cursor else "") + ("odd" if row % 2 else "even")
        else:
            return Strip.blank(width, self._style("base"))
        key = (cells, look, scroll_x, width)
        line = self._lines.get(key)
        if line is None:
            line = self._lines[key] = self._render(cells, self._style(look), scroll_x, width)
        return line

    def _render(self, cells: tuple[str, ...], style: Style, scroll_x: int, line_width: int) -> Strip:
        """One segment a cell, padded as DataTable pads, then the row's style to the right edge."""
        segments = [Segment(f" {cell}{' ' * (width - cell_len(cell))} ", style)
                    for cell, width in zip(cells, self._widths, strict=True)]
        table_width = self._table_width()
        if line_width > table_width:
            segments.append(Segment(" " * (line_width - table_width), style))
        strip = Strip(segments, max(line_width, table_width))  # its length known: not measured again
        return strip.crop(scroll_x, scroll_x + line_width).adjust_cell_length(line_width, self._style("base"))


class ProcessPane(Vertical):
    DEFAULT_CSS = """
    ProcessPane { height: 1fr; }
    ProcessPane ProcessTable { height: 1fr; }
    ProcessPane Input { display: none; height: 3; }
    ProcessPane.-filtering Input { display: block; }
    """
    BINDINGS = [
        Binding("slash", "filter", "Filter", id="processes.filter"),
        Binding("S", "cycle_sort", "Sort", id="processes.sort"),
        Binding("a", "toggle_all", "All/kernel", id="processes.all"),
    ]

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.rows: list[ProcessRow] = []
        self.sort = "cpu"
        self.show_kernel = False
        self.pattern: re.Pattern | None = None
        self.now = 0.0

    def compose(self) -> ComposeResult:
        yield ProcessTable(COLUMNS)
        yield Input(placeholder="filter processes (regex on command/user/stage; Enter applies, Esc clears)")

    @property
    def table(self) -> ProcessTable:
        return self.query_one(ProcessTable)

    def show(self, rows: list[ProcessRow], now: float) -> None:
        self.rows, self.now = rows, now
        self._render_rows()

    def selected(self) -> Process | None:
        key = self.table.cursor_key
        return next((r.process for r in self.rows if _key(r.process) == key), None) if key else None

    def visible(self) -> list[ProcessRow]:
        rows = [r for r in self.rows if self.show_kernel or r.process.argv]
        if self.pattern:
            # matched against the text as shown (control characters as their stand-ins)
            rows = [r for r in rows
                    if self.pattern.search(f"{r.stage or ''} {visible(r.process.user)} {visible(r.process.command)}")]
        by = _sort_key(self.sort)
        return sorted(rows, key=lambda r: (r.stage is None, r.stage or "", by(r)))

    def _render_rows(self) -> None:
        rows = self.visible()
        keep = self.selected()
        self.table.set_rows([(_key(r.process), self._cells(r)) for r in rows])
        self._select(keep)
        set_subtitle(self, f"{len(rows)} shown · sort {self.sort}" + (" · filtered" if self.pattern else ""))

    def _cells(self, r: ProcessRow) -> tuple[str, ...]:
        """The row's text; a user name or a command line is anyone's: control characters as stand-ins
        (the table paints cells as plain segments, so markup in them is never parsed)."""
        p = r.process
        return (r.stage or "", str(p.pid), visible(p.user[:10]), f"{r.cpu_percent:.1f}", units.size(p.rss),
                units.age(self.now - p.start_time), ",".join(map(str, r.ports)), visible(p.command[:200]))

    def _select(self, process: Process | None) -> None:
        """Put the cursor back on the process it was on, else on the first row."""
        row = self.table.index(_key(process)) if process else None
        self.table.move_cursor(row or 0, scroll=False)

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
            self.query_one(Input).border_title = Content(visible(f"bad regex: {e}"))  # it quotes the pattern
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


def _key(p: Process) -> str:
    return f"{p.pid}:{p.start_time}"
