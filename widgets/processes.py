"""Processes and ports: one row per process, grouped by the stage whose process group it is
in, listening ports beside their owner; sortable, filterable with `/`. The command is the column
that matters: it takes the rest of the width (the others are short, and `user` goes when the pane
is narrow), and the selected row's whole command line is shown under the table.

The table is its own Line API widget, not a DataTable: each poll changes a few cells (cpu%, the
ages of young processes), and DataTable re-renders a changed line from scratch (row styles, every
cell of the row formatted again through Rich): about 0.7 ms a line, most of what an idle console
spends. Here a line is a few strings in one style, kept by what it shows, and an update repaints
only the lines whose cells changed."""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache
from typing import TYPE_CHECKING

from rich.cells import cell_len, set_cell_size
from rich.segment import Segment
from rich.style import Style
from textual import events, on
from textual.app import ComposeResult
from textual.cache import LRUCache
from textual.containers import Vertical
from textual.content import Content
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.widgets import Input

from samai.console.core import units
from samai.console.core.redact import redact
from samai.remote.safe_text import visible
from samai.widgets.keys import bindings
from samai.widgets.pane import Pane, set_subtitle

if TYPE_CHECKING:
    from samai.console.core.update import ProcessRow, StateUpdate
    from samai.remote.model import GpuReading, Process

COLUMNS = ("stage", "pid", "user", "cpu%", "rss", "age", "ports", "command")
GPU_COLUMNS = ("stage", "pid", "user", "cpu%", "rss", "gpu", "age", "ports", "command")  # on a box with GPUs
SORTS = ("cpu", "rss", "pid", "age")  # named as the columns are
CAPS = {"stage": 8, "user": 8, "ports": 11}  # longer values are cut (the detail strip shows them whole)
DROP_WHEN_NARROW = ("user",)  # columns left out when the command would get fewer than WANT_COMMAND cells
WANT_COMMAND = 24
MIN_COMMAND = 12  # narrower than this, the table scrolls sideways

Row = tuple[str, tuple[str, ...]]  # a row's key and its cells


def _sort_key(sort: str):
    return {
        "cpu": lambda r: -r.cpu_percent,
        "rss": lambda r: -r.process.rss,
        "pid": lambda r: r.process.pid,
        "age": lambda r: r.process.start_time,
    }[sort]


class ProcessTable(ScrollView, can_focus=True):
    """Rows of text cells under a header that stays on top, with a row cursor; it looks like a
    DataTable with zebra stripes and a row cursor (the same theme variables)."""

    ALLOW_SELECT = False
    BINDINGS = bindings("process-rows")
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

    class CursorMoved(Message):
        """The cursor is on another row."""

    def __init__(self, labels: Sequence[str], drop: Sequence[str] = (), want_last: int = 1, min_last: int = 1,
                 **kw) -> None:
        """The last column takes the width the others leave (at least `min_last` cells); the
        columns named in `drop` are left out while it would get less than `want_last`."""
        super().__init__(**kw)
        self._labels = tuple(labels)
        self._drop_names = tuple(drop)
        self._drop = tuple(i for i, label in enumerate(self._labels) if label in drop)
        self._want_last, self._min_last = want_last, min_last
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
    def labels(self) -> tuple[str, ...]:
        return self._labels

    @property
    def widths(self) -> list[int]:
        """Each column's width in cells, without the padding."""
        return list(self._widths)

    def set_labels(self, labels: Sequence[str]) -> None:
        """Other columns (rows follow with `set_rows`): the widths start again from the labels."""
        labels = tuple(labels)
        if labels == self._labels:
            return
        self._labels, self._rows = labels, []
        self._drop = tuple(i for i, label in enumerate(labels) if label in self._drop_names)
        self._widths = [cell_len(label) for label in labels]
        self._lines.clear()
        self._set_virtual_size()
        self.refresh()

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

    def _fixed_width(self, columns: Sequence[int]) -> int:
        """The cells taken by `columns` but the last, each after a space, and the space before the last."""
        return sum(self._widths[i] + 1 for i in columns[:-1]) + 1

    def columns(self, line_width: int) -> tuple[list[int], int]:
        """The columns shown in a line of `line_width` cells, and the width of the last one."""
        shown = list(range(len(self._labels)))
        if line_width - self._fixed_width(shown) < self._want_last:
            shown = [i for i in shown if i not in self._drop]
        return shown, max(self._min_last, line_width - self._fixed_width(shown))

    def _set_virtual_size(self) -> None:
        # as wide as the narrowest layout: scrolled sideways only when even that does not fit
        shown = [i for i in range(len(self._labels)) if i not in self._drop]
        size = Size(self._fixed_width(shown) + self._min_last, len(self._rows) + 1)
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
            self.post_message(self.CursorMoved())
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
            line = self._lines[key] = self._paint_line(cells, self._style(look), scroll_x, width)
        return line

    def _paint_line(self, cells: tuple[str, ...], style: Style, scroll_x: int, line_width: int) -> Strip:
        """One segment a cell after a space, the last one cut (with an ellipsis) or padded to the
        right edge, all in the row's style."""
        shown, last_width = self.columns(line_width)
        segments = [Segment(f" {cells[i]}{' ' * (self._widths[i] - cell_len(cells[i]))}", style) for i in shown[:-1]]
        segments.append(Segment(" " + _fit(cells[shown[-1]], last_width), style))
        table_width = self._fixed_width(shown) + last_width
        strip = Strip(segments, table_width)  # its length known: not measured again
        return strip.crop(scroll_x, scroll_x + line_width).adjust_cell_length(line_width, self._style("base"))


@lru_cache(maxsize=1024)
def shown_command(command: str) -> str:
    """A command line as the pane shows it: no secret in it (anyone's argv may carry a token), its
    control characters as stand-ins. Cached: a box's command lines change little between polls."""
    return visible(redact(command))


def _fit(text: str, width: int) -> str:
    """text in exactly `width` cells: padded, or cut with an ellipsis at the end."""
    if cell_len(text) <= width:
        return set_cell_size(text, width)
    return set_cell_size(text, width - 1) + "…"


class ProcessDetail(Pane):
    """The selected process in full: its whole command line (two lines of it), pid, user, ports."""

    DEFAULT_CSS = "ProcessDetail { height: 2; padding: 0 1; background: $panel; color: $foreground 85%; }"

    def show_process(self, row: ProcessRow | None, gpu_memory: int | None = None) -> None:
        if row is None:
            self.show_content(Content("no process selected"), layout=False)
            return
        p = row.process
        ports = f" · ports {','.join(map(str, row.ports))}" if row.ports else ""
        gpu = f" · GPU memory {units.size(gpu_memory)}" if gpu_memory else ""
        # The command first, where a long one still fits; the box's words: literal text, control
        # characters as stand-ins, no secrets.
        self.show_content(Content.assemble(shown_command(p.command), ("  · pid ", "$foreground 60%"),
                                           (str(p.pid), "bold"), ("  · ", "$foreground 60%"), visible(p.user),
                                           (ports, "$accent"), (gpu, "$accent")),
                          layout=False)


class ProcessPane(Vertical):
    DEFAULT_CSS = """
    ProcessPane { height: 1fr; }
    ProcessPane ProcessTable { height: 1fr; }
    ProcessPane ProcessDetail { height: 2; }
    ProcessPane Input { display: none; height: 3; }
    ProcessPane.-filtering Input { display: block; }
    """
    BINDINGS = bindings("processes")

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.rows: list[ProcessRow] = []
        self.sort = "cpu"
        self.show_kernel = False
        self.pattern: re.Pattern | None = None
        self.now = 0.0
        self.gpu_memory: dict[int, int] | None = None  # pid -> bytes over every GPU; None: a box without GPUs

    def compose(self) -> ComposeResult:
        yield ProcessTable(COLUMNS, drop=DROP_WHEN_NARROW, want_last=WANT_COMMAND, min_last=MIN_COMMAND)
        yield ProcessDetail()
        yield Input(placeholder="filter processes (regex on command/user/stage; Enter applies, Esc clears)")

    @property
    def table(self) -> ProcessTable:
        return self.query_one(ProcessTable)

    def show_update(self, update: StateUpdate) -> None:
        self.show(update.processes, update.snapshot.time, update.snapshot.gpus)

    def show(self, rows: list[ProcessRow], now: float, gpus: GpuReading | None = None) -> None:
        """gpus: the box's GPU reading; with GPUs, each process's GPU memory is a column."""
        self.rows, self.now = rows, now
        self.gpu_memory = gpus.holders() if gpus is not None and gpus.gpus else None
        self._show_rows()

    def selected(self) -> Process | None:
        row = self._selected_row()
        return row.process if row else None

    def _selected_row(self) -> ProcessRow | None:
        key = self.table.cursor_key
        return next((r for r in self.rows if _key(r.process) == key), None) if key else None

    def shown_rows(self) -> list[ProcessRow]:
        """The rows the table shows, in its order: kernel threads and the filter applied."""
        rows = [r for r in self.rows if self.show_kernel or r.process.argv]
        if self.pattern:
            # matched against the text as shown (control characters as their stand-ins, no secrets)
            rows = [r for r in rows if self.pattern.search(
                f"{r.stage or ''} {visible(r.process.user)} {shown_command(r.process.command)}")]
        by = _sort_key(self.sort)
        return sorted(rows, key=lambda r: (r.stage is None, r.stage or "", by(r)))

    def _show_rows(self) -> None:
        rows = self.shown_rows()
        keep = self.selected()
        self.table.set_labels(COLUMNS if self.gpu_memory is None else GPU_COLUMNS)
        self.table.set_rows([(_key(r.process), self._cells(r)) for r in rows])
        self._select(keep)
        self._show_detail()
        set_subtitle(self, f"{len(rows)} shown · sort {self.sort}" + (" · filtered" if self.pattern else "")
                     + self._gpu_by_stage())

    def _gpu_by_stage(self) -> str:
        """GPU memory summed per stage (processes of no stage as `other`), for the subtitle."""
        if not self.gpu_memory:
            return ""
        sums: dict[str, int] = {}
        for r in self.rows:
            if held := self.gpu_memory.get(r.process.pid):
                sums[r.stage or "other"] = sums.get(r.stage or "other", 0) + held
        # the stage names are the config's; `other` last
        return "".join(f" · {name} {_short_size(n)} GPU" for name, n in sorted(sums.items(), key=lambda kv: (
            kv[0] == "other", kv[0])))

    def _cells(self, r: ProcessRow) -> tuple[str, ...]:
        """The row's text; a user name or a command line is anyone's: control characters as stand-ins
        (the table paints cells as plain segments, so markup in them is never parsed)."""
        p = r.process
        gpu = () if self.gpu_memory is None else (
            _short_size(self.gpu_memory[p.pid]) if p.pid in self.gpu_memory else "",)
        return (_cap(r.stage or "", "stage"), str(p.pid), _cap(visible(p.user), "user"), f"{r.cpu_percent:.1f}",
                _short_size(p.rss), *gpu, units.age(self.now - p.start_time),
                _cap(",".join(map(str, r.ports)), "ports"), shown_command(p.command)[:400])

    @on(ProcessTable.CursorMoved)
    def _show_detail(self) -> None:
        row = self._selected_row()
        held = self.gpu_memory.get(row.process.pid) if row is not None and self.gpu_memory else None
        self.query_one(ProcessDetail).show_process(row, held)

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
        self._show_rows()

    def action_toggle_all(self) -> None:
        self.show_kernel = not self.show_kernel
        self._show_rows()

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
        self._show_rows()

    def on_key(self, event) -> None:
        if event.key == "escape" and self.has_class("-filtering"):
            event.stop()
            self.query_one(Input).value = ""
            self.pattern = None
            self.remove_class("-filtering")
            self.table.focus()
            self._show_rows()


def _key(p: Process) -> str:
    return f"{p.pid}:{p.start_time}"


def _cap(text: str, column: str) -> str:
    width = CAPS[column]
    return text if cell_len(text) <= width else set_cell_size(text, width - 1) + "…"


def _short_size(n: int) -> str:
    """A size in at most 5 cells, as top shows it: 0.8K, 3.0M, 420M, 1.2G."""
    value = max(n, 0) / 1000
    for unit in "KMGT":
        if value < 9.95:
            return f"{value:.1f}{unit}"
        if value < 999.5 or unit == "T":
            return f"{value:.0f}{unit}"
        value /= 1000
    return "?"
