"""The tiny pipeline end to end on this machine's CPU, fired through the Box like the console does.

Every run provisions a fresh workspace, as a new user's first `make run` would: only what a
real user also keeps survives between runs (pip's download cache and the provision stage's
llama-cpp-python wheel in ~/.cache/samai). The first run on a fresh machine compiles that wheel
(12-17 minutes on 2 cores); later ones provision in about two. So that a broken first run
cannot hide behind a cached venv, nothing provisioned is reused between runs.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from samai.console import config, paths
from samai.console.actions import ActionPlan, Actions, Decision
from samai.console.audit import AuditLog
from samai.remote.box.gguf_check import check_file
from samai.remote.boxapi import Box
from samai.remote.local import LocalTransport
from tests.helpers import stop_stages_under

PROVISION_TIMEOUT = 45 * 60
STAGES_TIMEOUT = 20 * 60
# The suite-wide limit would cut provisioning, which runs in the first test's setup. Each wait
# below has its own deadline; this only bounds the whole.
pytestmark = pytest.mark.timeout(PROVISION_TIMEOUT + STAGES_TIMEOUT)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tiny(workspace: Path, port: int) -> config.Config:
    """The built-in tiny pipeline in this workspace, serving on a free port."""
    cfg = config.load_builtin("tiny")
    stages = tuple(replace(s, command=s.command.replace("18080", str(port)), ports=(port,) if s.ports else ())
                   for s in cfg.stages)
    return replace(cfg, workspace=str(workspace), stages=stages)


async def run_stage(box: Box, cfg: config.Config, name: str, timeout: float = 600) -> str:
    """Fire a stage and wait for its chain to end; its log as text."""
    stage = cfg.stage(name)
    fired = await box.fire(stage.name, stage.command, stage.log, env=dict(stage.env), verify_s=1.0)
    assert fired.state != "refused", f"{name}: {fired.reason}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rec = (await box.snapshot(processes=True)).state(name)
        if rec and rec.rc is not None:
            break
        await asyncio.sleep(1)
    log = (await box.tail(str(Path(cfg.workspace, stage.log)), offset=0, max_bytes=4 << 20)).data.decode()
    if not (rec and rec.rc is not None):
        await box.stop(name, grace=5)
        raise AssertionError(f"{name} still running after {timeout} s, stopped:\n{log[-3000:]}")
    return log


async def wait_marker(box: Box, cfg: config.Config, name: str, marker: str, timeout: float = 180) -> str:
    path = str(Path(cfg.workspace, cfg.stage(name).log))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = (await box.tail(path, offset=0, max_bytes=4 << 20)).data.decode()
        if marker in text or "CHAIN_DONE" in text:
            return text
        await asyncio.sleep(0.5)
    raise AssertionError(f"no {marker} in {path} after {timeout} s")


@pytest.fixture(scope="module")
def provisioned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A freshly provisioned venv, provisioned through the Box once for this module."""
    ws = tmp_path_factory.mktemp("provisioned")
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
    return ws / "venv"


@pytest.fixture
def pipeline_ws(tmp_path: Path, provisioned: Path) -> Path:
    ws = tmp_path / "tiny"
    ws.mkdir()
    (ws / "venv").symlink_to(provisioned)
    return ws


async def _anyway(plan: ActionPlan) -> Decision:
    """The operator's override: the stray listener holds the serve port, which blocks the plan."""
    return Decision.override(plan, "test") if plan.blocked else Decision.confirmed(plan, "test")


async def test_the_tiny_pipeline_end_to_end(pipeline_ws: Path, spawn) -> None:
    port = free_port()
    cfg = tiny(pipeline_ws, port)
    box = Box(LocalTransport(), str(pipeline_ws), python=sys.executable)
    started = time.monotonic()
    try:
        for name, marker in (("fetch", "FETCH_DONE"), ("train", "TRAIN_DONE"), ("merge", "MERGE_DONE"),
                             ("convert", "CONVERT_DONE"), ("quantize", "QUANT_DONE")):
            log = await run_stage(box, cfg, name)
            assert marker in log and log.rstrip().endswith("CHAIN_DONE rc=0"), f"{name}:\n{log[-4000:]}"
        gguf = pipeline_ws / "gguf" / "tiny-q8_0.gguf"
        assert check_file(str(gguf))["ok"]
        assert not (pipeline_ws / "models" / "merged").exists()  # intermediates deleted as declared
        assert not (pipeline_ws / "gguf" / "tiny-f16.gguf").exists()

        stray = spawn(sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        await _until_listening(port)
        serve = cfg.stage("serve")
        # As the console fires it: the action layer's plan stops the stray by pid (audited), then fires.
        outcome = await Actions(box, cfg, AuditLog(paths.audit_log()), readonly=False, confirm=_anyway).fire(serve.name)
        fired = outcome.result
        assert fired is not None and fired.state == "running", outcome.message
        log = await wait_marker(box, cfg, "serve", "SMOKE_OK")
        assert "SMOKE_OK" in log and "391" in log, log[-3000:]
        assert stray.wait(10) is not None  # the stray listener was stopped by pid
        snap = await box.snapshot()
        listeners = [s for s in snap.listeners if s.port == port]
        assert len(listeners) == 1 and snap.process(listeners[0].pid).argv[1:3] == ("-m", "llama_cpp.server")

        log = await run_stage(box, cfg, "eval")
        assert "EVAL_RC=0" in log, log[-3000:]
        (summary_path,) = (pipeline_ws / "runs" / "eval").glob("*/summary.json")
        summary = json.loads(summary_path.read_text())
        assert summary["accuracy"] >= 0.9 and summary["empty_content"] == 0, summary

        log = await run_stage(box, cfg, "push")
        assert "PUSH_DONE" in log, log[-3000:]
        pushed = pipeline_ws / "pushed"
        assert subprocess.run(["sha256sum", "-c", "MANIFEST.sha256"], cwd=pushed).returncode == 0
        print(f"tiny pipeline after provisioning: {time.monotonic() - started:.0f} s")
    finally:
        await box.stop("serve", grace=5)
        await box.close()


async def test_the_nan_guard_stops_training_and_merge_refuses(pipeline_ws: Path) -> None:
    cfg = tiny(pipeline_ws, free_port())
    box = Box(LocalTransport(), str(pipeline_ws), python=sys.executable)
    try:
        assert "FETCH_DONE" in await run_stage(box, cfg, "fetch")
        train = cfg.stage("train")
        poisoned = replace(cfg, stages=tuple(replace(s, command=s.command + " --inject-nan") if s is train else s
                                             for s in cfg.stages))
        log = await run_stage(box, poisoned, "train")
        assert "TRAIN_NAN" in log and "CHAIN_DONE rc=3" in log, log[-3000:]
        assert (pipeline_ws / "runs" / "train" / "TRAIN_NAN").exists()
        assert not (pipeline_ws / "runs" / "train" / "final").exists()
        log = await run_stage(box, cfg, "merge")
        assert "MERGE_REFUSED" in log and "TRAIN_NAN" in log and "CHAIN_DONE rc=2" in log
        log = await run_stage(box, cfg, "train")  # a restart that does not clear the poison is refused
        assert "TRAIN_REFUSED" in log and "poison" in log
        assert (await box.remove(list(train.poison))).ok  # what restart does before firing again
    finally:
        await box.close()


async def test_fp16_is_refused_with_the_reason(pipeline_ws: Path) -> None:
    cfg = tiny(pipeline_ws, free_port())
    train = cfg.stage("train")
    box = Box(LocalTransport(), str(pipeline_ws), python=sys.executable)
    try:
        fired = await box.fire("train", train.command + " --fp16", train.log, verify_s=20)
        assert fired.state == "failed" and fired.rc == 2
        assert any("TRAIN_REFUSED" in line and "GradScaler" in line for line in fired.log_tail)
    finally:
        await box.close()


async def _until_listening(port: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            await asyncio.sleep(0.1)
    raise AssertionError(f"nothing listens on {port}")
