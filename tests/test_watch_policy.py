"""What the watcher sends and when (console/core/watch/policy.py): one message per alert by its
identity, repeats only after repeat_after and never once acknowledged, resolutions, the hourly
cap and its one summary, the outage's two messages. Pure: no box, no receiver."""

from __future__ import annotations

import unicodedata
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from samai.console.core.alertbook import RUN_ENDED, Alert
from samai.console.core.config import Notify
from samai.console.core.fixes import FixAction
from samai.console.core.watch.ledger import LedgerRead, read_ledger, sealed_ledger
from samai.console.core.watch.policy import (
    FOLD_POLLS,
    HOUR_S,
    MAX_TEXT,
    NotifyPolicy,
    OutageWatch,
    alert_identity,
    plain,
)
from samai.console.core.watch.trust import Trust

T0 = 1_000_000.0
TRUST = Trust.of(b"k" * 32)  # this machine's watch key, as tests hold it


def died(run: float = 1.0, text: str = "stage train failed rc=137: oom_killed", **kw) -> Alert:
    return Alert(T0, "error", text, "train", "x resume", code=RUN_ENDED, action=FixAction.resume("train"), run=run,
                 **kw)


def finding(text: str, code: str = "disk_fills", severity: str = "error") -> Alert:
    return Alert(T0, severity, text, code=code, finding=(code, text))  # type: ignore[arg-type]


def policy(**kw) -> NotifyPolicy:
    return NotifyPolicy(Notify(**kw), "gpu1", "samai-console --config /etc/samai.toml")


def handed(p: NotifyPolicy, now: float = T0) -> LedgerRead:
    """p's ledger as the next leader reads it from the box: sealed with this machine's key."""
    return read_ledger(sealed_ledger(TRUST, p.ledger(), p.sent), TRUST, now)


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
    assert later[0].title == "samai gpu1: 35 held back" and "and 25 more" in later[0].body
    assert p.held == 0


def test_a_ledger_adopted_sends_nothing_it_sent_and_the_hour_counts() -> None:
    p = policy(max_per_hour=3)
    p.due([died(run=1.0), died(run=2.0, text="b")], set(), T0)
    q = policy(max_per_hour=3)
    q.adopt(handed(p))
    assert q.due([died(run=1.0), died(run=2.0, text="b")], set(), T0 + 10) == []
    kinds = [m.kind for m in q.due([died(run=1.0), died(run=2.0, text="b"), died(run=3.0, text="c"),
                                    died(run=4.0, text="d")], set(), T0 + 20)]
    assert kinds == ["alert", "capped"]


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
                    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=6), kids, max_size=4),
                    max_leaves=15))
def test_any_ledger_is_adopted_without_a_crash(ledger) -> None:
    p = policy()
    data = ledger if isinstance(ledger, dict) else {"sent": ledger, "windows": ledger, "held": ledger}
    for raw in (data, TRUST.seal(data)):  # as anyone wrote it, and as if this key had sealed it
        p.adopt(read_ledger(raw, TRUST, T0))
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
    q.adopt(handed(p))  # a cron run: it never saw the run end, so its state has no such alert
    assert q.due([], set(), T0 + 60, {"train": 7.0}) == []
    [m] = q.due([], set(), T0 + 120, {"train": 8.0})
    assert m.kind == "resolved"


# ---------------------------------------------------------------- the ledger is box input

HOSTILE = st.text(alphabet=st.sampled_from("ab \x1b[]0;\x07\x9b\x85\u202e\u200b\u2028\n\r\t\x00é"), max_size=40)
NUMBER = (st.integers(min_value=-(10**400), max_value=10**400) | st.floats() | st.just(10**400)
          | st.just(-1) | st.just(1e300) | st.none() | st.text(max_size=3) | st.booleans())


def _inert(m) -> None:
    for part in (m.title, *m.body.split("\n")):
        assert not [c for c in part if unicodedata.category(c) in ("Cc", "Cf", "Cs", "Zl", "Zp")], repr(part)


@settings(max_examples=300)
@given(first=NUMBER, last=NUMBER, run=NUMBER, text=HOSTILE, stage=HOSTILE, window=st.lists(NUMBER, max_size=5),
       held=st.fixed_dictionaries({"count": NUMBER, "titles": st.lists(HOSTILE, max_size=12), "since": NUMBER,
                                   "summary_at": NUMBER, "last_summary": NUMBER}),
       sealed=st.booleans())
def test_no_number_or_text_in_a_ledger_breaks_the_policy_or_reaches_a_receiver_raw(
        first, last, run, text, stage, window, held, sealed) -> None:
    """A 400-digit int, inf, NaN, a negative or far-future time, and ESC/C1/bidi text, in every field
    of the ledger, even one this machine's key sealed: adopted, resolved, capped and summed up
    without an exception, and every message inert."""
    data = {"sent": {"marker|train|1.000|x": {"first": first, "last": last, "text": text, "severity": "error",
                                              "stage": stage, "run": run}},
            "windows": {"rest": window, "error|run_ended|train": window}, "held": held,
            "statuses": {stage: text}, "box_at": first, "recoveries": {"done": {text: first}, "times": {stage: window}}}
    p = policy(max_per_hour=1)
    p.adopt(read_ledger(TRUST.seal(data) if sealed else data, TRUST, T0))
    messages = p.due([died()], set(), T0) + p.due([], set(), T0 + 1)
    for hour in range(1, 4):
        messages += p.due([died(run=float(hour * 10 + i), text=text) for i in range(3)], set(), T0 + hour * HOUR_S)
    for m in messages:
        _inert(m)


def test_a_400_digit_first_in_the_ledger_is_dropped_not_fatal() -> None:
    raw = TRUST.seal({"sent": {"k": {"first": 10**400, "last": T0, "text": "x", "severity": "error"}},
                      "box_at": 10**400, "windows": {"rest": [10**400, float("inf"), float("nan")]}})
    read = read_ledger(raw, TRUST, T0)
    assert read.trusted and read.sent == {} and read.box_at is None and read.windows == {"rest": []}


def test_ledger_text_reaches_a_receiver_inert_in_a_resolution_and_a_summary() -> None:
    evil = "ok\x1b]0;pwned\x07 \x9b31m \u202egnp.exe"
    p = policy(max_per_hour=1)
    p.adopt(read_ledger(TRUST.seal({"sent": {"finding|x": {"first": T0, "last": T0, "text": evil,
                                                           "severity": "error"}},
                                    "held": {"count": 2, "titles": [evil, evil], "summary_at": T0}}), TRUST, T0))
    messages = p.due([], set(), T0 + 1)
    assert [m.kind for m in messages] == ["suppressed", "resolved"]
    for m in messages:
        _inert(m)
        assert "\x1b" not in m.title + m.body and "\u202e" not in m.title + m.body


@given(sealed_by=st.sampled_from(["nobody", "another key", "a forged seal"]))
def test_a_ledger_this_key_did_not_seal_sends_no_resolution_and_spends_no_cap(sealed_by: str) -> None:
    """Made-up "sent" entries: none is resolved (a resolution is only for what was really sent),
    and a made-up hour of messages holds nothing back."""
    made_up = {"sent": {f"finding|fake{i}": {"first": T0, "last": T0, "text": f"fake {i}", "severity": "error"}
                        for i in range(50)},
               "windows": {"rest": [T0] * 50, "error|run_ended|train": [T0] * 50}}
    raw = {"nobody": made_up, "another key": Trust.of(b"o" * 32).seal(made_up),
           "a forged seal": {**TRUST.seal(made_up), "mac": "0" * 64}}[sealed_by]
    p = policy(max_per_hour=2)
    read = read_ledger(raw, TRUST, T0)
    assert not read.trusted and read.why
    p.adopt(read)
    assert [m.kind for m in p.due([died()], set(), T0 + 1)] == ["alert"]


# ---------------------------------------------------------------- caps by severity, one event one message


def output_line(text: str, run: float = 1.0, severity: str = "error") -> Alert:
    """An alert a run's own output raised (a marker line)."""
    return Alert(T0, severity, text, "train", run=run)  # type: ignore[arg-type]


@settings(max_examples=50)
@given(lines=st.lists(st.text(min_size=1, max_size=30), min_size=1, max_size=60, unique=True),
       warnings=st.integers(min_value=0, max_value=60), cap=st.integers(min_value=1, max_value=5))
def test_nothing_box_output_or_lower_severity_can_raise_holds_back_a_death(lines, warnings, cap) -> None:
    """A running stage prints many different error-marker lines, warnings storm, then it dies:
    its death goes, with its fix, whatever the cap; what was held back is counted exactly, in at
    most one summary an hour."""
    p = policy(max_per_hour=cap, min_severity="warning", repeat_after=10 * HOUR_S)
    noise = [output_line(f"FATAL {i} {t}") for i, t in enumerate(lines)]
    noise += [finding(f"warning {i}", code=f"w{i}", severity="warning") for i in range(warnings)]
    sent = []
    for poll in range(5):  # the run still running: its lines wait a few polls, then go as their own
        sent += p.due(noise, set(), T0 + poll, {"train": 1.0}, frozenset({"train"}))
    sent += p.due([died(), *noise], set(), T0 + 10, {"train": 1.0})
    deaths = [m for m in sent if m.kind == "alert" and m.key.startswith("run_ended")]
    assert len(deaths) == 1 and "press x: resume train" in deaths[0].body
    sent += p.due([died(), *noise], set(), T0 + HOUR_S + 20, {"train": 1.0})
    sent += p.due([died(), *noise], set(), T0 + 2 * HOUR_S + 30, {"train": 1.0})
    told = [m for m in sent if m.kind not in ("capped", "suppressed")]
    summaries = [m for m in sent if m.kind == "suppressed"]
    assert len(summaries) <= 1 and len([m for m in sent if m.kind == "capped"]) <= 1
    held = sum(int(m.title.split(": ")[1].split()[0]) for m in summaries) + p.held
    assert len(told) + held == len({alert_identity(a) for a in noise}) + 1  # every alert sent or counted, once


def test_a_summary_goes_at_most_once_an_hour_and_counts_exactly() -> None:
    p = policy(max_per_hour=1, min_severity="warning", repeat_after=100 * HOUR_S)
    standing: list[Alert] = []
    out = []
    for minute in range(0, 180, 5):  # a new warning every five minutes for three hours
        standing.insert(0, finding(f"w{minute}", code=f"w{minute}", severity="warning"))
        out += [(minute, m) for m in p.due(standing, set(), T0 + minute * 60)]
    told = [m for _, m in out if m.kind == "alert"]
    summaries = [(minute, m) for minute, m in out if m.kind == "suppressed"]
    counted = sum(int(m.title.split(": ")[1].split()[0]) for _, m in summaries)
    assert len(told) + counted + p.held == 36  # each sent, or counted once
    assert [minute for minute, _ in summaries] == [60, 120]  # an hour apart, never two within one
    notices = [minute for minute, m in out if m.kind == "capped"]
    assert notices == [5, 65, 125]  # the notice that the cap holds: once per hour that holds back


def test_a_runs_output_alerts_are_lines_of_its_death_message() -> None:
    """A refused run: its TRAIN_REFUSED line and its death are one message; the line resolves with it."""
    p = policy()
    refused = output_line("TRAIN_REFUSED poison files from an earlier run: clear them first")
    nan = Alert(T0, "error", "train: loss is NaN at step 40", "train", code="hidden_nan", run=1.0)
    [m] = p.due([died(text="stage train failed rc=2"), nan, refused], set(), T0, {"train": 1.0})
    assert m.kind == "alert" and m.title == "samai gpu1: stage train failed rc=2"
    assert "- TRAIN_REFUSED poison files" in m.body and "- train: loss is NaN" in m.body
    [gone] = p.due([], set(), T0 + 60, {"train": 2.0})
    assert gone.kind == "resolved" and "stage train failed" in gone.title


def test_a_running_runs_output_alert_waits_a_few_polls_for_its_death_then_goes_alone() -> None:
    p = policy()
    line = output_line("FATAL disk quota")
    for poll in range(FOLD_POLLS):
        assert p.due([line], set(), T0 + poll, {"train": 1.0}, frozenset({"train"})) == []
    [alone] = p.due([line], set(), T0 + FOLD_POLLS, {"train": 1.0}, frozenset({"train"}))
    assert alone.title == "samai gpu1: FATAL disk quota"
    later = policy()
    later.due([line], set(), T0, {"train": 1.0}, frozenset({"train"}))
    [one] = later.due([died(), line], set(), T0 + 1, {"train": 1.0})  # it died the next poll: one message
    assert one.key.startswith("run_ended") and "FATAL disk quota" in one.body
    flushed = policy()
    flushed.due([line], set(), T0, {"train": 1.0}, frozenset({"train"}))
    assert [m.title for m in flushed.due([line], set(), T0, {"train": 1.0}, frozenset({"train"}), wait=False)] == [
        "samai gpu1: FATAL disk quota"]  # the watcher ends: nothing waits for a poll that will not come
