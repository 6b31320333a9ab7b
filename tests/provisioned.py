"""What the modules that train, serve or launch share within one run: one box venv provisioned
through the Box, and one tiny base as the fetch stage's pretrain makes it.

Each is made once per run, by whichever worker (pytest-xdist) needs it first, under a file lock
in the run's temporary folder, which every worker of the run shares; the others wait for it and
use it. So every run still provisions a fresh venv, as a new user's first `make run` does (only
what a real user also keeps survives between runs: pip's download cache and the provision stage's
llama.cpp build in ~/.cache/samai), and a broken first provision cannot hide behind an old venv;
it is just not done again for each module. The first run on a fresh machine compiles llama.cpp
(12-17 minutes on 2 cores); later ones provision in about two."""

from __future__ import annotations

import asyncio
import fcntl
import os
import shutil
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest

from samai.remote.boxapi import Box
from samai.remote.local import LocalTransport
from tests.helpers import stop_stages_under
from tests.pipeline_helpers import PROVISION_TIMEOUT, free_port, run_stage, tiny


def run_folder(factory: pytest.TempPathFactory) -> Path:
    """The temporary folder of the whole run: every xdist worker's own folder is inside it."""
    base = factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def made_once(factory: pytest.TempPathFactory, name: str, make: Callable[[Path], None]) -> Path:
    """A folder of the run made by make(folder) once, whichever worker asks first; a make that
    failed fails every test that asks for it, with its reason, instead of being tried again."""
    root = run_folder(factory)
    folder, failed = root / name, root / f"{name}.failed"
    with open(root / f"{name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
        if failed.exists():
            pytest.fail(f"{name}, made earlier in this run, failed:\n{failed.read_text()}")
        if not (folder / ".made").exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            try:
                make(folder)
            except BaseException:
                failed.write_text(traceback.format_exc()[-6000:])
                raise
            (folder / ".made").touch()
    return folder


@pytest.fixture(scope="session")
def provisioned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A box venv freshly provisioned through the Box, once for the run."""

    def make(ws: Path) -> None:
        cfg = tiny(ws, free_port())

        async def provision() -> str:
            box = Box(LocalTransport(), str(ws), python=sys.executable)
            try:
                return await run_stage(box, cfg, "provision", PROVISION_TIMEOUT)
            finally:
                await box.close()

        try:
            log = asyncio.run(provision())
        finally:  # a failed or timed-out provision keeps compiling in its own session otherwise
            stop_stages_under(ws)
        assert "PROVISION_DONE" in log and "CHAIN_DONE rc=0" in log, log[-3000:]

    return made_once(tmp_path_factory, "provisioned", make) / "venv"


@pytest.fixture(scope="session")
def tiny_source(tmp_path_factory: pytest.TempPathFactory, provisioned: Path) -> Path:
    """The tiny base and its data as the tiny pipeline's fetch stage makes them (its pretrain,
    then the fetch itself, through the Box), once for the run: the workspaces that fetch the
    tiny base are each handed a copy of this source/, as a hub holds the weights each run
    downloads."""

    def make(ws: Path) -> None:
        (ws / "venv").symlink_to(provisioned)
        cfg = tiny(ws, free_port())

        async def fetch() -> str:
            box = Box(LocalTransport(), str(ws), python=sys.executable)
            try:
                return await run_stage(box, cfg, "fetch", 1800)
            finally:
                await box.close()

        try:
            log = asyncio.run(fetch())
        finally:
            stop_stages_under(ws)
        assert "PRETRAIN_DONE source/tiny-base loss=" in log and "FETCH_DONE" in log, log[-3000:]
        assert log.rstrip().splitlines()[-1].startswith("CHAIN_DONE rc=0 "), log[-3000:]

    return made_once(tmp_path_factory, "tiny-source", make) / "source"


@pytest.fixture
def pipeline_ws(tmp_path: Path, provisioned: Path) -> Path:
    """A workspace of the test's own on the run's box venv."""
    ws = tmp_path / "tiny"
    ws.mkdir()
    (ws / "venv").symlink_to(provisioned)
    return ws


@pytest.fixture
def tiny_ws(pipeline_ws: Path, tiny_source: Path) -> Path:
    """A workspace whose fetch stage finds the tiny base made (`PRETRAIN_DONE ... already made`)
    and fetches it, checked, as it would from a hub."""
    shutil.copytree(tiny_source, pipeline_ws / "source", symlinks=True)
    return pipeline_ws
