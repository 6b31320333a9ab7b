"""Helpers for tests that drive real processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time


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
