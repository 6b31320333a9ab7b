"""The GPUs feed: the probe's GPU readings kept across polls (console/core/gpus/findings.py), so
what only a sequence shows (a stall, a training run that stopped using its GPU) is judged, and the
curves pane draws the recent utilization."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from samai.console.core.feeds import Feed, Surroundings
from samai.console.core.gpus.findings import GpuWatch


@dataclass(frozen=True)
class GpuHistory:
    utilization: list[float | None]  # each recent poll's mean, oldest first


class GpusFeed(Feed):
    name = "gpus"
    row = True
    detectors = ("gpus",)

    def __init__(self, state, around: Surroundings) -> None:
        super().__init__(state, around)
        self.watch = GpuWatch(self.config)

    def context(self) -> dict[str, Any]:
        return {"gpu": self.watch}

    def view(self) -> GpuHistory:
        return GpuHistory(self.watch.utilization())
