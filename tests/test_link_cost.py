"""What the console costs a slow link: round trips to the first snapshot, the size of a steady
poll, and reads that grow while a log is behind (issue: the console over a real link).

Round trips are counted on a real transport wrapped to count what it sends: over SSH a command
run costs three (channel open, exec, its end), a stream two to start (open, exec) and one per
request. The benchmark bench/link.py times the same over an emulated 100 ms link.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from samai.console.app import SamaiApp
from samai.console.core import config
from samai.remote.box import install
from samai.remote.box import request_cache as box_held
from samai.remote.boxapi import Box, BoxError
from samai.remote.boxtools import ToolSet
from samai.remote.follow import CATCH_UP_READ, DEFAULT_READ, LogFollower
from samai.remote.local import LocalTransport
from samai.remote.request_delta import HeldRequest
from samai.remote.transport import RunResult
from tests.helpers import pilot_until

RUN_ROUND_TRIPS, STREAM_ROUND_TRIPS = 3, 2


@dataclass
class Counts:
    runs: int = 0
    streams: int = 0
    requests: int = 0

    @property
    def round_trips(self) -> int:
        return RUN_ROUND_TRIPS * self.runs + STREAM_ROUND_TRIPS * self.streams + self.requests


class CountingTransport:
    """LocalTransport, counting the calls that would each cost round trips on a link."""

    name = "counting"

    def __init__(self) -> None:
        self.inner = LocalTransport()
        self.counts = Counts()
        self.lines: list[bytes] = []

    @property
    def generation(self) -> int:
        return self.inner.generation

    async def run(self, argv: Sequence[str], *, stdin: bytes = b"", timeout: float,
                  retry_safe: bool = False) -> RunResult:
        self.counts.runs += 1
        return await self.inner.run(argv, stdin=stdin, timeout=timeout, retry_safe=retry_safe)

    async def open_stream(self, argv: Sequence[str], *, preamble: bytes = b""):
        self.counts.streams += 1
        return CountingStream(self, await self.inner.open_stream(argv, preamble=preamble))

    async def close(self) -> None:
        await self.inner.close()


class CountingStream:
    persistent = True

    def __init__(self, transport: CountingTransport, inner) -> None:
        self.transport, self.inner = transport, inner

    async def request(self, line: bytes, *, timeout: float) -> bytes:
        self.transport.counts.requests += 1
        self.transport.lines.append(line)
        return await self.inner.request(line, timeout=timeout)

    async def close(self) -> None:
        await self.inner.close()


# ---------------------------------------------------------------- first contact


async def test_the_first_snapshot_of_a_fresh_box_costs_four_round_trips_and_three_with_tools(workspace) -> None:
    fresh = CountingTransport()
    box = Box(fresh, str(workspace), python=sys.executable)
    snap = await box.snapshot()
    assert snap.processes and Path(box.tools_dir, ".ready").is_file()
    assert fresh.counts == Counts(runs=0, streams=1, requests=2)  # the archive rides on the second request
    assert fresh.counts.round_trips <= 5
    await box.stop("none")  # a tool run after the probe: the tools are known to be there, no check
    assert fresh.counts.runs == 1
    await box.close()

    present = CountingTransport()
    again = Box(present, str(workspace), python=sys.executable)
    await again.snapshot()
    assert present.counts == Counts(runs=0, streams=1, requests=1) and present.counts.round_trips <= 3
    await again.close()


async def test_tools_removed_under_a_running_console_are_installed_by_the_next_probe(workspace) -> None:
    box = Box(CountingTransport(), str(workspace), python=sys.executable)
    await box.snapshot()
    shutil.rmtree(box.tools_dir)
    await box.close()  # the probe ends with its connection; the next one starts afresh
    again = Box(CountingTransport(), str(workspace), python=sys.executable)
    assert (await again.snapshot()).processes and Path(again.tools_dir, ".ready").is_file()
    await again.close()


async def test_an_archive_that_does_not_match_its_digest_installs_nothing(workspace) -> None:
    tools = ToolSet.bundled()
    changed = dict(tools.files)
    changed["samai_box/probe.py"] += b"\nimport os; os.system('echo owned')\n"
    forged = ToolSet(tools.digest, changed)  # the digest of the real tools, on other content
    box = Box(CountingTransport(), str(workspace), python=sys.executable, tools=forged)
    with pytest.raises(BoxError, match="does not match its digest"):
        await box.snapshot()
    assert not Path(box.tools_dir, ".ready").exists() and not Path(box.tools_dir, "samai_box").exists()
    await box.close()


def test_the_digest_is_the_one_the_console_names_the_folder_by() -> None:
    tools = ToolSet.bundled()
    assert install.content_digest(dict(tools.files)) == tools.digest
    with pytest.raises(ValueError, match="does not match"):
        install.install("/nonexistent-samai-ws", tools.digest, {**tools.files, "samai_box/x.py": b""})


# ---------------------------------------------------------------- steady polls


@pytest.mark.slow
async def test_a_steady_tui_poll_fits_one_packet(workspace) -> None:
    """The samai-8b pipeline's real poll (nine stages, their markers, artifacts, binaries):
    whole it is several KB; once the probe holds it, a poll that changes nothing is under 1 KB."""
    cfg = config.load_builtin("samai-8b")
    cfg = replace(cfg, workspace=str(workspace), target=replace(cfg.target, python=sys.executable,
                                                                poll_interval=0.1))
    for stage in cfg.stages:
        log = Path(cfg.workspace, stage.log)
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("".join(f"{stage.name} step {i}\n" for i in range(50)))
    app = SamaiApp(cfg)
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot_until(pilot, lambda: app.box is not None and app.state.snapshot is not None)
        box = app.box
        sizes: list[int] = []

        def settled() -> bool:
            sizes.append(box.last_request_bytes)
            return len(sizes) > 30 and max(sizes[-5:]) < 1024

        await pilot_until(pilot, settled)
        followers = app.state.followers()
        whole = json.dumps({**box.snapshot_request(**app.state.request(followers)), "attach": True})
        assert len(whole) > 2048, len(whole)  # so the figure above says something
        assert len(followers) >= len(cfg.stages)


REQUEST_KEYS = ("workspace", "artifacts", "reports", "processes", "writers", "binaries", "processes_since")
VALUES = st.none() | st.booleans() | st.integers(-3, 3) | st.text(max_size=4) | st.lists(st.integers(0, 3), max_size=2)
LOG = st.fixed_dictionaries({"path": st.sampled_from(["a.log", "b.log", "c.log"])},
                            optional={k: VALUES for k in ("offset", "check", "mtime", "markers", "data", "scan_from")})
REQUEST = st.fixed_dictionaries({}, optional={**{k: VALUES for k in REQUEST_KEYS}, "logs": st.lists(LOG, max_size=4)})


@pytest.mark.slow
@settings(max_examples=300, deadline=None, database=None)
@given(first=REQUEST, then=st.lists(REQUEST, min_size=1, max_size=4))
def test_the_probe_reads_each_compacted_request_as_the_request_it_stands_for(first, then) -> None:
    console, probe = HeldRequest(), box_held.HeldRequest()
    console.answered(first, probe.keep(probe.expand(dict(first))))
    for request in then:
        sent = json.loads(json.dumps(console.compact(request)))  # as it travels
        got = probe.expand(sent)
        assert got == request
        console.answered(request, probe.keep(got))


def test_a_base_the_probe_does_not_hold_is_refused_by_name() -> None:
    probe = box_held.HeldRequest()
    with pytest.raises(box_held.HeldUnknown):
        probe.expand({"base": "someone-else.1", "same": ["logs"]})
    probe.keep({"logs": [{"path": "a"}]})
    with pytest.raises(ValueError, match="names no held log"):
        probe.expand({"base": probe.mark, "logs": [{"like": 5}]})


class ForgetfulTransport(CountingTransport):
    """Claims that one probe answers every request, but starts a new one for each: every
    compacted request reaches a probe that holds nothing."""

    async def open_stream(self, argv: Sequence[str], *, preamble: bytes = b""):
        self.counts.streams += 1
        return ForgetfulStream(self, list(argv))


class ForgetfulStream(CountingStream):
    def __init__(self, transport: CountingTransport, argv: list[str]) -> None:
        super().__init__(transport, None)
        self.argv = argv

    async def request(self, line: bytes, *, timeout: float) -> bytes:
        self.inner = await self.transport.inner.open_stream(self.argv)
        try:
            return await super().request(line, timeout=timeout)
        finally:
            await self.inner.close()

    async def close(self) -> None:
        return None


async def test_a_probe_that_does_not_hold_the_base_gets_the_request_whole(workspace) -> None:
    log = workspace / "a.log"
    log.write_text("one\ntwo\n")
    transport = ForgetfulTransport()
    box = Box(transport, str(workspace), python=sys.executable)
    follower = LogFollower(str(log), offset=0)
    assert follower.consume(await box.read_log(follower.cursor())).lines == ["one", "two"]
    with log.open("a") as f:
        f.write("three\n")
    assert follower.consume(await box.read_log(follower.cursor())).lines == ["three"]
    compacted, whole = transport.lines[-2:]
    assert b'"base"' in compacted and b'"base"' not in whole
    await box.close()


# ---------------------------------------------------------------- catch-up


async def test_reads_grow_while_a_log_is_behind_and_shrink_once_caught_up(box: Box, workspace) -> None:
    log = workspace / "burst.log"
    line = b"x" * 99 + b"\n"
    log.write_bytes(line * (200 * 1024))  # 20 MB
    follower = LogFollower(str(log), offset=0, catch_up_bytes=CATCH_UP_READ)
    reads, lines = [], 0
    while True:
        reads.append(follower.cursor().max_bytes)
        update = follower.consume(await box.read_log(follower.cursor()))
        lines += len(update.lines)
        if not update.more:
            break
    assert lines == 200 * 1024 and follower.offset == log.stat().st_size
    assert len(reads) <= 8 < log.stat().st_size // DEFAULT_READ  # 80 reads at the small size
    assert max(reads) == CATCH_UP_READ and follower.cursor().max_bytes == DEFAULT_READ


async def test_attached_bytes_come_back_exactly(box: Box, workspace) -> None:
    data = bytes(range(256)) * 64 + b"\n\r\x00\xff"
    (workspace / "blob.bin").write_bytes(data)
    assert await box.read_range(str(workspace / "blob.bin"), 0, len(data) - 1) == data
    chunk = await box.tail(str(workspace / "blob.bin"), 0)
    assert chunk.data == data
