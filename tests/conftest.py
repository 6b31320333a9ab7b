"""Shared fixtures: every test gets its own XDG dirs, workspace and a Box on this machine."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from samai.remote.boxapi import Box
from samai.remote.local import LocalTransport
from tests.helpers import stop_stages_under

# Rendered times (alerts, dialogs) must not depend on where the tests run: snapshots compare them.
os.environ["TZ"] = "UTC"
time.tzset()


@pytest.fixture(autouse=True)
def isolated_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in ("XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CONFIG_HOME"):
        folder = tmp_path / name.lower()
        folder.mkdir()
        monkeypatch.setenv(name, str(folder))
    return tmp_path


@pytest.fixture(autouse=True)
def stop_what_the_test_fired(tmp_path: Path):
    """Whatever a test fired is stopped after it, whether it passed, failed or timed out."""
    yield
    stop_stages_under(tmp_path)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    return ws


@pytest.fixture
async def box(workspace: Path):
    b = Box(LocalTransport(), str(workspace), python=sys.executable)
    yield b
    await b.close()


@pytest.fixture
def spawn():
    """Start real processes for a test and make sure none outlives it."""
    started: list[subprocess.Popen] = []

    def start(*argv: str, **kw) -> subprocess.Popen:
        proc = subprocess.Popen(list(argv), **kw)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
