"""What must be true before a stage fires, read off the latest snapshot: inputs present, disk
at the stage's peak, poison files from an earlier run, ports already held, already running."""

from __future__ import annotations

from dataclasses import dataclass

from samai.console import units
from samai.console.budget import disk_budget, project
from samai.console.config import Config, Stage
from samai.remote.model import Snapshot

POISON_PREFIX = "poison:"


@dataclass(frozen=True)
class Check:
    severity: str  # ok | warning | error (an error blocks the stage)
    text: str


@dataclass(frozen=True)
class Preflight:
    stage: str
    checks: tuple[Check, ...]
    poison: tuple[str, ...] = ()  # poison files present now (workspace-relative)

    @property
    def blocked(self) -> bool:
        return any(c.severity == "error" for c in self.checks)


def poison_artifacts(cfg: Config) -> list[tuple[str, str]]:
    """(name, path) pairs the probe sizes so that poison files are seen in every snapshot."""
    return [(f"{POISON_PREFIX}{s.name}:{p}", p) for s in cfg.stages for p in s.poison]


def preflight(cfg: Config, snap: Snapshot, stage: Stage) -> Preflight:
    checks: list[Check] = []
    record = snap.state(stage.name)
    if record and record.alive:
        checks.append(Check("error", f"already running as pid {record.pid}"))
    budget = disk_budget(cfg, snap)
    for name in stage.needs:
        use = budget.artifact(name)
        if use is None or use.actual is None:
            where = use.path if use else "?"
            checks.append(Check("error", f"needs {name} ({where}): missing"))
        else:
            checks.append(Check("ok", f"needs {name}: {units.size(use.actual)} present"))
    p = project(cfg, budget, stage)
    disk_text = (f"disk at peak: +{units.size(p.adds)} of {units.size(p.free_now)} free "
                 f"leaves {units.size(p.free_at_peak)} (reserve {units.size(p.reserve)})")
    if p.fits:
        checks.append(Check("ok", disk_text))
    elif p.fits_after_cleaning:
        checks.append(Check("warning", f"{disk_text}: clean {units.size(p.reclaimable)} of intermediates first"))
    else:
        checks.append(Check("error", f"{disk_text}: does not fit even after cleaning"))
    sizes = {a.name: a for a in snap.artifacts}
    poison = tuple(path for name, path in poison_artifacts(cfg)
                   if name.startswith(f"{POISON_PREFIX}{stage.name}:") and sizes.get(name) and sizes[name].exists)
    if poison:
        checks.append(Check("warning", f"poison files from an earlier run: {', '.join(poison)} (restart clears them)"))
    for port in stage.ports:
        holders = [s for s in snap.listeners if s.port == port]
        for s in holders:
            proc = snap.process(s.pid) if s.pid else None
            who = f"pid {s.pid} {proc.command[:50]}" if proc else "a process this user cannot see"
            checks.append(Check("error", f"port {port} is already held by {who}"))
        if not holders:
            checks.append(Check("ok", f"port {port} is free"))
    return Preflight(stage.name, tuple(checks), poison)
