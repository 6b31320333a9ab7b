"""A box is polled every interval from the start of the last poll, not an interval after its end:
on a box slowed by its own work (a training run on every core) a poll and what the session does
with it (the watcher's message, its recovery) take seconds, and a pause of a whole interval after
them made the watcher tell a death up to interval + a poll + a recovery after it (bench/
incident_latency.py measured 14-16 s at the 10 s default). A poll that took longer than the
interval is followed after a tenth of it (at least a quarter second, at most the interval), so a
slow box is never asked back to back."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from samai.console.core import config
from samai.console.core.session import MIN_GAP, MIN_PAUSE_S, BoxSession, PollFailed
from samai.console.core.update import StateUpdate
from samai.remote.boxapi import Box
from tests.replay_transport import ReplayTransport


class Stop(Exception):
    pass


def run_polls(workspace: Path, interval: float, took: list[float]) -> list[float]:
    """The pauses the poll loop takes after each of len(took) polls, each poll (and what was done
    with it) taking took[i] seconds of the session's clock."""
    now, pauses = [0.0], []

    async def sleep(seconds: float) -> None:
        pauses.append(seconds)
        now[0] += seconds
        if len(pauses) == len(took):
            raise Stop

    class Slow(BoxSession):
        async def poll_once(self) -> StateUpdate | PollFailed:
            result = await super().poll_once()
            assert not isinstance(result, PollFailed), result.error
            now[0] += took[len(pauses)]
            return result

    cfg = replace(config.load_builtin("tiny"), workspace=str(workspace))
    cfg = replace(cfg, target=replace(cfg.target, poll_interval=interval))
    session = Slow(cfg, lambda _cfg: Box(ReplayTransport.empty(workspace), str(workspace)),
                   headless=True, monotonic=lambda: now[0], sleep=sleep)

    async def go() -> None:
        try:
            with pytest.raises(Stop):
                await session.run(lambda _result: None, lambda e: pytest.fail(repr(e)))
        finally:
            await session.close()

    asyncio.run(go())
    return pauses


def test_the_next_poll_starts_an_interval_after_the_last_one_started(tmp_path: Path) -> None:
    pauses = run_polls(tmp_path, 10.0, [0.0, 3.0, 9.5, 14.0])
    assert pauses == pytest.approx([10.0, 7.0, 1.0, 1.0])  # 14 s: a tenth of the interval, not at once


@given(st.floats(0.2, 30.0), st.lists(st.floats(0.0, 60.0), min_size=1, max_size=6))
@settings(max_examples=30, deadline=None)
def test_polls_start_every_interval_or_a_tenth_of_it_after_a_poll_that_took_longer(
        tmp_path_factory: pytest.TempPathFactory, interval: float, took: list[float]) -> None:
    pauses = run_polls(tmp_path_factory.mktemp("ws"), interval, took)
    for pause, t in zip(pauses, took, strict=True):
        assert t + pause == pytest.approx(max(interval, t + max(MIN_GAP * interval, min(interval, MIN_PAUSE_S))))
