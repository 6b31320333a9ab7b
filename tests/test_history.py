"""A stage's runs read back from its log: the parser on any lines (fuzzed), and `H` in the TUI
on a stage fired three times for real."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.text import Text

from samai.console.app import SamaiApp
from samai.console.core import config
from samai.console.core.history import MAX_RUNS, RunHistory
from samai.console.screens.dialogs import ConfirmDialog, RunsScreen
from samai.remote.model import Marker
from tests.helpers import confirm_dialog, pilot_until

MARKERS = (Marker("DONE", "DONE"), Marker("BAD", "^BAD", "error"), Marker("CHAIN_DONE", r"CHAIN_DONE rc=\d+"))


def header(pid: int) -> str:
    return f"=== samai chain train: pid {pid} started 2026-12-01T01:0{pid % 10}:00Z"


def test_each_run_has_its_start_end_and_last_marker() -> None:
    history = RunHistory(MARKERS)
    history.feed(["an older launcher's line", header(11), "step", "DONE once", "BAD [red]x\x1b[2J",
                  "CHAIN_DONE rc=3", header(12), "DONE", "CHAIN_DONE rc=0"])
    history.end_file()
    history.feed(["a file that starts without a header", header(13), "working"])
    runs = history.runs()
    assert [(r.number, r.pid, r.rc, r.lines) for r in runs] == [(1, None, None, 1), (2, 11, 3, 4), (3, 12, 0, 2),
                                                                (4, None, None, 1), (5, 13, None, 1)]
    assert runs[1].last_marker == "BAD [red]x\x1b[2J" and runs[1].severity == "error"
    assert runs[1].started == "2026-12-01T01:01:00Z" and runs[2].last_marker == "DONE" and runs[3].last_marker == ""


def test_a_header_in_pieces_or_forged_still_splits_and_a_long_log_keeps_the_newest() -> None:
    history = RunHistory(MARKERS)
    history.feed(["=== samai chain x: pid not-a-number started ?", "line"])
    assert [(r.number, r.pid, r.started, r.lines) for r in history.runs()] == [(1, None, "?", 1)]
    assert RunHistory(MARKERS).runs() == []
    history = RunHistory(MARKERS)
    for pid in range(MAX_RUNS + 30):
        history.feed([header(pid), "CHAIN_DONE rc=0"])
    runs = history.runs()
    assert len(runs) == MAX_RUNS and runs[-1].pid == MAX_RUNS + 29 and runs[0].number == 31


@pytest.mark.slow
async def test_the_launcher_keeps_the_last_runs_logs_and_the_history_reads_them_all(box, workspace: Path) -> None:
    """Each fire rotates the stage's log; LOG_GENERATIONS earlier logs stay, the oldest drop off;
    a planted folder where a generation goes costs that generation only."""
    from samai.console.core.history import LOG_GENERATIONS, read_history

    (workspace / "logs").mkdir()
    (workspace / "logs" / "once.log.3").mkdir()  # not a log: never written, the rotation goes on
    for n in range(1, LOG_GENERATIONS + 4):
        fired = await box.fire("once", f"echo RUN-{n}", "logs/once.log", verify_s=0)
        assert fired.state in ("running", "done", "exited"), fired
        await _ended(box, "once")
    kept = sorted(p.name for p in (workspace / "logs").iterdir())
    assert kept == ["once.log"] + [f"once.log.{n}" for n in range(1, LOG_GENERATIONS + 1)]
    assert "RUN-8" in (workspace / "logs" / "once.log").read_text()
    runs, problems = await read_history(box, str(workspace / "logs" / "once.log"), [Marker("RUN", "^RUN-")])
    assert [r.last_marker for r in runs][-3:] == ["RUN-6", "RUN-7", "RUN-8"] and all(r.rc == 0 for r in runs)
    assert len(runs) == LOG_GENERATIONS  # one generation is the planted folder: said, not fatal
    assert len(problems) == 1 and "once.log." in problems[0]


async def _ended(box, stage: str) -> None:
    import asyncio

    for _ in range(200):
        rec = (await box.snapshot(processes=True)).state(stage)
        if rec and rec.rc is not None:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{stage} did not end")


LINES = st.lists(st.one_of(st.text(max_size=40), st.sampled_from([header(1), "CHAIN_DONE rc=2", "BAD", "DONE",
                                                                   "=== samai chain ", "CHAIN_DONE rc=99999"])),
                 max_size=60)


@given(lines=LINES, cut=st.integers(0, 60))
def test_any_lines_give_runs_that_account_for_every_line_fed_whole_or_in_two(lines, cut) -> None:
    whole, parts = RunHistory(MARKERS), RunHistory(MARKERS)
    whole.feed(lines)
    parts.feed(lines[:cut])
    parts.feed(lines[cut:])
    assert whole.runs() == parts.runs()
    headers = sum(line.startswith("=== samai chain ") for line in lines)
    assert sum(r.lines for r in whole.runs()) == len(lines) - headers
    assert all(r.rc is None or 0 <= r.rc <= 999 for r in whole.runs())


@pytest.mark.slow
async def test_shift_h_lists_the_shown_stages_runs_newest_first(tmp_path: Path, workspace: Path) -> None:
    f = tmp_path / "runs.toml"
    f.write_text(f'[target]\npoll_interval = 0.2\npython = "{sys.executable}"\n[workspace]\npath = "{workspace}"\n'
                 '[stages.train]\nkey = "t"\ncommand = "sh run.sh"\n'
                 'markers = [{ name = "DONE" }, { name = "BAD", pattern = "^BAD", severity = "error" }]\n')
    app = SamaiApp(config.load(f))
    async with app.run_test(size=(140, 45)) as pilot:
        await pilot_until(pilot, lambda: app.state.snapshot)
        for script in ("echo DONE\n", "echo 'BAD [b]input\x1b[31m'; exit 3\n", "echo working; sleep 30\n"):
            (workspace / "run.sh").write_text(script)
            before = app.state.runs.get("train")
            await pilot.press("t")
            await pilot_until(pilot, lambda: isinstance(app.screen, ConfirmDialog) and app.focused)
            await confirm_dialog(pilot)
            await pilot_until(pilot, lambda before=before: app.state.runs.get("train") not in (None, before))
            await pilot_until(pilot, lambda: not app.busy and not isinstance(app.screen, ConfirmDialog))
        await pilot_until(pilot, lambda: "working" in (workspace / "logs" / "train.log").read_text())
        await pilot.press("H")
        screen = await pilot_until(pilot, lambda: isinstance(app.screen, RunsScreen) and app.screen)
        table = screen.query_one("DataTable")
        rows = [[cell.plain if isinstance(cell, Text) else cell for cell in table.get_row_at(i)]
                for i in range(table.row_count)]
        assert [(r[0], r[3]) for r in rows] == [("3", "—"), ("2", "rc=3"), ("1", "rc=0")]  # the log, .1, .2
        assert rows[1][5] == "BAD [b]input␛[31m" and rows[2][5] == "DONE"
        await pilot.press("escape")
        await pilot_until(pilot, lambda: not isinstance(app.screen, RunsScreen))
