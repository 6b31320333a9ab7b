"""See it coming: how fast the workspace fills while a stage runs and when it will be full at that
rate (an alert while a running stage would fill it within ALERT_S); whether a running training
run's next checkpoint, about the size of its last ones, fits in what is free (an alert, its fix
a prune of the older checkpoints); and how fast a running stage's memory grows towards the limit
that applies to it, its cgroup's or the box's RAM (an alert when it would reach it within
MEMORY_ALERT_S).

Like the GPU watch, each keeps a short history across polls (the TUI's state holds them);
`doctor` has one look and no history, so no trend."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from samai.console.core import units
from samai.console.core.disk.budget import DiskBudget, workspace_disk
from samai.console.core.fixes import FixAction
from samai.console.core.problems import Finding
from samai.console.core.training.resume import PRUNE_KEEP

if TYPE_CHECKING:
    from samai.remote.model import Checkpoints, Snapshot, StageRecord

WINDOW_S = 120.0  # the rate is over the last two minutes of polls
MIN_SPAN_S = 10.0  # and at least this long: two polls a second apart say nothing of a rate
MIN_RATE = 64 * 1024  # bytes/s: below this the disk is not filling, it is breathing
ALERT_S = 15 * 60.0  # full within this long while a stage runs: an alert
MEMORY_ALERT_S = 10 * 60.0  # a stage's memory at its limit within this long: an alert
MIN_GROWTH = 1 << 20  # bytes/s of RSS: slower than this is no trend


@dataclass(frozen=True)
class DiskTrend:
    rate: float  # bytes a second the workspace's file system gains (negative: frees)
    free: int
    full_in: float | None  # seconds until full at this rate; None while it is not filling

    @property
    def soon(self) -> bool:
        """Full within ALERT_S at this rate: what the filling alert is raised for."""
        return self.full_in is not None and self.full_in < ALERT_S

    @property
    def text(self) -> str:
        if self.full_in is None:
            return f"{'freeing' if self.rate < 0 else 'steady'} ({units.size(abs(self.rate))}/s)"
        return f"filling {units.size(self.rate)}/s · full in {units.duration(self.full_in)}"


class DiskWatch:
    def __init__(self) -> None:
        self.samples: deque[tuple[float, int, int]] = deque()  # (time, used, free)

    def observe(self, snap: Snapshot) -> DiskTrend | None:
        """This poll's reading kept; the trend over the window, once it spans MIN_SPAN_S."""
        disk = workspace_disk(snap)
        if disk is None:
            return None
        if not self.samples or snap.time > self.samples[-1][0]:  # a replayed or stepped-back clock: not new
            self.samples.append((snap.time, disk.used, disk.free))
        while self.samples and snap.time - self.samples[0][0] > WINDOW_S:
            self.samples.popleft()
        return self.trend()

    def trend(self) -> DiskTrend | None:
        if len(self.samples) < 2 or self.samples[-1][0] - self.samples[0][0] < MIN_SPAN_S:
            return None
        (t0, used0, _), (t1, used1, free) = self.samples[0], self.samples[-1]
        rate = (used1 - used0) / (t1 - t0)
        filling = rate >= MIN_RATE
        return DiskTrend(rate if abs(rate) >= MIN_RATE else 0.0, free, free / rate if filling else None)


def filling_findings(trend: DiskTrend | None, running: list[str]) -> list[Finding]:
    """While a stage runs and the workspace would be full within ALERT_S at the current rate."""
    if trend is None or trend.full_in is None or trend.full_in > ALERT_S or not running:
        return []
    # No figure that moves every poll in the text (it is the alert's key): the disk pane has the
    # rate and the time left; the alert stands while the condition does, and is said again sharper.
    soon = trend.full_in < ALERT_S / 3
    within = units.duration(ALERT_S / 3 if soon else ALERT_S)
    return [Finding("disk_filling", "error" if soon else "warning",
                    f"the workspace fills fast enough while {', '.join(running)} runs to be full within {within} "
                    "(the disk pane has the rate); stop it, or free space (c cleans what is reclaimable)")]


CHECKPOINT_READ_S = 30.0  # a running training run's checkpoints are listed (sizes only) this often
SIZED_FROM = 3  # the next checkpoint is taken to be as large as the largest of the last this many


def checkpoint_findings(read: dict[str, Checkpoints], snap: Snapshot, budget: DiskBudget,
                        reserve: int) -> list[Finding]:
    """A running training run whose next checkpoint (as large as its last ones) will not fit in
    what the workspace has free (an error), or would leave less than the reserve (a warning).
    Its fix: delete the checkpoints older than the newest PRUNE_KEEP (never the one a resume takes)."""
    found = []
    for stage, listed in read.items():
        rec = snap.state(stage)
        if rec is None or rec.status != "running" or not listed.checkpoints:
            continue
        need = max(c.bytes for c in listed.checkpoints[:SIZED_FROM])
        if need + reserve <= budget.free:
            continue
        fits = need <= budget.free
        # No figure that moves every poll in the text (the alert's key): the disk pane has what is free.
        found.append(Finding(
            "checkpoint_wont_fit", "warning" if fits else "error",
            f"stage {stage}'s next checkpoint (about {units.size(need)}, as its last ones) "
            + ("would leave less than the disk reserve free" if fits else "will not fit in what the workspace has free")
            + f": x deletes its checkpoints older than the newest {PRUNE_KEEP} (never the one a resume would take)",
            FixAction.prune(stage)))
    return found


@dataclass(frozen=True)
class MemoryTrend:
    stage: str
    rss: int  # the stage's processes' resident memory now
    rate: float  # bytes a second it grows
    ceiling: int  # what it can grow to (its cgroup's limit, else the box's RAM)
    full_in: float | None  # seconds until it reaches the ceiling at this rate; None: not growing


class MemoryWatch:
    """Each running stage's resident memory (its chain's processes together), run by run."""

    def __init__(self) -> None:
        self.samples: dict[tuple[str, float], deque[tuple[float, int]]] = {}

    def observe(self, snap: Snapshot) -> list[MemoryTrend]:
        trends, running = [], set()
        for rec in snap.states:
            if rec.status != "running":
                continue
            key = (rec.stage, rec.fired_at)
            running.add(key)
            kept = self.samples.setdefault(key, deque())
            rss = sum(p.rss for p in snap.processes if p.pid in rec.group)
            if not kept or snap.time > kept[-1][0]:
                kept.append((snap.time, rss))
            while kept and snap.time - kept[0][0] > WINDOW_S:
                kept.popleft()
            trend = _memory_trend(rec, kept, snap.memory.ceiling)
            if trend is not None:
                trends.append(trend)
        self.samples = {k: v for k, v in self.samples.items() if k in running}  # runs that ended: forgotten
        return trends


def _memory_trend(rec: StageRecord, kept: deque[tuple[float, int]], ceiling: int) -> MemoryTrend | None:
    if len(kept) < 2 or kept[-1][0] - kept[0][0] < MIN_SPAN_S or ceiling <= 0:
        return None
    (t0, rss0), (t1, rss1) = kept[0], kept[-1]
    rate = (rss1 - rss0) / (t1 - t0)
    growing = rate >= MIN_GROWTH
    return MemoryTrend(rec.stage, rss1, rate if growing else 0.0, ceiling,
                       max(ceiling - rss1, 0) / rate if growing else None)


def memory_findings(trends: list[MemoryTrend], limit_said: str) -> list[Finding]:
    """A running stage whose memory would reach its ceiling within MEMORY_ALERT_S."""
    return [Finding("memory_filling", "warning",
                    f"stage {t.stage}'s memory grows fast enough to reach {limit_said} "
                    f"({units.size(t.ceiling)}) within {units.duration(MEMORY_ALERT_S)}: the OOM killer would "
                    "end it; stop it and resume with less memory (a smaller batch), or free memory")
            for t in trends if t.full_in is not None and t.full_in <= MEMORY_ALERT_S]
