"""The one way to change the box: fire, stop and kill go through here and nowhere else.

Each action is planned (the exact command and target), refused in read-only mode or when
the audit log cannot be written, confirmed by whoever drives the console (the CLI's
prompt or --yes, the TUI's dialog), carried out by the Box (which re-checks the process's
identity right before signalling) and written to the audit log.
"""

from __future__ import annotations

import os
import shlex
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import psutil

from samai.console import units
from samai.console.audit import AuditError, AuditLog
from samai.console.config import Config, Stage
from samai.console.preflight import Check, Preflight, poison_artifacts, preflight
from samai.remote.boxapi import Box, BoxError
from samai.remote.model import Boot, CleanResult, FireResult, SignalResult
from samai.remote.transport import TransportError


class UnknownStage(ValueError):
    def __init__(self, name: str, config: Config) -> None:
        known = ", ".join(s.name for s in config.stages) or "none"
        super().__init__(f"unknown stage {name!r} (stages in {config.source}: {known})")


@dataclass(frozen=True)
class ActionPlan:
    action: str  # fire | stop | kill | restart | clean
    target: str
    subject: str
    command: str  # the exact command, or the signal and what receives it
    details: tuple[str, ...] = ()
    pid: int | None = None
    start_time: float | None = None
    checks: tuple[Check, ...] = ()  # the preflight of a fire or restart

    @property
    def blocked(self) -> bool:
        """The preflight found an error: only an explicit override may go ahead."""
        return any(c.severity == "error" for c in self.checks)


# Given the plan, says how it was confirmed ("--yes", "prompt", "dialog"; "override" for a
# blocked plan that the operator chose to run anyway), or None to decline.
Confirm = Callable[[ActionPlan], Awaitable[str | None]]


@dataclass(frozen=True)
class ActionOutcome:
    ok: bool
    status: str  # done | refused | cancelled | failed
    message: str
    plan: ActionPlan
    result: FireResult | SignalResult | CleanResult | None = None


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

    # ------------------------------------------------------------ the actions

    async def _preflight(self, stage: Stage) -> Preflight | None:
        try:
            snap = await self.box.snapshot(artifacts=[(a.name, a.path) for a in self.config.artifacts]
                                           + poison_artifacts(self.config))
        except (BoxError, TransportError):
            return None  # the fire itself will say what is wrong with the box
        return preflight(self.config, snap, stage)

    async def fire(self, stage_name: str) -> ActionOutcome:
        stage = self._stage(stage_name)
        pre = await self._preflight(stage)
        plan = ActionPlan(
            action="fire",
            target=self.config.target.url,
            subject=f"stage {stage.name}",
            command=stage.command,
            details=(f"workspace {self.config.workspace}", f"log {stage.log}",
                     *(f"env {k}={v}" for k, v in stage.env)),
            checks=pre.checks if pre else (),
        )
        return await self._carry_out(plan, lambda: self.box.fire(stage.name, stage.command, stage.log,
                                                                  env=dict(stage.env)))

    async def stop(self, stage_name: str, *, grace: float = 10.0) -> ActionOutcome:
        stage = self._stage(stage_name)
        plan = ActionPlan(
            action="stop",
            target=self.config.target.url,
            subject=f"stage {stage.name}",
            command=f"SIGTERM to the process group of stage {stage.name}, SIGKILL after {grace:g} s",
        )
        return await self._carry_out(plan, lambda: self.box.stop(stage.name, grace=grace, protect=self._protect()))

    async def kill(self, pid: int, start_time: float, *, boot: Boot | None = None, signal: str = "TERM",
                   grace: float = 5.0) -> ActionOutcome:
        signal = signal.upper()
        then = f", SIGKILL after {grace:g} s" if signal != "KILL" else ""
        details: tuple[str, ...] = (f"start time {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(start_time))}",)
        try:
            snap = await self.box.snapshot()
            proc = snap.process(pid)
            if proc is not None:
                children = [p.pid for p in snap.processes if p.ppid == pid]
                details = (f"user {proc.user}", *details, f"command {proc.command}",
                           f"children (not signalled) {children}" if children else "no children")
        except (BoxError, TransportError):
            pass  # the plan is still exact; the identity check happens on the box regardless
        plan = ActionPlan(
            action="kill",
            target=self.config.target.url,
            subject=f"pid {pid}",
            command=f"SIG{signal} to pid {pid}{then}",
            details=details,
            pid=pid,
            start_time=start_time,
        )
        return await self._carry_out(plan, lambda: self.box.kill(pid, start_time, boot=boot, signal=signal,
                                                                  grace=grace, protect=self._protect()))

    async def clean(self, paths: Sequence[str], *, why: str = "") -> ActionOutcome:
        plan = ActionPlan(
            action="clean",
            target=self.config.target.url,
            subject=why or f"{len(paths)} path(s) in the workspace",
            command="rm -rf -- " + " ".join(shlex.quote(p) for p in paths),
            details=(f"inside {self.config.workspace} only; anything resolving outside it is refused",),
        )
        return await self._carry_out(plan, lambda: self.box.remove(paths))

    async def restart(self, stage_name: str, *, clear: Sequence[str] = (), grace: float = 10.0) -> ActionOutcome:
        """Stop the stage if it runs, delete the given poison files, fire it again: one confirmation."""
        stage = self._stage(stage_name)
        steps = [f"stop: SIGTERM to the group of stage {stage.name}, SIGKILL after {grace:g} s"]
        if clear:
            steps.append("clean: rm -rf -- " + " ".join(shlex.quote(p) for p in clear))
        steps.append(f"fire: {stage.command}")
        pre = await self._preflight(stage)
        checks = tuple(c for c in pre.checks if "already running" not in c.text) if pre else ()
        plan = ActionPlan(action="restart", target=self.config.target.url, subject=f"stage {stage.name}",
                          command="; ".join(steps), details=(f"workspace {self.config.workspace}",), checks=checks)

        async def run() -> FireResult:
            stopped = await self.box.stop(stage.name, grace=grace, protect=self._protect())
            if not stopped.ok:
                return FireResult(False, "refused", stage.name, f"stop failed: {stopped.reason}")
            if clear:
                cleaned = await self.box.remove(clear)
                if not cleaned.ok:
                    return FireResult(False, "refused", stage.name, f"clean refused: {cleaned.refused}")
            return await self.box.fire(stage.name, stage.command, stage.log, env=dict(stage.env))

        return await self._carry_out(plan, run)

    # ------------------------------------------------------------ the layer

    async def _carry_out(self, plan: ActionPlan,
                         run: Callable[[], Awaitable[FireResult | SignalResult | CleanResult]]) -> ActionOutcome:
        if self.readonly:
            return ActionOutcome(False, "refused", f"{plan.action} refused: the console is read-only", plan)
        try:
            self.audit.ensure_writable()
        except AuditError as e:
            return ActionOutcome(False, "refused", f"{plan.action} refused: {e}", plan)
        how = await self.confirm(plan)
        if how and plan.blocked and how != "override":
            how = None  # a blocked plan needs the override, not just a yes
        if not how:
            self._audit(plan, "declined", "cancelled", "")
            return ActionOutcome(False, "cancelled", f"{plan.action} {plan.subject}: cancelled", plan)
        started = time.time()
        try:
            result = await run()
        except (BoxError, TransportError) as e:
            # Never run it again blindly: look at the box and say what actually happened.
            seen = await self._what_happened(plan, started)
            message = f"{plan.action} {plan.subject}: {e}; {seen}"
            self._audit(plan, how, "error", message)
            return ActionOutcome(False, "failed", message, plan)
        outcome = _outcome(plan, result)
        try:
            self._audit(plan, how, outcome.status, outcome.message, result)
        except AuditError as e:  # the action happened; say loudly that its record did not
            return ActionOutcome(False, "failed", f"{outcome.message}; but {e}", plan, result)
        return outcome

    async def _what_happened(self, plan: ActionPlan, started: float) -> str:
        """After a call that broke half-way: read the box (reconnecting) and report its state."""
        try:
            snap = await self.box.snapshot()
        except (BoxError, TransportError) as e:
            return f"the box cannot be read either ({e}): check it before trying again"
        if plan.pid is not None:
            proc = snap.process(plan.pid)
            alive = proc is not None and abs(proc.start_time - (plan.start_time or 0)) < 0.011
            return f"pid {plan.pid} is {'still running' if alive else 'gone'}"
        rec = snap.state(plan.subject.removeprefix("stage "))
        if rec is None or rec.fired_at < started - 1:
            return "the box shows no new launch of it" if plan.action in ("fire", "restart") else \
                f"the stage is {rec.status if rec else 'idle'}"
        return f"the box shows it was fired: pid {rec.pid}, {rec.status}"

    def _audit(self, plan: ActionPlan, confirmation: str, status: str, message: str,
               result: FireResult | SignalResult | CleanResult | None = None) -> None:
        pid, start_time = plan.pid, plan.start_time
        if isinstance(result, FireResult):
            pid, start_time = result.pid, result.start_time
        self.audit.record(
            target=plan.target, action=plan.action, subject=plan.subject, command=plan.command,
            pid=pid, start_time=start_time, confirmation=confirmation, result=status, message=message,
            user=os.environ.get("USER") or str(os.getuid()),
        )


def _outcome(plan: ActionPlan, result: FireResult | SignalResult | CleanResult) -> ActionOutcome:
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
    what = {"exited": "exited after the signal", "killed": "killed (SIGKILL)", "gone": "was not running"}
    msg = f"{plan.subject} {what.get(result.result, result.result)}"
    if result.survivors:
        msg += f"; still alive: {', '.join(map(str, result.survivors))}"
    return ActionOutcome(result.ok, "done" if result.ok else "failed", msg, plan, result)
