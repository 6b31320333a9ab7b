"""Rank 0's training curve of a multi-node run, whichever box it runs on.

The Trainer logs its points on the world's process 0 alone, and torchrun's c10d rendezvous
decides which node runs it (not necessarily node rank 0): the node is the one whose log's rank
line says 0, and its log is then followed as one box's training pane follows its train stage's."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

from samai.console.core.chunked_lines import piece_follower
from samai.console.core.multinode import MultiRun, NodeRun, ranks_in_log
from samai.console.core.multinode.watch import HEAD_BYTES, READ_ERRORS, NodeState, log_head
from samai.console.core.problems import Problem
from samai.console.core.training.trainlog import TrainLogCheck, TrainPoint, newest_run_points
from samai.remote.boxapi import Box
from samai.remote.follow import CATCH_UP_READ, LogFollower


class RankZeroCurve:
    """Follows one run at a time: another run (a new fire) starts it afresh."""

    def __init__(self) -> None:
        self._start(None)

    def _start(self, run_id: str | None) -> None:
        self.run_id = run_id
        self.node: str | None = None  # where rank 0 runs, once a log has said so
        self._follower: LogFollower | None = None
        self._check = TrainLogCheck()
        self._restarts = 0  # runs begun in the followed log: a new one is a curve of its own
        self._searched: dict[str, int] = {}  # the bytes of each node's log head searched for rank 0

    @property
    def points(self) -> list[TrainPoint]:
        """The curve's points kept so far (evenly thinned on a long run, as one box's are)."""
        return self._check.parser.points

    @property
    def anomalies(self) -> list[Problem]:
        """What the checks found in rank 0's log of this run (NaN, spikes...), as `check trainlog` says them."""
        return self._check.anomalies

    @property
    def version(self) -> tuple[str | None, str | None, int, int]:
        """Changes whenever the points or the node they come from change."""
        return self.run_id, self.node, self._restarts, self._check.parser.series.seen

    async def read(self, run: MultiRun, states: Sequence[NodeState], boxes: Mapping[str, Box]) -> None:
        """Read what rank 0's log has added since the last read (nothing where no box answers)."""
        if run.run_id != self.run_id:
            self._start(run.run_id)  # a new run: nothing of the last one stays
        if self._follower is None:
            node = await self._rank_zero_node(run, states, boxes)
            if node is None:
                return
            self.node = node.node
            self._follower = piece_follower(node.log_path, offset=0, catch_up_bytes=CATCH_UP_READ)
        assert self.node is not None
        try:
            chunk = await boxes[self.node].read_log(self._follower.cursor())
        except READ_ERRORS:
            return  # read again next time, from the same place
        self._check, restarted, _ = newest_run_points(self._check, self._follower.consume(chunk).lines)
        self._restarts += restarted

    async def _rank_zero_node(self, run: MultiRun, states: Sequence[NodeState],
                              boxes: Mapping[str, Box]) -> NodeRun | None:
        """The node whose log names rank 0 (None until one has said so). A node whose whole head was
        searched is not asked again: a program that never says its rank costs no reads after that."""
        nodes = [n for n in (run.node(s.node) for s in states if s.alive is not None)
                 if n is not None and self._searched.get(n.node, 0) < HEAD_BYTES]
        heads = await asyncio.gather(*(_head(boxes[n.node], n) for n in nodes))
        for node, head in zip(nodes, heads, strict=True):
            if head is not None and 0 in ranks_in_log(head):
                return node
            self._searched[node.node] = len(head or b"")
        return None


async def _head(box: Box, node: NodeRun) -> bytes | None:
    try:
        return await log_head(box, node)
    except READ_ERRORS:
        return None  # asked again next time
