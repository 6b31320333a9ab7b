"""What a --serve probe remembers between requests never shows in its answers: processes that
exec, rewrite their argv, open listeners, die, or hold files that get renamed, between two
requests to one probe, show in the second reply as a fresh probe would see them.

Each process here sleeps through a few requests first (blocked reading its stdin), so that the
probe has every reason to trust what it remembered, and is then made to change."""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from samai.remote import model
from samai.remote.boxapi import Box, BoxError, HeldProcesses
from tests.helpers import wait_for

# Blocks on stdin; each line it reads is a command, each answered with one line.
SLEEPER = """import os, socket, sys
held = []
for line in sys.stdin:
    cmd = line.split()
    if cmd[0] == "ping":
        print("ok", flush=True)
    elif cmd[0] == "exec":
        os.execv(sys.executable, [sys.executable, "-c", "import sys; sys.stdin.read()", "after-exec"])
    elif cmd[0] == "listen":
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen()
        held.append(s)
        print(s.getsockname()[1], flush=True)
    elif cmd[0] == "open":
        held.append(open(cmd[1], "ab"))
        print("ok", flush=True)
    elif cmd[0] == "rewrite":  # argv rewritten in place, as setproctitle does: no exec, same comm
        f = open("/proc/self/stat").read()
        fields = f[f.rindex(")") + 2:].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (fields 48, 49)
        with open("/proc/self/mem", "r+b", buffering=0) as mem:
            mem.seek(start)
            args = mem.read(end - start)
            mem.seek(start + args.rindex(b"before-rewrite"))
            mem.write(b"after--rewrite")
        print("ok", flush=True)
"""


def _sleeper(spawn, *args: str) -> subprocess.Popen:
    """A started SLEEPER, blocked reading its next command."""
    proc = spawn(sys.executable, "-c", SLEEPER, *args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert _tell(proc, "ping") == "ok"
    return proc


def _tell(proc: subprocess.Popen, command: str) -> str:
    proc.stdin.write(command + "\n")
    proc.stdin.flush()
    return proc.stdout.readline().strip()


def _ended(pid: int) -> bool:
    """Gone, or a zombie (whose files are closed) waiting for whoever adopted it to reap it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2] in "ZX"


async def _settle(box: Box, **kw):
    """A few requests while everything sleeps: the probe now remembers all it may."""
    for _ in range(3):
        snap = await box.snapshot(**kw)
    return snap


async def test_a_process_that_execs_gets_its_new_argv(box: Box, spawn) -> None:
    proc = _sleeper(spawn, "before-exec")
    snap = await _settle(box)
    assert snap.process(proc.pid).argv[-1] == "before-exec"
    comm = snap.process(proc.pid).comm
    proc.stdin.write("exec\n")
    proc.stdin.flush()
    wait_for(lambda: b"after-exec" in Path(f"/proc/{proc.pid}/cmdline").read_bytes())
    wait_for(lambda: Path(f"/proc/{proc.pid}/stat").read_text().split()[2] == "S")
    seen = (await box.snapshot()).process(proc.pid)
    assert seen.argv[-1] == "after-exec" and seen.comm == comm  # same pid, start time and comm


async def test_argv_rewritten_in_place_is_seen(box: Box, spawn) -> None:
    proc = _sleeper(spawn, "before-rewrite")
    assert (await _settle(box)).process(proc.pid).argv[-1] == "before-rewrite"
    assert _tell(proc, "rewrite") == "ok"
    assert (await box.snapshot()).process(proc.pid).argv[-1] == "after--rewrite"


@pytest.mark.parametrize("writers", [True, False])
async def test_a_new_listener_is_seen_with_its_owner(box: Box, spawn, writers: bool) -> None:
    proc = _sleeper(spawn)
    await _settle(box, writers=writers)
    port = int(_tell(proc, "listen"))
    by_port = {s.port: s for s in (await box.snapshot(writers=writers)).listeners}
    assert by_port[port].pid == proc.pid


@pytest.mark.parametrize("writers", [True, False])
async def test_a_listener_goes_to_the_process_still_holding_it_when_its_owner_dies(box: Box, spawn,
                                                                                 writers: bool) -> None:
    code = ("import os,socket,sys,time\ns=socket.socket()\ns.bind(('127.0.0.1',0))\ns.listen()\n"
            "child=os.fork()\nif child==0:\n    time.sleep(60)\n    os._exit(0)\n"
            "print(s.getsockname()[1],child,flush=True)\nsys.stdin.read()")
    parent = spawn(sys.executable, "-c", code, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    port, child = map(int, parent.stdout.readline().split())
    try:
        owners = {s.port: s.pid for s in (await _settle(box, writers=writers)).listeners}
        assert owners[port] == min(parent.pid, child)  # both hold it: the lowest pid is named
        parent.kill()
        parent.wait()
        snap = await box.snapshot(writers=writers)
        assert snap.process(parent.pid) is None
        assert {s.port: s.pid for s in snap.listeners}[port] == child
        os.kill(child, signal.SIGKILL)
        wait_for(lambda: _ended(child))
        assert port not in {s.port for s in (await box.snapshot(writers=writers)).listeners}
    finally:
        if Path(f"/proc/{child}").exists():
            os.kill(child, signal.SIGKILL)


async def test_a_process_that_exits_is_gone_from_the_next_reply(box: Box, spawn) -> None:
    proc = _sleeper(spawn)
    assert (await _settle(box, writers=True)).process(proc.pid) is not None
    proc.kill()
    proc.wait()
    assert (await box.snapshot(writers=True)).process(proc.pid) is None


async def test_writers_follow_a_rename_and_a_new_writer(box: Box, workspace: Path, spawn) -> None:
    part = workspace / "model.gguf.part"
    first, second, third = (_sleeper(spawn) for _ in range(3))
    assert _tell(first, f"open {part}") == "ok" and _tell(second, f"open {part}") == "ok"
    snap = await _settle(box, writers=True)
    assert dict(snap.writers) == {str(part): tuple(sorted((first.pid, second.pid)))}
    done = workspace / "model.gguf"
    part.rename(done)  # under two writers that sleep through it
    snap = await box.snapshot(writers=True)
    assert dict(snap.writers) == {str(done): tuple(sorted((first.pid, second.pid)))}
    assert _tell(third, f"open {done}") == "ok"
    snap = await box.snapshot(writers=True)
    assert dict(snap.writers) == {str(done): tuple(sorted((first.pid, second.pid, third.pid)))}


@pytest.mark.slow
async def test_serve_answers_as_a_fresh_probe_does(box: Box, workspace: Path, spawn) -> None:
    procs = [_sleeper(spawn, f"arg-{i}") for i in range(5)]
    port = int(_tell(procs[0], "listen"))
    await _settle(box, writers=True)
    served = await box.snapshot(writers=True)
    done = subprocess.run([sys.executable, "-S", box.tools_dir, "probe"],
                          input=json.dumps({"workspace": str(workspace)}),  # one-shot: nothing remembered
                          capture_output=True, text=True, check=True)
    fresh = json.loads(done.stdout)
    by_pid = {p["pid"]: p for p in fresh["processes"]}
    for proc in procs:
        mine, theirs = served.process(proc.pid), by_pid[proc.pid]
        assert (mine.argv, mine.user, mine.start_time, mine.comm, mine.ppid, mine.pgid) == (
            tuple(theirs["argv"]), theirs["user"], theirs["start_time"], theirs["comm"], theirs["ppid"],
            theirs["pgid"])
    assert {s.port: s.pid for s in served.listeners}[port] == procs[0].pid
    assert {s["port"]: s["pid"] for s in fresh["listeners"]}[port] == procs[0].pid


# ---------------------------------------------------------------- the probe's own functions


BOX_MODULES = ("procfs", "disk", "sockets", "markers", "logfiles", "procs", "probe")


@pytest.fixture
def tools(monkeypatch):
    """The probe's modules, freshly imported (the package the box runs as samai_box)."""
    modules = [f"samai.remote.box.{name}" for name in BOX_MODULES]
    for module in modules:
        monkeypatch.delitem(sys.modules, module, raising=False)
    yield SimpleNamespace(**{name: importlib.import_module(m) for name, m in zip(BOX_MODULES, modules, strict=True)})


def test_remembered_listings_never_hide_a_change(tools, workspace: Path, monkeypatch) -> None:
    monkeypatch.setattr(tools.disk.Listings, "RACY_S", 0.0)  # remember every listing at once
    tree = workspace / "venv"
    for d in range(5):
        (tree / f"pkg{d}" / "sub").mkdir(parents=True)
        for f in range(3):
            (tree / f"pkg{d}" / "sub" / f"m{f}.py").write_bytes(b"x" * 100)
    listings = tools.disk.Listings()

    def check() -> tuple:
        time.sleep(0.05)  # past the timestamp tick of the last change
        remembered = tools.disk.artifacts(str(workspace), [{"name": "venv", "path": "venv"}], 10.0, listings)
        fresh = tools.disk.artifacts(str(workspace), [{"name": "venv", "path": "venv"}], 10.0)
        assert remembered == fresh
        return remembered[0]["bytes"], remembered[0]["files"]

    assert check() == (1500, 15)
    assert len(listings.kept) == 11  # venv, 5 pkg, 5 sub: all remembered
    (tree / "pkg0" / "sub" / "m0.py").write_bytes(b"x" * 1000)  # grows; its folder does not change
    assert check() == (2400, 15)
    (tree / "pkg1" / "sub" / "new.py").write_bytes(b"y" * 7)
    assert check() == (2407, 16)
    for f in (tree / "pkg2" / "sub").iterdir():
        f.unlink()
    (tree / "pkg2" / "sub").rmdir()
    assert check() == (2107, 13)
    (tree / "pkg3" / "sub" / "m1.py").unlink()
    (tree / "pkg3" / "sub" / "m1.py").mkdir()  # a file become a folder of the same name
    (tree / "pkg3" / "sub" / "m1.py" / "inner").write_bytes(b"z" * 50)
    assert check() == (2057, 13)
    os.rename(tree / "pkg4", workspace / "elsewhere")
    assert check() == (1757, 10)


@pytest.mark.slow
async def test_a_folder_changed_between_two_requests_is_seen(box: Box, workspace: Path) -> None:
    tree = workspace / "runs" / "checkpoints"
    (tree / "checkpoint-1").mkdir(parents=True)
    (tree / "checkpoint-1" / "weights").write_bytes(b"w" * 1000)
    time.sleep(2.2)  # old enough for the probe to remember the listings (Listings.RACY_S)
    arts = [("checkpoints", "runs/checkpoints")]
    for _ in range(2):
        (art,) = (await box.snapshot(artifacts=arts, processes=False)).artifacts
    assert (art.bytes, art.files) == (1000, 1)
    with open(tree / "checkpoint-1" / "weights", "ab") as f:
        f.write(b"w" * 500)
    (tree / "checkpoint-2").mkdir()
    (tree / "checkpoint-2" / "weights").write_bytes(b"v" * 10)
    (art,) = (await box.snapshot(artifacts=arts, processes=False)).artifacts
    assert (art.bytes, art.files) == (1510, 2)


def test_listening_sockets_from_netlink_are_those_of_proc_net(tools) -> None:
    mine = [socket.socket(socket.AF_INET), socket.socket(socket.AF_INET6)]
    try:
        mine[0].bind(("127.0.0.1", 0))
        mine[1].bind(("::1", 0))
        for s in mine:
            s.listen()
        tools.sockets.diag_listening(socket.AF_INET)  # raises where the kernel has no sock_diag
        errors: list = []
        found = tools.sockets.listening_sockets(errors)
        assert tools.sockets.SOCK_DIAG["usable"]
        assert found == tools.sockets.proc_net_listening(errors) and not errors
        ports = {(v["proto"], v["host"], v["port"]) for v in found.values()}
        assert ("tcp", "127.0.0.1", mine[0].getsockname()[1]) in ports
        assert ("tcp6", "::1", mine[1].getsockname()[1]) in ports
    finally:
        for s in mine:
            s.close()


def test_without_netlink_the_probe_reads_proc_net(tools, monkeypatch) -> None:
    def refused(family):
        raise OSError(93, "Protocol not supported")

    monkeypatch.setattr(tools.sockets, "diag_listening", refused)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        found = tools.sockets.listening_sockets([])
        assert s.getsockname()[1] in {v["port"] for v in found.values()}
    assert not tools.sockets.SOCK_DIAG["usable"]


# ---------------------------------------------------------------- only what changed


def _ask(tools, memory, since=None) -> dict:
    request = {"processes": True, "states": False} | ({"processes_since": since} if since else {})
    return json.loads(tools.probe.answer(json.dumps(request), memory))


def test_a_reply_since_the_last_one_gives_only_what_changed(tools, spawn) -> None:
    sleeping, leaving = _sleeper(spawn, "stays"), _sleeper(spawn, "leaves")
    memory = tools.probe.Memory()
    first = _ask(tools, memory)
    assert {sleeping.pid, leaving.pid} <= {p["pid"] for p in first["processes"]}
    assert "processes_since" not in first and "processes_gone" not in first
    settled = _ask(tools, memory, first["processes_mark"])
    assert settled["processes_since"] == first["processes_mark"]
    leaving.kill()
    leaving.wait()
    arrived = _sleeper(spawn, "arrives")
    changes = _ask(tools, memory, settled["processes_mark"])
    changed = {p["pid"] for p in changes["processes"]}
    assert sleeping.pid not in changed and arrived.pid in changed  # asleep all along: unchanged
    assert leaving.pid in changes["processes_gone"] and leaving.pid not in changed
    full = _ask(tools, memory, first["processes_mark"])  # not the last mark: everything again
    assert "processes_since" not in full and sleeping.pid in {p["pid"] for p in full["processes"]}
    assert _ask(tools, tools.probe.Memory(), full["processes_mark"])["processes_mark"] != full["processes_mark"]


async def test_the_box_makes_each_reply_whole_again(box: Box, spawn) -> None:
    stays, leaves = _sleeper(spawn, "stays"), _sleeper(spawn, "leaves")
    snap = await _settle(box)
    assert snap.process(stays.pid) and snap.process(leaves.pid)
    leaves.kill()
    leaves.wait()
    arrives = _sleeper(spawn, "arrives")
    snap = await box.snapshot()
    assert snap.process(stays.pid).argv[-1] == "stays" and snap.process(leaves.pid) is None
    assert snap.process(arrives.pid).argv[-1] == "arrives"
    pids = [p.pid for p in snap.processes]
    assert pids == sorted(pids) and len(set(pids)) == len(pids)


async def test_a_process_the_probe_left_unchanged_is_not_converted_again(box: Box, spawn) -> None:
    """The Box keeps what it made of each process: an entry the probe said had not changed comes
    back as the very same Process (a box's hundreds of idle processes cost nothing per poll), and
    one that changed is made anew."""
    _sleeper(spawn, "stays")
    before = await _settle(box)
    after = await box.snapshot()
    # Equal is unchanged here: the probe resends an entry when one of its fields changed, and a
    # lifetime CPU average that rounds otherwise is a new Process too.
    same = [(p, after.process(p.pid)) for p in before.processes if after.process(p.pid) == p]
    assert same and all(a is b for a, b in same)
    busy = spawn(sys.executable, "-c", "while True: pass")
    await box.snapshot()
    spun = (await box.snapshot()).process(busy.pid)
    assert spun is not None
    # What changes of it (its CPU time, its memory) makes its entry anew, once the scheduler gave it
    # a tick between two snapshots: a machine busy with other work may take a few (a condition, no bound).
    deadline = time.monotonic() + 60
    while (now := (await box.snapshot()).process(busy.pid)) is spun or now == spun:
        assert time.monotonic() < deadline, "a spinning process's entry never changed"
        await asyncio.sleep(0.1)
    assert now is not None


def probe_pids(snap: model.Snapshot, box: Box) -> list[int]:
    """The box's probe as the processes pane lists it: `python -S TOOLS probe --serve`."""
    return [p.pid for p in snap.processes if box.tools_dir in p.argv and "--serve" in p.argv]


async def test_an_error_reply_keeps_the_probe_and_what_it_holds(box: Box, spawn) -> None:
    proc = _sleeper(spawn)
    await _settle(box)
    probe = probe_pids(await box.snapshot(), box)
    assert len(probe) == 1
    with pytest.raises(BoxError, match="artifact_budget_s must be a number"):
        await box.ask_probe({"artifact_budget_s": "soon"})  # the probe cannot read it: an error reply
    with pytest.raises(BoxError, match=r"reports\[0\]\.max must be an integer"):
        await box.ask_probe({"reports": [{"glob": "*", "max": float("inf")}]})  # nor this, deeper in
    after = await box.snapshot()
    assert probe_pids(after, box) == probe and after.process(proc.pid) is not None


async def test_held_processes_that_are_not_the_probes_last_are_all_replaced(box: Box, spawn) -> None:
    proc = _sleeper(spawn)
    await _settle(box)
    held = box._processes
    held.by_pid[999_999_999] = dict(held.by_pid[proc.pid], pid=999_999_999)  # what the box never had
    held.mark = "another-probe.1"
    snap = await box.snapshot()
    assert snap.process(999_999_999) is None and snap.process(proc.pid) is not None


def test_changes_since_another_reply_than_the_held_one_are_refused() -> None:
    held = HeldProcesses()
    entry = {"pid": 7, "cpu_time": 1.0, "start_time": 0.0}
    held.fold({"processes": [entry], "processes_mark": "s.1"})
    assert held.ask({"processes": True}) == {"processes": True, "processes_since": "s.1"}
    assert held.ask({"processes": False}) == {"processes": False}
    with pytest.raises(BoxError, match="since s.0, not since s.1"):
        held.fold({"processes": [], "processes_gone": [7], "processes_since": "s.0", "processes_mark": "s.2"})
    assert held.ask({"processes": True}) == {"processes": True}  # so the next reply holds every process


def test_a_process_first_seen_shows_its_cpu_over_its_life() -> None:
    entry = {"pid": 7, "ppid": 1, "pgid": 7, "sid": 7, "user": "root", "state": "S", "rss": 0, "comm": "x",
             "argv": ["x"], "cpu_time": 30.0, "start_time": 1000.0}
    assert model.process(entry, 1100.0).cpu_percent == 30.0
    assert model.process(entry, 1000.2).cpu_percent == 3000.0  # under a second old: over one second


def test_kept_files_read_fresh_and_close_with_their_process(tools, spawn) -> None:
    busy = spawn(sys.executable, "-c", "while True: pass")
    files = tools.procs.OpenFiles()
    cpu = [int(files.read(busy.pid, "stat").split()[13])]
    kept = files.fds[(busy.pid, "stat")]
    wait_for(lambda: int(files.read(busy.pid, "stat").split()[13]) > cpu[0])  # the same descriptor, fresh
    assert files.fds[(busy.pid, "stat")] == kept
    busy.kill()
    busy.wait()
    with pytest.raises(OSError):
        files.read(busy.pid, "stat")
    assert (busy.pid, "stat") not in files.fds
    files.read(os.getpid(), "stat")
    files.keep_only({os.getpid()})
    files.keep_only(set())
    assert files.fds == {}


def test_kept_files_stay_within_their_limit(tools, spawn) -> None:
    procs = [_sleeper(spawn) for _ in range(3)]
    files = tools.procs.OpenFiles(limit=2)
    for proc in procs:
        assert files.read(proc.pid, "stat").startswith(b"%d (" % proc.pid)
    assert len(files.fds) == 2
    open_before = len(os.listdir("/proc/self/fd"))
    memory = tools.probe.Memory()
    memory.facts.files = files
    for _ in range(3):
        _ask(tools, memory)
    assert len(files.fds) <= 2 and len(os.listdir("/proc/self/fd")) <= open_before


def test_kept_entries_go_when_the_user_database_changes(tools, spawn, tmp_path: Path, monkeypatch) -> None:
    passwd = tmp_path / "passwd"
    passwd.write_text("root:x:0:0::/root:/bin/sh\n")
    monkeypatch.setattr(tools.procs.UserNames, "PASSWD", str(passwd))
    proc = _sleeper(spawn)
    facts = tools.procs.Facts()
    btime = tools.procfs.boot_time()

    def entry():
        return next(e for e in tools.procs.processes(btime, [], facts)[0] if e["pid"] == proc.pid)

    entry()
    kept = entry()
    assert entry() is kept  # asleep: the very entry given again
    passwd.write_text("root:x:0:0::/root:/bin/sh\nnewuser:x:1234:1234::/home/newuser:/bin/sh\n")
    assert entry() is not kept and entry() == kept
