"""What must be true before a stage fires, read off the latest snapshot: inputs present, disk
at the stage's peak, poison files from an earlier run, ports already held, already running, and
the server a stage talks to (its `--url` on this box) listening."""

from __future__ import annotations

import re
from dataclasses import dataclass

from samai.console.core import units
from samai.console.core.browsers import browser_missing, browser_stages
from samai.console.core.config import Config, Stage
from samai.console.core.disk.budget import DiskBudget, disk_budget, project
from samai.console.core.mmproj import declared, mmproj_artifact, projector_stage
from samai.console.core.preflight.resumable import resumable_checks
from samai.remote.model import Process, Snapshot, StageRecord

POISON_PREFIX = "poison:"
# A stage's server on the box itself, as its command names it: `--url http://127.0.0.1:18080`.
LOCAL_URL = re.compile(r"--url[= ]+[\"']?(https?)://(127\.0\.0\.1|localhost|0\.0\.0\.0|\[::1\])(?::(\d{1,5}))?")
SHOWN_COMMAND = 1000  # characters of a holder's command line (a dialog line, not the whole argv of a giant)


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


def poison_key(stage: str, path: str) -> str:
    """The artifact name under which the probe sizes one of a stage's poison paths."""
    return f"{POISON_PREFIX}{stage}:{path}"


def poison_artifacts(cfg: Config) -> list[tuple[str, str]]:
    """(name, path) pairs the probe sizes so that poison files are seen in every snapshot."""
    return [(poison_key(s.name, p), p) for s in cfg.stages for p in s.poison]


def present_poison(stage: Stage, snap: Snapshot) -> tuple[str, ...]:
    """The stage's poison paths that this snapshot found on the box."""
    sizes = {a.name: a for a in snap.artifacts}
    return tuple(p for p in stage.poison if (found := sizes.get(poison_key(stage.name, p))) and found.exists)


def preflight(cfg: Config, snap: Snapshot, stage: Stage, budget: DiskBudget | None = None,
              step_rate: float | None = None) -> Preflight:
    """budget: this snapshot's, when the caller has it already (a poll computes it once); step_rate:
    a training stage's optimizer steps a second, as last measured (whether a death loses too much)."""
    checks: list[Check] = []
    record = snap.state(stage.name)
    if record and record.alive:
        checks.append(Check("error", f"already running as pid {record.pid}"))
    budget = budget or disk_budget(cfg, snap)
    for name in stage.needs:
        use = budget.artifact(name)
        if use is None or use.actual is None:
            where = use.path if use else "?"
            checks.append(Check("error", f"needs {name} ({where}): missing"))
        else:
            checks.append(Check("ok", f"needs {name}: {units.size(use.actual)} present"))
    checks.append(_disk_check(cfg, budget, stage))
    poison = present_poison(stage, snap)
    if poison:
        checks.append(Check("warning", f"poison files from an earlier run: {', '.join(poison)} (restart clears them)"))
    for port in stage.ports:
        checks.extend(_port_checks(snap, port, record))
    checks.extend(_server_checks(cfg, snap, stage))
    checks.extend(_projector_checks(cfg, budget, stage))
    if stage in browser_stages(cfg):
        checks.extend(Check("error", f.message) for f in browser_missing(cfg, snap, [stage]))
    checks.extend(Check(severity, text) for severity, text in resumable_checks(cfg, stage, step_rate))
    return Preflight(stage.name, tuple(checks), poison)


def _disk_check(cfg: Config, budget: DiskBudget, stage: Stage) -> Check:
    p = project(cfg, budget, stage)
    if not p.writes:  # it writes no declared artifact: the reserve is for the stages that do
        if p.free_now >= p.reserve:
            return Check("ok", f"writes no declared artifact: {units.size(p.free_now)} free")
        return Check("warning", f"writes no declared artifact: {units.size(p.free_now)} free is below the reserve "
                                f"of {units.size(p.reserve)} (not a blocker for this stage)")
    disk_text = (f"disk at peak: +{units.size(p.adds)} of {units.size(p.free_now)} free "
                 f"leaves {units.size(p.free_at_peak)} (reserve {units.size(p.reserve)})")
    if p.fits:
        return Check("ok", disk_text)
    if p.fits_after_cleaning:
        return Check("warning", f"{disk_text}: clean {units.size(p.reclaimable)} of intermediates first")
    return Check("error", f"{disk_text}: does not fit even after cleaning")


def _port_checks(snap: Snapshot, port: int, record: StageRecord | None) -> list[Check]:
    """A listener the fire (or restart) stops first by pid is not a blocker; one this user cannot
    see cannot be stopped from here, and is."""
    seen: set[int | None] = set()
    checks = []
    own = set(record.group) | {record.pid} if record and record.alive else set()
    for s in snap.listeners:
        if s.port != port or s.pid in seen:
            continue
        seen.add(s.pid)
        proc = snap.process(s.pid) if s.pid else None
        if proc is None:
            checks.append(Check("error", f"port {port} is held by a process this user cannot see: "
                                         "the console cannot stop it"))
        elif proc.pid in own:
            checks.append(Check("warning", f"port {port} is held by this stage's own run: restart stops it first: "
                                           f"{holder_text(proc, snap.time)}"))
        else:
            earlier = " (this stage's previous run)" if record and (proc.pgid == record.pgid
                                                                     or proc.pid in record.group) else ""
            checks.append(Check("warning", f"port {port} is held{earlier}: will be stopped first (SIGTERM, "
                                           f"identity-checked): {holder_text(proc, snap.time)}"))
    if not seen:
        checks.append(Check("ok", f"port {port} is free"))
    return checks


def holder_text(proc: Process, now: float) -> str:
    """pid, start time (local, and how long ago) and the command line of a process on a port."""
    return f"pid {proc.pid} started {started_text(proc.start_time, now)}: {shown_command(proc.command)}"


def started_text(start_time: float, now: float) -> str:
    when = units.local_time(start_time, "%Y-%m-%d %H:%M:%S")
    return f"{when} ({units.duration(now - start_time)} ago)"


def shown_command(command: str) -> str:
    more = len(command) - SHOWN_COMMAND
    return command if more <= 0 else f"{command[:SHOWN_COMMAND]}… ({more} more characters)"


def server_ports(stage: Stage) -> list[tuple[str, int]]:
    """(url, port) of each server on the box the stage's command talks to (`--url http://127.0.0.1:P`)."""
    found = []
    for m in LOCAL_URL.finditer(stage.command):
        port = int(m.group(3)) if m.group(3) else (443 if m.group(1) == "https" else 80)
        if port not in stage.ports and 0 < port < 65536:
            found.append((f"{m.group(1)}://{m.group(2)}:{port}", port))
    return found


def _server_checks(cfg: Config, snap: Snapshot, stage: Stage) -> list[Check]:
    """The server the stage asks must be up before it runs: nothing listening is a blocker, not
    a run that fails every request."""
    checks = []
    for url, port in server_ports(stage):
        listening = [s for s in snap.listeners if s.port == port]
        if listening:
            pid = next((s.pid for s in listening if s.pid), None)
            checks.append(Check("ok", f"server {url}: port {port} is listening" + (f" (pid {pid})" if pid else "")))
            continue
        server = next((s for s in cfg.stages if port in s.ports), None)
        hint = f": fire {server.name} (key {server.key}) first" if server else ""
        checks.append(Check("error", f"server {url} is down: nothing listens on port {port}{hint}"))
    return checks


def _projector_checks(cfg: Config, budget: DiskBudget, stage: Stage) -> list[Check]:
    """A multimodal serve stage, as far as the snapshot tells: its command must carry --mmproj, and
    the projector's file be there (said here unless `needs` said it). Whether the projector matches
    the model takes reading both headers: mmproj_match does that when the stage is about to fire."""
    serve = projector_stage(cfg, stage)
    if serve is None:
        return []
    checks = []
    artifact = mmproj_artifact(cfg)
    if serve.mmproj is None and artifact is not None:
        checks.append(Check("error", f"the pipeline is multimodal ([model] mmproj = {artifact.name}) but this "
                                     f"command runs llama-server without --mmproj {artifact.path}: image requests "
                                     "would fail or be answered blind"))
    path = serve.mmproj if serve.mmproj is not None else artifact.path if artifact else None
    known = declared(cfg, path) if path else None
    use = budget.artifact(known.name) if known else None
    if known and known.name not in stage.needs and use is not None and use.actual is None:
        checks.append(Check("error", f"mmproj {path} (artifact {known.name}, the projector GGUF): missing"))
    return checks
