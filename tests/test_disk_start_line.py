"""A stage's disk delta when its log is longer than the lines the marker watch scans at start
(issue 47): the chain writes the SAMAI_DISK start line right after the run's header, so a console
opened after a stage that printed thousands of lines reads it from the head of the log, once,
beside the poll. Only the chain's own line counts: one carrying the run's nonce, after the header
that names it (real stages fired on this machine, the real TUI and the real session)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from samai.console.app import SamaiApp
from samai.console.core import config
from samai.console.core.disk.delta import DiskReading, parse_disk_line
from samai.console.core.disk.feed import DiskFeed, DiskView
from samai.console.core.feeds import Surroundings
from samai.console.core.runs import MARKER_HISTORY_LINES
from samai.console.core.session import BoxSession
from samai.remote.boxapi import Box
from samai.remote.local import LocalTransport
from samai.widgets.disk import DiskPane
from tests.helpers import pilot_until, wait_for

PRINTED = 2000  # the stage's own lines: far more than the watch scans at start
WRITE = 24 * 1024 * 1024
LONG_STAGE = (f"seq 1 {PRINTED}; dd if=/dev/zero of=written.bin bs=1048576 count={WRITE // 1048576} conv=fsync "
              "2>/dev/null; echo wrote")

PIPE = """
pipeline = "long-log"
[target]
poll_interval = 0.2
python = "{python}"
[workspace]
path = "{ws}"
[stages.long]
key = "b"
command = "true"
log = "logs/long.log"
"""


def _config(tmp_path: Path, workspace: Path) -> config.Config:
    f = tmp_path / "long.toml"
    f.write_text(PIPE.format(ws=workspace, python=sys.executable))
    return config.load(f)


def _readings(log: Path) -> list[DiskReading]:
    return [r for r in map(parse_disk_line, log.read_text().splitlines()) if r is not None]


async def _long_run(box: Box, workspace: Path) -> tuple[Path, str]:
    """The stage fired and ended: its log, far longer than the watch scans, and the run's nonce."""
    fired = await box.fire("long", LONG_STAGE, "logs/long.log", verify_s=0.3)
    assert fired.ok and fired.nonce
    log = workspace / "logs" / "long.log"
    wait_for(lambda: f"CHAIN_DONE rc=0 [run {fired.nonce}]" in log.read_text(), timeout=60)
    lines = log.read_text().splitlines()
    assert len(lines) > PRINTED > 2 * MARKER_HISTORY_LINES
    assert lines[1].startswith("SAMAI_DISK start used=")  # the chain's, right after the header
    return log, fired.nonce


async def test_a_console_opened_after_a_long_stage_shows_its_delta(tmp_path: Path, workspace: Path,
                                                                  isolated_dirs) -> None:
    cfg = _config(tmp_path, workspace)
    first = Box(LocalTransport(), str(workspace), python=sys.executable)
    try:
        log, _ = await _long_run(first, workspace)
    finally:
        await first.close()
    start, end = _readings(log)[0], _readings(log)[-1]
    assert (start.phase, end.phase) == ("start", "end")
    app = SamaiApp(cfg)
    async with app.run_test(size=(160, 50)) as pilot:
        await pilot_until(pilot, lambda: app.state.snapshot)
        pane = app.box_screen.query_one(DiskPane)
        shown = await pilot_until(pilot, lambda: re.search(r"long: ([+-][\d.]+) MB \(start [\d.]+ GB used, end ",
                                                           str(pane.render())))
        # What the stage grew the disk by, to a tenth of a MB: the chain's own lines, the log's
        # second and its last but one.
        assert abs(float(shown[1]) - (end.used - start.used) / 1e6) <= 0.05 + 1e-9
        assert "no start line" not in str(pane.render())


# ------------------------------------------------------------ only the chain's own start line

async def _look(cfg: config.Config, box: Box) -> DiskView:
    """A console's first look (doctor's: one poll, then the reads beside it), its disk view."""
    session = BoxSession(cfg, lambda _: box, headless=True, around=Surroundings(one_look=True))
    await session.look_once()
    feed = session.state.feed(DiskFeed)
    assert feed is not None
    return feed.view()


HEX = "0123456789abcdef"


def _tags(nonce: str) -> st.SearchStrategy[str]:
    """What a stage may end a start line with: anything but its run's nonce, which it never sees."""
    other = st.text(HEX, min_size=16, max_size=16).filter(lambda n: n != nonce)
    return st.one_of(st.just(""), other.map(lambda n: f" [run {n}]"), st.just(f" [run {nonce.upper()}]"),
                     st.just(f" [run {nonce[:15]}]"), st.just(f" [run {nonce}] "), st.just(f" [run {nonce}]x"),
                     st.just(f"[run {nonce}]"), st.text(max_size=30).filter(lambda t: "\n" not in t))


def _forged(nonce: str) -> st.SearchStrategy[str]:
    reading = st.tuples(st.integers(0, 10**13), st.integers(0, 10**13), st.integers(1, 10**14))
    return st.builds(lambda r, tag: f"SAMAI_DISK start used={r[0]} avail={r[1]} size={r[2]} (forged) "
                                    f'path="/ws"{tag}', reading, _tags(nonce))


def test_a_start_line_the_stage_printed_in_the_head_is_not_taken(tmp_path: Path, workspace: Path,
                                                                isolated_dirs) -> None:
    import asyncio

    cfg = _config(tmp_path, workspace)
    loop = asyncio.new_event_loop()
    box = Box(LocalTransport(), str(workspace), python=sys.executable)
    try:
        log, nonce = loop.run_until_complete(_long_run(box, workspace))
        header, genuine, *rest = log.read_text().splitlines()
        genuine_reading = parse_disk_line(genuine)
        assert genuine_reading is not None and genuine.endswith(f" [run {nonce}]")
        unavailable = f"SAMAI_DISK start unavailable [run {nonce}]"  # what the chain says when it cannot read the disk
        headers = st.sampled_from([header, header.replace(nonce, "0" * 16), header.rsplit(" [run ", 1)[0]])

        @settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
        @given(st.lists(_forged(nonce), min_size=1, max_size=4), st.booleans(), headers, st.randoms())
        @example(['SAMAI_DISK start used=1 avail=1 size=9 path="/ws"'], False, header, None)
        def check(forged: list[str], with_genuine: bool, first: str, rnd) -> None:
            head = [*forged, genuine if with_genuine else unavailable]
            if rnd is not None:
                rnd.shuffle(head)
            log.write_text("\n".join([first, *head, *rest]) + "\n")
            delta = loop.run_until_complete(_look(cfg, box)).delta
            assert delta is not None and delta.stage == "long" and delta.end is not None
            taken = delta.start
            if with_genuine and first == header:
                assert taken == genuine_reading
            else:
                assert taken is None, (first, head)

        check()
    finally:
        loop.run_until_complete(box.close())
        loop.close()
