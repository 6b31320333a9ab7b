"""The connections a front end needs for its multi-node stages: one Box per node, opened when
first needed and closed together; the multi-node action layer over them; and the watch of each
multi-node stage's recorded run, as alerts (a rank that died, a rank that stalled), and the
training (role train) stage's rank 0 curve."""

from __future__ import annotations

import asyncio

from samai.console.core.actions import Actions, Confirm
from samai.console.core.audit import AuditLog
from samai.console.core.config import Config
from samai.console.core.connect import open_box
from samai.console.core.detectors import Finding
from samai.console.core.fixes import FixAction
from samai.console.core.multinode import load_run
from samai.console.core.multinode.actions import MultiNodeActions
from samai.console.core.multinode.curve import RankZeroCurve
from samai.console.core.multinode.stall import StallWatch
from samai.console.core.multinode.watch import NodeState, watch
from samai.console.core.roles import Role
from samai.remote.boxapi import Box

CURVE_ROLE = Role.TRAIN  # whose stage's curve the training pane shows (its first), on one box as on several


def multi_node_stage(cfg: Config, stage_name: str | None) -> bool:
    stage = cfg.stage(stage_name) if stage_name else None
    return stage is not None and bool(stage.nodes)


class MultiNodeSession:
    """cfg: the whole fleet's config (its [boxes] and stages)."""

    def __init__(self, cfg: Config, audit: AuditLog, *, readonly: bool, confirm: Confirm) -> None:
        self.config = cfg
        self.audit = audit
        self.readonly = readonly
        self.confirm = confirm
        self.boxes: dict[str, Box] = {}
        self._ended: set[str] = set()  # the runs seen ended on every node: not read again
        self.states: dict[str, tuple[NodeState, ...]] = {}  # each stage's nodes as last read
        self._read: dict[tuple[str, str], tuple[int | None, int | None]] = {}  # dead nodes' rank and step
        self.curve = RankZeroCurve()  # the train stage's, when it runs on several nodes
        self.stalls: dict[str, StallWatch] = {}  # each stage's ranks' progress (rank_stalled)

    def _nodes(self) -> list[str]:
        return list(dict.fromkeys(n for s in self.config.stages for n in s.nodes))

    def box(self, name: str) -> Box:
        if name not in self.boxes:
            self.boxes[name] = open_box(self.config.on_box(name), readonly=self.readonly)
        return self.boxes[name]

    def actions(self) -> MultiNodeActions:
        nodes = {n: Actions(self.box(n), self.config.on_box(n), self.audit, readonly=self.readonly,
                            confirm=self.confirm) for n in self._nodes()}
        return MultiNodeActions(self.config, nodes, confirm=self.confirm)

    async def poll(self, shown_box: str | None = None) -> tuple[list[Finding], list[str]]:
        """Each multi-node stage's recorded run, read on its nodes: what holds now (a rank that died
        while others run, a rank that stalled while every node's processes live, what rank 0's
        training log shows; each screen raises what it has not shown yet), and the stages whose
        run has just ended on every node. shown_box: the box on screen, whose own log's findings
        its screen raises itself."""
        standing: list[Finding] = []
        ended: list[str] = []
        for stage in (s for s in self.config.stages if s.nodes):
            run = load_run(self.config, stage.name)
            if run is None or run.run_id in self._ended or any(self.config.box(n.node) is None for n in run.nodes):
                continue
            boxes = {n.node: self.box(n.node) for n in run.nodes}
            states, findings = await watch(run, boxes, self._read)
            self.states[stage.name] = states
            # Read after the states: a run just ended has its last lines read.
            if stage.name == self.config.role_name(CURVE_ROLE):
                await self.curve.read(run, states, boxes)
                standing += self._curve_findings(stage.name) if self.curve.node != shown_box else []
            standing += findings
            stalls = self.stalls.setdefault(stage.name, StallWatch())
            standing += await stalls.judge(run, states, boxes, self.config.train.stall_after_s)
            if all(s.alive is False for s in states):
                self._ended.add(run.run_id)
                ended.append(stage.name)
        return standing, ended

    def _curve_findings(self, stage: str) -> list[Finding]:
        """Rank 0's log anomalies, for every node's screen: an error's fix is to stop all."""
        return [Finding(p.code, p.severity, f"{stage}, rank 0 on box {self.curve.node}: {p.message}",
                        FixAction.stop(stage) if p.severity == "error" else None) for p in self.curve.anomalies]

    def marks(self) -> str:
        """Which nodes of each followed run are alive: `train: a alive · b down`."""
        words = {True: "alive", False: "down", None: "unreachable"}
        return "; ".join(f"{stage}: " + " · ".join(f"{s.node} {words[s.alive]}" for s in states)
                         + self._curve_from(stage) for stage, states in self.states.items())

    def _curve_from(self, stage: str) -> str:
        curve_stage = self.config.role_name(CURVE_ROLE)
        return f" · rank 0 on {self.curve.node}" if stage == curve_stage and self.curve.node else ""

    async def close(self) -> None:
        boxes, self.boxes = self.boxes, {}
        await asyncio.gather(*(b.close() for b in boxes.values()), return_exceptions=True)
