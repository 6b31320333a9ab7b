"""Tests that fire a long stage and then fail or time out: run only by test_suite_hygiene.py,
which checks that what they started is stopped after them. Not collected on their own (the
file name does not start with test_)."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest


async def _fire_and_note(box, name: str) -> None:
    fired = await box.fire(name, "trap '' TERM; sleep 300", f"logs/{name}.log", verify_s=0.3)
    assert fired.state == "running", fired
    with Path(os.environ["SAMAI_HYGIENE_OUT"]).open("a") as out:
        out.write(json.dumps({"pid": fired.pid, "start_time": fired.start_time}) + "\n")


async def test_fires_then_fails(box) -> None:
    await _fire_and_note(box, "fails")
    raise AssertionError("this test fails on purpose, with its stage still running")


@pytest.mark.timeout(3)
async def test_fires_then_times_out(box) -> None:
    await _fire_and_note(box, "hangs")
    await asyncio.sleep(60)
