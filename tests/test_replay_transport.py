"""The replay box answers the Box as a probe on a box would (tests/replay_transport.py): the
recording for what needs processes, the workspace's files, read by the box's own code, for the
rest; what it cannot answer is a refusal, never a made-up reply."""

from __future__ import annotations

import pytest

from samai.remote.boxapi import Box
from samai.remote.model import BoxError
from samai.remote.transport import TransportError
from tests.replay_transport import ReplayTransport


async def test_the_boxs_reads_come_from_the_workspace_as_the_probe_reads_it(recorded_box: ReplayTransport) -> None:
    box = Box(recorded_box, recorded_box.workspace)
    try:
        log = str(recorded_box.path("logs/train.log"))
        assert (await box.tail(log, last_lines=1)).data == b"step 5/40  loss 1.512  [chars/s 18210]\n"
        assert await box.read_range(log, 0, 11) == b"=== samai ch"
        assert (await box.list_dir("logs", "tr")).names == ("train.log",)
        users = await box.disk_users(top=1)
        assert [u.path for u in users.top] == ["logs/train.log"] and users.complete  # two levels down
        snap = await box.snapshot()
        assert snap.host == "gpu-box-7" and snap.process(4250).command.endswith("stages/train.py")
        assert box.last_request_bytes < len(str(recorded_box.requests[0]))  # sent as changes to the held one
    finally:
        await box.close()


async def test_what_the_replay_box_cannot_answer_is_refused(recorded_box: ReplayTransport) -> None:
    box = Box(recorded_box, recorded_box.workspace)
    try:
        with pytest.raises(BoxError, match="launch: not in the replay box"):
            await box.fire("train", "true", "logs/train.log")
        assert [module for module, _ in recorded_box.runs] == ["launch"]
        with pytest.raises(BoxError, match="must be a list"):  # the probe's own check of what is asked
            await box.ask_probe({"logs": "not a list"})
        recorded_box.down = "the link is down"
        with pytest.raises(TransportError, match="the link is down"):
            await box.snapshot()
    finally:
        await box.close()
