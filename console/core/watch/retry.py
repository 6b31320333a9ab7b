"""Whether the watcher retries a death, by its cause (issue 48, item 4): never a crash loop.

Retried: what came from outside the run and may not come again (an external kill, a reboot, a
preemption, a node that failed, a time limit, a collective that timed out, a GPU's Xid, a server
that hung), and an out-of-memory kill or CUDA OOM the first time. Not retried, and said why: what
the run will do again (an exception in its code, a NaN or a divergence, the same cause at the same
step twice, a disk still full), and anything past [watch] max_recoveries in the last hour. Between
two tries of one stage the watcher waits, twice as long each time (the backoff). Pure: the
watcher gathers the evidence (console/core/watch/watcher.py) and writes the decision's audit line."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

MAX_BACKOFF_S = 900.0  # the backoff's longest wait
# What came from outside the run: a resume meets none of it again.
FROM_OUTSIDE = ("signal", "reboot", "preempted", "node_failed", "time_limit", "collective_timeout", "gpu_xid",
                "lost", "serve_hung")
# Memory: a bigger batch than fits, or a leak, dies at the same step again; another process's hunger does not.
MEMORY = ("oom_killed", "cuda_oom")
# What the run does to itself: a resume does it again.
NEVER: dict[str, str] = {
    "exception": "an exception in the stage's own code: a resume runs the same code into it again; fix it first",
    "exit": "it exited with an error of its own: a resume would do the same; read its log first",
    "stopped": "it was stopped on purpose",
}


@dataclass(frozen=True)
class Death:
    """What the watcher knows of one death: its cause, the last step its run logged (None for a
    stage that logs no steps), whether its log showed a NaN or a divergence, and whether the disk
    has room again (what a full disk's retry waits for)."""

    cause: str
    step: int | None = None
    anomaly: str = ""  # its log's error-level finding (a NaN, a divergence): "" when none
    disk_room: bool = True


@dataclass(frozen=True)
class Verdict:
    retry: bool
    why: str  # said in the message and the audit line either way
    wait_s: float = 0.0  # > 0: not yet (the backoff); asked again then


def decide(death: Death, earlier: Sequence[tuple[str, int | None]], recent: Sequence[float], now: float,
           max_recoveries: int, *, trains: bool, backoff_s: float = 30.0) -> Verdict:
    """Whether to retry this death. earlier: the (cause, step) of the deaths of this stage already
    handled, oldest first; recent: when this stage was recovered in the last hour; trains: a
    training stage (its code's exception is its own; a server's exit is retried once); backoff_s:
    the wait before a stage's second try within the hour ([watch] backoff_s), doubled after."""
    if death.anomaly:
        return Verdict(False, f"its log shows {death.anomaly}: a resume takes the same weights into the same "
                              "trouble (lower the learning rate; check the precision)")
    if death.cause == "stopped" or (trains and death.cause in NEVER):
        return Verdict(False, NEVER[death.cause])
    if death.cause == "disk_full" and not death.disk_room:
        return Verdict(False, "the disk is still full: prune or clean first (x on the disk's alert)")
    if death.step is not None and (death.cause, death.step) in earlier:
        advice = " — lower the batch or the sequence length" if death.cause in MEMORY else ""
        return Verdict(False, f"{_said(death.cause)} at step {death.step} twice: it would die there again{advice}")
    # no step to tell whether it moved on (a server): the same cause twice in a row is where it stays
    if not trains and death.step is None and death.cause not in FROM_OUTSIDE and earlier \
            and earlier[-1][0] == death.cause:
        return Verdict(False, f"{_said(death.cause)} twice in a row: it would die the same way again")
    if len(recent) >= max_recoveries:
        return Verdict(False, f"{len(recent)} recoveries in the last hour, the most [watch] max_recoveries allows")
    if recent:
        wait = min(backoff_s * 2 ** (len(recent) - 1), MAX_BACKOFF_S) - (now - max(recent))
        if wait > 0:
            return Verdict(False, f"waiting {wait:.0f} s before the next try (backoff)", wait)
    if death.cause in FROM_OUTSIDE:
        return Verdict(True, f"{_said(death.cause)}: it came from outside the run")
    if death.cause in MEMORY or death.cause == "disk_full" or not trains:
        return Verdict(True, f"{_said(death.cause)}, the first time" + (" at this step" if death.step else ""))
    return Verdict(False, f"{_said(death.cause)} is not a cause the watcher retries")


def _said(cause: str) -> str:
    return {"oom_killed": "OOM kill", "cuda_oom": "CUDA OOM", "disk_full": "a full disk", "signal": "an external kill",
            "serve_hung": "a hung server", "gpu_xid": "a GPU Xid", "collective_timeout": "a collective timeout"}.get(
        cause, cause.replace("_", " "))
