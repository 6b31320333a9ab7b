"""The fleet table: one row per box (k9s's contexts), rendered from BoxRow and nothing else.

Every cell that quotes a box (its host's words in an error, a stage name, an alert's text) is
literal rich Text with its control characters as stand-ins."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual.widgets import DataTable

from samai.console.core import units
from samai.remote.safe_text import visible
from samai.widgets.keys import bindings

if TYPE_CHECKING:
    from samai.console.core.fleet import BoxRow

COLUMNS = (("box", "box"), ("connection", "connection"), ("age", "read"), ("rtt", "rtt"), ("running", "running"),
           ("disk", "disk used / peak"), ("gpu", "GPU util · memory"), ("alert", "newest alert"))
# Which columns stay when the table is narrower than them all: the first ones; the others give way
# from the end (rtt first). The alert takes the width left, at least ALERT_MIN, ellipsized.
KEPT_FIRST = ("box", "connection", "age", "alert", "running", "disk", "gpu", "rtt")
ALERT_MIN = 24
SCROLLBAR = 2  # the vertical scroll bar's columns, once the rows overflow
STATE_STYLE = {"connected": "green", "connecting": "yellow", "unreachable": "bold red", "lost": "bold red"}
SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": ""}
ALERT_CHARS = 120  # the row is one line: the alerts pane of the box's screen has the rest


def _bytes(n: int | None) -> str:
    return "?" if n is None else units.size(n)


FRESH_S = 10.0  # a row read this recently is "now": a fleet's boxes are polled every 1-6 s


def age(row: BoxRow, now: float) -> Text:
    """How long ago the row's box was last read: "now" while as fresh as its polls make it (so a
    healthy fleet's ages do not change every second), else the age, bold once a minute old."""
    if row.seen_at is None:
        return Text("—")
    seconds = max(0.0, now - row.seen_at)
    if seconds < FRESH_S:
        return Text("now", "dim")
    return Text(units.age(seconds) + " ago", "bold yellow" if seconds >= 60 else "yellow")


def cells(row: BoxRow, now: float) -> dict[str, Text]:
    """The row's cells by column key, its age as of now."""
    state = Text(row.state, STATE_STYLE.get(row.state, ""))
    disk = "" if row.disk_used is None else f"{_bytes(row.disk_used)} / {_bytes(row.disk_peak)}"
    if disk and row.disk_capacity:
        disk += f" of {_bytes(row.disk_capacity)}"
    gpu = ""
    if row.gpu_count:
        util = "?" if row.gpu_util is None else f"{row.gpu_util:.0f} %"
        gpu = f"{row.gpu_count}× {util} · {_bytes(row.gpu_memory_used)} / {_bytes(row.gpu_memory_total)}"
    alert = Text()
    if row.alert is not None:
        alert.append(row.alert.severity + " ", SEVERITY_STYLE.get(row.alert.severity, ""))
        alert.append(visible(row.alert.text)[:ALERT_CHARS])
    elif row.error and row.state != "connected":  # why it cannot be read, in the row's widest column
        alert.append(visible(row.error)[:ALERT_CHARS], "dim")
    return {"box": Text(visible(row.name), "bold"), "connection": state, "age": age(row, now),
            "rtt": Text("" if row.rtt is None else f"{row.rtt * 1000:.0f} ms"),
            "running": Text(visible(", ".join(row.running)) if row.running else "—"),
            "disk": Text(disk), "gpu": Text(gpu), "alert": alert}


def natural_widths(rows: list[dict[str, Text]]) -> dict[str, int]:
    """Each column's width to show every cell whole (its label's at least)."""
    return {key: max([len(label), *(cells[key].cell_len for cells in rows)]) for key, label in COLUMNS}


def fit(natural: dict[str, int], width: int, padding: int = 1) -> dict[str, int | None]:
    """The columns shown in `width` cells: key -> fixed width (the alert's), or None (as wide as its
    cells). A column is shown whole or not at all: KEPT_FIRST's first ones that fit, the rest give way."""
    pad = 2 * padding
    room, shown = width - SCROLLBAR, set()
    for key in KEPT_FIRST:
        need = (ALERT_MIN if key == "alert" else natural[key]) + pad
        if need > room:
            break  # this one and every less useful one give way
        shown.add(key)
        room -= need
    out: dict[str, int | None] = {key: None for key, _ in COLUMNS if key in shown}
    if "alert" in out:
        out["alert"] = min(natural["alert"], ALERT_MIN + room)
    return out


class FleetTable(DataTable):
    """Rows keyed by box name; Enter (DataTable's RowSelected) is the screen's to handle. Every
    column shown is shown whole: those that do not fit the width give way (KEPT_FIRST)."""

    DEFAULT_CSS = "FleetTable { height: 1fr; }"
    BINDINGS = bindings("fleet-rows")  # DataTable's enter, shown and named

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._cells: dict[str, dict[str, Text]] = {}  # each box's cells, in the rows' order
        self._natural: dict[str, int] = natural_widths([])
        self._shown: dict[str, int | None] = {}

    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.zebra_stripes = True
        self._lay_out()

    def on_resize(self) -> None:
        self._lay_out()

    def show(self, rows: list[BoxRow], now: float) -> None:
        for row in rows:
            self.show_row(row, now)

    def show_row(self, row: BoxRow, now: float) -> None:
        """Add the box's row, or change the cells that changed (its age as of now)."""
        new = cells(row, now)
        old = self._cells.get(row.name)
        self._cells[row.name] = new
        wider = {key: w for key, w in natural_widths([new]).items() if w > self._natural[key]}
        if wider:
            self._natural.update(wider)
            if self._lay_out():
                return  # laid out again, this row with the others
        if old is None:
            self.add_row(*(self._cell(key, new[key]) for key in self._shown), key=row.name)
            return
        for key, fixed in self._shown.items():
            if old[key] != new[key]:
                self.update_cell(row.name, key, self._cell(key, new[key]), update_width=fixed is None)

    def _cell(self, key: str, text: Text) -> Text:
        fixed = self._shown.get(key)
        if fixed is None or text.cell_len <= fixed:
            return text
        cut = text.copy()
        cut.truncate(fixed, overflow="ellipsis")
        return cut

    def _lay_out(self) -> bool:
        """Columns and rows again where the columns that fit the width changed; whether they did."""
        shown = fit(self._natural, self.size.width or 10_000, self.cell_padding)
        if shown == self._shown and self.columns:
            return False
        selected = self.coordinate_to_cell_key(self.cursor_coordinate).row_key if self.row_count else None
        self._shown = shown
        self.clear(columns=True)
        for key, label in COLUMNS:
            if key in shown:
                self.add_column(label, key=key, width=shown[key])
        for name, row in self._cells.items():
            self.add_row(*(self._cell(key, row[key]) for key in shown), key=name)
        if selected is not None and selected.value in self._cells:
            self.move_cursor(row=self.get_row_index(selected))
        return True
