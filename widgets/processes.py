"""Processes and ports: one row per process, grouped by the stage whose process group it is
in, listening ports beside their owner; sortable, filterable with `/`."""

from __future__ import annotations

import re

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import DataTable, Input

from samai.console import units
from samai.console.state import ProcessRow
from samai.remote.model import Process

COLUMNS = ("stage", "pid", "user", "cpu%", "rss", "elapsed", "ports", "command")
SORTS = ("cpu", "rss", "pid", "elapsed")


def _sort_key(sort: str):
    return {
        "cpu": lambda r: -r.cpu_percent,
        "rss": lambda r: -r.process.rss,
        "pid": lambda r: r.process.pid,
        "elapsed": lambda r: r.process.start_time,
    }[sort]


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
        self._keys: list[str] = []

    def compose(self) -> ComposeResult:
        table = DataTable(cursor_type="row", zebra_stripes=True)
        table.add_columns(*COLUMNS)
        yield table
        yield Input(placeholder="filter processes (regex on command/user/stage; Enter applies, Esc clears)")

    @property
    def table(self) -> DataTable:
        return self.query_one(DataTable)

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
        table = self.table
        keep = self.selected()
        rows = self.visible()
        table.clear()
        self._keys = []
        for r in rows:
            p = r.process
            table.add_row(r.stage or "", str(p.pid), p.user[:10], f"{r.cpu_percent:.1f}", units.size(p.rss),
                          units.duration(self.now - p.start_time), ",".join(map(str, r.ports)), p.command[:200],
                          key=_key(r))
            self._keys.append(_key(r))
        if keep:
            key = f"{keep.pid}:{keep.start_time}"
            if key in self._keys:
                table.move_cursor(row=self._keys.index(key), animate=False, scroll=False)
        self.border_subtitle = f"{len(rows)} shown · sort {self.sort}" + (" · filtered" if self.pattern else "")

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
