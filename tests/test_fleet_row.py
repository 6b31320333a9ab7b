"""A fleet row's slim poll (issue 36): the probe reads the process table for the stage states but
sends only the stages' processes, and the row's state judges what that shows. Real local boxes,
real fired stages; the box screen's full poll of the same workspace is the reference."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import pytest

from samai.console.core import config
from samai.console.core.connect import open_box
from samai.console.core.fleet import BoxWatch
from samai.console.core.session import BoxSession
from samai.remote.box.probe import check_request
from samai.remote.boxapi import Box
from samai.remote.boxtools import ToolSet
from samai.remote.local import LocalTransport
from tests.helpers import stop_stages_under

WORK = """
[stages.work]
key = "z"
command = "echo 'OOPS 7'; sleep 3; exit 3"
log = "logs/work.log"
markers = [{ name = "OOPS", pattern = "OOPS \\\\d+", severity = "warning" }]
"""


@pytest.fixture
def stages_stopped(tmp_path: Path):
    yield
    stop_stages_under(tmp_path)


def _config(tmp_path: Path, workspace: Path, extra: str = "") -> config.Config:
    f = tmp_path / "row.toml"
    f.write_text(f'pipeline = "row"\n[workspace]\npath = "{workspace}"\n[target]\nurl = "local"\npoll_interval = 0.3\n'
                 + extra + WORK)
    return config.load(f)


async def test_the_stages_scope_sends_the_stages_processes_and_the_same_states(box: Box, workspace: Path,
                                                                                stages_stopped) -> None:
    fired = await box.fire("work", "sleep 30 & sleep 30; wait", "logs/work.log", verify_s=1.0)
    full = await box.snapshot(processes=True)
    slim = await box.snapshot(processes="stages")
    again = await box.snapshot(processes="stages")  # answered as changes to the last: made whole again
    rec = slim.state("work")
    assert rec is not None and rec.status == "running" and fired.pid in rec.group and len(rec.group) >= 3
    assert {p.pid for p in slim.processes} == set(rec.group) == {p.pid for p in again.processes}
    assert os.getpid() in {p.pid for p in full.processes} and os.getpid() not in {p.pid for p in slim.processes}
    assert [(r.stage, r.status, r.alive, r.group) for r in full.states] == \
        [(r.stage, r.status, r.alive, r.group) for r in slim.states]


def test_a_processes_scope_it_does_not_know_is_refused_by_name() -> None:
    for bad in ("all", 1, None, ["stages"]):
        with pytest.raises(ValueError, match="request.processes"):
            check_request({"processes": bad})
    for good in (True, False, "stages"):
        check_request({"processes": good})


async def _poll_until(session, watch, predicate, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        update, row = await session.poll_once(), await watch.poll_once()
        if predicate(update, row):
            return update, row
        await asyncio.sleep(0.3)
    raise AssertionError("the condition never held")


async def test_a_row_says_what_the_box_screen_says_of_a_run_that_dies(tmp_path: Path, workspace: Path,
                                                                      stages_stopped) -> None:
    cfg = _config(tmp_path, workspace)
    session = BoxSession(cfg, lambda c: open_box(c))
    watch = BoxWatch("a", cfg, lambda c: open_box(c))
    firing = Box(LocalTransport(), str(workspace), python=sys.executable)
    try:
        await _poll_until(session, watch, lambda u, r: r.state == "connected")
        request = watch.state.request(watch.state.followers())
        assert request["processes"] == "stages"
        assert not {"writers", "binaries", "reports", "serving"} & request.keys()
        await firing.fire("work", cfg.stage("work").command, "logs/work.log", verify_s=0.5)
        _, row = await _poll_until(session, watch, lambda u, r: r.running == ("work",))
        held = {pid for rec in watch.state.snapshot.states for pid in rec.group}
        assert {p.pid for p in watch.state.snapshot.processes} <= held
        # Both have read the end: the session polls first, so the run can end between its poll and the row's.
        await _poll_until(session, watch, lambda u, r: not r.running and r.alert is not None
                          and "failed" in r.alert.text and any("failed" in a.text for a in session.state.alerts))
        said = [a.text for a in session.state.alerts if a.active]
        row_said = [a.text for a in watch.state.alerts if a.active]
        assert any("rc=3" in t and "OOPS 7" in t for t in row_said), row_said
        assert row_said == said  # the same alerts, in the same order, with the same evidence
    finally:
        await asyncio.gather(session.close(), watch.close(), firing.close())


async def test_a_row_raises_the_disk_reserve_alert_and_no_alarm_for_what_it_did_not_ask(
        tmp_path: Path, workspace: Path) -> None:
    extra = '[budget]\nreserve_gb = 1000000\n[model]\nllama_server = "/nowhere/llama-server"\n'
    cfg = _config(tmp_path, workspace, extra)
    watch = BoxWatch("a", cfg, lambda c: open_box(c, readonly=True))
    try:
        row = await watch.poll_once()
    finally:
        await watch.close()
    assert row.state == "connected" and row.alert is not None and "below the reserve" in row.alert.text
    codes = {a.code for a in watch.state.alerts}
    assert "binary_missing" not in codes  # binaries are not asked for: no claim either way


def test_every_box_shares_one_tool_set_and_its_packed_bytes(tmp_path: Path) -> None:
    a = Box(LocalTransport(), str(tmp_path / "a"), python=sys.executable)
    b = Box(LocalTransport(), str(tmp_path / "b"), python=sys.executable)
    assert a.tools is b.tools
    packed = a.tools.loader_for("probe.py")
    assert packed is b.tools.loader_for("probe.py") and a.tools.archive() is b.tools.archive()
    fresh = ToolSet(a.tools.digest, dict(a.tools.files))  # the same files: the same bytes, packed anew
    assert fresh.loader_for("probe.py") == packed
