"""Helpers for tests that drive real processes."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.box_tools import tool_argv


def run_cli(*args: str, env: dict | None = None, timeout: float = 60, stdin=subprocess.DEVNULL):
    """samai-console as a user runs it: a separate process, its real exit code and streams."""
    return subprocess.run([sys.executable, "-m", "samai.console", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout, stdin=stdin)


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout} s")


async def until(predicate, timeout: float = 10.0, interval: float = 0.02):
    """predicate's first true value, awaited between looks (wait_for, for a test's event loop)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        await asyncio.sleep(interval)
    raise AssertionError(f"condition not met within {timeout} s")


def stop_stages_under(folder: Path) -> list[str]:
    """Stop every stage recorded in a workspace under folder that may still run; their names.

    Fired chains are detached (their own session), so they outlive a test that failed or timed
    out half-way; this stops them with the box's own identity-checked kill tool."""
    stopped = []
    records = [r for depth in range(4) for r in folder.glob("*/" * depth + ".samai/state/*.json")]
    for record in records:
        workspace, stage = record.parents[2], record.stem
        request = json.dumps({"stage": stage, "workspace": str(workspace), "signal": "TERM", "grace": 2})
        done = subprocess.run(tool_argv("kill"), input=request, capture_output=True,
                              text=True, timeout=30)
        if '"gone"' not in done.stdout:
            stopped.append(stage)
    return stopped


async def pilot_until(pilot, predicate, timeout: float = 30.0):
    """predicate's first true value, while the app keeps running. (A generous wait, not a timing
    assert: the machines these run on are shared.)"""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        assert pilot.app.is_running, "the app exited"
        await pilot.pause(0.05)
    raise AssertionError("condition not met in time")


async def polls_after(pilot, n: int = 2, timeout: float = 30.0) -> None:
    """Wait until the app has folded in n snapshots that the box took after this call (by its
    clock: a box on this machine reads this machine's). An absence check after it has seen polls
    that could have shown what it checks is not there; a fixed pause proves nothing on a slow day."""
    since = time.time()
    seen, count = None, 0
    deadline = time.monotonic() + timeout
    while count < n:
        snap = pilot.app.state.snapshot
        if snap is not None and snap is not seen and snap.time >= since:
            seen, count = snap, count + 1
            continue
        assert pilot.app.is_running, "the app exited"
        assert time.monotonic() < deadline, f"{count} of {n} polls in {timeout} s"
        await pilot.pause(0.02)


def unavailable_here(reason: str) -> None:
    """A test whose real component this machine lacks is skipped on a developer's machine, but
    fails under CI, where .ci/run provides every component: there it must never pass by skipping."""
    if os.environ.get("CI"):
        pytest.fail(f"CI must run this test: {reason}")
    pytest.skip(reason)


def start_time_of(pid: int) -> float:
    """A process's start time as the box tools read it (btime + ticks): psutil's own boot time
    may differ from /proc/stat's by up to a second, and then an identity check rightly refuses."""
    from samai.remote.box.procfs import boot_time, read_stat, start_epoch

    return start_epoch(read_stat(pid)["starttime"], boot_time())


async def click_until(pilot, selector: str, done, timeout: float = 30.0, retry_s: float = 5.0):
    """Click selector until done() holds (its first true value). A click that lands while the
    widget is still being laid out (under load) is lost: it is clicked again after retry_s, once
    the widget has a region, which is safe where the click's effect happens once (a dialog's
    button: the dialog is dismissed once)."""
    deadline = time.monotonic() + timeout
    while True:
        widget = pilot.app.screen.query(selector)
        if widget and widget.first().region.area:
            await pilot.click(selector)
        try:
            return await pilot_until(pilot, done, timeout=min(retry_s, max(0.1, deadline - time.monotonic())))
        except AssertionError:
            if time.monotonic() >= deadline:
                raise


async def confirm_dialog(pilot, timeout: float = 30.0) -> None:
    """Click the confirm button of the dialog on screen until that dialog is dismissed (see
    click_until: a click that lands while it is still being laid out is lost)."""
    dialog = await pilot_until(pilot, lambda: len(pilot.app.screen.query("#confirm")) and pilot.app.screen, timeout)
    await click_until(pilot, "#confirm", lambda: pilot.app.screen is not dialog, timeout)


def collect_toasts(app) -> list[str]:
    """Every toast the app raises from now on, as its text (the app's own notify, wrapped)."""
    seen: list[str] = []
    real = app.notify

    def notify(message: str, **kw) -> None:
        seen.append(message)
        real(message, **kw)

    app.notify = notify
    return seen


def action_layer(app):
    """The action layer as the app builds it (its box, config, audit log and read-only flag), called
    directly: it refuses on its own, whatever the UI lets through."""
    from samai.console.core.actions import Actions, Decision

    async def confirm(plan):
        return Decision.confirmed(plan, "test")

    return Actions(app.box, app.config, app.audit, readonly=app.readonly, confirm=confirm)
