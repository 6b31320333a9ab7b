"""The fleet: every box of the config watched on its own (its own Box, state and deadlines), each
folded into one BoxRow; and the one-shot fetch of every box at once (`snapshot --all-boxes`).

A box that does not answer costs only its own row: no box waits on another."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from samai.console.core.alertbook import Alert
from samai.console.core.config import Config
from samai.console.core.disk.budget import project
from samai.console.core.redact import redact
from samai.console.core.session import BoxSession, OpenBox, PollFailed, error_text
from samai.console.core.state import ConsoleState
from samai.console.core.update import StateUpdate
from samai.remote.model import GpuReading

DEFAULT_BOX = "default"  # the one box of a config without [boxes]

T = TypeVar("T")


def fleet_configs(cfg: Config) -> list[tuple[str, Config]]:
    """(name, the config as seen on that box) of every box, in the config's order."""
    if not cfg.boxes:
        return [(DEFAULT_BOX, cfg)]
    return [(b.name, cfg.on_box(b.name)) for b in cfg.boxes]


def fleet_interval(boxes: int) -> float:
    """The poll interval of a fleet's box that sets none: 1 s for up to 10 boxes, then longer with
    the fleet's size, up to 6 s from 60 (as all-smi does: a row read every second is no use to
    an operator scanning 64 of them, and costs a core)."""
    return min(6.0, max(1.0, boxes / 10))


def polled_configs(cfg: Config) -> list[tuple[str, Config]]:
    """fleet_configs, each box's poll interval its own where its config sets one, else the fleet's."""
    configs = fleet_configs(cfg)
    adaptive = fleet_interval(len(configs))
    return [(name, c if c.target.poll_interval_given else replace(c, target=replace(c.target, poll_interval=adaptive)))
            for name, c in configs]


def deadline_of(cfg: Config) -> float:
    """The longest one box may take to answer once: its connect, then one call."""
    return cfg.target.connect_timeout + cfg.target.timeout


def unreachable(error: str) -> dict[str, str]:
    return {"error": error, "state": "unreachable"}


async def gather_boxes(configs: list[tuple[str, Config]],
                       fetch: Callable[[Config], Awaitable[T]]) -> dict[str, T | dict[str, str]]:
    """fetch(config) on every box at once, each under its own deadline; a box that fails or
    does not answer in time is an `unreachable` entry, never a delay for the others."""

    async def one(cfg: Config) -> T | dict[str, str]:
        deadline = deadline_of(cfg)
        try:
            return await asyncio.wait_for(fetch(cfg), deadline)
        except TimeoutError:
            return unreachable(f"no answer within {deadline:g} s")
        except Exception as e:  # one box's bad reply is its own entry: the others are printed
            return unreachable(error_text(e))

    results = await asyncio.gather(*(one(cfg) for _, cfg in configs))
    return {name: result for (name, _), result in zip(configs, results, strict=True)}


# ------------------------------------------------------------------ the fleet screen's model


@dataclass(frozen=True)
class BoxRow:
    """One box as the fleet sees it: what its row shows."""

    name: str
    url: str
    state: str = "connecting"  # connecting (the first poll in flight) | connected | unreachable (never answered) | lost
    rtt: float | None = None  # seconds, of the last snapshot
    error: str = ""  # why the last poll failed
    running: tuple[str, ...] = ()  # stages running now
    disk_used: int | None = None  # bytes, the workspace's filesystem (or its capacity in the budget)
    disk_peak: int | None = None  # bytes used at the running (else next) stage's projected peak
    disk_capacity: int | None = None
    gpu_count: int = 0
    gpu_util: float | None = None  # percent, the mean over the GPUs that report it
    gpu_memory_used: int | None = None  # bytes, over every GPU
    gpu_memory_total: int | None = None
    alert: Alert | None = None  # the newest active alert
    seen_at: float | None = None  # when the last snapshot arrived (the console's clock)
    polls: int = 0  # snapshots folded in so far


def _gpu_fields(gpus: GpuReading) -> dict[str, Any]:
    utils = [g.util_gpu for g in gpus.gpus if g.util_gpu is not None]
    used = [g.memory_used for g in gpus.gpus if g.memory_used is not None]
    total = [g.memory_total for g in gpus.gpus if g.memory_total is not None]
    return {"gpu_count": len(gpus.gpus), "gpu_util": sum(utils) / len(utils) if utils else None,
            "gpu_memory_used": sum(used) if used else None, "gpu_memory_total": sum(total) if total else None}


def _peak(cfg: Config, u: StateUpdate) -> int | None:
    """The disk used at the peak of the running stage, else of the next one to run."""
    running = [v for v in u.stages if v.status == "running"]
    upcoming = running or [v for v in u.stages if v.status in ("idle", "blocked")]
    stage = cfg.stage(upcoming[0].name) if upcoming else None
    if stage is None:
        return None
    return u.budget.used + project(cfg, u.budget, stage).adds


def row_of(row: BoxRow, cfg: Config, u: StateUpdate, alerts: list[Alert], now: float) -> BoxRow:
    """The row after one snapshot folded in (u) with the box's alerts as they now stand."""
    return replace(row, state="connected", rtt=u.snapshot.rtt, error="",
                   running=tuple(v.name for v in u.stages if v.status == "running"),
                   disk_used=u.budget.used, disk_capacity=u.budget.capacity, disk_peak=_peak(cfg, u),
                   alert=next((a for a in alerts if a.active), None), seen_at=now, polls=row.polls + 1,
                   **_gpu_fields(u.snapshot.gpus))


class BoxWatch:
    """One box of the fleet: its session (the same poll as the box screen's) and its row."""

    def __init__(self, name: str, config: Config, open_box: OpenBox, clock: Callable[[], float] = time.time) -> None:
        self.name, self.config = name, config
        self.session = BoxSession(config, open_box, clock=clock, row_only=True)
        self.row = BoxRow(name, redact(config.target.url))  # shown: a password in it masked
        self._clock = clock

    @property
    def state(self) -> ConsoleState:
        return self.session.state

    async def poll_once(self) -> BoxRow:
        """One snapshot folded in; a failure is said on the row (unreachable, or lost once it had answered)."""
        try:
            self._fold(await self.session.poll_once())
        except Exception as e:  # a bug folding it in: the row says so, and the next poll may be fine
            self._bug(e)
        return self.row

    def _fold(self, result: StateUpdate | PollFailed) -> None:
        if isinstance(result, PollFailed):
            state = "unreachable" if result.link_was in ("connecting", "unreachable") else "lost"
            alert = next((a for a in self.state.alerts if a.active), None)
            self.row = replace(self.row, state=state, error=result.error, alert=alert)
        else:
            self.row = row_of(self.row, self.config, result, self.state.alerts, self._clock())

    def _bug(self, e: Exception) -> None:
        self.row = replace(self.row, state="unreachable" if self.row.state != "connected" else "lost",
                           error=error_text(e))

    async def run(self, report: Callable[[BoxRow], None]) -> None:
        """Poll until cancelled, the next poll scheduled when the last is done; report each row."""

        def folded(result: StateUpdate | PollFailed) -> None:
            self._fold(result)
            report(self.row)

        def bug(e: Exception) -> None:
            self._bug(e)
            report(self.row)

        await self.session.run(folded, bug)

    async def close(self) -> None:
        await self.session.close()


class Fleet:
    """Every box of a config, each watched on its own."""

    def __init__(self, config: Config, open_box: OpenBox, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.watches = [BoxWatch(name, cfg, open_box, clock) for name, cfg in polled_configs(config)]

    @property
    def names(self) -> list[str]:
        return [w.name for w in self.watches]

    @property
    def rows(self) -> list[BoxRow]:
        return [w.row for w in self.watches]

    def watch(self, name: str) -> BoxWatch | None:
        return next((w for w in self.watches if w.name == name), None)

    async def close(self) -> None:
        await asyncio.gather(*(w.close() for w in self.watches), return_exceptions=True)
