"""What the watcher sends and when (console/core/watch/policy.py): one message per alert by its
identity, repeats only after repeat_after and never once acknowledged, resolutions, the hourly
cap and its one summary, the outage's two messages. Pure: no box, no receiver."""

from __future__ import annotations

import unicodedata
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from samai.console.core.config import Notify
from samai.console.core.fixes import FixAction
from samai.console.core.state import RUN_ENDED, Alert
from samai.console.core.watch.policy import HOUR_S, MAX_TEXT, NotifyPolicy, OutageWatch, alert_identity, plain

T0 = 1_000_000.0


def died(run: float = 1.0, text: str = "stage train failed rc=137: oom_killed", **kw) -> Alert:
    return Alert(T0, "error", text, "train", "x resume", code=RUN_ENDED, action=FixAction.resume("train"), run=run,
                 **kw)


def finding(text: str, code: str = "disk_fills", severity: str = "error") -> Alert:
    return Alert(T0, severity, text, code=code, finding=(code, text))  # type: ignore[arg-type]


def policy(**kw) -> NotifyPolicy:
    return NotifyPolicy(Notify(**kw), "gpu1", "samai-console --config /etc/samai.toml")


def test_an_alert_is_sent_once_with_its_box_stage_cause_time_and_fix() -> None:
    p = policy()
    [m] = p.due([died()], set(), T0)
    assert m.kind == "alert" and m.severity == "error"
    assert m.title == "samai gpu1: stage train failed rc=137: oom_killed"
    assert "on box gpu1" in m.body and "stage: train" in m.body and "oom_killed" in m.body
    assert "run `samai-console --config /etc/samai.toml --box gpu1` and press x: resume train" in m.body
    assert p.due([died()], set(), T0 + 60) == []


def test_below_min_severity_nothing_is_sent_and_warning_lowers_the_bar() -> None:
    warn = finding("disk fills in 40 min", severity="warning")
    assert policy().due([warn], set(), T0) == []
    assert [m.kind for m in policy(min_severity="warning").due([warn], set(), T0)] == ["alert"]


def test_a_finding_whose_numbers_move_is_the_same_alert() -> None:
    p = policy()
    assert len(p.due([finding("disk full in 12 min (3.1 GB/min)")], set(), T0)) == 1
    assert p.due([finding("disk full in 9 min (3.4 GB/min)")], set(), T0 + 30) == []


def test_a_new_run_dying_is_a_new_alert() -> None:
    p = policy()
    p.due([died(run=1.0)], set(), T0)
    assert [m.kind for m in p.due([died(run=2.0)], set(), T0 + 5)] == ["resolved", "alert"]


def test_still_active_it_repeats_after_repeat_after_unless_acknowledged() -> None:
    p = policy(repeat_after=600.0)
    a = died()
    p.due([a], set(), T0)
    assert p.due([a], set(), T0 + 599) == []
    [again] = p.due([a], set(), T0 + 600)
    assert again.kind == "repeat" and "still active" in again.title and "acknowledge" in again.body
    assert p.due([a], {alert_identity(a)}, T0 + 5000) == []


def test_its_resolution_is_sent_when_it_goes_and_only_then() -> None:
    p = policy()
    a = died()
    p.due([a], set(), T0)
    [m] = p.due([replace(a, resolved_at=T0 + 100)], set(), T0 + 100)
    assert m.kind == "resolved" and m.title == "samai gpu1: resolved: stage train failed rc=137: oom_killed"
    assert p.due([], set(), T0 + 200) == []


def test_the_outage_alert_of_the_state_is_left_to_the_outage_rule() -> None:
    assert policy().due([Alert(T0, "error", "box not answering: x", code="box_unreachable")], set(), T0) == []


def test_the_cap_holds_under_a_storm_says_so_once_and_sums_up_when_the_hour_has_room() -> None:
    p = policy(max_per_hour=5, repeat_after=10 * HOUR_S)
    storm = [died(run=float(i), text=f"stage train failed rc=1 run {i}") for i in range(40)]
    first = p.due(storm, set(), T0)
    assert [m.kind for m in first] == ["alert"] * 5 + ["capped"]
    assert p.held == 35
    assert p.due(storm, set(), T0 + 60) == []  # still standing, already counted
    later = p.due(storm, set(), T0 + HOUR_S)
    assert [m.kind for m in later] == ["suppressed"]
    assert later[0].title == "samai gpu1: 35 more suppressed" and "and 25 more" in later[0].body
    assert p.held == 0


def test_a_ledger_adopted_sends_nothing_it_sent_and_the_hour_counts() -> None:
    p = policy(max_per_hour=3)
    p.due([died(run=1.0), died(run=2.0, text="b")], set(), T0)
    q = policy(max_per_hour=3)
    q.adopt(p.ledger())
    assert q.due([died(run=1.0), died(run=2.0, text="b")], set(), T0 + 10) == []
    kinds = [m.kind for m in q.due([died(run=1.0), died(run=2.0, text="b"), died(run=3.0, text="c"),
                                    died(run=4.0, text="d")], set(), T0 + 20)]
    assert kinds == ["alert", "capped"]


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
                    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=6), kids, max_size=4),
                    max_leaves=15))
def test_any_ledger_is_adopted_without_a_crash(ledger) -> None:
    p = policy()
    p.adopt(ledger if isinstance(ledger, dict) else {"sent": ledger, "window": ledger, "held": ledger})
    p.due([died()], set(), T0)


@settings(max_examples=200)
@given(st.text())
def test_box_text_in_a_message_is_one_bounded_line_without_controls(text: str) -> None:
    [m] = policy().due([died(text=text)], set(), T0)
    for part in (m.title, *m.body.split("\n")):
        assert not [c for c in part if unicodedata.category(c) in ("Cc", "Cf", "Cs", "Zl", "Zp")]
    assert len(plain(text)) <= MAX_TEXT


def test_an_outage_is_one_message_after_unreachable_after_and_its_end_another() -> None:
    o = OutageWatch("gpu1", 300.0)
    assert o.failed("connection refused", T0) is None
    assert o.failed("connection refused", T0 + 299) is None
    down = o.failed("connection refused", T0 + 300)
    assert down is not None and down.title == "samai gpu1: unreachable for 5 min"
    assert o.failed("connection refused", T0 + 900) is None
    back = o.answered(T0 + 960)
    assert back is not None and back.kind == "reachable" and "after 16 min" in back.body
    assert o.answered(T0 + 970) is None


def test_a_short_outage_says_nothing() -> None:
    o = OutageWatch("", 300.0)
    o.failed("timeout", T0)
    assert o.answered(T0 + 100) is None and o.failed("timeout", T0 + 200) is None


def test_a_run_alert_an_earlier_watcher_sent_stands_while_its_run_is_the_last() -> None:
    p = policy()
    p.due([died(run=7.0)], set(), T0)
    q = policy()
    q.adopt(p.ledger())  # a cron run: it never saw the run end, so its state has no such alert
    assert q.due([], set(), T0 + 60, {"train": 7.0}) == []
    [m] = q.due([], set(), T0 + 120, {"train": 8.0})
    assert m.kind == "resolved"
