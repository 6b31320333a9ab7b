"""Fire and stop a multi-node stage through the one action layer, on every node at once.

A multi-node plan is one confirmation over every node's own plan: the operator sees each box,
its node rank and its exact command, with the preflight of every node and of the nodes
together (each reachable, the same box tools and the same training program on each, the
rendezvous port free on the master). Running it runs each node's plan through that node's
Actions (read-only refused, identity re-checked on the box, an audit intent and outcome line
per node), the master first. A node that does not start stops those already started (audited
too): half a run would only wait for the rest until its rendezvous timed out.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace

from samai.console.core.actions import (
    ActionOutcome,
    ActionPlan,
    Actions,
    Confirm,
    Decision,
    FirePlan,
    OutcomeStatus,
    StopPlan,
)
from samai.console.core.config import Config, Stage, UnknownStage
from samai.console.core.multinode import (
    MultiNodeError,
    MultiRun,
    NodeLaunch,
    NodeRun,
    launches,
    load_run,
    master_of,
    new_run_id,
    program_of,
    save_run,
)
from samai.console.core.preflight.nodes import cross_node_checks
from samai.remote.model import FireResult


@dataclass(frozen=True)
class NodeStep:
    node: str
    rank: int
    plan: ActionPlan  # run by that node's Actions


@dataclass(frozen=True)
class MultiPlan:
    summary: FirePlan | StopPlan  # what the operator is shown and confirms; each node runs its own step
    steps: tuple[NodeStep, ...]
    run: MultiRun | None = None  # a fire's run, its pids not known yet

    @property
    def blocked(self) -> bool:
        return self.summary.blocked


@dataclass(frozen=True)
class MultiOutcome:
    ok: bool
    status: OutcomeStatus
    message: str
    plan: MultiPlan
    nodes: tuple[tuple[str, ActionOutcome], ...] = ()  # each node's own outcome, as audited
    run: MultiRun | None = None  # a fire's run as recorded


class MultiNodeActions:
    """nodes: each box's Actions (its Box, its config as seen on it: Config.on_box), by box name."""

    def __init__(self, config: Config, nodes: Mapping[str, Actions], *, confirm: Confirm) -> None:
        self.config = config
        self.nodes = dict(nodes)
        self.confirm = confirm

    def _stage(self, name: str) -> Stage:
        stage = self.config.stage(name)
        if stage is None:
            raise UnknownStage(name, self.config)
        if not stage.nodes:
            raise MultiNodeError(f"stages.{name}: not a multi-node stage (no nodes)")
        missing = [n for n in stage.nodes if n not in self.nodes]
        if missing:
            raise MultiNodeError(f"stages.{name}.nodes: no connection to box {', '.join(missing)}")
        return stage

    # ------------------------------------------------------------ plans

    async def plan_fire(self, stage_name: str) -> MultiPlan:
        stage = self._stage(stage_name)
        run_id = new_run_id(stage.name)
        found = launches(self.config, stage, run_id)
        program = program_of(stage)
        planned, together = await asyncio.gather(
            asyncio.gather(*(self._node_fire(stage, launch, run_id, len(found)) for launch in found)),
            cross_node_checks(self.config, stage, program, {n: self.nodes[n].box for n in stage.nodes}))
        checks = tuple(together) + tuple(replace(c, text=f"box {s.node}: {c.text}") for s in planned
                                         for c in s.plan.checks)
        steps = tuple(replace(s, plan=replace(s.plan, checks=checks)) for s in planned)
        run = MultiRun(stage.name, stage.launcher, run_id, _master(self.config, stage), 0.0,
                       tuple(NodeRun(x.node, x.rank, x.target, x.workspace, stage.log, x.command) for x in found))
        summary = FirePlan(
            target=_targets(found), subject=f"stage {stage.name} on {len(found)} nodes "
            f"({stage.launcher}, run {run_id})", command=" ; ".join(f"[box {x.node}] {x.command}" for x in found),
            details=tuple(f"box {x.node} ({x.target}): node rank {x.rank} of {len(found)}, workspace {x.workspace}, "
                          f"log {stage.log}" for x in found) + (f"master {run.master}",),
            checks=checks, stage=stage.name)
        return MultiPlan(summary, steps, run)

    async def _node_fire(self, stage: Stage, launch: NodeLaunch, run_id: str, count: int) -> NodeStep:
        """That node's own fire plan (its preflight, its port holders), for its exact command."""
        env = (*stage.env, ("SAMAI_RUN", run_id), ("SAMAI_NODE", launch.node), ("SAMAI_NODE_RANK", str(launch.rank)))
        own = replace(stage, command=launch.command, nodes=(), launcher="", env=env)
        actions = self.nodes[launch.node]
        cfg = replace(actions.config, stages=tuple(own if s.name == stage.name else s for s in actions.config.stages))
        plan = await Actions(actions.box, cfg, actions.audit, readonly=actions.readonly,
                             confirm=actions.confirm).plan_fire(stage.name)
        subject = f"stage {stage.name} (box {launch.node}, node rank {launch.rank} of {count}, run {run_id})"
        return NodeStep(launch.node, launch.rank, replace(plan, subject=subject))

    def plan_stop(self, stage_name: str, *, grace: float = 10.0) -> MultiPlan:
        """Every node's chain of the stage: SIGTERM to its group, SIGKILL after grace, each process's
        identity re-checked on its box against the launch it recorded."""
        stage = self._stage(stage_name)
        run = load_run(self.config, stage.name)
        steps = []
        for rank, node in enumerate(stage.nodes):
            plan = self.nodes[node].plan_stop(stage.name, grace=grace)
            known = run.node(node) if run else None
            seen = f", last fired as pid {known.pid} (run {run.run_id})" if known and run and known.pid else ""
            steps.append(NodeStep(node, rank, replace(plan, subject=f"stage {stage.name} (box {node}{seen})")))
        summary = StopPlan(
            target=", ".join(f"{s.node}={s.plan.target}" for s in steps),
            subject=f"stage {stage.name} on every node ({', '.join(stage.nodes)})",
            command=f"on each of {', '.join(stage.nodes)}: SIGTERM to the process group of stage {stage.name}, "
                    f"SIGKILL after {grace:g} s",
            details=tuple(f"box {s.node} ({s.plan.target}): {s.plan.subject}" for s in steps),
            stage=stage.name, grace=grace)
        return MultiPlan(summary, tuple(steps), run)

    # ------------------------------------------------------------ confirm and run

    async def fire(self, stage_name: str) -> MultiOutcome:
        return await self.confirm_and_run(await self.plan_fire(stage_name))

    async def stop_all(self, stage_name: str, *, grace: float = 10.0) -> MultiOutcome:
        return await self.confirm_and_run(self.plan_stop(stage_name, grace=grace))

    async def confirm_and_run(self, plan: MultiPlan) -> MultiOutcome:
        refused = self._refusal(plan)
        if refused:
            return refused
        return await self.run(plan, await self.confirm(plan.summary))

    def _refusal(self, plan: MultiPlan) -> MultiOutcome | None:
        for step in plan.steps:
            refused = self.nodes[step.node].refusal(step.plan)
            if refused:
                return MultiOutcome(False, "refused", f"box {step.node}: {refused.message}", plan)
        return None

    async def run(self, plan: MultiPlan, decision: Decision) -> MultiOutcome:
        """Carry out exactly this plan on every node, as decided for its summary."""
        if not isinstance(decision, Decision) or decision.plan != plan.summary:
            return MultiOutcome(False, "refused", f"{plan.summary.action} {plan.summary.subject} refused: the "
                                "confirmation was not given for this plan", plan)
        refused = self._refusal(plan)
        if refused:
            return refused
        if decision.verdict != "declined" and isinstance(plan.summary, FirePlan):
            return await self._fire(plan, decision)
        outcomes = await asyncio.gather(*(self._run_step(s, decision) for s in plan.steps))
        done = tuple((s.node, o) for s, o in zip(plan.steps, outcomes, strict=True))
        ok = all(o.ok for _, o in done)
        status: OutcomeStatus = "done" if ok else next(o.status for _, o in done if not o.ok)
        message = "; ".join(f"box {n}: {o.message}" for n, o in done)
        return MultiOutcome(ok, status, message, plan, done, plan.run)

    async def _run_step(self, step: NodeStep, decision: Decision, how: str | None = None) -> ActionOutcome:
        node_decision = Decision(step.plan, decision.verdict, how or decision.how)
        return await self.nodes[step.node].run(step.plan, node_decision)

    async def _fire(self, plan: MultiPlan, decision: Decision) -> MultiOutcome:
        """The master first, then the others; the first node that does not start stops the rest."""
        done: list[tuple[str, ActionOutcome]] = []
        for step in plan.steps:
            outcome = await self._run_step(step, decision)
            done.append((step.node, outcome))
            if not outcome.ok:
                stopped = await self._roll_back(list(plan.steps[:len(done) - 1]), step.node)
                message = f"box {step.node}: {outcome.message}" + (f"; {stopped}" if stopped else "")
                return MultiOutcome(False, outcome.status, message, plan, tuple(done))
        run = _fired_run(plan, done)
        save_run(self.config, run)
        started = ", ".join(f"box {n.node} rank {n.rank} pid {n.pid}" for n in run.nodes)
        return MultiOutcome(True, "done", f"fired stage {run.stage} on {len(run.nodes)} nodes (run {run.run_id}): "
                                          f"{started}", plan, tuple(done), run)

    async def _roll_back(self, fired: list[NodeStep], failed: str) -> str:
        """Stop the nodes already started (each audited as its own stop)."""
        said = []
        for step in fired:
            stop = self.nodes[step.node].plan_stop(step.plan.stage or "", grace=10.0)
            outcome = await self.nodes[step.node].run(stop, Decision.confirmed(
                stop, f"rollback: box {failed} did not start"))
            said.append(f"box {step.node} stopped again: {outcome.message}")
        return "; ".join(said)


def _fired_run(plan: MultiPlan, done: list[tuple[str, ActionOutcome]]) -> MultiRun:
    assert plan.run is not None  # a fire plan carries its run
    results = {n: o.result for n, o in done}
    nodes = []
    for node in plan.run.nodes:
        result = results.get(node.node)
        fired = result if isinstance(result, FireResult) else None
        nodes.append(replace(node, pid=fired.pid if fired else None, start_time=fired.start_time if fired else None))
    return replace(plan.run, fired_at=time.time(), nodes=tuple(nodes))


def _master(cfg: Config, stage: Stage) -> str:
    address, port = master_of(cfg, stage)
    return f"{address}:{port}"


def _targets(found: tuple[NodeLaunch, ...]) -> str:
    return ", ".join(f"{x.node}={x.target}" for x in found)

