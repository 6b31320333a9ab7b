"""The watchers' shared folder on the box (box/watchers.py): heartbeats, one leader, the
leader's ledger, acknowledgements; whatever else writes there never breaks a read."""

from __future__ import annotations

import asyncio
import json
import math
import os
import sys
import time
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


def _beat(ws: str, watcher: str, interval: float = 10.0) -> dict:
    return watchers.handle({"workspace": ws, "op": "beat", "id": watcher, "heartbeat": {"who": f"op@{watcher}",
                                                                                         "interval": interval},
                            "lease_s": 30.0, "ledger": None})


def test_a_lease_is_held_only_while_its_holder_beats(workspace: Path) -> None:
    """A forged leader.json (a far `until`, a holder that never beat or beat long ago) holds
    nobody back: the next watcher to beat takes it. A live holder keeps it, whatever `until` says."""
    ws, folder = str(workspace), watch_folder(workspace)
    folder.mkdir(parents=True)
    (folder / "leader.json").write_text(json.dumps({"id": "ghost", "until": 1e308}))
    taken = watch_shared(_beat(ws, "me"))
    assert taken.leading and taken.leader == "me"
    (folder / "W-ghost.json").write_text(json.dumps({"id": "ghost", "interval": 1e9, "written": time.time() - 901}))
    (folder / "leader.json").write_text(json.dumps({"id": "ghost", "until": 10**400}))
    assert watch_shared(_beat(ws, "me")).leading  # beat 901 s ago: past any interval's bound
    (folder / "W-ghost.json").write_text(json.dumps({"id": "ghost", "interval": 10, "written": time.time()}))
    (folder / "leader.json").write_text(json.dumps({"id": "ghost", "until": time.time() + 60, "since": 5.0}))
    kept = watch_shared(_beat(ws, "me"))
    assert not kept.leading and kept.leader == "ghost" and kept.leader_since == 5.0
    lease = json.loads((folder / "leader.json").read_text())
    assert lease["id"] == "ghost" and lease["since"] == 5.0  # untouched while its holder beats


def test_the_lease_written_is_bounded_and_keeps_when_it_was_taken(workspace: Path) -> None:
    ws, folder = str(workspace), watch_folder(workspace)
    first = watch_shared(watchers.handle({"workspace": ws, "op": "beat", "id": "me", "heartbeat": {},
                                          "lease_s": 1e12, "ledger": None}))
    lease = json.loads((folder / "leader.json").read_text())
    assert first.leading and lease["until"] <= time.time() + watchers.MAX_LEASE_S
    again = watch_shared(_beat(ws, "me"))
    assert again.leader_since == first.leader_since == lease["since"]


@pytest.mark.parametrize("name", ["ledger.json", "acks.json", "leader.json", "W-other.json"])
def test_a_file_the_box_cannot_read_whole_is_said_not_dropped_silently(workspace: Path, name: str) -> None:
    folder = watch_folder(workspace)
    folder.mkdir(parents=True)
    ws = str(workspace)
    (folder / name).write_bytes(b'{"pad": "' + b"x" * watchers.MAX_FILE + b'"}')
    shared = watch_shared(watchers.handle({"workspace": ws, "op": "read"}))
    assert any(p.startswith(f"{name}: more than") for p in shared.problems), shared.problems
    (folder / name).write_bytes(b"{not json")
    shared = watch_shared(watchers.handle({"workspace": ws, "op": "read"}))
    assert f"{name}: not JSON" in shared.problems


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=st.sampled_from([10**400, -(10**400), float("inf"), float("nan"), -1, 1e308, 0, "1", None, True]),
       field=st.sampled_from(["written", "interval", "since", "last_poll", "last_sent", "at", "pid", "sent"]))
def test_a_beat_with_a_number_no_arithmetic_takes_costs_only_its_own_line(workspace: Path, value, field) -> None:
    folder = watch_folder(workspace)
    folder.mkdir(parents=True, exist_ok=True)
    beat = {"id": "other", "who": "op@x", "interval": 10, "written": time.time(), field: value}
    (folder / "W-other.json").write_text(json.dumps(beat))
    (folder / "leader.json").write_text(json.dumps({"id": "other", "until": value, "since": value}))
    shared = watch_shared(watchers.handle({"workspace": str(workspace), "op": "read"}))
    for b in shared.watchers:
        assert all(isinstance(getattr(b, n), float) and math.isfinite(getattr(b, n))
                   for n in ("since", "interval", "written"))
    from samai.console.core.watch.seen import watched_words

    watched_words(shared, shared.now)  # no arithmetic on it raises
