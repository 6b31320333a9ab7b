"""The serving feed: each running server's ports asked in the poll every [serve] every_s (the
probe asks their monitoring endpoints at once, within a budget), read into views and judged
(serve_hung, serve_queue, ctx_full) by a watch kept across polls (console/core/serving/watch.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from samai.console.core.feeds import Feed, Surroundings
from samai.console.core.serving.watch import ServingView, ServingWatch
from samai.remote.model import Snapshot


@dataclass(frozen=True)
class ServingReadings:
    """The serve pane's view: each running server's last reading."""

    servers: tuple[ServingView, ...]


class ServingFeed(Feed):
    name = "serving"
    detectors = ("serving",)

    def __init__(self, state, around: Surroundings) -> None:
        super().__init__(state, around)
        self.watch = ServingWatch(self.config, one_look=around.one_look)

    def request(self, now: float) -> dict[str, Any]:
        # One look (doctor's) asks every serve stage's ports: which of them run, its answers say.
        asked = [s.name for s in self.config.stages] if self.around.one_look else self.state.running()
        return self.watch.request(asked, self.state.received_at or 0.0)

    def prepare(self, snap: Snapshot) -> None:
        self.watch.prepare(snap)  # the /metrics bodies, parsed off the event loop

    def context(self) -> dict[str, Any]:
        return {"serving": self.watch}

    def view(self) -> ServingReadings:
        return ServingReadings(tuple(self.watch.views.values()))  # as the serving detector just read them
