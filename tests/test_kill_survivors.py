"""Kill and stop end what they were asked to end, or say by pid what still lives (issue 13, item 6).

Real processes throughout: group leaders whose children ignore SIGTERM, stages whose commands
leave processes behind in sessions of their own, kernel threads, another user's process."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from samai.remote.boxapi import Box, BoxError
from samai.remote.local import LocalTransport
from tests.helpers import start_time_of, unavailable_here, wait_for

PF_KTHREAD = 0x00200000

# Forks two children that ignore SIGTERM, says "ready" and sleeps; SIGTERM ends the leader itself.
LEADER = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
for _ in range(2):
    if os.fork() == 0:
        time.sleep(60)
        os._exit(0)
signal.signal(signal.SIGTERM, signal.SIG_DFL)
print("ready", flush=True)
time.sleep(60)
"""

# Ignores SIGTERM, writes its pid to the file argv[1] names and sleeps.
STUBBORN = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(60)
"""


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _kill_quietly(pids) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture
def leader(spawn) -> Iterator[tuple[subprocess.Popen, list[int]]]:
    """A group leader (its own session) and its two TERM-ignoring children, all killed at the end."""
    proc = spawn(sys.executable, "-c", LEADER, stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout.readline().strip() == "ready"
    children = sorted(c.pid for c in psutil.Process(proc.pid).children())
    assert len(children) == 2 and all(os.getpgid(c) == proc.pid for c in children)
    yield proc, children
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


async def test_killing_a_group_leader_alone_reports_its_children_still_running(box: Box, leader) -> None:
    proc, children = leader
    started = start_time_of(proc.pid)
    result = await box.kill(proc.pid, started, signal="TERM", grace=2, group=False)
    assert proc.wait(5) == -signal.SIGTERM  # only the leader was asked to end, and it did
    assert result.ok and result.result == "exited" and not result.survivors
    assert result.remaining == tuple(children)  # not ok-silent: who is left, by pid
    assert all(_alive(c) for c in children)


@pytest.mark.slow
async def test_killing_the_whole_group_ends_even_children_that_ignore_term(box: Box, leader) -> None:
    proc, children = leader
    started = start_time_of(proc.pid)
    result = await box.kill(proc.pid, started, signal="TERM", grace=1, group=True)
    assert result.ok and result.result == "killed" and not result.survivors and not result.remaining
    assert set(result.signalled) == {proc.pid, *children}
    assert proc.wait(5) == -signal.SIGTERM
    assert not any(_alive(c) for c in children)


async def test_a_kill_request_must_say_process_or_group(box: Box, spawn) -> None:
    proc = spawn("sleep", "30")
    request = {"pid": proc.pid, "start_time": start_time_of(proc.pid), "signal": "KILL"}
    reply = await box.call("kill.py", request)
    assert reply["result"] == "refused" and '"group"' in reply["reason"]
    assert proc.poll() is None


def _stubborn_script(workspace: Path) -> Path:
    script = workspace / "stubborn.py"
    script.write_text(STUBBORN)
    return script


def _pids_in(folder: Path, *names: str) -> list[int]:
    return [int((folder / name).read_text()) for name in names]


@pytest.mark.slow
async def test_stop_follows_a_stages_processes_into_sessions_of_their_own(box: Box, workspace: Path) -> None:
    """One child leaves the group with setsid and is orphaned (only its chain marker tells it is
    the stage's); another leaves it with its environment cleared (its parent still leads to it)."""
    py, script = sys.executable, _stubborn_script(workspace)
    command = f"setsid sh -c '{py} {script} orphan.pid &'; setsid env -i {py} {script} bare.pid & sleep 60; wait"
    fired = await box.fire("escape", command, "logs/escape.log", verify_s=0.3)
    assert fired.state == "running"
    wait_for(lambda: (workspace / "orphan.pid").exists() and (workspace / "bare.pid").exists())
    escaped = _pids_in(workspace, "orphan.pid", "bare.pid")
    try:
        assert all(os.getsid(p) != fired.pid and os.getpgid(p) != fired.pid for p in escaped)
        assert psutil.Process(escaped[0]).ppid() != fired.pid  # its parent sh is gone: no trail by ppid
        seen = (await box.snapshot()).state("escape")
        assert set(escaped) <= set(seen.group)
        result = await box.stop("escape", grace=1)
        assert not any(_alive(p) for p in escaped), result
        assert result.ok and result.result == "killed" and not result.survivors
        assert set(escaped) <= set(result.signalled)
    finally:
        _kill_quietly(escaped)


@pytest.mark.slow
async def test_a_stage_whose_chain_finished_stops_the_setsid_child_it_left(box: Box, workspace: Path) -> None:
    """Nothing of a finished stage lives on (issue 31): a child that left the group with setsid
    and ignores TERM is still found by its chain marker when the chain ends, and killed."""
    command = f"setsid sh -c '{sys.executable} {_stubborn_script(workspace)} daemon.pid &'; sleep 0.5; echo started"
    await box.fire("daemon", command, "logs/daemon.log", verify_s=0.2)
    wait_for(lambda: (workspace / "daemon.pid").exists())
    (daemon,) = _pids_in(workspace, "daemon.pid")
    try:
        wait_for(lambda: not _alive(daemon), timeout=20)  # TERM ignored: KILL after the grace
        log_file = workspace / "logs" / "daemon.log"
        log = wait_for(lambda: "CHAIN_DONE" in log_file.read_text() and log_file.read_text())
        last = log.rstrip().splitlines()[-1]
        assert f"SAMAI_SURVIVORS stopped {daemon}:" in log and last.startswith("CHAIN_DONE rc=0 ")
        snap = await box.snapshot()
        assert snap.state("daemon").status == "done" and snap.state("daemon").group == ()
    finally:
        _kill_quietly([daemon])


def _kernel_threads() -> list[int]:
    found = []
    for p in psutil.pids():
        try:
            raw = Path(f"/proc/{p}/stat").read_text()
        except OSError:
            continue
        if int(raw[raw.rindex(")") + 2:].split()[6]) & PF_KTHREAD:
            found.append(p)
    return found


async def test_pid_2_is_refused(box: Box) -> None:
    if not os.path.exists("/proc/2"):
        unavailable_here("no pid 2 in this pid namespace")
    started = start_time_of(2)
    for group in (False, True):
        result = await box.kill(2, started, signal="KILL", group=group)
        assert result.result == "refused" and "kthreadd" in result.reason and "\n" not in result.reason


async def test_a_kernel_thread_is_refused(box: Box) -> None:
    threads = [p for p in _kernel_threads() if p != 2]
    if not threads:
        unavailable_here("no kernel thread is visible in this pid namespace")
    pid = threads[-1]
    for group in (False, True):
        result = await box.kill(pid, start_time_of(pid), signal="KILL", group=group)
        assert result.result == "refused" and "kernel thread" in result.reason, result
    assert psutil.pid_exists(pid)


@pytest.fixture
def unprivileged_box() -> Iterator[Box]:
    """A Box whose tools run as uid 65533 (no user of that id needed), in a workspace it can read."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        unavailable_here("needs root and setpriv to run the box tools as another user")
    folder = Path(tempfile.mkdtemp(prefix="samai-kill-"))
    try:
        folder.chmod(0o755)
        python = folder / "python-as-65533"
        wrapper = f"exec setpriv --reuid=65533 --regid=65533 --clear-groups {sys.executable} \"$@\"\n"
        python.write_text("#!/bin/sh\n" + wrapper)
        python.chmod(python.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        (folder / "ws").mkdir(mode=0o755)
        os.chown(folder / "ws", 65533, 65533)  # its own workspace, where it may install the tools
        yield Box(LocalTransport(), str(folder / "ws"), python=str(python))
    finally:
        shutil.rmtree(folder)


@pytest.mark.parametrize("group", [False, True])
async def test_another_users_process_is_a_one_line_permission_refusal(unprivileged_box: Box, spawn,
                                                                      group: bool) -> None:
    victim = spawn("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sleep", "60",
                   start_new_session=True)
    wait_for(lambda: psutil.Process(victim.pid).uids().real == 65534)
    owner = psutil.Process(victim.pid).username()
    result = await unprivileged_box.kill(victim.pid, start_time_of(victim.pid), group=group)
    assert result.result == "refused" and not result.ok
    assert result.reason == f"pid {victim.pid} belongs to user {owner}: permission denied"
    assert victim.poll() is None


async def test_a_failure_in_the_tool_is_one_line_not_a_traceback(box: Box, workspace: Path) -> None:
    (workspace / ".samai" / "state" / "odd.json").mkdir(parents=True)  # a record that cannot be read
    with pytest.raises(BoxError) as failed:
        await box.stop("odd", grace=1)
    message = str(failed.value)
    assert "Traceback" not in message and "\n" not in message.strip()
    assert "not a regular file" in message


@pytest.mark.slow
async def test_a_stage_killed_outright_gets_its_chain_done_only_in_a_log_inside_the_workspace(
        box: Box, workspace: Path, tmp_path: Path) -> None:
    inside = await box.fire("inside", "sleep 30", "logs/inside.log", verify_s=0.3)
    outside = await box.fire("outside", "sleep 30", "logs/outside.log", verify_s=0.3)
    assert inside.state == outside.state == "running"
    elsewhere = tmp_path / "elsewhere.log"
    elsewhere.write_text("not the console's\n")
    record = workspace / ".samai" / "state" / "outside.json"
    record.write_text(record.read_text().replace(str(workspace / "logs" / "outside.log"), str(elsewhere)))
    for stage in ("inside", "outside"):
        result = await box.stop(stage, signal="KILL")
        assert result.ok and result.result == "killed"
    assert not _alive(inside.pid) and not _alive(outside.pid)
    lines = (workspace / "logs" / "inside.log").read_text().splitlines()
    assert lines[-1] == f"CHAIN_DONE rc=137 (killed by samai-console) [run {inside.nonce}]"
    assert elsewhere.read_text() == "not the console's\n"  # a record pointing out of the workspace wrote nothing


@pytest.mark.slow
async def test_a_fifo_in_place_of_a_stage_record_is_refused_not_waited_on(box: Box, workspace: Path) -> None:
    """A FIFO's open() blocks until a writer comes: neither stop nor fire may wait for one."""
    state = workspace / ".samai" / "state"
    state.mkdir(parents=True)
    os.mkfifo(state / "trap.json")
    box.timeout = 10  # a blocked open would show as this deadline passing, not as a refusal
    with pytest.raises(BoxError) as failed:
        await box.stop("trap", grace=1)
    assert "not a regular file" in str(failed.value)
    fired = await box.fire("trap", "sleep 30", "logs/trap.log", verify_s=0.3)
    assert fired.state == "running"  # the FIFO is no record of a running stage: replaced by the real one
    assert (await box.stop("trap", grace=1)).ok
