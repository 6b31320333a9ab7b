"""The nodes feed: the multi-node stages' runs read on every node (console/core/multinode/): a rank
that died while others run is an alert at once (rank_died, whose fix stops every node), resolved
once the run has ended on every node; a rank that stalled while every node's processes live
(rank_stalled, the same fix), resolved once it is no longer judged so (a step again, the run
stopped); which nodes are alive, and rank 0's training curve, which the curves pane shows
whichever box it runs on."""

from __future__ import annotations

from dataclasses import dataclass

from samai.console.core.alertbook import Alert
from samai.console.core.feeds import Feed, Read, Surroundings
from samai.console.core.problems import Finding
from samai.console.core.roles import Role
from samai.console.core.training.trainlog import TrainPoint

STALLED = "rank_stalled"  # console/core/multinode/stall.py's code


@dataclass(frozen=True)
class NodesView:
    marks: str  # which nodes of each followed run are alive: `train: a alive · b down`
    curve: list[TrainPoint] | None = None  # rank 0's curve when it changed (multi-node training)


class NodesFeed(Feed):
    name = "nodes"

    def __init__(self, state, around: Surroundings) -> None:
        super().__init__(state, around)
        self.enabled = around.nodes is not None and any(s.nodes for s in self.config.stages)
        self._asked = float("-inf")
        self._curve_shown: tuple | None = None
        self._view: NodesView | None = None

    def reads(self, now: float) -> list[Read]:
        if not self.enabled or now - self._asked < self.config.target.poll_interval:
            return []
        self._asked = now
        return [Read("the multi-node runs on their nodes", self._poll_nodes, self._fold_nodes)]

    async def _poll_nodes(self, box) -> tuple[list[Finding], list[str]]:
        assert self.around.nodes is not None  # (enabled)
        return await self.around.nodes().poll(self.around.box_name)

    def _fold_nodes(self, reading: tuple[list[Finding], list[str]], now: float) -> list[Alert]:
        findings, ended = reading
        self.state.book.resolve(lambda a: a.code == "rank_died" and a.action is not None
                                and getattr(a.action, "stage", None) in ended, now)
        stalled = {f.message for f in findings if f.code == STALLED}  # a stall stands while it is judged so
        self.state.book.resolve(lambda a: a.code == STALLED and a.text not in stalled, now)
        new = [Alert(now, f.severity, f.message, code=f.code, action=f.action, hint="x stop all" if f.action else "")
               for f in findings if not self.state.book.standing(f.code, f.message)]
        assert self.around.nodes is not None
        session = self.around.nodes()
        training = session.config.role_name(Role.TRAIN)
        curve = None
        if multi_node(session.config, training) and session.curve.version != self._curve_shown:
            curve, self._curve_shown = list(session.curve.points), session.curve.version
        self._view = NodesView(session.marks(), curve)
        return new

    def view(self) -> NodesView | None:
        view, self._view = self._view, None
        return view


def multi_node(config, stage: str | None) -> bool:
    found = config.stage(stage) if stage else None
    return found is not None and bool(found.nodes)
