"""The box screen's keys that change the box, each through the action layer
(samai.console.core.actions: read-only check, the confirm dialog with the exact command, the
identity re-check, the audit line): fire, stop, restart, resume, prune, kill, clean, fix,
uninstall, acknowledge, GGUF surgery, and a multi-node stage on every node at once. The screen
runs each in its one action worker (one at a time: BoxScreen.act)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from samai.console.core import units
from samai.remote.errors import BoxError
from samai.remote.transport import TransportError
from samai.widgets.processes import ProcessPane

if TYPE_CHECKING:
    from samai.console.core.actions import ActionOutcome
    from samai.console.screens.box_base import BoxScreenBase
    from samai.console.screens.gguf import GgufScreen
    from samai.remote.model import GgufKv, Process

KILL_GRACE_S = 5.0
STOP_GRACE_S = 10.0


class BoxActions:
    def __init__(self, screen: BoxScreenBase) -> None:
        self.screen = screen

    def _notify(self, text: str, **kw) -> None:
        self.screen.notify(text, markup=False, **kw)  # names boxes, stages, paths: never markup

    async def fire(self, stage: str) -> None:
        """A stage's key: fire it, or, while it runs, restart it (its own dialog says so)."""
        screen = self.screen
        if screen.multi_node(stage):
            return await self._on_every_node("fire", stage)
        actions = screen.actions()
        snap = screen.state.snapshot
        rec = snap.state(stage) if snap else None
        if rec is not None and rec.alive:
            pre = screen.state.preflight(stage)
            plan = await actions.plan_restart(stage, clear=pre.poison if pre else (), grace=STOP_GRACE_S)
            first = f"stage {stage} is running (pid {rec.pid}): its key restarts it: stop, then fire again"
            outcome = await actions.confirm_and_run(replace(plan, details=(first, *plan.details)))
        else:
            outcome = await actions.fire(stage)
        screen.say_outcome(outcome)
        if outcome.status == "failed":  # a toast fades: the failure stays in the alerts pane
            await self._alert_failed_fire(outcome)
        screen.logs.open_stage_log(stage)

    async def _alert_failed_fire(self, outcome: ActionOutcome) -> None:
        from samai.console.core.alertbook import FIRE_FAILED, run_error

        # The stage's own last words, not the chain's bookkeeping around them.
        tail = [line[:200] for line in getattr(outcome.result, "stage_tail", ())]
        text = " · ".join([outcome.message, *tail[-2:]])
        stage, now = outcome.plan.stage or "", self.screen.clock()
        alert = run_error(now, text, stage, await self._run_fired(outcome), FIRE_FAILED)
        self.screen.show_beside_poll(self.screen.state.raise_alert(alert, now))

    async def _run_fired(self, outcome: ActionOutcome) -> float | None:
        """The run (fired_at) a fire launched: its alert belongs to it and resolves with the next run."""
        pid, box = getattr(outcome.result, "pid", None), self.screen.box
        try:
            rec = (await box.snapshot()).state(outcome.plan.stage or "") if pid and box else None
        except (BoxError, TransportError):
            return None
        return rec.fired_at if rec and rec.pid == pid else None

    async def stop(self, stage: str | None) -> None:
        stage = stage or self.screen.shown_stage
        if stage and self.screen.multi_node(stage):
            await self._on_every_node("stop", stage)
        elif stage:
            self.screen.say_outcome(await self.screen.actions().stop(stage, grace=STOP_GRACE_S))

    async def resume(self, stage: str) -> None:
        """A dead training run, continued from its newest fit checkpoint; with none, why not."""
        from samai.console.core.training.resume import NothingToResume

        try:
            self.screen.say_outcome(await self.screen.actions().resume(stage, grace=STOP_GRACE_S))
        except NothingToResume as e:
            self._notify(f"{e}; r restarts {stage} from step 0", title="nothing to resume from", severity="warning",
                         timeout=12)

    async def prune(self, stage: str) -> None:
        """A training run's older checkpoints deleted (the newest few and the resume's kept)."""
        from samai.console.core.training.resume import NothingToPrune

        try:
            self.screen.say_outcome(await self.screen.actions().prune(stage))
        except NothingToPrune as e:
            self._notify(str(e), title="nothing to prune", severity="warning", timeout=12)

    async def restart(self, stage: str | None) -> None:
        stage = stage or self.screen.shown_stage
        pre = self.screen.state.preflight(stage) if stage else None
        if stage:
            self.screen.say_outcome(await self.screen.actions().restart(stage, clear=pre.poison if pre else (),
                                                                        grace=STOP_GRACE_S))

    def fix(self) -> None:
        """The newest active alert's suggested action, through that action's own confirmation."""
        alerts = self.screen.state.alerts
        alert = next((a for a in alerts if a.action and a.active), None)
        if alert is not None and alert.action is not None:
            method, args = alert.action.call  # its kind's method on the screen (fixes.FIXES)
            getattr(self.screen, method)(*args)
            return
        resolved = next((a for a in alerts if a.action), None)
        if resolved is not None and resolved.resolved_at is not None:
            when = units.local_time(resolved.resolved_at)
            self._notify(f"already resolved at {when}: {self.screen.named(resolved).text}", severity="information")
        else:
            self._notify("no alert with a suggested action", severity="information")

    def process(self, pid: int, start_time: float) -> Process | None:
        """An alert's process, while it is that process (its pid not taken by another since)."""
        snap = self.screen.state.snapshot
        proc = snap.same_process(pid, start_time) if snap else None
        if proc is None:
            self._notify(f"pid {pid} is gone or is another process now", severity="warning")
        return proc

    async def uninstall(self, python: str, package: str) -> None:
        """A package removed from a training environment (the §9 fix), then the environments read again."""
        from samai.console.core.feeds.environments import EnvironmentsFeed

        self.screen.say_outcome(await self.screen.actions().uninstall(python, package))
        self.screen.session.read_again(EnvironmentsFeed, self.screen.report, self.screen.read_bug)

    async def kill(self, process: Process | None) -> None:
        from samai.console.core.actions import Decision
        from samai.console.screens.dialogs import KillDialog  # each dialog's module is imported when one opens

        screen = self.screen
        process = process or screen.query_one(ProcessPane).selected()
        snap = screen.state.snapshot
        if process is None or snap is None:
            self._notify("select a process in the processes pane first", severity="warning")
            return
        # The layer plans first (this process or its group, TERM or KILL); the dialog shows those
        # plans and returns the one chosen; that plan, and nothing rebuilt after it, is what runs.
        actions = screen.actions()
        plans = await actions.kill_choices(process.pid, process.start_time, boot=snap.boot, grace=KILL_GRACE_S)
        refused = actions.refusal(plans[0])
        if refused:
            screen.say_outcome(refused)
            return
        chosen = await screen.app.push_screen_wait(KillDialog(process, plans))
        if chosen is None:
            screen.say_outcome(await actions.run(plans[0], Decision.declined(plans[0], "cancelled in the dialog")))
            return
        screen.say_outcome(await actions.run(chosen, Decision.confirmed(chosen, "dialog")))

    async def clean(self) -> None:
        from samai.console.core.disk.budget import (
            disk_budget,  # the poll's modules: loaded with it, after the first paint
        )

        snap = self.screen.state.snapshot
        if snap is None:
            return
        reclaimable = [a for a in disk_budget(self.screen.config, snap).artifacts if a.reclaimable]
        if not reclaimable:
            self._notify("nothing is reclaimable now", severity="information")
            return
        why = "reclaimable intermediates: " + ", ".join(a.name for a in reclaimable)
        sizes = {a.path: a.actual for a in reclaimable if a.actual is not None}
        self.screen.say_outcome(await self.screen.actions().clean([a.path for a in reclaimable], why=why,
                                                                  sizes=sizes))

    async def acknowledge(self) -> None:
        """Every active alert acknowledged on the box: no watcher of it repeats them (audited)."""
        from samai.console.core.feeds.watchers import WatchersFeed
        from samai.console.core.watch.policy import alert_identity

        active = self.screen.state.active_alerts()
        if not active:
            self._notify("no active alert to acknowledge", severity="information")
            return
        texts = {alert_identity(a): a.text[:300] for a in active}
        ok, message = await self.screen.actions().acknowledge(list(texts), texts)
        self._notify(message, severity="information" if ok else "error")
        if ok:
            self.screen.session.read_again(WatchersFeed, self.screen.report, self.screen.read_bug)

    # ------------------------------------------------------------ a GGUF file: surgery on it

    async def gguf_set_kv(self, view: GgufScreen, kv: GgufKv) -> None:
        from samai.console.screens.gguf_dialogs import SetKvDialog

        form = await self.screen.app.push_screen_wait(SetKvDialog(view.path, kv.key, kv.type, kv.value))
        if form is not None:
            await self._gguf_surgery(form.request())

    async def gguf_add_tensors(self, view: GgufScreen) -> None:
        from samai.console.screens.gguf_dialogs import AddTensorsDialog

        form = await self.screen.app.push_screen_wait(AddTensorsDialog(view.path))
        if form is not None:
            await self._gguf_surgery(form.request())

    async def _gguf_surgery(self, request: dict) -> None:
        """Through the action layer: its plan (what is written where, the disk it needs) confirmed
        in the usual dialog, refused read-only or over the disk budget, audited."""
        try:
            outcome = await self.screen.actions().gguf(request)
        except (BoxError, TransportError, ValueError) as e:  # the box could not even plan it
            self._notify(f"gguf {request.get('op')}: {e}", severity="error", timeout=15)
            return
        self.screen.say_outcome(outcome)

    # ------------------------------------------------------------ multi-node stages: every node at once

    async def _on_every_node(self, what: str, stage: str) -> None:
        """Fire or stop a multi-node stage: one dialog over every node's box and command."""
        from samai.console.core.multinode import MultiNodeError

        multi = self.screen.context.nodes().actions()
        try:
            outcome = await (multi.fire(stage) if what == "fire" else multi.stop_all(stage, grace=STOP_GRACE_S))
        except MultiNodeError as e:
            self._notify(str(e), severity="error")
            return
        self._notify(outcome.message, severity="information" if outcome.ok else "error")
