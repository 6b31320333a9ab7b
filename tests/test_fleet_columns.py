"""The fleet table reads at a glance (issue 49, item 5): every column it shows is shown whole, at
160 columns all of them, and where the screen is narrower the least useful give way first (rtt,
then the GPUs, the disk, what runs), never the box, its connection or its newest alert (cut with
an ellipsis to the width left). Measured from outside before: `6 m` for 6 ms and `40.3 GB / ? of
2` at 160 columns: a cell that grew after its row was added was cut to the column's first width."""

from __future__ import annotations

import time

from hypothesis import given, settings
from hypothesis import strategies as st
from rich.text import Text
from textual.app import App, ComposeResult

from samai.console.core import config
from samai.console.core.alertbook import Alert
from samai.console.core.fleet import BoxRow, fleet_interval, polled_configs
from samai.widgets.fleet import ALERT_MIN, COLUMNS, KEPT_FIRST, SCROLLBAR, FleetTable, age, cells, fit

GB = 10**9
NOW = 1_000_000.0
ALERT = "the next checkpoint (1.2 GB) will not fit: 0.8 GB free above the reserve; x prunes the old ones " * 2


class _Fleet(App):
    def compose(self) -> ComposeResult:
        yield FleetTable()


def _rows() -> list[BoxRow]:
    return [BoxRow("gpu-box-a", "ssh://a", "connected", seen_at=NOW - 3, rtt=0.006, running=("train", "serve"),
                   disk_used=40_300_000_000, disk_peak=52 * GB, disk_capacity=2000 * GB, gpu_count=8, gpu_util=97.0,
                   gpu_memory_used=600 * GB, gpu_memory_total=640 * GB,
                   alert=Alert(1.0, "warning", ALERT, "train", code="checkpoint_wont_fit")),
            BoxRow("gpu-box-b", "ssh://b", "unreachable", error="connect to 10.0.0.7 port 22: connection refused "
                   "(no route to host after 3 tries)")]


def _shown(table: FleetTable) -> dict[str, int]:
    """Each column shown and the width its cells get."""
    return {str(c.key.value): (c.content_width if c.auto_width else c.width) for c in table.ordered_columns}


def _whole(table: FleetTable) -> None:
    """Every cell fits its column: shown whole, or (the alert) cut with an ellipsis, never silently."""
    widths = _shown(table)
    for row_key in table.rows:
        for key, width in widths.items():
            cell = table.get_cell(row_key, key)
            assert isinstance(cell, Text) and cell.cell_len <= width, (key, cell.plain, width)
            if key != "alert":
                assert cell.plain == cells(next(r for r in _rows() if r.name == row_key.value), NOW)[key].plain


async def test_at_160_columns_every_column_is_shown_whole_also_a_cell_that_grew() -> None:
    app = _Fleet()
    async with app.run_test(size=(160, 20)) as pilot:
        table = app.query_one(FleetTable)
        first = [BoxRow(r.name, r.url) for r in _rows()]  # connecting: no rtt, no disk yet
        table.show(first, NOW)
        await pilot.pause()
        table.show(_rows(), NOW)
        await pilot.pause()
        assert list(_shown(table)) == [key for key, _ in COLUMNS]
        assert table.get_cell("gpu-box-a", "rtt").plain == "6 ms" and _shown(table)["rtt"] >= len("6 ms")
        assert table.get_cell("gpu-box-a", "disk").plain == "40.3 GB / 52.0 GB of 2.0 TB"
        _whole(table)
        assert table.get_cell("gpu-box-a", "alert").plain.endswith("…")
        assert sum(c.get_render_width(table) for c in table.ordered_columns) <= 160


async def test_narrower_the_least_useful_columns_give_way_first_and_come_back() -> None:
    app = _Fleet()
    async with app.run_test(size=(120, 20)) as pilot:
        table = app.query_one(FleetTable)
        table.show(_rows(), NOW)
        await pilot.pause()
        shown = list(_shown(table))
        assert {"box", "connection", "alert"} <= set(shown) and "rtt" not in shown
        gone = [key for key in KEPT_FIRST if key not in shown]
        assert gone and gone == list(KEPT_FIRST[len(KEPT_FIRST) - len(gone):]), gone  # from the least useful
        assert table.get_cell("gpu-box-b", "alert").plain.startswith("connect to 10.0.0.7")  # why b is not read
        _whole(table)
        assert sum(c.get_render_width(table) for c in table.ordered_columns) <= 120
        table.move_cursor(row=1)
        await pilot.resize_terminal(170, 20)
        await pilot.pause()
        assert list(_shown(table)) == [key for key, _ in COLUMNS]
        assert table.cursor_row == 1  # the operator's row stays chosen


@settings(max_examples=300, deadline=None)
@given(st.fixed_dictionaries({key: st.integers(0, 200) for key, _ in COLUMNS}), st.integers(0, 400))
def test_the_columns_shown_fit_and_a_column_gives_way_only_to_one_kept_before_it(natural: dict[str, int],
                                                                                 width: int) -> None:
    shown = fit(natural, width)
    need = {key: (ALERT_MIN if key == "alert" else natural[key]) + 2 for key in natural}
    used = sum((shown[key] or natural[key]) + 2 for key in shown)
    assert used <= max(width - SCROLLBAR, 0) or not shown
    for key, fixed in shown.items():
        assert fixed is None or (key == "alert" and fixed <= natural["alert"] and fixed >= min(ALERT_MIN,
                                                                                                natural["alert"]))
    kept = [key for key in KEPT_FIRST if key in shown]
    assert kept == list(KEPT_FIRST[:len(kept)])  # what gives way is always the least useful
    if len(kept) < len(KEPT_FIRST):  # and only when it did not fit beside those kept
        assert sum(need[k] for k in kept) + need[KEPT_FIRST[len(kept)]] > width - SCROLLBAR


def test_a_rows_age_says_now_while_fresh_then_how_old_it_is() -> None:
    row = _rows()[0]
    said = {seconds: age(row, row.seen_at + seconds).plain for seconds in (0, 9.9, 10, 42, 185, 7300)}
    assert said == {0: "now", 9.9: "now", 10: "10s ago", 42: "42s ago", 185: "3m ago", 7300: "2h01m ago"}
    assert age(_rows()[1], NOW).plain == "—"  # never read


def test_a_fleet_polls_its_boxes_as_often_as_its_size_allows_unless_a_box_says() -> None:
    def fleet(n: int, given: str = "") -> list[float]:
        boxes = "".join(f'[boxes.b{i}]\nurl = "ssh://op@b{i}"\nworkspace = "samai/x"\n'
                        + (given if i == 0 else "") for i in range(n))
        cfg = config.parse(boxes, "(test)")
        return [c.target.poll_interval for _, c in polled_configs(cfg)]

    assert fleet(1) == [1.0] and set(fleet(16)) == {1.6} and set(fleet(64)) == {6.0}
    assert fleet(64, "poll_interval = 1.0\n")[:2] == [1.0, 6.0]  # given: honoured, the others adapt
    assert [fleet_interval(n) for n in (4, 10, 20, 30, 60, 200)] == [1.0, 1.0, 2.0, 3.0, 6.0, 6.0]


async def test_the_fleet_screen_draws_its_rows_once_a_tick_not_once_a_poll(tmp_path, monkeypatch) -> None:
    """Three boxes polled every 0.3 s: the table is drawn at most once per DRAW_EVERY_S with every
    row, not each time a box's poll ends (64 boxes would repaint it 64 times a second)."""
    from samai.console.app import SamaiApp
    from samai.console.screens.fleet import DRAW_EVERY_S, FleetScreen
    from tests.helpers import pilot_until
    from tests.test_fleet import local_boxes, write_config

    drawn: list[int] = []
    real = FleetTable.show
    monkeypatch.setattr(FleetTable, "show", lambda self, rows, now: (drawn.append(len(rows)), real(self, rows, now)))
    tables, _ = local_boxes(tmp_path)
    app = SamaiApp(config.load(write_config(tmp_path, tables)))
    async with app.run_test(size=(160, 30)) as pilot:
        fleet = await pilot_until(pilot, lambda: isinstance(app.screen, FleetScreen) and app.screen)
        started, since = len(drawn), time.monotonic()
        await pilot_until(pilot, lambda: sum(w.row.polls for w in fleet.fleet.watches) >= 3 * 8, timeout=60)
        polls, draws = sum(w.row.polls for w in fleet.fleet.watches), len(drawn) - started
        ticks = (time.monotonic() - since) / DRAW_EVERY_S  # a busy machine delays ticks, never adds them
    assert set(drawn) == {3}  # every row each time
    assert draws <= ticks + 1 < polls, (draws, ticks, polls)  # drawn a tick, not a poll
