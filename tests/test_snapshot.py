"""The probe through the Box on this machine: real processes, real sockets, real files."""

from __future__ import annotations

import ast
import os
import shutil
import socket
import subprocess
import sys
from importlib import resources
from pathlib import Path

import psutil
import pytest

from samai.remote.boxapi import Box, BoxError, tool_names
from samai.remote.local import LocalTransport


async def test_snapshot_sees_a_started_process(box: Box, spawn) -> None:
    argv = (sys.executable, "-c", "import time; time.sleep(60)", "an arg with spaces", "ünï")
    proc = spawn(*argv)
    snap = await box.snapshot()
    seen = snap.process(proc.pid)
    assert seen is not None
    assert seen.argv == argv
    assert seen.ppid == os.getpid()
    assert seen.user == psutil.Process(proc.pid).username()
    assert abs(seen.start_time - psutil.Process(proc.pid).create_time()) < 0.05
    assert seen.state in ("S", "R")
    assert seen.rss > 0


async def test_snapshot_maps_a_loopback_listener_to_its_process(box: Box, spawn) -> None:
    code = ("import socket,sys,time\ns=socket.socket()\ns.bind(('127.0.0.1',0))\ns.listen()\n"
            "print(s.getsockname()[1],flush=True)\ntime.sleep(60)")
    server = spawn(sys.executable, "-c", code, stdout=subprocess.PIPE, text=True)
    port = int(server.stdout.readline())
    own = socket.socket(socket.AF_INET6)
    own.bind(("::1", 0))
    own.listen()
    try:
        snap = await box.snapshot()
    finally:
        own_port = own.getsockname()[1]
        own.close()
    by_port = {s.port: s for s in snap.listeners}
    assert by_port[port].pid == server.pid
    assert by_port[port].host == "127.0.0.1" and by_port[port].proto == "tcp"
    assert by_port[own_port].pid == os.getpid()
    assert by_port[own_port].host == "::1" and by_port[own_port].proto == "tcp6"


async def test_snapshot_reports_disks_and_artifact_sizes(box: Box, workspace: Path) -> None:
    (workspace / "models" / "base").mkdir(parents=True)
    (workspace / "models" / "base" / "a.bin").write_bytes(b"x" * 5000)
    (workspace / "models" / "base" / "b.bin").write_bytes(b"y" * 3000)
    (workspace / "one.gguf").write_bytes(b"z" * 100)
    snap = await box.snapshot(artifacts=[("base", "models/base"), ("gguf", "one.gguf"), ("none", "missing")])
    labels = {d.label for d in snap.disks}
    assert "workspace" in labels
    disk = snap.disks[0]
    assert disk.total > 0 and 0 <= disk.free <= disk.total and disk.used <= disk.total
    arts = {a.name: a for a in snap.artifacts}
    assert (arts["base"].bytes, arts["base"].files, arts["base"].complete) == (8000, 2, True)
    assert arts["gguf"].bytes == 100
    assert not arts["none"].exists


async def test_artifact_walk_is_bounded_in_time(box: Box, workspace: Path) -> None:
    tree = workspace / "many"
    for i in range(300):
        (tree / f"d{i}").mkdir(parents=True)
        (tree / f"d{i}" / "f").write_bytes(b"1")
    snap = await box.snapshot(artifacts=[("many", "many")], artifact_budget_s=0.0)
    (art,) = snap.artifacts
    assert art.exists and not art.complete and art.files < 300


async def test_unreadable_things_become_error_entries(box: Box, workspace: Path) -> None:
    secret = workspace / "locked.log"
    secret.write_text("x\n")
    snap = await box.snapshot(logs=[_cursor(str(workspace / "absent.log")), _cursor(str(workspace))])
    missing, directory = snap.logs
    assert missing.missing and "No such file" in missing.error
    assert directory.error and "directory" in directory.error.lower()
    state_dir = workspace / ".samai" / "state"
    state_dir.mkdir(parents=True)
    (state_dir / "broken.json").write_text("{not json")
    snap = await box.snapshot()
    assert any("broken.json" in e["what"] for e in snap.errors)


@pytest.mark.slow
def test_box_tools_are_stdlib_python_3_8() -> None:
    """The tools run on whatever Python the box has: no syntax or imports newer than 3.8."""
    tools = [n for n in tool_names() if not n.startswith("stages/")]  # stages may use the box venv
    stdlib = set(sys.stdlib_module_names) | {name[:-3] for name in tools}
    folder = resources.files("samai.remote.box")
    for name in tools:
        tree = ast.parse(folder.joinpath(name).read_text(), feature_version=(3, 8))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                roots = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                roots = [(node.module or "").split(".")[0]]
            else:
                continue
            assert set(roots) <= stdlib, f"{name} imports {roots}"


@pytest.mark.slow
async def test_tools_are_uploaded_once_and_again_when_removed(workspace: Path) -> None:
    box = Box(LocalTransport(), str(workspace), python=sys.executable)
    await box.snapshot()
    ready = Path(box.tools_dir, ".ready")
    assert ready.exists()
    first = ready.stat().st_mtime_ns
    await Box(LocalTransport(), str(workspace), python=sys.executable).snapshot()
    assert ready.stat().st_mtime_ns == first  # same hash: nothing uploaded
    shutil.rmtree(box.tools_dir)
    await box.snapshot()  # the probe it keeps running needs no file
    with pytest.raises(BoxError):
        await box.stop("none")  # but a tool started anew fails: this Box believed they were there
    assert (await box.stop("none")).result == "gone"  # ...and uploads them again on the next call
    assert ready.exists()
    await box.close()


def _cursor(path: str):
    from samai.remote.follow import LogCursor

    return LogCursor(path)


async def test_read_range_returns_exactly_the_bytes_asked_for(box: Box, workspace: Path) -> None:
    blob = workspace / "model.gguf"
    blob.write_bytes(bytes(range(256)) * 40)
    assert await box.read_range(str(blob), 10, 19) == bytes(range(10, 20))
    assert await box.read_range(str(blob), 10_230, 10_239) == bytes(range(246, 256))
    with pytest.raises(BoxError, match="got 5 bytes, file is 10240 bytes"):
        await box.read_range(str(blob), 10_235, 10_244)  # past the end: never a silent short read
    with pytest.raises(BoxError, match="No such file"):
        await box.read_range(str(workspace / "absent"), 0, 1)
