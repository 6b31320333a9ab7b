"""Firing, stopping and killing real processes through the Box on this machine."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

from samai.remote.boxapi import Box
from samai.remote.local import LocalTransport
from samai.remote.model import Boot
from tests.helpers import start_time_of, wait_for


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.slow
async def test_fire_verifies_the_chain_and_it_prints_chain_done(box: Box, workspace: Path) -> None:
    result = await box.fire("hello", "echo hello from $SAMAI_STAGE; sleep 1.5; echo bye", "logs/hello.log",
                            verify_s=0.5)
    assert result.ok and result.state == "running"
    assert abs(result.start_time - start_time_of(result.pid)) < 0.05
    assert os.getpgid(result.pid) == result.pid and os.getsid(result.pid) == result.pid
    log = workspace / "logs" / "hello.log"
    wait_for(lambda: "CHAIN_DONE rc=0" in log.read_text(), timeout=10)
    text = log.read_text()
    assert "hello from hello" in text and text.index("bye") < text.index("CHAIN_DONE rc=0")
    snap = await box.snapshot()
    assert snap.state("hello").status == "done" and snap.state("hello").rc == 0


async def test_a_chain_whose_command_does_not_exist_is_reported_failed(box: Box) -> None:
    # Reported as soon as it died: waiting out the 600 s verify window would hit the deadline.
    result = await asyncio.wait_for(box.fire("broken", "no-such-command-xyz --flag", "logs/broken.log",
                                             verify_s=600.0), timeout=60)
    assert not result.ok and result.state == "failed" and result.rc == 127
    assert any("no-such-command-xyz" in line and "not found" in line for line in result.log_tail)
    assert result.log_tail[-1] == f"CHAIN_DONE rc=127 [run {result.nonce}]"


async def test_a_quick_successful_stage_is_done_not_failed(box: Box) -> None:
    result = await box.fire("quick", "true", "logs/quick.log", verify_s=2.0)
    assert result.ok and result.state == "done" and result.rc == 0


@pytest.mark.slow
async def test_a_restarted_box_reattaches_to_a_running_stage(box: Box, workspace: Path) -> None:
    fired = await box.fire("long", "sleep 30", "logs/long.log", verify_s=0.3)
    try:
        fresh = Box(LocalTransport(), str(workspace), python=sys.executable)  # as a restarted console would build it
        rec = (await fresh.snapshot()).state("long")
        assert rec is not None and rec.status == "running"
        assert (rec.pid, rec.start_time, rec.cmd) == (fired.pid, fired.start_time, "sleep 30")
        again = await fresh.fire("long", "sleep 30", "logs/long.log", verify_s=0.3)
        assert again.state == "refused" and "already running" in again.reason
        await fresh.close()  # its probe with it (left running, it outlived the test)
    finally:
        await box.stop("long", grace=1)
    assert not _alive(fired.pid)


def _as_if_the_clock_stepped(workspace: Path, stage: str, seconds: int, boot_id: str | None = None) -> None:
    """Rewrite a stage's record as its launch would have written it had /proc/stat's btime been
    `seconds` later: what every tool on the box sees once the clock has been stepped back by that
    much (chrony's makestep, a VM resumed), since btime moves with the clock."""
    path = workspace / ".samai" / "state" / f"{stage}.json"
    rec = json.loads(path.read_text())
    assert rec["boot_id"] and rec["boot_time"]
    rec.update(start_time=round(rec["start_time"] + seconds, 2), boot_time=rec["boot_time"] + seconds)
    if boot_id:
        rec["boot_id"] = boot_id
    path.write_text(json.dumps(rec))


@pytest.mark.slow
async def test_after_a_clock_step_a_running_stage_still_runs_once_and_stops(box: Box, workspace: Path) -> None:
    fired = await box.fire("long", "sleep 30", "logs/long.log", verify_s=0.3)
    try:
        _as_if_the_clock_stepped(workspace, "long", 5)
        assert (await box.snapshot()).state("long").status == "running"  # not lost, not orphaned
        again = await box.fire("long", "sleep 30", "logs/long.log", verify_s=0.3)
        assert again.state == "refused" and "already running" in again.reason  # no second run beside it
        stopped = await box.stop("long", grace=1)
        assert stopped.ok and stopped.result == "exited"
    finally:
        if _alive(fired.pid):
            os.killpg(fired.pid, signal.SIGKILL)
    assert not _alive(fired.pid)


@pytest.mark.slow
async def test_a_record_from_another_boot_matches_no_process(box: Box, workspace: Path) -> None:
    fired = await box.fire("long", "sleep 30", "logs/long.log", verify_s=0.3)
    try:
        _as_if_the_clock_stepped(workspace, "long", 5, boot_id="another-boot")
        assert (await box.snapshot()).state("long").status != "running"
        stopped = await box.stop("long", grace=1)
        assert stopped.result == "refused" and "another process" in stopped.reason
        assert _alive(fired.pid)
    finally:
        os.killpg(fired.pid, signal.SIGKILL)


async def test_fire_rotates_the_previous_log(box: Box, workspace: Path) -> None:
    await box.fire("r", "echo first", "logs/r.log", verify_s=1.0)
    await box.fire("r", "echo second", "logs/r.log", verify_s=1.0)
    assert "second" in (workspace / "logs" / "r.log").read_text()
    assert "first" in (workspace / "logs" / "r.log.1").read_text()


async def test_kill_with_a_wrong_start_time_is_refused_and_the_process_lives(box: Box, spawn) -> None:
    proc = spawn("sleep", "30")
    real = start_time_of(proc.pid)
    result = await box.kill(proc.pid, real - 5.0, signal="KILL")
    assert result.result == "refused" and "another process" in result.reason and result.signalled == ()
    assert proc.poll() is None
    result = await box.kill(proc.pid, real, signal="TERM", grace=2)
    assert result.ok and result.result == "exited"
    assert proc.wait(5) == -signal.SIGTERM  # TERM ended it: the refused KILL never reached it


@pytest.mark.parametrize("off_by", [2.0, 1.5, 0.5, -2.0, 1.05])
async def test_a_start_time_off_by_more_than_btimes_own_step_is_refused(box: Box, spawn, off_by: float) -> None:
    proc = spawn("sleep", "30")
    assert (await box.kill(proc.pid, start_time_of(proc.pid) + off_by, signal="KILL")).result == "refused"
    assert proc.poll() is None


@pytest.mark.parametrize("off_by", [1.0, -1.0])
async def test_a_start_time_read_when_btime_said_the_second_beside_still_names_the_process(
        box: Box, spawn, off_by: float) -> None:
    # /proc/stat's btime is worked out anew at each read and cut to a whole second, so a start
    # time read a moment earlier can be exactly one second off (it failed a CI run that way).
    proc = spawn("sleep", "30")
    done = await box.kill(proc.pid, start_time_of(proc.pid) + off_by, signal="TERM", grace=2)
    assert done.ok and done.result == "exited" and proc.wait(5) == -signal.SIGTERM


async def test_kill_refuses_init_and_the_console_itself(box: Box) -> None:
    me = psutil.Process()
    assert (await box.kill(1, 0.0)).result == "refused"
    result = await box.kill(me.pid, start_time_of(me.pid), signal="TERM")
    assert result.result == "refused" and "protected" in result.reason
    parent = me.parent()
    assert (await box.kill(parent.pid, start_time_of(parent.pid))).result == "refused"


@pytest.mark.slow
async def test_stop_kills_the_whole_group_even_a_child_that_ignores_term(box: Box, workspace: Path) -> None:
    stubborn = f"{sys.executable} -c 'import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); " \
               f"print(\"ready\", flush=True); time.sleep(60)'"
    fired = await box.fire("stubborn", f"{stubborn} & sleep 60; wait", "logs/stubborn.log", verify_s=0.3)
    assert fired.state == "running"
    log = workspace / "logs" / "stubborn.log"
    wait_for(lambda: "ready" in log.read_text())
    group = [p for p in psutil.process_iter() if _pgid(p.pid) == fired.pid]
    assert len(group) >= 3  # the chain, its subshell's sleep and the stubborn child
    started = time.monotonic()
    result = await box.stop("stubborn", grace=1.0)
    assert result.ok and result.result == "killed" and not result.survivors
    assert time.monotonic() - started >= 1.0  # TERM first, KILL only after the grace period
    assert not any(_alive(p.pid) for p in group)
    assert "CHAIN_DONE rc=" in log.read_text()


async def test_stop_of_a_stage_that_is_not_running_says_so(box: Box) -> None:
    assert (await box.stop("never-fired")).result == "gone"
    await box.fire("brief", "true", "logs/brief.log", verify_s=1.0)
    assert (await box.stop("brief")).result == "gone"


async def test_a_kill_reads_the_start_time_against_the_boot_it_came_with(box: Box, spawn) -> None:
    proc = spawn("sleep", "30")
    snap = await box.snapshot()
    seen = snap.process(proc.pid)
    assert snap.boot == Boot(snap.boot_time, snap.boot_id) and snap.boot_id
    # As the snapshot would have read it before the clock was stepped back by 5 s.
    before_step, started = Boot(snap.boot_time + 5, snap.boot_id), seen.start_time + 5
    assert (await box.kill(proc.pid, started, signal="KILL")).result == "refused"  # read against btime now
    other_boot = await box.kill(proc.pid, started, boot=Boot(before_step.time, "another-boot"), signal="KILL")
    assert other_boot.result == "refused" and proc.poll() is None
    done = await box.kill(proc.pid, started, boot=before_step, grace=2)
    assert done.ok and done.result == "exited" and proc.wait(5) == -signal.SIGTERM


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


@pytest.mark.slow
def test_launch_does_not_leave_the_callers_pipes_open(workspace: Path) -> None:
    """A detached chain must not hold the launcher's stdout: SSH sessions would hang on it."""
    box = Box(LocalTransport(), str(workspace), python=sys.executable)
    # A chain that held the launcher's stdout would hold the call for its 600 s: the deadline only catches that.
    result = asyncio.run(asyncio.wait_for(box.fire("detached", "sleep 600", "logs/d.log", verify_s=0.2), timeout=60))
    try:
        fds = os.listdir(f"/proc/{result.pid}/fd")
        links = {os.readlink(f"/proc/{result.pid}/fd/{fd}") for fd in fds}
        assert not any(link.startswith("pipe:") for link in links)
        assert os.path.realpath("/dev/null") in links
    finally:
        asyncio.run(box.stop("detached", grace=1))

