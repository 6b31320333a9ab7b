"""Artifact trees are walked on every poll only while a stage makes them; the others keep their
last size for a while, and every snapshot the console folds in still lists every artifact."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from samai.console.config import load_builtin
from samai.console.sizing import REFRESH_S, REFRESH_S_PER_FILE, ArtifactSizer
from samai.console.state import ConsoleState
from samai.remote.boxapi import Box
from samai.remote.model import ArtifactSize

WANTED = [("venv", "venv"), ("gguf", "model.gguf")]


def test_a_big_tree_waits_a_file_does_not() -> None:
    sizer = ArtifactSizer(WANTED)
    assert sizer.due(None, ()) == WANTED
    merged = sizer.merge([ArtifactSize("venv", "venv", True, 10**9, files=40_000),
                          ArtifactSize("gguf", "model.gguf", True, 10**8, files=1)], now=100.0)
    assert [a.name for a in merged] == ["venv", "gguf"]
    assert sizer.due(101.0, ()) == [("gguf", "model.gguf")]
    assert sizer.due(101.0, {"venv"}) == WANTED  # a running stage makes it: every poll
    assert sizer.due(100.0 + REFRESH_S, ()) == [("gguf", "model.gguf")]  # 40,000 files: walked less often
    assert sizer.due(100.0 + 40_000 * REFRESH_S_PER_FILE, ()) == WANTED
    merged = sizer.merge([ArtifactSize("gguf", "model.gguf", False)], now=101.0)
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
