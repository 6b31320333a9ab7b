"""Shared fixtures: every test gets its own XDG dirs, workspace and a Box on this machine."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from samai.console.core import config
from samai.remote.boxapi import Box
from samai.remote.local import LocalTransport
from tests.helpers import stop_stages_under
from tests.replay_transport import ReplayConsole, ReplayTransport

pytest_plugins = ["tests.receivers",  # json_receiver, ntfy_receiver, smtp_receiver
                  "tests.provisioned"]  # provisioned, tiny_source, pipeline_ws, tiny_ws: one box venv a run

# Under pytest-xdist the stages each worker fires share the cores with the other workers': torch's
# and llama.cpp's threads spin while they wait, so two runs of as many threads as cores each take
# several times their time (two 2-thread Trainer steps at once on 2 cores: x6.6 one alone). Each
# worker's stages compute on its share of the cores (the stages honour OMP_NUM_THREADS, and
# llama-server LLAMA_ARG_THREADS), as an operator would set them on a box shared with other work.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
if _WORKERS > 1:
    _SHARE = str(max(1, (os.cpu_count() or 1) // _WORKERS))
    os.environ.setdefault("OMP_NUM_THREADS", _SHARE)
    os.environ.setdefault("LLAMA_ARG_THREADS", _SHARE)

# Rendered times (alerts, dialogs) must not depend on where the tests run: snapshots compare them.
os.environ["TZ"] = "UTC"
time.tzset()

# Fixtures that make a test slow: a provisioned box venv (which builds llama.cpp on a fresh
# machine, and which training and serving need), a real sshd, the real Gemma model and every
# llama.cpp vocab file (downloaded once, then read whole). Every test that uses one is marked
# `slow`, left out of `make test-quick` (tests/test_suite_hygiene.py checks that each fixture that
# starts sshd, provisions or takes the Gemma model is named here). Tests slow by themselves
# (seconds of real processes, sockets or a Textual app, waited on) carry the mark in their module.
SLOW_FIXTURES = frozenset({"provisioned", "trained_inputs", "sshd_server", "two_servers", "gemma", "vocab_files"})


# The modules whose tests train or provision take minutes each. `make test` runs every module on
# one worker (pytest-xdist's loadscope) in the order `scheduled` puts them: the first long module
# first (its worker provisions the run's box venv, tests/provisioned.py), the other long ones
# spread over the first half of the short ones (the other workers start on short ones, which need
# no venv, while it is made), and the second half of the short ones last, so that no worker is
# left with a long module at the end while the others wait.
MINUTES_FIXTURES = frozenset({"provisioned", "trained_inputs"})
# The long modules, longest first (measured with --durations); one not named here comes after them.
LONGEST_FIRST = ("test_pipeline_vlm.py", "test_pipeline.py", "test_pipeline_guards.py", "test_pipeline_tui.py",
                 "test_multinode.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    long_modules = set()
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if SLOW_FIXTURES & fixtures:
            item.add_marker(pytest.mark.slow)
        if MINUTES_FIXTURES & fixtures:
            long_modules.add(item.path)
    items[:] = scheduled(items, long_modules)


def scheduled(items: list[pytest.Item], long_modules: set[Path]) -> list[pytest.Item]:
    """The items module by module (each module's own order kept), the modules ordered as above."""
    modules: dict[Path, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.path, []).append(item)
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    long = sorted((m for m in modules if m in long_modules), key=lambda m: rank.get(m.name, len(rank)))
    short = [m for m in modules if m not in long_modules]
    order = long[:1]
    half, rest = len(short) // 2, long[1:]
    for i, module in enumerate(short):
        order.append(module)
        # the i-th short module of the first half is followed by a long one every half/len(rest) modules
        if rest and i < half and (i + 1) % max(1, half // len(rest)) == 0:
            order.append(rest.pop(0))
    order += rest
    return [item for module in order for item in modules[module]]


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
def recorded_box(tmp_path: Path) -> ReplayTransport:
    """The recorded box (tests/data/recorded_box.json), its workspace and logs under tmp_path: no process."""
    return ReplayTransport.recorded(tmp_path / "recorded-ws")


@pytest.fixture
async def recorded_console(recorded_box: ReplayTransport):
    """The tiny pipeline's ConsoleState polled through a Box on the recorded box."""
    console = ReplayConsole(recorded_box, replace(config.load_builtin("tiny"), workspace=recorded_box.workspace))
    yield console
    await console.close()


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


@pytest.fixture
async def replay_box(workspace: Path):
    """A Box on an empty replay box (tests/replay_transport.py) whose workspace is `workspace`:
    its logs and reports are read from there by the probe's own code, and no process starts."""
    b = Box(ReplayTransport.empty(workspace), str(workspace))
    yield b
    await b.close()
