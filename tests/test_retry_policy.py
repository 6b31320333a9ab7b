"""Recovery by cause, never a crash loop (issue 48, item 4): the watcher's decision for one death
(console/core/watch/retry.py), over every cause the console names: what came from outside the run
is retried; what the run does to itself is not (its code's exception, a NaN or a divergence, the
same cause at the same step twice, a disk still full); never past max_recoveries in the hour, and
with a backoff that doubles between two tries of one stage. Every verdict says why."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from samai.console.core.watch.retry import FROM_OUTSIDE, MEMORY, NEVER, Death, decide

BACKOFF_S = 30.0  # [watch] backoff_s's default

CAUSES = st.sampled_from(sorted({*FROM_OUTSIDE, *MEMORY, *NEVER, "disk_full"}))
STEPS = st.one_of(st.none(), st.integers(0, 10**6))


@given(CAUSES, STEPS, st.booleans())
@settings(max_examples=300, deadline=None)
def test_a_first_death_is_retried_only_when_the_run_would_not_meet_it_again(cause, step, trains) -> None:
    verdict = decide(Death(cause, step), [], [], 1000.0, 3, trains=trains)
    assert verdict.why  # said either way
    deterministic = cause == "stopped" or (trains and cause in NEVER)
    assert verdict.retry == (not deterministic), (cause, trains, verdict)


@given(st.sampled_from(sorted({*FROM_OUTSIDE, *MEMORY, "disk_full"})), st.integers(0, 10**6), st.booleans())
@settings(max_examples=200, deadline=None)
def test_the_same_cause_at_the_same_step_twice_is_not_retried(cause, step, trains) -> None:
    verdict = decide(Death(cause, step), [(cause, step)], [], 1000.0, 3, trains=trains)
    assert not verdict.retry and f"at step {step} twice" in verdict.why
    if cause in MEMORY:
        assert "lower the batch or the sequence length" in verdict.why
    assert decide(Death(cause, step + 1), [(cause, step)], [], 1000.0, 3, trains=trains).retry  # it moved on


def test_a_cuda_oom_at_the_same_step_on_every_run_is_resumed_once() -> None:
    earlier: list[tuple[str, int | None]] = []
    recent: list[float] = []
    said = []
    for now in (1000.0, 2000.0, 3000.0):  # each run dies the same way at step 12
        verdict = decide(Death("cuda_oom", 12), earlier, recent, now, 3, trains=True)
        said.append(verdict)
        earlier.append(("cuda_oom", 12))
        if verdict.retry:
            recent.append(now)
    assert [v.retry for v in said] == [True, False, False]
    assert said[1].why == "CUDA OOM at step 12 twice: it would die there again — lower the batch or the sequence length"


def test_a_nan_an_exception_and_a_full_disk_are_not_retried_and_say_why() -> None:
    nan = decide(Death("signal", 40, anomaly="hidden NaN at step 38"), [], [], 0.0, 3, trains=True)
    assert not nan.retry and "hidden NaN at step 38" in nan.why and "learning rate" in nan.why
    exc = decide(Death("exception", 5), [], [], 0.0, 3, trains=True)
    assert not exc.retry and "exception" in exc.why
    full = decide(Death("disk_full", 5, disk_room=False), [], [], 0.0, 3, trains=True)
    assert not full.retry and "prune or clean" in full.why
    assert decide(Death("disk_full", 5, disk_room=True), [], [], 0.0, 3, trains=True).retry  # a prune freed it


def test_a_server_that_dies_the_same_way_twice_in_a_row_is_not_restarted_again() -> None:
    assert decide(Death("exit"), [], [], 0.0, 3, trains=False).retry
    again = decide(Death("exit"), [("exit", None)], [1.0], 1000.0, 3, trains=False)
    assert not again.retry and "twice in a row" in again.why
    assert decide(Death("serve_hung"), [("serve_hung", None)], [1.0], 1000.0, 3, trains=False).retry  # outside


@given(st.integers(1, 6), st.floats(0, 3600))
@settings(max_examples=200, deadline=None)
def test_the_hours_cap_holds_and_the_backoff_doubles(tries: int, since: float) -> None:
    recent = [1000.0 - 3600 + 60 * i for i in range(tries - 1)] + [1000.0]
    now = 1000.0 + since
    verdict = decide(Death("signal", None), [], [t for t in recent if now - t < 3600], now, 4, trains=True)
    counted = len([t for t in recent if now - t < 3600])
    if counted >= 4:
        assert not verdict.retry and "max_recoveries" in verdict.why and verdict.wait_s == 0
    else:
        wait = min(BACKOFF_S * 2 ** (counted - 1), 900) - since if counted else 0
        assert verdict.retry == (wait <= 0) and (verdict.wait_s > 0) == (wait > 0)
