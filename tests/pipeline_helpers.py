"""What the pipeline modules share: the built-in pipelines in a test's workspace, and their stages
fired and waited on as the console fires them, through the Box or through the TUI's keys."""

from __future__ import annotations

import asyncio
import socket
import time
from dataclasses import replace
from pathlib import Path

import pytest

from samai.console.core import config
from samai.console.core.actions import ActionPlan, Decision
from samai.console.core.detectors import detect
from samai.console.core.problems import Finding
from samai.remote.boxapi import Box
from samai.remote.model import Snapshot

PROVISION_TIMEOUT = 45 * 60
STAGES_TIMEOUT = 20 * 60
# The suite-wide limit would cut provisioning, which runs in the setup of the first test that
# needs the box venv, in whichever module that is. Each wait has its own deadline; this only
# bounds the whole.
LONG = pytest.mark.timeout(PROVISION_TIMEOUT + STAGES_TIMEOUT)


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


def findings_about(cfg: config.Config, snap: Snapshot, code: str, pids: set[int | None]) -> list[Finding]:
    """The findings of one code about these processes: other workers' llama-servers run on this
    machine too, and the detectors read every one of them."""
    return [f for f in detect(cfg, snap) if f.code == code and f.action is not None and f.action.pid in pids]


def own_server_findings(cfg: config.Config, snap: Snapshot, code: str) -> list[Finding]:
    """The findings of one code about the server listening on this pipeline's serve port."""
    ports = set(cfg.stage("serve").ports)
    return findings_about(cfg, snap, code, {s.pid for s in snap.listeners if s.port in ports})


def with_command(cfg: config.Config, name: str, command: str) -> config.Config:
    return replace(cfg, stages=tuple(replace(s, command=command) if s.name == name else s for s in cfg.stages))


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


async def until_async(predicate, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await predicate():
            return
        await asyncio.sleep(0.5)
    raise AssertionError(f"condition not met within {timeout} s")


async def until_listening(port: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            await asyncio.sleep(0.1)
    raise AssertionError(f"nothing listens on {port}")


async def confirm(plan: ActionPlan) -> Decision:
    return Decision.confirmed(plan, "test")


async def anyway(plan: ActionPlan) -> Decision:
    """The operator's override: the stray listener holds the serve port, which blocks the plan."""
    return Decision.override(plan, "test") if plan.blocked else Decision.confirmed(plan, "test")


# ---------------------------------------------------------------- through the TUI's keys


def bar(app) -> str:
    """The stages bar as shown."""
    return str(app.box_screen.query_one("#stages").render())


def ended(app, stage: str):
    """The stage's current run once it has ended (its record has an rc), else None."""
    rec = app.state.snapshot.state(stage) if app.state.snapshot else None
    return rec if rec and rec.rc is not None else None


def log_of(app, stage: str) -> str:
    return (Path(app.config.workspace) / app.config.stage(stage).log).read_text(errors="replace")


async def open_dialog(pilot, app, key: str):
    """Press a key and wait for the confirmation dialog it opens (Cancel focused)."""
    from samai.console.screens.dialogs import ConfirmDialog
    from tests.helpers import pilot_until

    await pilot_until(pilot, lambda: not app.busy and not isinstance(app.screen, ConfirmDialog))
    await pilot.press(key)
    return await pilot_until(pilot, lambda: isinstance(app.screen, ConfirmDialog) and app.focused and app.screen)


async def fire_confirmed(pilot, app, key: str, stage: str, timeout: float = 600):
    """Fire (or restart) through the dialog, not blocked, and wait for the new run to end well."""
    from tests.helpers import confirm_dialog, pilot_until

    before = app.state.stages.runs.get(stage)
    dialog = await open_dialog(pilot, app, key)
    assert not [c.text for c in dialog.checks if c.severity == "error"], dialog.checks
    await confirm_dialog(pilot)
    await pilot_until(pilot, lambda: app.state.stages.runs.get(stage) not in (None, before), timeout=60)
    rec = await pilot_until(pilot, lambda: ended(app, stage), timeout=timeout)
    assert rec.rc == 0, f"{stage} rc={rec.rc}:\n{log_of(app, stage)[-3000:]}"
    return rec
