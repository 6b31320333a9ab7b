"""A stalled rank of a multi-node run: rank_stalled.

In a collective every rank waits for the slowest, so a rank that stops (stopped by a signal, hung
in a driver call or a deadlock, its network gone quiet) stops the others at their next
collective; with the heartbeat timeouts public launch scripts set (TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC
of hours) nothing ends the run, and every process still lives. Each node's progress is read with
its state (watch.py: its log's last progress line, `train STEP/TOTAL [`, which the train stage
writes on every rank at every optimizer step, how long ago the log was last written and which of
the run's processes are stopped). A node's step is taken to have advanced when its log was last
written as the reading that first shows that step says it (an age on the box's own clock: no skew
between the boxes' clocks), and the run is stalled once one of its ranks has not advanced for
[train] stall_after_s while every node's processes live, whether another rank went on meanwhile
or none did. The rank named is the one that stopped first: one whose process is stopped (state T
in /proc), else the one at the lowest step, else the one whose step stopped advancing first, else
the one whose log went quiet first. A node whose log never showed a progress line is not judged
(a program that logs no steps), and a run whose last step is its total is finishing, not stalled.
The fix stops every node; the operator then resumes from the newest whole checkpoint."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from samai.console.core.fixes import FixAction
from samai.console.core.multinode import MultiRun, rank_in_log
from samai.console.core.multinode.watch import READ_ERRORS, NodeState, Progress, log_head
from samai.console.core.problems import Finding
from samai.remote.boxapi import Box

CODE = "rank_stalled"


@dataclass
class _Seen:
    step: int
    advanced_at: float  # this machine's clock: when its log was written as the first reading of this step showed
    quiet_since: float  # when its log was last written, as last read


class StallWatch:
    """One multi-node stage's runs, one at a time (a new run starts afresh)."""

    def __init__(self) -> None:
        self._start(None)

    def _start(self, run_id: str | None) -> None:
        self.run_id = run_id
        self._seen: dict[str, _Seen] = {}
        self._ranks: dict[str, int | None] = {}  # each named node's rank, as its log's head says it
        self._standing: list[Finding] = []

    async def judge(self, run: MultiRun, states: Sequence[NodeState], boxes: Mapping[str, Box],
                    stall_after_s: float) -> list[Finding]:
        """The run's stall as this reading of its nodes shows it: one finding, or none. While a node
        cannot be read, what was last judged stands."""
        if run.run_id != self.run_id:
            self._start(run.run_id)
        if any(s.alive is None for s in states):
            return self._standing
        live = [(s, s.progress) for s in states if s.alive and s.progress is not None]
        if not states or len(live) != len(states):  # a node's processes ended: no stall (rank_died says a death)
            self._standing = []
            return []
        for state, progress in live:
            self._note(state.node, progress)
        self._standing = await self._stall(run, states, boxes, stall_after_s, max(p.read_at for _, p in live))
        return self._standing

    def _note(self, node: str, progress: Progress) -> None:
        written = progress.read_at - progress.quiet_s if progress.quiet_s is not None else progress.read_at
        seen = self._seen.get(node)
        if progress.step is None:  # no progress line among the last lines read: the step is as it was
            if seen is not None:
                seen.quiet_since = max(seen.quiet_since, written)
        elif seen is None or seen.step != progress.step:
            self._seen[node] = _Seen(progress.step, written, written)
        else:
            seen.quiet_since = written

    async def _stall(self, run: MultiRun, states: Sequence[NodeState], boxes: Mapping[str, Box],
                     stall_after_s: float, now: float) -> list[Finding]:
        finishing = any(s.progress is not None and s.progress.step is not None and s.progress.total is not None
                        and s.progress.step >= s.progress.total for s in states)
        if finishing or not any(now - self._seen[s.node].advanced_at >= stall_after_s
                                for s in states if s.node in self._seen):
            return []
        first = min(states, key=self._order)
        seen = self._seen.get(first.node)
        if seen is None:  # a stopped process on a node that never logged a step
            since = "before its first logged step"
        else:
            since = f"since step {seen.step} (logged at {_clock(seen.advanced_at)})"
        rank = await self._rank(run, first, boxes)
        who = f"rank {rank}" if rank is not None else f"node rank {first.node_rank}"
        stopped = first.progress.stopped if first.progress is not None else ()
        how = ""
        if stopped:
            pids = ", ".join(f"pid {pid}" for pid, _ in stopped[:3])
            how = (f"; its processes {pids} are" if len(stopped) > 1 else f"; its process {pids} is") + \
                f" stopped (state {stopped[0][1]})"
        message = (f"{who} on box {first.node} stopped first: no step {since} for [train] stall_after_s "
                   f"({stall_after_s:g} s) while every node's processes live{how}: stop all, then resume "
                   f"from the newest whole checkpoint")
        return [Finding(CODE, "error", message, FixAction.stop(run.stage), step=seen.step if seen else None)]

    def _order(self, state: NodeState) -> tuple[float, ...]:
        """Which node stopped first sorts first: a stopped process, the lowest step, the earliest
        advance, the earliest quiet log; a node that logged no step after those that did."""
        stopped = 0.0 if state.progress is not None and state.progress.stopped else 1.0
        seen = self._seen.get(state.node)
        if seen is None:
            return (stopped, 1.0, 0.0, 0.0, 0.0, float(state.node_rank))
        return (stopped, 0.0, float(seen.step), seen.advanced_at, seen.quiet_since, float(state.node_rank))

    async def _rank(self, run: MultiRun, state: NodeState, boxes: Mapping[str, Box]) -> int | None:
        """The node's distributed rank, from its log's head (read once per run and node)."""
        if state.node not in self._ranks:
            node = run.node(state.node)
            if node is None:
                return None
            try:
                self._ranks[state.node] = rank_in_log(await log_head(boxes[state.node], node))
            except READ_ERRORS:
                return None  # asked again next time
        return self._ranks[state.node]


def _clock(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))
