"""The disk planner: what the declared artifacts take, what each stage would add at its peak,
and what could be deleted. The playbook's 57 GB container filled up because base, merged and
f16 GGUF coexisted; this is the arithmetic that would have said so before the merge started."""

from __future__ import annotations

from dataclasses import dataclass

from samai.console.core.config import Artifact, Config, Stage
from samai.remote.model import Disk, Snapshot

GB = 1_000_000_000


@dataclass(frozen=True)
class ArtifactUse:
    name: str
    path: str
    expected: int  # bytes, from the config
    actual: int | None  # bytes on disk now, None when absent
    intermediate: bool
    reclaimable: bool  # an intermediate whose consumers have produced what they make


@dataclass(frozen=True)
class Projection:
    stage: str
    adds: int  # bytes the stage writes that are not there yet (at its peak)
    frees: int  # bytes it deletes when it is done
    free_now: int
    reclaimable: int
    reserve: int
    writes: bool = True  # False: the stage makes no declared artifact, and the reserve is not its concern

    @property
    def free_at_peak(self) -> int:
        return self.free_now - self.adds

    @property
    def fits(self) -> bool:
        return not self.writes or self.free_at_peak >= self.reserve

    @property
    def fits_after_cleaning(self) -> bool:
        return not self.writes or self.free_at_peak + self.reclaimable >= self.reserve


@dataclass(frozen=True)
class DiskBudget:
    capacity: int
    used: int
    free: int
    artifacts: tuple[ArtifactUse, ...]

    @property
    def reclaimable(self) -> int:
        return sum(a.actual or 0 for a in self.artifacts if a.reclaimable)

    def artifact(self, name: str) -> ArtifactUse | None:
        return next((a for a in self.artifacts if a.name == name), None)


def workspace_disk(snap: Snapshot) -> Disk | None:
    return next((d for d in snap.disks if d.label == "workspace"), snap.disks[0] if snap.disks else None)


def disk_budget(cfg: Config, snap: Snapshot) -> DiskBudget:
    sizes = {a.name: a for a in snap.artifacts}
    present = {name for name, a in sizes.items() if a.exists}
    uses = tuple(
        ArtifactUse(a.name, a.path, int(a.size_gb * GB), sizes[a.name].bytes if a.name in present else None,
                    a.intermediate, a.intermediate and a.name in present and _consumed(cfg, a, present))
        for a in cfg.artifacts
    )
    disk = workspace_disk(snap)
    total, used, free = (disk.total, disk.used, disk.free) if disk else (0, 0, 0)
    if cfg.budget.capacity_gb:
        # A container quota smaller than the filesystem: count what we know lives in it.
        capacity = int(cfg.budget.capacity_gb * GB)
        if capacity < total:
            used = sum(u.actual or 0 for u in uses)
            free = min(free, capacity - used)
            total = capacity
    return DiskBudget(total, used, free, uses)


def project(cfg: Config, budget: DiskBudget, stage: Stage) -> Projection:
    adds = sum(u.expected for u in budget.artifacts if u.name in stage.makes and u.actual is None)
    frees = sum(u.actual or u.expected for u in budget.artifacts if u.name in stage.frees and u.actual)
    return Projection(stage.name, adds, frees, budget.free, budget.reclaimable, int(cfg.budget.reserve_gb * GB),
                      writes=bool(stage.makes))


def _consumed(cfg: Config, artifact: Artifact, present: set[str]) -> bool:
    """True when every stage that reads or frees the artifact has produced its output (or
    something further down the pipeline exists): then the artifact is no longer needed."""
    consumers = [s for s in cfg.stages if artifact.name in s.needs or artifact.name in s.frees]
    return bool(consumers) and all(_produced(cfg, s, present, set()) for s in consumers)


def _produced(cfg: Config, stage: Stage, present: set[str], seen: set[str]) -> bool:
    if not stage.makes or stage.name in seen:
        return False
    seen.add(stage.name)
    for made in stage.makes:
        if made in present:
            continue
        downstream = [s for s in cfg.stages if made in s.needs]
        if not any(_produced(cfg, s, present, seen) for s in downstream):
            return False
    return True


# ------------------------------------------------------------------ the whole run, planned


@dataclass(frozen=True)
class StagePeak:
    stage: str
    alive: tuple[str, ...]  # artifacts on disk at the stage's peak (what it reads and what it writes)
    peak: int  # bytes of those artifacts
    kept_peak: int  # the same if nothing were ever deleted (the unsafe order)
    limit: int  # capacity less the reserve
    cleaned: tuple[str, ...] = ()  # consumed intermediates whose deletion would make it fit
    cleaned_peak: int | None = None  # the peak once they are deleted

    @property
    def fits(self) -> bool:
        return self.peak <= self.limit

    @property
    def kept_fits(self) -> bool:
        return self.kept_peak <= self.limit


def plan_run(cfg: Config, capacity: int) -> list[StagePeak]:
    """Every stage in order from an empty workspace: what is alive at its peak with the
    intermediates deleted as declared (`frees`); for a stage that would not fit, what deleting
    the intermediates already consumed would bring it to (what the console offers); and, for
    contrast, the peak if nothing were ever deleted."""
    by_name = {a.name: a for a in cfg.artifacts}  # names are unique: keys of the [artifacts] table
    size = {name: int(a.size_gb * GB) for name, a in by_name.items()}
    limit = capacity - int(cfg.budget.reserve_gb * GB)
    alive: list[str] = []
    kept: list[str] = []
    done: list[Stage] = []
    peaks = []
    for stage in cfg.stages:
        at_peak = alive + [m for m in stage.makes if m not in alive]
        kept = kept + [m for m in stage.makes if m not in kept]
        peak = sum(size[n] for n in at_peak)
        cleaned: list[str] = []
        if peak > limit:
            cleaned = [n for n in alive if n not in stage.needs and _used_up(cfg, by_name[n], done)]
        peaks.append(StagePeak(stage.name, tuple(at_peak), peak, sum(size[n] for n in kept), limit, tuple(cleaned),
                               peak - sum(size[n] for n in cleaned) if cleaned else None))
        alive = [n for n in at_peak if n not in stage.frees]
        done.append(stage)
    return peaks


def _used_up(cfg: Config, artifact: Artifact, done: list[Stage]) -> bool:
    """An intermediate whose every reader has run: it may go."""
    readers = [s for s in cfg.stages if artifact.name in s.needs]
    return artifact.intermediate and bool(readers) and all(s in done for s in readers)
