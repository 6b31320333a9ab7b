"""Preflight across the nodes of a multi-node stage, before it fires: every node reachable, the
same box tools and the same training program on every node (hashed on each box by runhash.py),
and the rendezvous port free on the master. Each node's own preflight (disk, poison files,
already running) is its Actions' plan_fire; this is what only the nodes together can tell."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass

from samai.console.core.config import Config, Stage
from samai.console.core.multinode import Program, master_of
from samai.console.core.preflight import Check, holder_text
from samai.remote.boxapi import Box, BoxError
from samai.remote.model import Snapshot
from samai.remote.safe_text import visible
from samai.remote.transport import TransportError

RUNHASH = "runhash.py"


@dataclass(frozen=True)
class NodeReading:
    node: str
    error: str = ""  # the box could not be read: unreachable, or its tool failed
    snapshot: Snapshot | None = None
    tools: str | None = None  # the installed tools' digest
    program: str = ""  # the program's file on that box
    sha256: str = ""
    program_error: str = ""


async def read_node(node: str, box: Box, program: Program) -> NodeReading:
    """One node's snapshot and the hashes of what it would run; never raises for the box's sake."""
    request = {"workspace": box.workspace, "python": program.python}
    request.update({"module": program.module} if program.module else {"script": program.script})
    try:
        snap = await box.snapshot(processes=True)
        got = await box.call_readonly(RUNHASH, request)
    except (BoxError, TransportError, OSError) as e:
        return NodeReading(node, error=visible(str(e))[:300] or type(e).__name__)
    tools = got.get("tools")
    return NodeReading(node, snapshot=snap, tools=tools if isinstance(tools, str) else None,
                       program=visible(str(got.get("program", "")))[:300], sha256=str(got.get("sha256", ""))[:64],
                       program_error=visible(str(got.get("program_error", "")))[:300])


async def cross_node_checks(cfg: Config, stage: Stage, program: Program, boxes: Mapping[str, Box]) -> list[Check]:
    readings = await asyncio.gather(*(read_node(n, boxes[n], program) for n in stage.nodes))
    return node_checks(cfg, stage, program, list(readings))


def node_checks(cfg: Config, stage: Stage, program: Program, readings: list[NodeReading]) -> list[Check]:
    checks = [Check("error", f"box {r.node} is unreachable: {r.error}") if r.error
              else Check("ok", f"box {r.node} is reachable") for r in readings]
    read = [r for r in readings if not r.error]
    checks += _same("box tools", [(r.node, r.tools) for r in read if r.tools], "error")
    what = f"module {program.module}" if program.module else f"script {program.script}"
    checks += [Check("error", f"box {r.node}: the {what} cannot be hashed: {r.program_error}")
               for r in read if r.program_error]
    checks += _same(f"training program ({what})", [(r.node, r.sha256) for r in read if r.sha256], "error")
    master = next((r for r in readings if r.node == stage.nodes[0]), None)
    if master is not None and master.snapshot is not None:
        checks.append(_port_check(cfg, stage, master.snapshot))
    return checks


def _same(what: str, hashes: list[tuple[str, str]], severity: str) -> list[Check]:
    """One check: every node's hash equal, or which node has which."""
    if not hashes:
        return []
    if len({h for _, h in hashes}) == 1:
        return [Check("ok", f"the same {what} on every node ({hashes[0][1][:16]})")]
    shown = ", ".join(f"box {n}: {h[:16]}" for n, h in hashes)
    return [Check(severity, f"the {what} differs between the nodes: {shown}")]


def _port_check(cfg: Config, stage: Stage, snap: Snapshot) -> Check:
    address, port = master_of(cfg, stage)
    where = f"the rendezvous port {port} on the master (box {stage.nodes[0]}, {address})"
    holder = next((s for s in snap.listeners if s.port == port), None)
    if holder is None:
        return Check("ok", f"{where} is free")
    proc = snap.process(holder.pid) if holder.pid else None
    if proc is None:
        return Check("error", f"{where} is held by a process this user cannot see")
    return Check("error", f"{where} is held: {holder_text(proc, snap.time)}")


def multi_node_checks(stage: Stage) -> tuple[Check, ...]:
    """A multi-node stage fired on one box would wait alone for a rendezvous: it fires on every
    node at once (multinode.actions.MultiNodeActions), never through one box's plan."""
    if not stage.nodes:
        return ()
    return (Check("error", f"stage {stage.name} runs on the nodes {', '.join(stage.nodes)} under {stage.launcher}: "
                           "it is fired on every node at once, not on one box"),)
