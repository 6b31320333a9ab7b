"""Watch a multi-node run as one: each node's launch, identity-checked against the run's record,
and the alert when one node's process has died while others run. Those others then wait in
their next collective (or their next rendezvous) until it times out, so the alert comes at once,
with the rank, the box and the last step the dead node's log shows, and "stop all" as its fix.
With each live node's launch, the same reading takes its log's last lines and its processes'
states: its progress, which stall.py judges (rank_stalled)."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from samai.console.core.detectors import Finding
from samai.console.core.fixes import FixAction
from samai.console.core.multinode import MultiRun, NodeRun, last_step_in_log, progress_in_log, rank_in_log
from samai.remote.boxapi import Box, BoxError
from samai.remote.follow import LogCursor
from samai.remote.model import Snapshot, StageRecord, same_start
from samai.remote.safe_text import visible
from samai.remote.transport import TransportError

HEAD_BYTES = 256 * 1024  # where the rank line is, near the start of the log
TAIL_LINES = 400  # where the last step is
PROGRESS_LINES = 100  # a live node's log's last lines read at each reading: its last step
PROGRESS_BYTES = 64 * 1024  # at most
STOPPED = ("T", "t")  # a process's state in /proc when a signal (SIGSTOP, SIGTSTP) or a tracer stopped it
READ_ERRORS = (BoxError, TransportError, OSError)  # a box that cannot be read now


@dataclass(frozen=True)
class Progress:
    """What a live node's log and processes say at one reading."""

    step: int | None  # its last progress line's step (None: none in the log's last lines)
    total: int | None  # that line's total steps
    quiet_s: float | None  # how long before the reading the log was last written (the box's clock)
    read_at: float  # when the reply came (this machine's clock)
    stopped: tuple[tuple[int, str], ...] = ()  # the run's processes on the node that are stopped: (pid, state)


@dataclass(frozen=True)
class NodeState:
    node: str
    node_rank: int
    alive: bool | None  # None: the box could not be read
    status: str  # the launch's status on the box (running, failed, stopped...), or why it is unknown
    pid: int | None = None
    progress: Progress | None = None  # a live launch's


async def node_states(run: MultiRun, boxes: Mapping[str, Box]) -> tuple[NodeState, ...]:
    return tuple(await asyncio.gather(*(_state(run, n, boxes[n.node]) for n in run.nodes)))


async def _state(run: MultiRun, node: NodeRun, box: Box) -> NodeState:
    try:
        snap = await box.snapshot(processes=True, logs=[LogCursor(node.log_path, None, last_lines=PROGRESS_LINES,
                                                                  max_bytes=PROGRESS_BYTES)])
    except READ_ERRORS as e:
        return NodeState(node.node, node.rank, None, f"unreachable: {visible(str(e))[:200]}", node.pid)
    rec = snap.state(run.stage)
    if rec is None:
        return NodeState(node.node, node.rank, False, "no launch recorded", node.pid)
    ours = (node.pid is not None and rec.pid == node.pid and node.start_time is not None
            and rec.start_time is not None and same_start(rec.start_time, node.start_time))
    if not ours:  # another launch of the stage replaced this run's on that box
        return NodeState(node.node, node.rank, False, f"replaced by pid {rec.pid}", node.pid)
    return NodeState(node.node, node.rank, rec.alive, rec.status, node.pid,
                     _progress(snap, rec, time.time()) if rec.alive else None)


def _progress(snap: Snapshot, rec: StageRecord, read_at: float) -> Progress:
    """The node's progress as this reading shows it: its log's last step and how long it has been
    quiet (box values: a step or a time out of range is none), and its run's stopped processes."""
    chunk = snap.logs[0] if snap.logs else None
    found = progress_in_log(chunk.data) if chunk is not None else None
    step, total = found if found is not None and found[0] <= found[1] else (None, None)
    quiet = None
    if chunk is not None and chunk.mtime is not None and math.isfinite(snap.time):
        quiet = min(max(snap.time - chunk.mtime, 0.0), 365 * 86400.0)
    stopped = tuple((p.pid, p.state) for p in (snap.process(pid) for pid in rec.group[:4096])
                    if p is not None and p.state in STOPPED)
    return Progress(step, total, quiet, read_at, stopped)


async def death_findings(run: MultiRun, states: Sequence[NodeState], boxes: Mapping[str, Box],
                         read: dict[tuple[str, str], tuple[int | None, int | None]] | None = None) -> list[Finding]:
    """One error per node whose process died while another node's still runs. read: the rank and
    step already read from a dead node's log, by (run, node): a dead node's log is read once."""
    read = {} if read is None else read
    alive = [s.node for s in states if s.alive]
    dead = [s for s in states if s.alive is False]
    if not alive or not dead:
        return []
    found = []
    for state in dead:
        node = run.node(state.node)
        key = (run.run_id, state.node)
        got = read.get(key) or (await _rank_and_step(boxes[state.node], node) if node else None)
        if got is not None:
            read[key] = got
        rank, step = got or (None, None)
        who = f"rank {rank}" if rank is not None else f"node rank {state.node_rank}"
        when = f"at step {step}" if step is not None else "before its first logged step"
        message = (f"{who} on box {state.node} died {when} ({state.status}); ranks on {', '.join(alive)} will hang "
                   f"until the collective times out: stop all")
        found.append(Finding("rank_died", "error", message, FixAction.stop(run.stage)))
    return found


async def watch(run: MultiRun, boxes: Mapping[str, Box],
                read: dict[tuple[str, str], tuple[int | None, int | None]] | None = None
                ) -> tuple[tuple[NodeState, ...], list[Finding]]:
    """One reading of every node, and its alerts (read: see death_findings)."""
    states = await node_states(run, boxes)
    return states, await death_findings(run, states, boxes, read)


async def log_head(box: Box, node: NodeRun) -> bytes:
    """The start of the node's log, where its rank line is (READ_ERRORS where it cannot be read)."""
    return (await box.tail(node.log_path, offset=0, max_bytes=HEAD_BYTES)).data


async def _rank_and_step(box: Box, node: NodeRun) -> tuple[int | None, int | None] | None:
    """What the node's log says (None: it cannot be read now; asked again next time)."""
    try:
        head = await log_head(box, node)
        tail = (await box.tail(node.log_path, last_lines=TAIL_LINES)).data
    except READ_ERRORS:
        return None
    return rank_in_log(head + b"\n" + tail), last_step_in_log(tail)
