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
from samai.console.core.training.history import MAX_RUNS, RunHistory
from samai.console.screens.dialogs import ConfirmDialog, RunsScreen
from samai.remote.model import Marker
from tests import chainlog
from tests.helpers import confirm_dialog, pilot_until

MARKERS = (Marker("DONE", "DONE"), Marker("BAD", "^BAD", "error"), Marker("CHAIN_DONE", r"CHAIN_DONE rc=\d+"))


def header(pid: int) -> str:
    return chainlog.header("train", pid, f"2026-12-01T01:0{pid % 10}:00Z")


def test_each_run_has_its_start_end_and_last_marker() -> None:
    history = RunHistory(MARKERS)
    history.feed(["an older launcher's line", "CHAIN_DONE rc=3"])
    history.end_file()
    history.feed([header(11), "step", "DONE once", "BAD [red]x\x1b[2J", chainlog.chain("CHAIN_DONE rc=3", 11)])
    history.end_file()
    history.feed([header(12), "DONE", chainlog.chain("SAMAI_DEATH exit: exit status 0? no", 12),
                  chainlog.chain("CHAIN_DONE rc=0", 12)])
    history.end_file()
    history.feed([header(13), "working"])
    runs = history.runs()
    assert [(r.number, r.pid, r.rc, r.lines) for r in runs] == [(1, None, None, 2), (2, 11, 3, 4), (3, 12, 0, 3),
                                                                (4, 13, None, 1)]
    assert runs[1].last_marker == "BAD [red]x\x1b[2J" and runs[1].severity == "error"
    assert runs[1].started == "2026-12-01T01:01:00Z" and runs[2].last_marker == "DONE" and runs[3].last_marker == ""
    assert runs[2].death == "exit: exit status 0? no"


def test_a_header_is_a_files_first_line_and_a_chain_line_carries_its_runs_nonce() -> None:
    """What the stage prints is its text: a header, CHAIN_DONE or SAMAI_DEATH line with no nonce,
    another run's or a made-up one starts no run, ends none and says no cause."""
    forged = [header(99), "=== samai chain train: pid 7 started 2026-12-01T09:00:00Z", "CHAIN_DONE rc=0",
              chainlog.chain("CHAIN_DONE rc=0", 99), "SAMAI_DEATH disk_full: No space left on device",
              chainlog.chain("SAMAI_DEATH cuda_oom: CUDA out of memory", 11, nonce="f" * 16), "CHAIN_DONE rc=0 [run ]"]
    history = RunHistory(MARKERS)
    history.feed([header(11), "step 1", *forged, "BAD end", chainlog.chain("SAMAI_DEATH exception: KeyError: 'x'", 11),
                  chainlog.chain("CHAIN_DONE rc=1", 11)])
    [run] = history.runs()
    assert (run.pid, run.rc, run.death, run.lines) == (11, 1, "exception: KeyError: 'x'", len(forged) + 4)
    assert run.last_marker == "BAD end"
    history = RunHistory(MARKERS)
    history.feed(["a log written by other means", header(12), chainlog.chain("CHAIN_DONE rc=0", 12)])
    [run] = history.runs()  # its header is no first line: none of its chain's lines is trusted
    assert (run.pid, run.rc, run.lines) == (None, None, 3)
    history = RunHistory(MARKERS)
    history.feed(["=== samai chain x: pid not-a-number started ?", "line"])
    assert [(r.number, r.pid, r.started, r.lines) for r in history.runs()] == [(1, None, "", 2)]
    assert RunHistory(MARKERS).runs() == []


def test_a_long_history_keeps_the_newest_runs() -> None:
    history = RunHistory(MARKERS)
    for pid in range(MAX_RUNS + 30):
        history.feed([header(pid), chainlog.chain("CHAIN_DONE rc=0", pid)])
        history.end_file()
    runs = history.runs()
    assert len(runs) == MAX_RUNS and runs[-1].pid == MAX_RUNS + 29 and runs[0].number == 31


@pytest.mark.slow
async def test_the_launcher_keeps_the_last_runs_logs_and_the_history_reads_them_all(box, workspace: Path) -> None:
    """Each fire rotates the stage's log; LOG_GENERATIONS earlier logs stay, the oldest drop off;
    a planted folder where a generation goes costs that generation only."""
    from samai.console.core.training.history import LOG_GENERATIONS, read_history

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


# Text a stage may print: anything, and copies of its chain's lines with no nonce, another run's or
# a made-up one.
COPIES = st.sampled_from([header(1), header(11), "=== samai chain ", "=== samai chain train: pid 3 started x",
                          "CHAIN_DONE rc=2", "CHAIN_DONE rc=99999", chainlog.chain("CHAIN_DONE rc=0", 1),
                          chainlog.chain("SAMAI_DEATH disk_full: No space left on device", 2),
                          "SAMAI_DEATH cuda_oom: CUDA out of memory", chainlog.chain("SAMAI_DISK end used=1", 3),
                          "SAMAI_DISK start used=1 avail=1 size=2", "CHAIN_DONE rc=0 [run ]", "BAD", "DONE"])
STAGE_TEXT = st.lists(st.one_of(st.text(max_size=40), COPIES), max_size=40)


@given(lines=STAGE_TEXT, cut=st.integers(0, 60))
def test_any_lines_give_runs_that_account_for_every_line_fed_whole_or_in_two(lines, cut) -> None:
    whole, parts = RunHistory(MARKERS), RunHistory(MARKERS)
    whole.feed(lines)
    parts.feed(lines[:cut])
    parts.feed(lines[cut:])
    assert whole.runs() == parts.runs()
    header_first = bool(lines) and lines[0].startswith("=== samai chain ") and whole.runs()[0].pid is not None
    assert sum(r.lines for r in whole.runs()) == len(lines) - header_first
    assert len(whole.runs()) == (1 if lines else 0)  # one file, one run: a header anywhere else is text
    if not header_first:  # no header first: no line of the file is a chain's
        assert all(r.rc is None and not r.death for r in whole.runs())


@given(text=STAGE_TEXT, rc=st.integers(0, 255), cut=st.integers(0, 40))
def test_no_text_the_stage_prints_changes_its_runs_boundaries_rc_or_cause(text, rc, cut) -> None:
    """The class of issue 46's item 3: any text the stage prints (copies of chain lines with a
    wrong nonce or none included), anywhere in its run, leaves each run's start, end, rc and cause
    as its chain wrote them."""
    def run(pid: int, said: list[str]) -> list[str]:
        return [header(pid), chainlog.chain("SAMAI_DISK start used=1 avail=1 size=2", pid), *said,
                chainlog.chain(f"SAMAI_DEATH exit: exit status {rc}", pid),
                chainlog.chain("SAMAI_DISK end used=2 avail=0 size=2", pid), chainlog.chain(f"CHAIN_DONE rc={rc}", pid)]

    plain, noisy = RunHistory(MARKERS), RunHistory(MARKERS)
    for history, said in ((plain, ["step 1", "step 2"]), (noisy, ["step 1", *text[:cut], "step 2", *text[cut:]])):
        for pid in (5, 6):
            history.start_file(f"logs/train.log.{pid}")
            history.feed(run(pid, said))
            history.end_file(100.0 + pid)
    for a, b in zip(plain.runs(), noisy.runs(), strict=True):
        assert (a.number, a.pid, a.started, a.rc, a.death, a.ended_at) == (b.number, b.pid, b.started, b.rc, b.death,
                                                                           b.ended_at)
        assert [m.text for m in a.marks if m.name == "disk"] == [m.text for m in b.marks if m.name == "disk"]
    assert len(noisy.runs()) == 2


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
            before = app.state.stages.runs.get("train")
            await pilot.press("t")
            await pilot_until(pilot, lambda: isinstance(app.screen, ConfirmDialog) and app.focused)
            await confirm_dialog(pilot)
            await pilot_until(pilot, lambda before=before: app.state.stages.runs.get("train") not in (None, before))
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
