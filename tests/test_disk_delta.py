"""§4.1: every stage's chain writes the workspace's disk line at its start and end, and the disk
pane shows what the last stage did (real stages fired on this machine, the real TUI)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from samai.console.app import SamaiApp
from samai.console.core import config
from samai.console.core.disk.delta import DiskDelta, DiskReading, latest, parse_disk_line
from samai.remote.boxapi import Box
from samai.widgets.disk import DiskPane
from tests.helpers import pilot_until, wait_for

BLOB = 32 * 1024 * 1024
WRITE_BLOB = f"dd if=/dev/zero of=blob.bin bs=1048576 count={BLOB // 1048576} conv=fsync 2>/dev/null; echo wrote"


def _readings(log: Path) -> list[DiskReading]:
    return [r for r in map(parse_disk_line, log.read_text().splitlines()) if r is not None]


async def test_a_stage_log_has_the_disk_line_at_its_start_and_end(box: Box, workspace: Path) -> None:
    grew = []
    for attempt in range(3):  # the filesystem is shared: another test's files deleted meanwhile shrink it
        (workspace / "blob.bin").unlink(missing_ok=True)
        result = await box.fire("blob", WRITE_BLOB, f"logs/blob-{attempt}.log", verify_s=0.5)
        assert result.ok
        log = workspace / "logs" / f"blob-{attempt}.log"
        wait_for(lambda log=log: "CHAIN_DONE rc=0" in log.read_text(), timeout=60)
        lines = log.read_text().splitlines()
        disk = [i for i, line in enumerate(lines) if line.startswith("SAMAI_DISK ")]
        assert len(disk) == 2 and disk[0] < lines.index("wrote") < disk[1] == len(lines) - 2  # CHAIN_DONE last
        assert lines[disk[0]].endswith(f'path="{workspace}" [run {result.nonce}]')
        start, end = _readings(log)
        assert (start.phase, end.phase) == ("start", "end") and start.size == end.size
        grew.append(end.used - start.used)
        if grew[-1] >= BLOB:  # what the stage wrote, at least (blocks are allocated whole)
            return
    raise AssertionError(f"the disk grew by {grew} bytes, not by the {BLOB} the stage wrote")


@pytest.mark.slow
async def test_a_stopped_stage_still_writes_its_end_line(box: Box, workspace: Path) -> None:
    fired = await box.fire("sleeper", "sleep 30", "logs/sleeper.log", verify_s=0.3)
    assert fired.ok
    await box.stop("sleeper")
    log = workspace / "logs" / "sleeper.log"
    wait_for(lambda: "CHAIN_DONE" in log.read_text(), timeout=30)
    assert [r.phase for r in _readings(log)] == ["start", "end"]


PIPE = """
pipeline = "disk"
[target]
poll_interval = 0.2
python = "{python}"
[workspace]
path = "{ws}"
[stages.blob]
key = "b"
command = "true"
"""


@pytest.mark.slow
async def test_the_disk_pane_shows_the_last_stages_delta(tmp_path: Path, workspace: Path, isolated_dirs) -> None:
    f = tmp_path / "disk.toml"
    f.write_text(PIPE.format(ws=workspace, python=sys.executable))
    app = SamaiApp(config.load(f))
    async with app.run_test(size=(160, 50)) as pilot:
        await pilot_until(pilot, lambda: app.state.snapshot)
        pane = app.box_screen.query_one(DiskPane)
        assert "blob:" not in str(pane.render())
        # Garbage disk lines first: ignored, the chain's own lines still count.
        garbage = 'echo "SAMAI_DISK end used=5 avail=9 size=1"; echo "SAMAI_DISK start used=[b]x"; '
        result = await app.box.fire("blob", garbage + WRITE_BLOB, "logs/blob.log", verify_s=0.5)
        assert result.ok
        shown = await pilot_until(pilot, lambda: re.search(r"blob: ([+-][\d.]+) MB \(start [\d.]+ GB used, end ",
                                                           str(pane.render())))
        # The chain's own lines, the log's first and last: what the stage grew the disk by, to a tenth
        # of a MB. (Whether that is the blob, the filesystem being shared, is the test above's.)
        readings = _readings(workspace / "logs" / "blob.log")
        start, end = readings[0], readings[-1]
        assert (start.phase, end.phase) == ("start", "end")
        assert abs(float(shown[1]) - (end.used - start.used) / 1e6) <= 0.05 + 1e-9


# ------------------------------------------------------------ the parser, fuzzed

def _line(phase: str, used: int, avail: int, size: int, rest: str = "") -> str:
    return f"SAMAI_DISK {phase} used={used} avail={avail} size={size}{rest}"


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
@example("SAMAI_DISK start used=1 avail=1 size=99999999999999999999")
@example("SAMAI_DISK end used=1 avail=1 size=0")
@example("SAMAI_DISK end used=\u0661 avail=1 size=5")  # an Arabic-Indic digit
def test_any_text_parses_to_a_reading_or_none(text: str) -> None:
    reading = parse_disk_line(text)
    assert reading is None or (0 <= reading.used <= reading.size and reading.used + reading.avail <= reading.size)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["start", "end"]), st.integers(0, 10**18), st.integers(0, 10**18), st.integers(1, 10**18),
       st.text(max_size=80))
def test_a_well_formed_line_reads_back_exactly_and_a_bad_one_is_ignored(phase, used, avail, size, rest) -> None:
    tail = " (human form) path=" + rest.replace("\n", " ")
    reading = parse_disk_line(_line(phase, used, avail, size, tail))
    if used + avail <= size:
        assert reading == DiskReading(phase, used, avail, size)
    else:
        assert reading is None  # numbers no file system has


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40), st.integers(0, 10**15), st.integers(0, 10**15),
       st.one_of(st.none(), st.integers(0, 10**15)))
def test_the_delta_text_never_fails_and_signs_the_change(stage: str, before: int, after: int, now) -> None:
    start = DiskReading("start", before, 0, 10**16)
    end = DiskReading("end", after, 0, 10**16)
    assert DiskDelta(stage, start, end).delta == after - before
    assert DiskDelta(stage, start, end).text.startswith(f"{stage}: {'-' if after < before else '+'}")
    assert DiskDelta(stage, start, None, now).text
    assert DiskDelta(stage, None, end).delta is None and DiskDelta(stage, None, end).text


def test_the_latest_fired_stage_is_shown_a_running_one_against_now() -> None:
    s, e = DiskReading("start", 100, 0, 1000), DiskReading("end", 160, 0, 1000)
    readings = {"train": (s, e), "merge": (s, None)}
    assert latest(readings, {"train": 1.0, "merge": 2.0}, {"merge"}, 130) == DiskDelta("merge", s, None, 130)
    assert latest(readings, {"train": 1.0, "merge": 2.0}, {"merge"}, 130).text.startswith("merge: +30 B so far")
    assert latest(readings, {"train": 3.0, "merge": 2.0}, set(), 130).text == \
        "train: +60 B (start 100 B used, end 160 B)"
    assert latest({}, {}, set(), None) is None
