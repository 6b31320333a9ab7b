"""Artifact trees are walked on every poll only while a stage makes them; the others keep their
last size for a while, and every snapshot the console folds in still lists every artifact."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from samai.console.core.config import load_builtin
from samai.console.core.disk.sizing import REFRESH_S, REFRESH_S_PER_FILE, ArtifactSizer
from samai.console.core.state import ConsoleState
from samai.remote.boxapi import Box
from tests import factories

WANTED = [("venv", "venv"), ("gguf", "model.gguf")]


def test_a_big_tree_waits_a_file_does_not() -> None:
    sizer = ArtifactSizer(WANTED)
    assert sizer.due(None, ()) == WANTED
    merged = sizer.merge([factories.artifact("venv", "venv", bytes=10**9, allocated=0, files=40_000),
                          factories.artifact("gguf", "model.gguf", bytes=10**8, allocated=0, files=1)], now=100.0)
    assert [a.name for a in merged] == ["venv", "gguf"]
    assert sizer.due(101.0, ()) == [("gguf", "model.gguf")]
    assert sizer.due(101.0, {"venv"}) == WANTED  # a running stage makes it: every poll
    assert sizer.due(100.0 + REFRESH_S, ()) == [("gguf", "model.gguf")]  # 40,000 files: walked less often
    assert sizer.due(100.0 + 40_000 * REFRESH_S_PER_FILE, ()) == WANTED
    merged = sizer.merge([factories.artifact("gguf", "model.gguf", exists=False)], now=101.0)
    assert [(a.name, a.exists) for a in merged] == [("venv", True), ("gguf", False)]
    sizer.refresh_all()
    assert sizer.due(102.0, ()) == WANTED


async def test_the_console_keeps_a_tree_size_between_walks(box: Box, workspace: Path) -> None:
    cfg = load_builtin("tiny")
    state = ConsoleState(dataclasses.replace(cfg, workspace=str(workspace)))
    venv = workspace / "venv" / "lib"
    venv.mkdir(parents=True)
    for i in range(200):
        (venv / f"m{i}.py").write_bytes(b"x" * 10)

    async def poll(now: float):
        followers = state.followers()
        what = state.request(followers)
        state.apply(await box.snapshot(**what), followers, now)
        venv_size = next(a for a in state.snapshot.artifacts if a.name == "venv")
        return [name for name, _ in what["artifacts"]], venv_size

    asked, size = await poll(1000.0)
    assert "venv" in asked and (size.files, size.bytes) == (200, 2000)
    (venv / "new.py").write_bytes(b"y" * 5)
    asked, size = await poll(1001.0)
    assert "venv" not in asked and "base" in asked  # a missing artifact costs one lstat: asked every time
    assert (size.files, size.bytes) == (200, 2000)  # the last walk's, until the next one
    assert len(state.snapshot.artifacts) == len(state.sizer.wanted)
    state.sizer.refresh_all()  # as after any action
    asked, size = await poll(1002.0)
    assert "venv" in asked and (size.files, size.bytes) == (201, 2005)
    asked, size = await poll(1002.0 + REFRESH_S)  # asked by the time of the last snapshot: one poll late
    assert "venv" not in asked
    asked, size = await poll(1003.0 + REFRESH_S)
    assert "venv" in asked


async def test_the_workspaces_largest_users_through_the_real_probe(box: Box, workspace: Path) -> None:
    """Two levels, biggest first, links not followed, an unreadable folder costing itself only,
    and a walk past its time budget saying so."""
    (workspace / "venv" / "lib").mkdir(parents=True)
    for i in range(50):
        (workspace / "venv" / "lib" / f"m{i}.py").write_bytes(b"x" * 5000)
    (workspace / "gguf").mkdir()
    (workspace / "gguf" / "m.gguf").write_bytes(b"g" * 100_000)
    (workspace / "notes.txt").write_text("n")
    (workspace / "gguf" / "everything").symlink_to("/")
    users = await box.disk_users(top=20)
    ours = [u for u in users.top if not u.path.startswith(".samai/")]  # the box tools live there
    assert [u.path for u in ours] == ["venv/lib", "gguf/m.gguf", "notes.txt", "gguf/everything"] and users.complete
    assert ours[0].files == 50 and users.entries == len(users.top)
    assert users.allocated == sum(f.lstat().st_blocks * 512 for f in workspace.rglob("*")
                                  if not f.is_dir() or f.is_symlink())  # / behind the link is not counted
    assert len((await box.disk_users(top=2)).top) == 2
    cut = await box.disk_users(top=20, budget_s=0)
    assert not cut.complete and cut.entries == users.entries
    (workspace / "venv").chmod(0)
    try:
        if os.access(workspace / "venv", os.R_OK):
            return  # root reads it anyway: nothing unreadable to show here
        users = await box.disk_users(top=5)
        assert "venv" in [u.path for u in users.top] and "gguf/m.gguf" in [u.path for u in users.top]
    finally:
        (workspace / "venv").chmod(0o755)
