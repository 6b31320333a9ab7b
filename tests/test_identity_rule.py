"""One start-time identity rule (pid + start time): the console's model and the box tools answer
alike, at the boundary too (a tick's tolerance, the boundary included)."""

from __future__ import annotations

import pytest

from samai.remote import model
from samai.remote.box import identity, kill, probe, procfs

TICK = identity.TICK_S
# (a, b, one process?): the boundary exactly, just past it, and start times as the tools round them.
CASES = [
    (0.0, 0.0, True),
    (0.0, TICK, True),
    (TICK, 0.0, True),
    (0.0, TICK + 1e-4, False),
    (1_700_000_000.00, 1_700_000_000.01, True),  # one tick apart: two reads of one process
    (1_700_000_000.00, 1_700_000_000.02, False),  # two ticks: another process
    (1_700_000_000.00, 1_700_000_000.00 + TICK, True),
]


@pytest.mark.parametrize(("a", "b", "same"), CASES)
def test_the_console_and_the_box_tools_agree_at_the_boundary(a: float, b: float, same: bool) -> None:
    assert model.same_start(a, b) is same
    assert procfs.same_start(a, b) is same
    assert kill.same_start(a, b) is same
    assert probe.same_start(a, b) is same


def test_there_is_one_rule() -> None:
    assert model.same_start is procfs.same_start is identity.same_start


def test_a_missing_start_time_is_no_process() -> None:
    assert not identity.same_start(None, 1.0) and not identity.same_start(1.0, None)


@pytest.mark.parametrize("gap", [0.0, TICK / 2, TICK, TICK + 1e-4, 0.02, 5.0])
def test_born_before_is_earlier_and_not_the_same_start(gap: float) -> None:
    start = 1_700_000_000.0
    assert identity.started_before(start - gap, start) is (gap > 0 and not identity.same_start(start - gap, start))
    assert not identity.started_before(start + gap, start)


@pytest.mark.parametrize(("gap", "member"), [(0.0, True), (TICK, True), (TICK + 1e-4, False)])
def test_a_chain_counts_a_group_member_born_within_a_tick_of_it(gap: float, member: bool) -> None:
    """A member of the chain's group born a tick before the chain's leader is born since the chain
    (chain_pids), as a leader a tick off is the recorded one (same_start): one boundary for both."""
    start = TICK  # so that a gap of TICK is exactly the boundary: start - gap == 0.0
    rec = {"pid": 10, "pgid": 10, "start_time": start}
    table = {10: {"ppid": 1, "pgid": 10, "state": "S", "start_time": start},
             11: {"ppid": 1, "pgid": 10, "state": "S", "start_time": start - gap}}
    found = procfs.chain_pids(table, rec, 0.0, lambda pid, start: None)
    assert found == ({10, 11} if member else {10})
    table[10]["start_time"] = start - gap  # the leader read a tick off is still the recorded one
    assert (10 in procfs.chain_pids(table, rec, 0.0, lambda pid, start: None)) is member
