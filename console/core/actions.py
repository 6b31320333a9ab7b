"""The one way to change the box: fire, stop, kill, restart and clean go through here and nowhere else.

Planning and running are separate steps, and what runs is exactly the plan that was confirmed:

1. plan_KIND() reads the box and builds that kind's plan (FirePlan, StopPlan, KillPlan...: one
   frozen dataclass per ActionKind, registered in PLANS, each running itself): the exact command
   and target, the preflight of a fire, and every process the action will signal (a fire of a
   stage with declared ports lists the listeners it will stop on them first, by pid and start time).
2. The front end shows that plan and answers with a Decision (confirm(plan) -> Decision):
   confirmed, override (only for a plan that shows it is blocked) or declined.
3. run(plan, decision) carries out that plan: refused in read-only mode, refused when the
   decision is not for this plan or does not fit it (a blocked plan needs an override, an
   override needs a blocked plan), refused when its audit intent line cannot be written; then
   the Box (which re-checks each process's identity right before signalling), then the
   outcome line. Every pid signalled on the operator's behalf has its own audit lines.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import shlex
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from dataclasses import fields as dataclass_fields
from typing import ClassVar, Literal

import psutil

from samai.console.core import units
from samai.console.core.audit import AuditError, AuditLog
from samai.console.core.config import Config, Stage, UnknownStage, command_words  # noqa: F401 (its callers import it here too)
from samai.console.core.disk.budget import GB, disk_budget, workspace_disk
from samai.console.core.kinds import ActionKind
from samai.console.core.preflight import (
    Check,
    poison_artifacts,
    preflight,
    present_poison,
    shown_command,
    started_text,
)
from samai.console.core.preflight.evidence import training_evidence
from samai.console.core.preflight.mmproj import projector_evidence
from samai.console.core.preflight.nodes import multi_node_checks
from samai.console.core.redact import redact, redact_assignment
from samai.console.core.training.resume import PRUNE_KEEP, NothingToResume, prune_choice, resume_choice
from samai.remote.boxapi import Box, BoxError
from samai.remote.model import (
    Boot,
    Checkpoint,
    CleanResult,
    FireResult,
    GgufAssertion,
    GgufWriteResult,
    SignalResult,
    Snapshot,
    StageRecord,
    same_start,
)
from samai.remote.transport import TransportError

PORT_GRACE_S = 5.0  # a listener on a stage's port: TERM, then KILL after this long
SIGNALS = ("TERM", "KILL", "INT", "HUP")
SHOWN_MEMBERS = 8  # of a process group, in a kill plan
PACKAGE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")  # a distribution name as pip takes it
GGUF_OPS = ("set_kv", "add_tensors", "extract")
GGUF_SECONDS_PER_GB = 100.0  # a write's deadline: a donor over the network at 10 MB/s, then read back for sha256


@dataclass(frozen=True)
class PortHolder:
    """A process listening on a port the stage declares: stopped by pid before the stage fires."""

    port: int
    pid: int
    start_time: float
    command: str


Result = FireResult | SignalResult | CleanResult | GgufWriteResult
PLANS: dict[ActionKind, type[ActionPlan]] = {}  # each kind's plan type: the one way to plan that kind


@dataclass(frozen=True)
class ActionPlan(ABC):
    """What every plan shows and audits: the front ends show these fields (and blocked), the audit
    log keeps them. Each kind is a subclass, registered in PLANS by its kind, that carries exactly
    what runs and runs it (execute); this class is no plan of its own."""

    kind: ClassVar[ActionKind]
    target: str
    subject: str
    command: str  # the exact command, or the signal and what receives it
    details: tuple[str, ...] = ()
    checks: tuple[Check, ...] = ()  # the preflight of a fire or restart; what blocks an uninstall, a surgery
    stage: str | None = None  # the stage it acts on, where it acts on one

    def __init_subclass__(cls, **kw) -> None:
        super().__init_subclass__(**kw)
        kind = cls.__dict__.get("kind")
        if kind is None:
            return  # a part that kinds share (LaunchPlan): registers nothing, plans nothing
        if not isinstance(kind, ActionKind) or kind in PLANS:
            raise TypeError(f"{cls.__name__}: kind {kind!r} is not an ActionKind, or has its plan already")
        PLANS[kind] = cls

    def __post_init__(self) -> None:
        kind = getattr(type(self), "kind", None)
        if kind is None or PLANS.get(kind) is not type(self):
            raise TypeError(f"{type(self).__name__} is not the plan of a registered kind")
        # What is shown (the CLI's prompt, the TUI's dialogs) and audited carries no secret; what
        # runs (chain, env, paths, gguf_request, the pid) is kept exactly as it is.
        for name in ("target", "subject", "command"):
            object.__setattr__(self, name, redact(getattr(self, name)))
        object.__setattr__(self, "details", tuple(redact(line) for line in self.details))
        object.__setattr__(self, "checks", tuple(replace(c, text=redact(c.text)) for c in self.checks))

    @property
    def action(self) -> str:
        """The kind's name, as the dialogs, the prompt and the audit log say it."""
        return self.kind.value

    @property
    def blocked(self) -> bool:
        """The preflight found an error: only an explicit override may go ahead."""
        return any(c.severity == "error" for c in self.checks)

    def audited_process(self) -> tuple[int | None, float | None]:
        """The process its audit entry names by pid and start time (a kill's), or none."""
        return None, None

    def intent_fields(self) -> dict:
        """What its intent line holds beside the entry: the details, and the checks that block it."""
        fields: dict = {"details": list(self.details)}
        if self.checks:
            fields["blocked_by"] = [c.text for c in self.checks if c.severity == "error"]
        return fields

    @abstractmethod
    async def execute(self, actions: Actions, decision: Decision, audit_id: str) -> Result:
        """Carry it out on actions' box: only Actions.run calls this, once decided and audited."""

    def what_happened(self, snap: Snapshot, started: float) -> str:
        """After a call that broke half-way: what the box, read again (snap), shows of it."""
        rec = snap.state(self.stage or "")
        if rec is None or rec.fired_at < started - 1:
            return self._not_launched(rec)
        return f"the box shows it was fired: pid {rec.pid}, {rec.status}"

    def _not_launched(self, rec: StageRecord | None) -> str:
        return f"the stage is {rec.status if rec else 'idle'}"


@dataclass(frozen=True, kw_only=True)
class LaunchPlan(ActionPlan):
    """What a fire and a restart share: the stage's chain as launched, and the port holders stopped first."""

    chain: str = ""  # the stage command it launches
    log: str = ""
    env: tuple[tuple[str, str], ...] = ()
    boot: Boot | None = None  # the boot the holders' start times were read on
    holders: tuple[PortHolder, ...] = ()  # stopped first, each audited

    def intent_fields(self) -> dict:
        fields = super().intent_fields()
        if self.holders:
            fields["holders"] = [{"pid": h.pid, "start_time": h.start_time, "port": h.port, "command": h.command}
                                 for h in self.holders]
        return fields

    async def launch(self, actions: Actions) -> FireResult:
        return await actions._launch(self.stage, self.chain, self.log, self.env)

    def _not_launched(self, rec: StageRecord | None) -> str:
        return "the box shows no new launch of it"


@dataclass(frozen=True, kw_only=True)
class FirePlan(LaunchPlan):
    """Fire a stage (detached, verified), its ports' other listeners stopped first."""

    kind: ClassVar[ActionKind] = ActionKind.FIRE

    async def execute(self, actions: Actions, decision: Decision, audit_id: str) -> FireResult:
        return await actions._clear_ports(self, decision, audit_id) or await self.launch(actions)


@dataclass(frozen=True, kw_only=True)
class RestartPlan(LaunchPlan):
    """Stop the stage if it runs, delete the poison files, stop the port's other listeners, fire it again."""

    kind: ClassVar[ActionKind] = ActionKind.RESTART
    grace: float = 10.0  # the stop's: SIGKILL after this long
    paths: tuple[str, ...] = ()  # the poison files cleared

    async def execute(self, actions: Actions, decision: Decision, audit_id: str) -> FireResult:
        stage = self.stage or ""
        stopped = await actions.box.stop(stage, grace=self.grace, protect=actions._protect(),
                                         by=operator(self.action, decision.by))
        if not stopped.ok:
            return FireResult(False, "refused", stage, f"stop failed: {stopped.reason}")
        if self.paths:
            cleaned = await actions.box.remove(self.paths)
            if not cleaned.ok:
                return FireResult(False, "refused", stage, f"clean refused: {cleaned.refused}")
        return await actions._clear_ports(self, decision, audit_id) or await self.launch(actions)


@dataclass(frozen=True, kw_only=True)
class ResumePlan(RestartPlan):
    """A restart of a dead training run that continues from one of its checkpoints (its chain
    takes --resume-from): the checkpoint named, the newer ones passed over said in details."""

    kind: ClassVar[ActionKind] = ActionKind.RESUME
    checkpoint: str = ""  # workspace-relative: the checkpoint-STEP folder resumed from


@dataclass(frozen=True, kw_only=True)
class StopPlan(ActionPlan):
    """A stage's process group: SIGTERM, SIGKILL after grace."""

    kind: ClassVar[ActionKind] = ActionKind.STOP
    grace: float = 10.0

    async def execute(self, actions: Actions, decision: Decision, audit_id: str) -> SignalResult:
        return await actions.box.stop(self.stage or "", grace=self.grace, protect=actions._protect(),
                                      by=operator(self.action, decision.by))


@dataclass(frozen=True, kw_only=True)
class KillPlan(ActionPlan):
    """One process (or its group), named by pid and start time: re-checked on the box before the signal."""

    kind: ClassVar[ActionKind] = ActionKind.KILL
    pid: int
    start_time: float
    signal: str = "TERM"
    grace: float = 5.0
    group: bool = False  # the process's whole process group, not just the process
    boot: Boot | None = None  # the boot the start time was read on

    def audited_process(self) -> tuple[int | None, float | None]:
        return self.pid, self.start_time

    def intent_fields(self) -> dict:
        fields = super().intent_fields()
        return {"details": fields.pop("details"), "signal": self.signal, "group": self.group, "grace": self.grace,
                **fields}

    async def execute(self, actions: Actions, decision: Decision, audit_id: str) -> SignalResult:
        return await actions.box.kill(self.pid, self.start_time, boot=self.boot, signal=self.signal,
                                      grace=self.grace, protect=actions._protect(), group=self.group)

    def what_happened(self, snap: Snapshot, started: float) -> str:
        proc = snap.process(self.pid)
        alive = proc is not None and same_start(proc.start_time, self.start_time)
        return f"pid {self.pid} is {'still running' if alive else 'gone'}"


@dataclass(frozen=True, kw_only=True)
class CleanPlan(ActionPlan):
    """Paths deleted inside the workspace (anything resolving outside it is refused by the box)."""

    kind: ClassVar[ActionKind] = ActionKind.CLEAN
    paths: tuple[str, ...] = ()

    async def execute(self, actions: Actions, decision: Decision, audit_id: str) -> CleanResult:
        return await actions.box.remove(self.paths)


@dataclass(frozen=True, kw_only=True)
class PrunePlan(CleanPlan):
    """A training run's older checkpoints deleted, the newest few and the one a resume would take
    kept (each named in details)."""

    kind: ClassVar[ActionKind] = ActionKind.PRUNE
    stage: str = ""


@dataclass(frozen=True, kw_only=True)
class UninstallPlan(ActionPlan):
    """`PYTHON -m pip uninstall -y PACKAGE`, run like a stage: detached, its own log, verified."""

    kind: ClassVar[ActionKind] = ActionKind.UNINSTALL
    chain: str = ""  # the command, as it runs
    log: str = ""
    boot: Boot | None = None

    async def execute(self, actions: Actions, decision: Decision, audit_id: str) -> FireResult:
        return await actions._launch(self.stage, self.chain, self.log)


@dataclass(frozen=True, kw_only=True)
class GgufPlan(ActionPlan):
    """GGUF surgery: the box writes exactly what it planned (its pin), or refuses."""

    kind: ClassVar[ActionKind] = ActionKind.GGUF
    gguf_request: str = ""  # the box tool's exact request (JSON), as planned
    gguf_bytes: int = 0  # the size of the output

    async def execute(self, actions: Actions, decision: Decision, audit_id: str) -> GgufWriteResult:
        return await actions._gguf_write(self)

    def what_happened(self, snap: Snapshot, started: float) -> str:
        return "OUT is renamed into place only after every assertion held: look whether it exists"


@dataclass(frozen=True)
class Decision:
    """A front end's answer for one plan it showed. Build it with confirmed/override/declined."""

    plan: ActionPlan
    verdict: str  # confirmed | override | declined
    how: str  # how it was given ("--yes", "prompt", "dialog", "--force --yes"), or why it was declined
    by: str = ""  # who decided, when not the operator of this console (a watcher: "watcher op@host (pid N)")

    @classmethod
    def confirmed(cls, plan: ActionPlan, how: str, *, by: str = "") -> Decision:
        return cls(plan, "confirmed", how, by)

    @classmethod
    def override(cls, plan: ActionPlan, how: str, *, by: str = "") -> Decision:
        """Run a plan shown as blocked anyway: valid only for a blocked plan."""
        return cls(plan, "override", how, by)

    @classmethod
    def declined(cls, plan: ActionPlan, why: str, *, by: str = "") -> Decision:
        return cls(plan, "declined", why, by)

    @property
    def actor(self) -> str:
        """Who acts, as the audit log's "user" names them: the decision's `by`, else this console's user."""
        return self.by or user_name()

    @property
    def confirmation(self) -> str:
        """What the audit log's "confirmation" says."""
        return self.verdict if self.verdict in ("override", "declined") else self.how


# Shows the plan (its checks, and that it is blocked) and says what the operator decided.
Confirm = Callable[[ActionPlan], Awaitable[Decision]]


OutcomeStatus = Literal["done", "refused", "cancelled", "failed"]


@dataclass(frozen=True)
class ActionOutcome:
    ok: bool
    status: OutcomeStatus
    message: str
    plan: ActionPlan
    result: Result | None = None
    audit_id: str | None = None


def own_lineage() -> list[int]:
    """This process and its ancestors: never signalled on a local target."""
    me = psutil.Process()
    return [me.pid] + [p.pid for p in me.parents()]


class Actions:
    def __init__(self, box: Box, config: Config, audit: AuditLog, *, readonly: bool, confirm: Confirm) -> None:
        self.box = box
        self.config = config
        self.audit = audit
        self.readonly = readonly
        self.confirm = confirm

    def _stage(self, name: str) -> Stage:
        stage = self.config.stage(name)
        if stage is None:
            raise UnknownStage(name, self.config)
        return stage

    def _protect(self) -> list[int]:
        return own_lineage() if self.config.target.is_local else []

    async def _snapshot(self, **what) -> Snapshot | None:
        try:
            return await self.box.snapshot(**what)
        except (BoxError, TransportError):
            return None  # the action itself will say what is wrong with the box

    async def acknowledge(self, keys: Sequence[str], texts: Mapping[str, str]) -> tuple[bool, str]:
        """Alerts acknowledged for every watcher of this box: none repeats them. Nothing that runs
        changes, so nothing is confirmed; it writes on the box, so read-only refuses it; audited."""
        if self.readonly:
            return False, "acknowledge refused: the console is read-only (the acknowledgement is written on the box)"
        entry = dict(target=self.config.target.url, action="acknowledge", subject=f"{len(keys)} alert(s)",
                     command="", alerts=list(keys), by=me())
        try:
            audit_id = self.audit.intent(**entry)
        except AuditError as e:
            return False, f"acknowledge refused: {e}"
        try:
            await self.box.acknowledge(keys, me(), texts)
        except (BoxError, TransportError) as e:
            result: tuple[bool, str] = (False, f"not acknowledged: {e}")
        else:
            result = (True, f"{len(keys)} alert(s) acknowledged: no watcher of this box repeats them")
        try:
            self.audit.outcome(audit_id, **entry, result="ok" if result[0] else "error", message=result[1])
        except AuditError as e:
            return False, f"{result[1]}; but {e}"
        return result

    # ------------------------------------------------------------ plans

    async def plan_fire(self, stage_name: str) -> FirePlan:
        stage = self._stage(stage_name)
        snap = await self._stage_snapshot()
        checks = preflight(self.config, snap, stage).checks if snap else ()
        checks += await training_evidence(self.box, self.config, stage)
        checks += await projector_evidence(self.box, self.config, stage, snap)
        checks += multi_node_checks(stage)
        holders = _port_holders(stage, snap) if snap else ()
        return FirePlan(
            target=self.config.target.url, subject=f"stage {stage.name}", command=stage.command,
            details=(*_holder_lines(holders), f"workspace {self.config.workspace}", f"log {stage.log}",
                     *(f"env {redact_assignment(k, v)}" for k, v in stage.env)),
            checks=checks, stage=stage.name, chain=stage.command, log=stage.log, env=stage.env,
            boot=snap.boot if snap else None, holders=holders,
        )

    async def plan_restart(self, stage_name: str, *, clear: Sequence[str] = (), grace: float = 10.0) -> RestartPlan:
        """Stop the stage if it runs, delete the given poison files, stop the port's other
        listeners, fire it again: one plan, one confirmation."""
        stage = self._stage(stage_name)
        snap = await self._stage_snapshot()
        rec = snap.state(stage.name) if snap else None
        own = set(rec.group) | {rec.pid} if rec and rec.alive else set()
        holders = _port_holders(stage, snap) if snap else ()
        steps = [f"stop: SIGTERM to the group of stage {stage.name}, SIGKILL after {grace:g} s"]
        if clear:
            steps.append("clean: rm -rf -- " + " ".join(shlex.quote(p) for p in clear))
        steps += [f"stop pid {h.pid}: SIGTERM, SIGKILL after {PORT_GRACE_S:g} s" for h in holders]
        steps.append(f"fire: {stage.command}")
        # Running, and holding its own ports, is what a restart is for.
        checks = tuple(c for c in (preflight(self.config, snap, stage).checks if snap else ())
                       if "already running" not in c.text and not _about_own_listener(c, own))
        checks += await training_evidence(self.box, self.config, stage)
        checks += await projector_evidence(self.box, self.config, stage, snap)
        checks += needed_artifact_checks(self.config, clear, stage.name)
        checks += multi_node_checks(stage)
        return RestartPlan(
            target=self.config.target.url, subject=f"stage {stage.name}",
            command="; ".join(steps), details=(*_holder_lines(holders), f"workspace {self.config.workspace}"),
            checks=checks, stage=stage.name, chain=stage.command, log=stage.log, env=stage.env, grace=grace,
            boot=snap.boot if snap else None, paths=tuple(clear), holders=holders,
        )

    async def plan_resume(self, stage_name: str, checkpoint: str | None = None, *,
                          grace: float = 10.0) -> ResumePlan:
        """Resume a dead training run from its newest fit checkpoint (or the named one, refused
        with the reason when it is not fit): its poison files cleared, the disk its next
        checkpoint needs checked against what is free."""
        stage = self._stage(stage_name)
        snap = await self._stage_snapshot()
        choice = await resume_choice(self.box, self.config, stage, checkpoint,
                                     writing=bool(snap and _alive(snap, stage.name)))
        if choice.chosen is None:
            raise NothingToResume(choice.why_none())
        base = await self.plan_restart(stage_name, clear=present_poison(stage, snap) if snap else (), grace=grace)
        chain = f"{stage.command} --resume-from {shlex.quote(choice.path)}"
        ck = choice.chosen
        details = (f"resume from {choice.path} (step {ck.step}, {units.size(ck.bytes)})",
                   *(f"passed over {p.name}: {p.why}" for p in choice.passed),
                   *([choice.left_out] if choice.left_out else []), *base.details)
        fields_of = {f.name: getattr(base, f.name) for f in dataclass_fields(base)}
        return ResumePlan(**dict(fields_of, command=base.command.replace(f"fire: {stage.command}", f"fire: {chain}"),
                                 chain=chain, details=details, checks=base.checks + _next_checkpoint_check(ck, snap)),
                          checkpoint=choice.path)

    async def plan_prune(self, stage_name: str, keep: int = PRUNE_KEEP) -> PrunePlan:
        """Delete a train stage's checkpoints older than its newest `keep`, never the one a resume
        would take (NothingToPrune when none may go)."""
        stage = self._stage(stage_name)
        snap = await self._snapshot()
        choice = await prune_choice(self.box, self.config, stage, keep,
                                    writing=bool(snap and _alive(snap, stage.name)))
        paths = choice.paths()
        clean = self.plan_clean(paths, why=f"{stage.name}'s checkpoints older than its newest {keep}",
                                sizes={posixpath.join(choice.folder, c.name): c.bytes for c in choice.deleted})
        kept = [f"kept {c.name} (step {c.step}){': a resume would take it' if c == choice.resume else ''}"
                for c in choice.kept] + ([f"{choice.left_out}: none of them is deleted"] if choice.left_out else [])
        return PrunePlan(target=clean.target, subject=clean.subject, command=clean.command,
                         details=(*kept, *clean.details), checks=clean.checks, paths=paths, stage=stage.name)

    def plan_stop(self, stage_name: str, *, grace: float = 10.0) -> StopPlan:
        stage = self._stage(stage_name)
        return StopPlan(
            target=self.config.target.url, subject=f"stage {stage.name}",
            command=f"SIGTERM to the process group of stage {stage.name}, SIGKILL after {grace:g} s",
            stage=stage.name, grace=grace,
        )

    async def plan_kill(self, pid: int, start_time: float, *, boot: Boot | None = None, signal: str = "TERM",
                        grace: float = 5.0, group: bool = False) -> KillPlan:
        return _kill_plan(self.config.target.url, await self._snapshot(), pid, start_time, boot, signal.upper(),
                          grace, group)

    async def kill_choices(self, pid: int, start_time: float, *, boot: Boot | None = None,
                           grace: float = 5.0) -> tuple[KillPlan, ...]:
        """The four kill plans of one process, from one reading of the box: this process or its
        whole group, each with TERM or KILL (in that order)."""
        return kill_plans(self.config.target.url, await self._snapshot(), pid, start_time, boot, grace)

    def plan_clean(self, paths: Sequence[str], *, why: str = "", sizes: Mapping[str, int] | None = None) -> CleanPlan:
        """sizes: each path's bytes as last measured, shown per path with their total."""
        known = {p: sizes[p] for p in paths if p in sizes} if sizes else {}
        sized = [f"{p}: {units.size(n)}" for p, n in known.items()]
        if sized:
            sized.append(f"in all {units.size(sum(known.values()))}")
        return CleanPlan(
            target=self.config.target.url, subject=why or f"{len(paths)} path(s) in the workspace",
            command="rm -rf -- " + " ".join(shlex.quote(p) for p in paths),
            details=(*sized, f"inside {self.config.workspace} only; anything resolving outside it is refused"),
            paths=tuple(paths), checks=needed_artifact_checks(self.config, paths),
        )

    async def plan_uninstall(self, python: str, package: str) -> UninstallPlan:
        """`PYTHON -m pip uninstall -y PACKAGE`, run like a stage (detached, its own log, verified):
        blocked while a stage that runs from that environment is running."""
        if not PACKAGE_NAME.match(package):
            raise ValueError(f"not a distribution name: {package!r}")
        command = f"{shlex.quote(python)} -m pip uninstall -y {shlex.quote(package)}"
        name = f"uninstall-{package}"
        log = f"logs/{name}.log"
        users = [s for s in self.config.stages if _runs_python(s, python)]
        snap = await self._snapshot()
        running = [s.name for s in users if snap and _alive(snap, s.name)]
        checks = tuple(Check("error", f"stage {n} is running from {python}: stop it first") for n in running)
        used = [f"used by stage {', '.join(s.name for s in users)}"] if users else []
        return UninstallPlan(
            target=self.config.target.url, subject=f"{package} from {python}", command=command,
            details=(*used, f"workspace {self.config.workspace}", f"log {log}"), checks=checks, stage=name,
            chain=command, log=log, boot=snap.boot if snap else None,
        )

    async def uninstall(self, python: str, package: str) -> ActionOutcome:
        return await self.confirm_and_run(await self.plan_uninstall(python, package))

    async def plan_gguf(self, request: Mapping) -> GgufPlan:
        """GGUF surgery (set_kv, add_tensors, extract: box/gguf_surgery.py): the box plans it
        first (nothing written, the donor's header read), which gives the bytes the output needs:
        checked against the disk budget. A plan the box refuses is blocked with its reason. The
        write carries the plan's pin: the box writes exactly what was planned (the same sources,
        size and ranges) or refuses, naming what changed. A request with an empty or malformed
        field is a ValueError (a usage error), never sent."""
        op = request.get("op")
        if op not in GGUF_OPS:
            raise ValueError(f"not a GGUF surgery: {op!r} (one of {', '.join(GGUF_OPS)})")
        problem = gguf_usage_problem(request)
        if problem:
            raise ValueError(problem)
        planned = await self.box.gguf_plan(request)
        if planned.ok:
            checks = (self._gguf_disk_check(planned, await self._stage_snapshot()),)
        else:
            checks = (Check("error", f"the box refuses it: {planned.error}"),)
        exact = {k: v for k, v in request.items() if k not in ("workspace", "plan", "pin")}
        if planned.pin is not None:
            exact["pin"] = planned.pin
        return GgufPlan(
            target=self.config.target.url, subject=f"{op} -> {request.get('out')}",
            command=gguf_command(request), details=_gguf_details(request, planned, self.config.workspace),
            checks=checks, gguf_request=json.dumps(exact, sort_keys=True),
            gguf_bytes=planned.bytes,
        )

    def _gguf_disk_check(self, planned: GgufWriteResult, snap: Snapshot | None) -> Check:
        """The output against the budget: what stays free after it must cover the reserve."""
        free = planned.free
        if snap is not None and snap.disks:
            budget_free = disk_budget(self.config, snap).free
            free = budget_free if free is None else min(free, budget_free)
        reserve = int(self.config.budget.reserve_gb * GB)
        if free is None:
            return Check("warning", f"writes {units.size(planned.bytes)}: the free disk could not be read")
        left = free - planned.bytes
        if left < reserve:
            return Check("error", f"writes {units.size(planned.bytes)} with {units.size(free)} free: "
                                  f"{units.size(left)} would be left, under the reserve of {units.size(reserve)}")
        return Check("ok", f"writes {units.size(planned.bytes)}; {units.size(left)} of {units.size(free)} free "
                           f"stays free")

    async def gguf(self, request: Mapping) -> ActionOutcome:
        return await self.confirm_and_run(await self.plan_gguf(request))

    async def _stage_snapshot(self) -> Snapshot | None:
        return await self._snapshot(artifacts=[(a.name, a.path) for a in self.config.artifacts]
                                    + poison_artifacts(self.config))

    # ------------------------------------------------------------ plan, confirm, run

    async def fire(self, stage_name: str) -> ActionOutcome:
        return await self.confirm_and_run(await self.plan_fire(stage_name))

    async def restart(self, stage_name: str, *, clear: Sequence[str] = (), grace: float = 10.0) -> ActionOutcome:
        return await self.confirm_and_run(await self.plan_restart(stage_name, clear=clear, grace=grace))

    async def resume(self, stage_name: str, checkpoint: str | None = None, *, grace: float = 10.0) -> ActionOutcome:
        return await self.confirm_and_run(await self.plan_resume(stage_name, checkpoint, grace=grace))

    async def stop(self, stage_name: str, *, grace: float = 10.0) -> ActionOutcome:
        return await self.confirm_and_run(self.plan_stop(stage_name, grace=grace))

    async def kill(self, pid: int, start_time: float, *, boot: Boot | None = None, signal: str = "TERM",
                   grace: float = 5.0, group: bool = False) -> ActionOutcome:
        plan = await self.plan_kill(pid, start_time, boot=boot, signal=signal, grace=grace, group=group)
        return await self.confirm_and_run(plan)

    async def clean(self, paths: Sequence[str], *, why: str = "", sizes: Mapping[str, int] | None = None
                    ) -> ActionOutcome:
        return await self.confirm_and_run(self.plan_clean(paths, why=why, sizes=sizes))

    async def prune(self, stage_name: str, keep: int = PRUNE_KEEP) -> ActionOutcome:
        return await self.confirm_and_run(await self.plan_prune(stage_name, keep))

    async def confirm_and_run(self, plan: ActionPlan) -> ActionOutcome:
        """Ask the front end about this plan (unless it is refused anyway), then run it."""
        refused = self.refusal(plan)
        if refused:
            return refused
        return await self.run(plan, await self.confirm(plan))

    def refusal(self, plan: ActionPlan) -> ActionOutcome | None:
        """Why the plan cannot run whatever the operator says (asked before asking them)."""
        if self.readonly:
            return ActionOutcome(False, "refused", f"{plan.action} refused: the console is read-only", plan)
        try:
            self.audit.ensure_writable()
        except AuditError as e:
            return ActionOutcome(False, "refused", f"{plan.action} refused: {e}", plan)
        return None

    async def run(self, plan: ActionPlan, decision: Decision) -> ActionOutcome:
        """Carry out exactly this plan, as decided."""
        if self.readonly:
            return ActionOutcome(False, "refused", f"{plan.action} refused: the console is read-only", plan)
        if not isinstance(decision, Decision) or decision.plan != plan:
            return ActionOutcome(False, "refused", f"{plan.action} {plan.subject} refused: the confirmation was "
                                 "not given for this plan", plan)
        why_not = _mismatch(plan, decision)
        if why_not:
            self._declined(plan, decision, why_not)
            return ActionOutcome(False, "refused", f"{plan.action} {plan.subject} refused: {why_not}", plan)
        if decision.verdict == "declined":
            self._declined(plan, decision, decision.how)
            reason = f": {decision.how}" if decision.how else ""
            return ActionOutcome(False, "cancelled", f"{plan.action} {plan.subject}: not run{reason}", plan)
        try:
            audit_id = self.audit.intent(**self._entry(plan, decision), **plan.intent_fields())
        except AuditError as e:
            return ActionOutcome(False, "refused", f"{plan.action} refused: {e}", plan)
        started = time.time()
        try:
            result = await plan.execute(self, decision, audit_id)
        except (BoxError, TransportError) as e:
            # Never run it again blindly: look at the box and say what actually happened.
            seen = await self._what_happened(plan, started)
            outcome = ActionOutcome(False, "failed", f"{plan.action} {plan.subject}: {e}; {seen}", plan,
                                    audit_id=audit_id)
            return self._write_outcome(plan, decision, audit_id, outcome, "error")
        outcome = _outcome(plan, result)
        return self._write_outcome(plan, decision, audit_id,
                                   ActionOutcome(outcome.ok, outcome.status, outcome.message, plan, result, audit_id),
                                   outcome.status)

    async def _gguf_write(self, plan: GgufPlan) -> GgufWriteResult:
        """The box writes and asserts; on a local target gguf-py's reader reads OUT as well."""
        request = json.loads(plan.gguf_request)
        if "pin" not in request:  # an override passes the disk budget, never the box's own refusal
            return GgufWriteResult(False, str(request.get("op")), str(request.get("out")),
                                   error="the box refused to plan it, so nothing was planned to write")
        timeout = max(self.box.timeout, 60.0) + GGUF_SECONDS_PER_GB * plan.gguf_bytes / GB
        result = await self.box.gguf_write(request, timeout=timeout)
        if not (result.ok and self.config.target.is_local):
            return result  # a remote box has no gguf-py (its tools are stdlib only)
        return await _read_by_gguf_py(self.box, result, posixpath.join(self.config.workspace, result.out))

    async def _launch(self, stage: str | None, chain: str, log: str, env: Sequence[tuple[str, str]] = ()) -> FireResult:
        return await self.box.fire(stage or "", chain, log, env=dict(env))

    async def _clear_ports(self, plan: LaunchPlan, decision: Decision, parent: str) -> FireResult | None:
        """Stop each listener the plan lists, identity-checked, one audited kill each.
        A failure (reported as the fire's result) means the stage is not fired."""
        stage = plan.stage or ""
        for h in plan.holders:
            kill = KillPlan(target=plan.target, subject=f"pid {h.pid} (holds port {h.port})",
                            command=f"SIGTERM to pid {h.pid}, SIGKILL after {PORT_GRACE_S:g} s",
                            details=(f"command {h.command}",), pid=h.pid, start_time=h.start_time,
                            signal="TERM", grace=PORT_GRACE_S, boot=plan.boot)
            entry = dict(self._entry(kill, decision), parent=parent)
            try:
                kill_id = self.audit.intent(**entry, **kill.intent_fields())
            except AuditError as e:
                return FireResult(False, "refused", stage, f"port {h.port}: pid {h.pid} not stopped: {e}")
            result = await self.box.kill(h.pid, h.start_time, boot=plan.boot, signal="TERM", grace=PORT_GRACE_S,
                                         protect=self._protect())
            done = _outcome(kill, result)
            try:
                self.audit.outcome(kill_id, **entry, result=done.status, message=done.message,
                                   **_signal_fields(result))
            except AuditError as e:
                return FireResult(False, "refused", stage, f"{done.message}; but {e}; the stage was not fired")
            if not done.ok:
                return FireResult(False, "refused", stage,
                                  f"port {h.port} not cleared: {done.message}; the stage was not fired")
        return None

    def _write_outcome(self, plan: ActionPlan, decision: Decision, audit_id: str, outcome: ActionOutcome,
                       status: str) -> ActionOutcome:
        result = outcome.result
        fields = self._entry(plan, decision)
        if isinstance(result, FireResult):
            fields.update(pid=result.pid, start_time=result.start_time)
        try:
            self.audit.outcome(audit_id, **fields, result=status, message=outcome.message,
                               **_signal_fields(result))
        except AuditError as e:  # the action happened (its intent is logged); say loudly its outcome is not
            return ActionOutcome(False, "failed", f"{outcome.message}; but {e}", plan, result, audit_id)
        return outcome

    def _declined(self, plan: ActionPlan, decision: Decision, why: str) -> None:
        try:
            self.audit.outcome(None, **dict(self._entry(plan, decision), confirmation="declined"),
                               result="cancelled", message=why)
        except AuditError:
            pass  # nothing ran: there is nothing the log must hold

    async def _what_happened(self, plan: ActionPlan, started: float) -> str:
        """After a call that broke half-way: read the box (reconnecting) and report its state."""
        try:
            snap = await self.box.snapshot()
        except (BoxError, TransportError) as e:
            return f"the box cannot be read either ({e}): check it before trying again"
        return plan.what_happened(snap, started)

    def _entry(self, plan: ActionPlan, decision: Decision) -> dict:
        pid, start_time = plan.audited_process()
        return dict(target=plan.target, action=plan.action, subject=plan.subject, command=plan.command,
                    pid=pid, start_time=start_time, confirmation=decision.confirmation,
                    via=decision.how, user=decision.actor)


# ------------------------------------------------------------------ helpers


def _mismatch(plan: ActionPlan, decision: Decision) -> str:
    """Why a decision cannot stand for this plan (empty: it can)."""
    if decision.verdict not in ("confirmed", "override", "declined"):
        return f"unknown decision {decision.verdict!r}"
    if decision.verdict == "confirmed" and plan.blocked:
        return "the preflight blocks it; it runs only with an explicit override (--force)"
    if decision.verdict == "override" and not plan.blocked:
        return "an override was given for a plan that is not blocked"
    return ""


def _signal_fields(result) -> dict:
    if isinstance(result, SignalResult):
        return {"signalled": list(result.signalled), "survivors": list(result.survivors),
                "remaining": list(getattr(result, "remaining", ()))}
    return {}


def _next_checkpoint_check(ck: Checkpoint, snap: Snapshot | None) -> tuple[Check, ...]:
    """The next checkpoint the resumed run writes is about the size of this one: room for it?"""
    disk = workspace_disk(snap) if snap else None
    if disk is None:
        return ()
    need = f"the next checkpoint needs about {units.size(ck.bytes)} (the size of {ck.name})"
    if disk.free < ck.bytes:
        return (Check("error", f"{need}, and the workspace has {units.size(disk.free)} free"),)
    return (Check("ok", f"{need}; {units.size(disk.free)} free"),)


def _port_holders(stage: Stage, snap: Snapshot) -> tuple[PortHolder, ...]:
    """The visible processes listening on the stage's ports, but not the stage's own (a fire of a
    running stage is refused by the box; a restart stops them with the stage)."""
    rec = snap.state(stage.name)
    own = set(rec.group) | {rec.pid} if rec and rec.alive else set()
    found: dict[int, PortHolder] = {}
    for port in stage.ports:
        for s in snap.listeners:
            proc = snap.process(s.pid) if s.port == port and s.pid else None
            if proc is not None and proc.pid not in own and proc.pid not in found:
                found[proc.pid] = PortHolder(port, proc.pid, proc.start_time, proc.command)
    return tuple(found.values())


def needed_artifact_checks(config: Config, paths: Sequence[str], by: str | None = None) -> tuple[Check, ...]:
    """An error check for each path whose deletion takes a declared artifact that another stage
    needs (restart train clears final/: merge's adapter). Intermediates are declared deletable."""
    def norm(path: str) -> str:
        return posixpath.normpath(path if path.startswith("/") else posixpath.join(config.workspace, path))

    def overlap(a: str, b: str) -> bool:
        return a == b or a.startswith(b.rstrip("/") + "/") or b.startswith(a.rstrip("/") + "/")

    checks = []
    for path in paths:
        for art in config.artifacts:
            if art.intermediate or not overlap(norm(path), norm(art.path)):
                continue
            users = [s.name for s in config.stages if art.name in s.needs and s.name != by]
            if users:
                checks.append(Check("error", f"deletes {path}: the {art.name} artifact, which stage "
                                    f"{' and '.join(users)} needs"))
    return tuple(checks)


def user_name() -> str:
    """This console's user, by name: $USER, else the account's name (cron and systemd set no
    $USER; a bare uid names nobody), its uid only where the account has no name."""
    import getpass

    try:
        return os.environ.get("USER") or getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())


def me() -> str:
    """This console's user@host: who acts, acknowledges or watches."""
    import getpass
    import socket

    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"


def operator(action: str, by: str = "") -> str:
    """Who stops a run, as its cause of death says: this console's user@host (or `by`, who
    decided: a watcher), and how (stop, restart, resume)."""
    return f"{by or me()} ({action})"


def _alive(snap: Snapshot, stage: str) -> bool:
    rec = snap.state(stage)
    return rec is not None and rec.alive


def _runs_python(stage: Stage, python: str) -> bool:
    """Whether the stage's command runs that interpreter (pip would pull files from under it)."""
    return python in (command_words(stage.command) or ())


def _holder_lines(holders: Sequence[PortHolder]) -> list[str]:
    """Each holder with its whole command and a readable start time: the operator decides on them."""
    now = time.time()
    return [f"first stops pid {h.pid} (holds port {h.port}, started {started_text(h.start_time, now)}): SIGTERM, "
            f"SIGKILL after {PORT_GRACE_S:g} s, identity-checked: {shown_command(h.command)}" for h in holders]


def _about_own_listener(check: Check, own: set[int]) -> bool:
    return check.severity == "error" and any(f"held by pid {pid} " in check.text + " " for pid in own)


def _when(start_time: float) -> str:
    return units.local_time(start_time, "%Y-%m-%d %H:%M:%S")


def kill_plans(target: str, snap: Snapshot | None, pid: int, start_time: float, boot: Boot | None,
               grace: float) -> tuple[KillPlan, ...]:
    """This process alone, then its whole group; each with TERM, then KILL."""
    return tuple(_kill_plan(target, snap, pid, start_time, boot, signal, grace, group)
                 for group in (False, True) for signal in ("TERM", "KILL"))


def _kill_plan(target: str, snap: Snapshot | None, pid: int, start_time: float, boot: Boot | None, signal: str,
               grace: float, group: bool) -> KillPlan:
    then = f", SIGKILL after {grace:g} s" if signal != "KILL" else ""
    # Another process with that pid now: the box will refuse, the plan shows nothing of it.
    proc = snap.same_process(pid, start_time) if snap else None
    details = [f"start time {_when(start_time)} ({start_time:.2f}); identity re-checked on the box before the signal"]
    if proc is not None:
        details[:0] = [f"user {proc.user}", f"command {proc.command}"]
    if not group:
        children = [p.pid for p in snap.processes if p.ppid == pid] if snap and proc else []
        details.append(f"children (not signalled) {children}" if children else "no children")
        return KillPlan(target=target, subject=f"pid {pid}", command=f"SIG{signal} to pid {pid}{then}",
                        details=tuple(details), pid=pid, start_time=start_time, signal=signal, grace=grace,
                        boot=boot)
    if proc is None or snap is None:
        what, members = f"the process group of pid {pid}", []
    else:
        members = [p for p in snap.processes if p.pgid == proc.pgid]
        what = f"process group {proc.pgid} ({len(members)} process{'es' if len(members) != 1 else ''})"
    details += [f"  {m.pid} {m.user} {m.command[:120]}" for m in members[:SHOWN_MEMBERS]]
    if len(members) > SHOWN_MEMBERS:
        details.append(f"  … and {len(members) - SHOWN_MEMBERS} more")
    return KillPlan(target=target, subject=f"pid {pid} and its group",
                    command=f"SIG{signal} to {what}{then}", details=tuple(details), pid=pid,
                    start_time=start_time, signal=signal, grace=grace, group=True, boot=boot)


def gguf_command(request: Mapping) -> str:
    """The surgery as the command line writes it: what the confirmation shows and the audit keeps."""
    op = str(request.get("op"))
    words = ["gguf", op.replace("_", "-"), str(request.get("path"))]
    words += [f"{k}={v}" for k, v in (request.get("set") or {}).items()]
    types = sorted({str(t) for t in (request.get("types") or {}).values()})
    words += [w for t in types for w in ("--type", t)]
    if request.get("donor"):
        words += ["--from", str(request["donor"])]
    if request.get("tensors"):
        words += ["--tensor", *map(str, request["tensors"])]
    words += ["--out", str(request.get("out"))]
    for key in ("expect_tensors", "expect_last"):
        if request.get(key) is not None:
            words += ["--" + key.replace("_", "-"), str(request[key])]
    words += [w for host in request.get("redirect_hosts") or () for w in ("--allow-redirect", str(host))]
    return " ".join(shlex.quote(w) for w in words)


GGUF_NAMES = (("path", "the input PATH"), ("out", "--out"), ("donor", "--from"), ("expect_last", "--expect-last"))


def gguf_usage_problem(request: Mapping) -> str | None:
    """What makes a surgery request unusable as given (an empty name, a folder for OUT, a
    negative count), said as the command line's options; None when there is nothing."""
    required = {"path", "out"} | ({"donor"} if request.get("op") == "add_tensors" else set())
    for key, option in GGUF_NAMES:
        value = request.get(key)
        if (value is not None or key in required) and not (isinstance(value, str) and value.strip()):
            return f"{option} is empty: it must name {'a tensor' if key == 'expect_last' else 'a file'}"
    if str(request["out"]).endswith("/"):
        return f"--out {request['out']} names a folder: OUT is the new file's name"
    names = request.get("tensors") if request.get("op") != "set_kv" else ["-"]
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
        return "--tensor takes tensor names, and a name is empty"
    if not all(isinstance(k, str) and k for k in request.get("set") or {}):
        return "KEY=VALUE with an empty KEY"
    expected = request.get("expect_tensors")
    if expected is not None and (type(expected) is not int or expected < 0):
        return f"--expect-tensors {expected} is not a tensor count (0 or more)"
    hosts = request.get("redirect_hosts") or []
    if not isinstance(hosts, list) or not all(isinstance(h, str) and h.strip() for h in hosts):
        return "--allow-redirect takes a host name, and one is empty"
    return None


def _gguf_details(request: Mapping, planned: GgufWriteResult, workspace: str) -> tuple[str, ...]:
    lines = [f"input {request.get('path')}"]
    if request.get("donor"):
        lines.append(f"donor {request['donor']}" + (f" ({units.size(planned.donor_size)})"
                                                    if planned.donor_size is not None else ""))
    lines.append(f"output {request.get('out')} (written as .part, asserted, then renamed; inside {workspace} only)")
    if planned.ok:
        lines.append(f"{units.size(planned.bytes)} ({planned.bytes} bytes), {planned.tensors} tensors, "
                     f"last {planned.last_tensor}")
    if planned.added:
        shown = ", ".join(planned.added[:SHOWN_MEMBERS]) + (" ..." if len(planned.added) > SHOWN_MEMBERS else "")
        lines.append(f"tensors {'extracted' if request.get('op') == 'extract' else 'added'}: {shown}")
    return tuple(lines)


async def _read_by_gguf_py(box: Box, result: GgufWriteResult, path: str) -> GgufWriteResult:
    """The issue's last assertion, where OUT is on this machine: gguf-py's GGUFReader reads it whole."""
    from samai.console.core.checks import Unreadable, check_gguf  # gguf-py: only for a write that needs it
    from samai.remote.box import gguf_check

    try:
        checked = await check_gguf(box, path, expect_tensors=result.tensors, expect_last=result.last_tensor,
                                   local=True, deep=True)
        # A projector's keys are check gguf's matter, not the reader's: surgery may be what fixes them.
        failed = [f"{p.code}: {p.message}" for p in checked.problems
                  if p.severity == "error" and p.code not in gguf_check.PROJECTOR_CODES]
    except Unreadable as e:
        failed = [str(e)]
    detail = "; ".join(failed) or f"GGUFReader reads {result.tensors} tensors, the last {result.last_tensor}"
    read = GgufAssertion("gguf_py", not failed, detail)
    error = f"OUT was written, but gguf-py's reader refuses it: {detail}" if failed else None
    return replace(result, ok=not failed, assertions=(*result.assertions, read), error=error)


def _gguf_outcome(plan: ActionPlan, result: GgufWriteResult) -> ActionOutcome:
    if result.ok:
        msg = (f"wrote {result.out}: {units.size(result.bytes)}, {result.tensors} tensors, last {result.last_tensor}"
               f"; assertions held: {', '.join(a.name for a in result.assertions)}")
        if result.fetched:
            msg += f"; {units.size(result.fetched)} fetched from the donor"
        return ActionOutcome(True, "done", msg, plan, result)
    status: OutcomeStatus = "failed" if result.assertions else "refused"  # refused: nothing was written
    return ActionOutcome(False, status, f"gguf {result.op} -> {result.out} {status}: {result.error}", plan, result)


def _outcome(plan: ActionPlan, result: Result) -> ActionOutcome:
    if isinstance(result, GgufWriteResult):
        return _gguf_outcome(plan, result)
    if isinstance(result, CleanResult):
        msg = f"removed {len(result.removed)} path(s), {units.size(result.freed)} freed"
        if result.refused:
            msg += "; refused: " + "; ".join(f"{p} ({why})" for p, why in result.refused)
        return ActionOutcome(result.ok, "done" if result.ok else "refused", msg, plan, result)
    if isinstance(result, FireResult):
        if result.state == "running":
            msg = f"fired stage {result.stage}: pid {result.pid} verified running, log {result.log}"
        elif result.state == "done":
            msg = f"stage {result.stage} finished at once with rc=0, log {result.log}"
        else:
            msg = f"stage {result.stage} {result.state}: {result.reason}"
        return ActionOutcome(result.ok, "done" if result.ok else "failed", msg, plan, result)
    if result.result == "refused":
        return ActionOutcome(False, "refused", f"{plan.action} {plan.subject} refused: {result.reason}", plan, result)
    what = {"exited": "exited after the signal", "killed": "killed (SIGKILL)", "gone": "was not running",
            "failed": "did not end"}
    msg = f"{plan.subject} {what.get(result.result, result.result)}"
    if result.survivors:
        msg += f"; still alive: {', '.join(map(str, result.survivors))}"
    if result.remaining:  # not asked to end: the children or group of a process killed alone
        msg += f"; its children or group still running: {', '.join(map(str, result.remaining))}"
    return ActionOutcome(result.ok, "done" if result.ok else "failed", msg, plan, result)
