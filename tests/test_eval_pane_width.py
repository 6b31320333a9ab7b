"""The eval pane at 160 columns (issue 49, item 5): each run's key figures on screen whatever its
name: a cu run's kind, success rate and its no-action, missed and error counts, an eval run's kind
and score. Read back from the exported screenshot (what fits in the pane), not from the cells."""

from __future__ import annotations

import asyncio
import html
import re
from pathlib import Path

from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from textual.app import App, ComposeResult
from textual.containers import Horizontal
from textual.geometry import Region
from textual.widgets import Static

from samai.console import replay
from samai.console.app import SamaiApp
from samai.console.core.evals.runs import EvalRun
from samai.themes import stylesheet
from samai.widgets.evals import EvalTable
from tests.helpers import pilot_until

RECORDING = replay.load(Path(__file__).parent / "data" / "recorded_box.json")
SIZE = (160, 50)
RUNS_SHOWN = 4  # two lines a run, in the bottom row's height at 50 lines
TEXT = re.compile(r'<text[^>]*x="([\d.]+)" y="([\d.]+)"[^>]*>(.*?)</text>')
CELL, LINE = 0.61 * 20, 1.22 * 20  # Rich's SVG export: a cell's width, a line's height (its text 20 below its top)


def _inside(app: App, region: Region) -> list[str]:
    """The lines of the pane at region as the exported screenshot shows them, within its border:
    its header first, then two lines a run."""
    screen = [[" "] * SIZE[0] for _ in range(SIZE[1])]
    for m in TEXT.finditer(app.export_screenshot()):
        text = html.unescape(re.sub("<[^>]+>", "", m.group(3))).replace("\xa0", " ")
        x, y = round(float(m.group(1)) / CELL), round((float(m.group(2)) - 20) / LINE)
        screen[y][x:x + len(text)] = text
    return ["".join(line[region.x + 1:region.right - 1]) for line in screen[region.y + 1:region.bottom - 1]]


async def _show(pilot, table: EvalTable, runs: list[EvalRun]) -> None:
    """The runs in the table, as painted once it has laid them out (on its idle: its height, and so
    its scroll bars, are the old rows' until then)."""
    table.show(runs)
    await pilot_until(pilot, lambda: table.virtual_size.height == 1 + sum(r.height for r in table.rows.values()))
    await pilot.pause()


def _cu(name: str, n: int, rate: float | None, no_action: int, missed: int, errors: int, i: int = 0) -> EvalRun:
    return EvalRun(name, n, rate, 0, 0, -i, f"/w/runs/cu/{i}", "cu", no_action + missed, errors, missed)


def _eval(name: str, n: int, accuracy: float | None, empty: int, truncated: int, i: int = 0) -> EvalRun:
    return EvalRun(name, n, accuracy, empty, truncated, -i, f"/w/runs/eval/{i}")


def _expected(r: EvalRun) -> tuple[str, str, str]:
    """What the run's two lines must hold: its kind and score, and its counts (their words)."""
    score = "?" if r.accuracy is None else f"{100 * r.accuracy:.1f} %"
    if r.kind == "cu":
        errors = f"{r.errors} error" + ("" if r.errors == 1 else "s")
        return "cu", score, f"{r.parse_failures - r.missed} no action, {r.missed} missed, {errors}"
    return "eval", score, f"{r.empty_content} empty, {r.truncated} truncated"


def _assert_shown(pane: list[str], runs: list[EvalRun]) -> None:
    for i, r in enumerate(runs[:RUNS_SHOWN]):  # newest first, as the pane lists them
        first, second = pane[1 + 2 * i], pane[2 + 2 * i]
        kind, score, counts = _expected(r)
        assert first.split()[0] == kind and f" {score} " in first, (first, r)
        assert r.name[:24] in first, (first, r)  # and the start of its name beside them
        assert f" of {r.n} " in second and counts in second, (second, r)


async def test_at_160_columns_a_cu_run_and_an_eval_run_with_long_names_show_every_figure() -> None:
    app = SamaiApp(replay.recorded_config(RECORDING), poll=False, clock=lambda: RECORDING["probe"]["time"])
    runs = [_cu("rft-1-after-" + "c" * 48, 28, 0.2143, 1, 16, 1), _eval("eval-" + "e" * 55, 100, 0.5, 3, 2, 1)]
    async with app.run_test(size=SIZE) as pilot:
        replay.show(app, RECORDING)
        table = app.box_screen.query_one(EvalTable)
        await _show(pilot, table, runs)
        pane = _inside(app, table.region)
        assert pane[0].split() == ["kind", "score", "run"]
        assert pane[1].startswith(" cu    21.4 %  rft-1-after-ccc")
        assert pane[2].startswith("       of 28   1 no action, 16 missed, 1 error ")
        assert pane[3].startswith(" eval  50.0 %  eval-eee")
        assert pane[4].startswith("       of 100  3 empty, 2 truncated ")
        _assert_shown(pane, runs)


class Bottom(App):
    """The box screen's bottom row, its panes' widths from the console's own stylesheet."""

    CSS = stylesheet()

    def compose(self) -> ComposeResult:
        with Horizontal(id="bottom"):
            yield Static(id="curves")
            yield EvalTable(id="evals")
            yield Static(id="alerts")


async def _pane_of(runs: list[EvalRun]) -> list[str]:
    app = Bottom()
    async with app.run_test(size=SIZE) as pilot:
        table = app.query_one(EvalTable)
        await _show(pilot, table, runs)
        return _inside(app, table.region)


async def test_the_bottom_row_stand_in_gives_the_pane_its_width_in_the_box_screen() -> None:
    app = SamaiApp(replay.recorded_config(RECORDING), poll=False, clock=lambda: RECORDING["probe"]["time"])
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        real = app.box_screen.query_one(EvalTable).region
    async with Bottom().run_test(size=SIZE) as pilot:
        assert pilot.app.query_one(EvalTable).region.size == real.size


NAMES = st.text(alphabet="abcxyz-_.019", max_size=120)
COUNT = st.integers(0, 99)  # a cu run's counts: cu_eval's runs are tens of episodes
RATE = st.none() | st.floats(0, 1)
CU = st.builds(lambda name, rate, a, b, c, more: (name, a + b + c + more, rate, a, b, c),
               NAMES, RATE, COUNT, COUNT, COUNT, st.integers(0, 9999 - 3 * 99))
EVAL = st.builds(lambda name, n, acc, f: (name, n, acc, int(f[0] * n), int(f[1] * n)),
                 NAMES, st.integers(0, 9999), RATE, st.tuples(st.floats(0, 1), st.floats(0, 1)))


# Each example starts an app: a failure is reported as drawn, not shrunk (minutes of apps).
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(st.lists(st.tuples(st.booleans(), CU, EVAL), min_size=1, max_size=RUNS_SHOWN + 2))
@example([(True, ("x" * 120, 9999, 1.0, 99, 99, 99), ("", 0, None, 0, 0))] * (RUNS_SHOWN + 2))  # the widest, scrolled
def test_every_figure_fits_whatever_the_names_and_counts(drawn) -> None:
    """Up to six runs of either kind, any names, counts up to those the bound above allows: the
    visible runs' figures whole (beyond four runs the pane scrolls, with its scroll bar beside them)."""
    runs = [_cu(*cu, i=i) if is_cu else _eval(*ev, i=i) for i, (is_cu, cu, ev) in enumerate(drawn)]
    _assert_shown(asyncio.run(_pane_of(runs)), runs)
