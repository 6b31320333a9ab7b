"""The screen as an operator at 160x48 and 120x40 reads it (issue 15, items 5, 8, 9, 11, 14): the
recorded box through the real app, read back as the text of the exported screenshot."""

from __future__ import annotations

import html
import re
from dataclasses import replace
from pathlib import Path

import pytest
from textual.app import App, ComposeResult

from samai.console import replay
from samai.console.app import SamaiApp
from samai.console.core.training.trainlog import TrainPoint
from samai.console.core.update import StageView
from samai.console.report import describe_snapshot
from samai.remote.boxapi import Box
from samai.widgets.curves import CurvesPane
from samai.widgets.processes import ProcessDetail, ProcessPane, ProcessTable
from samai.widgets.stages import STATUS_STYLE, StagesBar
from tests.helpers import pilot_until

RECORDING = replay.load(Path(__file__).parent / "data" / "recorded_box.json")
NOW = RECORDING["probe"]["time"]
SIZES = [(160, 48), (120, 40)]
CHAR_WIDTH = 0.61 * 20  # Rich's SVG export: a cell is this wide at its default font size
TEXT = re.compile(r'<text[^>]*x="([\d.]+)" y="([\d.]+)"[^>]*>(.*?)</text>')


def screen_text(app: App, width: int) -> list[str]:
    """The screen's lines as the operator reads them (no colours), from the exported SVG."""
    rows: dict[float, dict[int, str]] = {}
    for m in TEXT.finditer(app.export_screenshot()):
        text = html.unescape(re.sub("<[^>]+>", "", m.group(3))).replace("\xa0", " ")
        rows.setdefault(float(m.group(2)), {})[round(float(m.group(1)) / CHAR_WIDTH)] = text
    lines = []
    for y in sorted(rows):
        line = [" "] * width
        for column, text in rows[y].items():
            line[column:column + len(text)] = text
        lines.append("".join(line[:width]).rstrip())
    return lines


def _recorded_app() -> SamaiApp:
    return SamaiApp(replay.recorded_config(RECORDING), poll=False, clock=lambda: NOW)


def _pane_lines(lines: list[str], title: str) -> list[str]:
    """The lines inside a bordered pane of the left column, from its title down to its bottom border."""
    start = next(i for i, line in enumerate(lines) if f"─ {title} ─" in line)
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("╰"))
    return [line.split("│")[1] for line in lines[start + 1:end]]


# ---------------------------------------------------------------- 8: processes and ports


@pytest.mark.parametrize("size", SIZES)
async def test_the_command_takes_the_rest_of_the_processes_pane(size) -> None:
    app = _recorded_app()
    async with app.run_test(size=size) as pilot:
        replay.show(app, RECORDING)
        await pilot.pause()
        pane = app.box_screen.query_one(ProcessPane)
        lines = _pane_lines(screen_text(app, size[0]), "processes & ports")
        header = lines[0]
        assert header.split() == (["stage", "pid", "user", "cpu%", "rss", "age", "ports", "command"]
                                  if size[0] >= 160 else ["stage", "pid", "cpu%", "rss", "age", "ports", "command"])
        command_at = header.index("command")
        assert len(header) - command_at >= {160: 28, 120: 14}[size[0]]  # the other columns are short
        server = next(line for line in lines if " 5100 " in line)
        assert server[command_at:].startswith("llama-server -")
        width = pane.table.scrollable_content_region.width
        assert pane.table.virtual_size.width <= width  # nothing to scroll sideways for
        # the selected row's whole command line, under the table
        pane.table.focus()
        row = pane.table.index(next(k for k, _ in pane.table.rows if k.startswith("5100:")))
        pane.table.move_cursor(row)
        await pilot.pause()
        shown = " ".join(str(pane.query_one(ProcessDetail).render()).split())
        assert pane.selected().command in shown and "pid 5100" in shown and "ports 18080" in shown


@pytest.mark.slow
async def test_the_narrowest_layout_scrolls_sideways_and_keeps_the_command_its_minimum() -> None:
    app = _recorded_app()
    async with app.run_test(size=(80, 40)) as pilot:
        replay.show(app, RECORDING)
        await pilot.pause()
        table = app.box_screen.query_one(ProcessPane).table
        shown, command = table.columns(table.scrollable_content_region.width)
        assert "user" not in [table.labels[i] for i in shown] and command >= 12


# ---------------------------------------------------------------- 9: the stages bar


@pytest.mark.parametrize("size", SIZES + [(100, 40)])
async def test_no_stage_is_cut_across_two_lines_and_the_running_one_stands_out(size) -> None:
    app = _recorded_app()
    async with app.run_test(size=size) as pilot:
        replay.show(app, RECORDING)
        await pilot.pause()
        lines = screen_text(app, size[0])
        bar = "\n".join(lines[3:3 + app.box_screen.query_one(StagesBar).size.height])
        for stage in app.config.stages:
            status = RECORDING_STATUS.get(stage.name, "blocked")
            assert f"[{stage.key}] {stage.name} {STATUS_STYLE[status][0]} {status}" in bar, (stage.name, bar)
        rendered = app.box_screen.query_one(StagesBar).render()
        running = rendered.plain.index("[3] train")
        backgrounds = {span.style for span in rendered.spans if span.start <= running < span.end}
        assert any("on $primary" in str(style) for style in backgrounds)


RECORDING_STATUS = {"provision": "done", "fetch": "done", "train": "running", "eval": "idle"}


@pytest.mark.slow
async def test_the_stages_bar_flows_again_when_the_terminal_is_resized() -> None:
    app = _recorded_app()
    async with app.run_test(size=(160, 48)) as pilot:
        replay.show(app, RECORDING)
        await pilot.pause()
        bar = app.box_screen.query_one(StagesBar)
        assert bar.size.height == 2
        await pilot.resize_terminal(90, 40)
        await pilot_until(pilot, lambda: bar.size.height == 3)
        lines = str(bar.render()).split("\n")
        assert len(lines) == 3 and all(len(line) <= bar.content_size.width for line in lines)
        assert lines[0].endswith("[3] train ● running 10m")


# ---------------------------------------------------------------- 11: training curves


class Curves(App):
    def compose(self) -> ComposeResult:
        yield CurvesPane()


async def test_loss_and_grad_norm_have_their_own_axes_and_the_last_values_are_numbers() -> None:
    points = [TrainPoint(1, 0.52, 18.0), TrainPoint(2, 0.41, 12.0), TrainPoint(3, float("nan"), float("nan")),
              TrainPoint(4, 0.33, 9.0), TrainPoint(5, 0.30, 2.5)]
    async with Curves().run_test(size=(80, 14)) as pilot:
        pane = pilot.app.query_one(CurvesPane)
        pane.add(points)  # the plot is mounted to draw them
        await pilot_until(pilot, lambda: pane.plot is not None)
        await pilot.pause()
        lines = screen_text(pilot.app, 80)
        assert "step 5: loss 0.3 · grad_norm 2.5" in lines[0]
        left = [float(m) for line in lines for m in re.findall(r"^ *(\d+\.\d+)┤", line)]
        right = [float(m) for line in lines for m in re.findall(r"├(\d+\.?\d*)$", line)]
        assert left and max(left) < 1 and min(left) >= 0.29  # the loss has the whole left axis to itself
        assert right and max(right) >= 17
        assert any("NaN/inf (1)" in line for line in lines)
        pane.add([TrainPoint(6, float("nan"), float("nan"))])
        await pilot.pause()
        assert "step 6: loss nan · grad_norm nan" in screen_text(pilot.app, 80)[0]


# ---------------------------------------------------------------- 14: snapshot text


async def test_the_snapshot_text_shows_ages_and_local_times_not_epochs(box: Box) -> None:
    snap = await box.snapshot()
    text = describe_snapshot(snap, replay.recorded_config(RECORDING))
    assert "STARTED" in text and "START " not in text
    oldest = min(snap.processes, key=lambda p: p.start_time)
    assert f"{oldest.start_time:.2f}" not in text and f"{int(oldest.start_time)}" not in text
    assert re.search(r"\d+[smhd]\S* ago, (\d\d:\d\d:\d\d|\d{4}-\d\d-\d\d \d\d:\d\d)", text)


async def test_the_stages_bar_repaints_only_on_change_and_lays_out_only_when_its_height_changes(monkeypatch) -> None:
    app = _recorded_app()
    async with app.run_test(size=(160, 48)) as pilot:
        replay.show(app, RECORDING)
        await pilot.pause()
        bar = app.box_screen.query_one(StagesBar)
        views = [StageView(s.name, s.key, "idle", None, None, None, None) for s in app.config.stages]
        bar.show(views, NOW)
        await pilot.pause()
        calls: list[dict] = []
        real = bar.refresh
        monkeypatch.setattr(bar, "refresh", lambda *a, **kw: calls.append(kw) or real(*a, **kw))
        bar.show(list(views), NOW)
        assert calls == []  # the same stages: nothing to paint
        running = [replace(views[2], status="running", since=NOW - 5)] + views[3:]
        bar.show(views[:2] + running, NOW)
        bar.show(views[:2] + running, NOW + 1)  # a second later: the elapsed time only
        assert [kw.get("layout") for kw in calls] == [False, False]  # still two lines: no layout pass
        bar.show(views + [StageView(f"extra{i}", "x", "idle", None, None, None, None) for i in range(12)], NOW)
        assert calls[-1].get("layout") is True


async def test_at_120x40_the_processes_pane_keeps_rows_for_processes() -> None:
    """On a short terminal the disk list scrolls and the bottom row shrinks before the processes
    pane does: the recorded box's six processes are all on screen at 120x40."""
    recording = replay.load(Path(__file__).parent / "data" / "recorded_box.json")
    app = SamaiApp(replay.recorded_config(recording), poll=False, clock=lambda: recording["probe"]["time"])
    async with app.run_test(size=(120, 40)) as pilot:
        replay.show(app, recording)
        await pilot.pause()
        table = app.box_screen.query_one(ProcessTable)
        assert len(table.rows) == 6
        assert table.size.height >= 1 + 6, table.size  # the header line and every row


async def test_an_outage_never_pushes_read_only_off_the_status_line() -> None:
    from samai.widgets.status import Connection, StatusBar

    class One(App):
        def compose(self) -> ComposeResult:
            yield StatusBar()

    error = "Server not responding to keepalive " * 6  # what asyncssh says, long
    app = One()
    async with app.run_test(size=(160, 3)) as pilot:
        bar = app.query_one(StatusBar)
        bar.show(Connection("ssh://op@gpu-box-7:2222", "gpu-box-7", "lost", 95.0, None, True, True, error))
        await pilot.pause()
        line = screen_text(app, 160)[0]
        assert "READ-ONLY" in line and "ssh://op@gpu-box-7:2222" in line and "● lost" in line and "STALE" in line
        assert line.index("READ-ONLY") < line.index("STALE")  # what may be cut at the edge comes last


@pytest.mark.slow
async def test_the_first_snapshot_after_connecting_says_connect_time_not_rtt(tmp_path: Path, workspace: Path) -> None:
    from samai.console.core import config
    from samai.widgets.status import StatusBar

    f = tmp_path / "rtt.toml"
    f.write_text(f'[target]\npoll_interval = 0.2\n[workspace]\npath = "{workspace}"\n')
    app = SamaiApp(config.load(f))
    async with app.run_test(size=(160, 45)) as pilot:
        bar = app.box_screen.query_one(StatusBar)
        await pilot_until(pilot, lambda: app.state.snapshot)
        first = app.connection
        assert first.rtt is None and first.connect_s is not None
        await pilot_until(pilot, lambda: app.connection.rtt is not None)  # the next poll: a round trip
        await pilot_until(pilot, lambda: " rtt " in str(bar.render()))
        assert app.connection.connect_s == first.connect_s
