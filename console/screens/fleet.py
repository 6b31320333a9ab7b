"""The fleet screen: every box of the config on one line each, live (k9s's contexts).

Each box is polled by its own worker (samai.console.core.fleet.BoxWatch), so a slow or dead box
holds up only its own row. Enter asks the app to open that box's screen; the screen itself does
no I/O beyond the pollers' and never touches the box screen's Box."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from textual.app import ComposeResult
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Static

from samai.widgets.fleet import FleetTable
from samai.widgets.footer import KeysFooter
from samai.widgets.keys import bindings

if TYPE_CHECKING:
    from samai.console.core.fleet import BoxRow, Fleet


DRAW_EVERY_S = 1.0  # the table is drawn at most this often, whatever the number of boxes


class FleetScreen(Screen[None]):
    BINDINGS = bindings("fleet")

    class BoxChosen(Message):
        """The operator picked a box (None: the one the box screen showed): the app points its box screen at it."""

        def __init__(self, name: str | None) -> None:
            super().__init__()
            self.name = name

    def __init__(self, fleet: Fleet) -> None:
        super().__init__()
        self.fleet = fleet

    def compose(self) -> ComposeResult:
        yield Static(f"fleet · {len(self.fleet.watches)} boxes · Enter opens a box · F comes back here",
                     id="fleet-title", markup=False)
        yield FleetTable(id="fleet")
        yield KeysFooter()

    def on_mount(self) -> None:
        table = self.query_one(FleetTable)
        table.show(self.fleet.rows, time.time())
        table.focus()
        for watch in self.fleet.watches:
            self.run_worker(watch.run(self._polled), name=f"fleet poll {watch.name}", group="fleet",
                            exit_on_error=False)
        self.set_interval(DRAW_EVERY_S, self._draw)

    async def on_unmount(self) -> None:
        await self.fleet.close()

    def _polled(self, row: BoxRow) -> None:
        """Each box's row is drawn with the others at the next tick (_draw), not as its poll ends:
        64 boxes polled at their own times would repaint the table 64 times a second."""

    def _draw(self) -> None:
        """Every row as its box was last read, with its age, in one batch: only the cells that
        changed are updated, and the screen is repainted once."""
        for table in self.query(FleetTable):  # none once the screen is being taken down
            with self.app.batch_update():
                table.show([w.row for w in self.fleet.watches], time.time())

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        if event.row_key.value is not None:
            self.post_message(self.BoxChosen(event.row_key.value))

    def action_back(self) -> None:
        self.post_message(self.BoxChosen(None))  # at start, the box screen's first box: its poll starts then
