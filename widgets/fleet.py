"""The fleet table: one row per box (k9s's contexts), rendered from BoxRow and nothing else.

Every cell that quotes a box (its host's words in an error, a stage name, an alert's text) is
literal rich Text with its control characters as stand-ins."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text
from textual.widgets import DataTable

from samai.console.core import units
from samai.remote.safe_text import visible
from samai.widgets.keys import bindings

if TYPE_CHECKING:
    from samai.console.core.fleet import BoxRow

COLUMNS = (("box", "box"), ("connection", "connection"), ("rtt", "rtt"), ("running", "running"),
           ("disk", "disk used / peak"), ("gpu", "GPU util · memory"), ("alert", "newest alert"))
STATE_STYLE = {"connected": "green", "connecting": "yellow", "unreachable": "bold red", "lost": "bold red"}
SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": ""}
ALERT_CHARS = 120  # the row is one line: the alerts pane of the box's screen has the rest


def _bytes(n: int | None) -> str:
    return "?" if n is None else units.size(n)


def cells(row: BoxRow) -> dict[str, Text]:
    """The row's cells by column key."""
    state = Text(row.state, STATE_STYLE.get(row.state, ""))
    if row.error and row.state != "connected":
        state.append(": " + visible(row.error[:60]), "dim")
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
    return {"box": Text(visible(row.name), "bold"), "connection": state,
            "rtt": Text("" if row.rtt is None else f"{row.rtt * 1000:.0f} ms"),
            "running": Text(visible(", ".join(row.running)) if row.running else "—"),
            "disk": Text(disk), "gpu": Text(gpu), "alert": alert}


class FleetTable(DataTable):
    """Rows keyed by box name; Enter (DataTable's RowSelected) is the screen's to handle."""

    DEFAULT_CSS = "FleetTable { height: 1fr; }"
    BINDINGS = bindings("fleet-rows")  # DataTable's enter, shown and named

    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.zebra_stripes = True
        for key, label in COLUMNS:
            self.add_column(label, key=key)

    def show(self, rows: list[BoxRow]) -> None:
        for row in rows:
            self.show_row(row)

    def show_row(self, row: BoxRow) -> None:
        """Add the box's row, or change the cells that changed."""
        new = cells(row)
        if row.name not in self.rows:
            self.add_row(*(new[key] for key, _ in COLUMNS), key=row.name)
            return
        for key, _ in COLUMNS:
            if self.get_cell(row.name, key) != new[key]:
                self.update_cell(row.name, key, new[key])
