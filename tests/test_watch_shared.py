"""The watchers' shared folder on the box (box/watchers.py): heartbeats, one leader, the
leader's ledger, acknowledgements; whatever else writes there never breaks a read."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from samai.remote.box import watchers
from samai.remote.boxapi import Box, BoxError
from samai.remote.local import LocalTransport
from samai.remote.model import watch_shared


def watch_folder(workspace: Path) -> Path:
    return workspace / ".samai" / "watch"


async def test_nobody_watches_a_fresh_box_and_reading_writes_nothing(box: Box, workspace: Path) -> None:
    shared = await box.watchers()
    assert shared.watchers == () and shared.leader is None and not shared.leading
    assert not watch_folder(workspace).exists()


async def test_the_first_watcher_leads_and_a_second_stands_by_until_the_lease_ends(box: Box, workspace: Path) -> None:
    first = await box.watch_beat("aaa", {"who": "op@laptop", "pid": 11, "since": 1.0}, 30.0, {"sent": {"k": 1}})
    second = await box.watch_beat("bbb", {"who": "op@server", "pid": 22, "since": 2.0}, 30.0, {"sent": {}})
    assert first.leading and not second.leading and second.leader == "aaa"
    assert {w.id for w in second.watchers} == {"aaa", "bbb"}
    assert second.ledger == {"sent": {"k": 1}}  # a standby writes no ledger
    leader = json.loads((watch_folder(workspace) / "leader.json").read_text())
    leader["until"] = 0  # the leader stopped beating: its lease ran out
    (watch_folder(workspace) / "leader.json").write_text(json.dumps(leader))
    taken = await box.watch_beat("bbb", {"who": "op@server"}, 30.0, {"sent": {"j": 2}})
    assert taken.leading and taken.ledger == {"sent": {"j": 2}}
    again = await box.watch_beat("aaa", {"who": "op@laptop"}, 30.0, {"sent": {"k": 1}})
    assert not again.leading and again.leader == "bbb"


async def test_two_watchers_beating_at_once_have_one_leader(box: Box, workspace: Path) -> None:
    boxes = [Box(LocalTransport(), str(workspace), python=sys.executable) for _ in range(6)]
    try:
        replies = await asyncio.gather(*(b.watch_beat(f"w{i}", {}, 30.0, None) for i, b in enumerate(boxes)))
    finally:
        await asyncio.gather(*(b.close() for b in boxes))
    assert sum(r.leading for r in replies) == 1


async def test_acknowledged_keys_are_kept_newest_and_bounded(box: Box) -> None:
    shared = await box.acknowledge(["run_ended|train|1.000"], "op@laptop", {"run_ended|train|1.000": "train died"})
    assert shared.acks["run_ended|train|1.000"]["by"] == "op@laptop"
    shared = await box.acknowledge([f"k{i}" for i in range(600)], "op", {})
    assert len(shared.acks) == 500


async def test_a_readonly_box_reads_but_never_beats_or_acknowledges(workspace: Path, box: Box) -> None:
    await box.watch_beat("aaa", {"who": "op"}, 30.0, None)
    ro = Box(LocalTransport(), str(workspace), python=sys.executable, readonly=True)
    try:
        assert [w.who for w in (await ro.watchers()).watchers] == ["op"]
        with pytest.raises(BoxError, match="read-only"):
            await ro.watch_beat("bbb", {}, 30.0, None)
        with pytest.raises(BoxError, match="read-only"):
            await ro.acknowledge(["k"], "op", {})
    finally:
        await ro.close()


async def test_a_link_in_place_of_the_folder_is_refused(box: Box, workspace: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (workspace / ".samai").mkdir(parents=True, exist_ok=True)
    os.symlink(elsewhere, watch_folder(workspace))
    with pytest.raises(BoxError):
        await box.watch_beat("aaa", {}, 30.0, None)
    assert list(elsewhere.iterdir()) == []


JSONISH = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                       lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids,
                                                                                   max_size=4), max_leaves=12)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(leader=st.binary(max_size=200) | JSONISH.map(lambda v: json.dumps(v).encode()),
       beat=st.binary(max_size=200) | JSONISH.map(lambda v: json.dumps(v).encode()),
       acks=st.binary(max_size=200) | JSONISH.map(lambda v: json.dumps(v).encode()))
def test_whatever_else_wrote_the_folder_a_read_and_a_beat_answer(workspace: Path, leader: bytes, beat: bytes,
                                                                acks: bytes) -> None:
    """The box tool in this process (synchronous: no event loop under hypothesis), and the
    console's reading of its replies."""
    folder = watch_folder(workspace)
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in (("leader.json", leader), ("W-other.json", beat), ("acks.json", acks),
                       ("ledger.json", beat)):
        (folder / name).write_bytes(data)
    ws = str(workspace)
    watch_shared(watchers.handle({"workspace": ws, "op": "read"}))
    shared = watch_shared(watchers.handle({"workspace": ws, "op": "beat", "id": "me", "heartbeat": {"who": "op"},
                                           "lease_s": 30.0, "ledger": None}))
    assert "me" in {w.id for w in shared.watchers}
    watch_shared(watchers.handle({"workspace": ws, "op": "ack", "keys": ["k"], "by": "op"}))
