"""The box screen's keys that change the box, each in its own worker and each through the action
layer (samai.console.core.actions): fire, stop, restart, kill, clean, fix, uninstall, GGUF
surgery; plus the reads an action or a pane asks for (the runs list, the disk's largest users,
the training environments, a finished eval's items) and the multi-node stages' watch."""

from __future__ import annotations

import asyncio
import functools
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from textual import work

from samai.console.core import units
from samai.console.screens.box_logs import LogKeys
from samai.remote.errors import BoxError
from samai.remote.safe_text import visible
from samai.remote.targets import TargetError
from samai.remote.transport import TransportError
from samai.widgets.curves import CurvesPane
from samai.widgets.disk import DiskPane
from samai.widgets.pane import inert
from samai.widgets.processes import ProcessPane

if TYPE_CHECKING:
    from samai.console.core.actions import ActionOutcome
    from samai.console.core.evalruns import EvalRun
    from samai.console.screens.gguf import GgufScreen
    from samai.remote.model import DiskUsers, GgufKv, Process

KILL_GRACE_S = 5.0
STOP_GRACE_S = 10.0
USERS_SHOWN = 12  # the largest users of the workspace the disk pane lists
USERS_EVERY_S = 30.0  # while it lists them: a walk of the whole workspace, so not every poll
USERS_BUDGET_S = 3.0  # the box stops a walk after this long (and says the sizes are partial)


def one_action_at_a_time(method: Any) -> Any:
    """Run an action in a worker, refusing a second while one is in flight: cancelling an action
    half-way would lose its result and its audit line, and queueing one stacks up surprises."""

    @functools.wraps(method)
    async def guarded(self: ActionKeys, *args: Any) -> None:
        if self._action_running:
            self.notify("another action is still running; wait for its result", severity="warning", markup=False)
            return
        self._action_running = True
        try:
            await method(self, *args)
        finally:
            self._action_running = False

    return work(guarded, group="action", exit_on_error=False)


class ActionKeys(LogKeys):
    _users_measured = 0.0  # when the workspace's largest users were last asked for
    _curve_shown: tuple | None = None  # the version of rank 0's curve on show (multi-node training)

    @one_action_at_a_time
    async def action_fire(self, stage: str) -> None:
        """A stage's key: fire it, or, while it runs, restart it (its own dialog says so)."""
        if self.multi_node(stage):
            return await self._on_every_node("fire", stage)
        actions = self._actions()
        snap = self.state.snapshot
        rec = snap.state(stage) if snap else None
        if rec is not None and rec.alive:
            pre = self.state.preflight(stage)
            plan = await actions.plan_restart(stage, clear=pre.poison if pre else (), grace=STOP_GRACE_S)
            first = f"stage {stage} is running (pid {rec.pid}): its key restarts it: stop, then fire again"
            outcome = await actions.confirm_and_run(replace(plan, details=(first, *plan.details)))
        else:
            outcome = await actions.fire(stage)
        self._report(outcome)
        if outcome.status == "failed":  # a toast fades: the failure stays in the alerts pane
            await self._alert_failed_fire(outcome)
        self.open_stage_log(stage)

    async def _alert_failed_fire(self, outcome: ActionOutcome) -> None:
        from samai.console.core.state import FIRE_FAILED, run_error

        # The stage's own last words, not the chain's bookkeeping around them.
        tail = [line[:200] for line in getattr(outcome.result, "stage_tail", ())]
        text = " · ".join([outcome.message, *tail[-2:]])
        stage = outcome.plan.stage or ""
        alert = run_error(self.clock(), text, stage, await self._run_fired(outcome), FIRE_FAILED)
        self.show_beside_poll(self.state.raise_alert(alert, self.clock()))

    async def _run_fired(self, outcome: ActionOutcome) -> float | None:
        """The run (fired_at) a fire launched: its alert belongs to it and resolves with the next run."""
        pid = getattr(outcome.result, "pid", None)
        try:
            rec = (await self.box.snapshot()).state(outcome.plan.stage or "") if pid and self.box else None
        except (BoxError, TransportError):
            return None
        return rec.fired_at if rec and rec.pid == pid else None

    @one_action_at_a_time
    async def action_stop(self, stage: str | None = None) -> None:
        stage = stage or self.state.shown_stage
        if stage and self.multi_node(stage):
            await self._on_every_node("stop", stage)
        elif stage:
            self._report(await self._actions().stop(stage, grace=STOP_GRACE_S))

    @one_action_at_a_time
    async def action_resume(self, stage: str) -> None:
        """A dead training run, continued from its newest fit checkpoint; with none, why not."""
        from samai.console.core.resume import NothingToResume

        try:
            self._report(await self._actions().resume(stage, grace=STOP_GRACE_S))
        except NothingToResume as e:  # names checkpoints: box text, never markup
            self.notify(f"{e}; r restarts {stage} from step 0", title="nothing to resume from", severity="warning",
                        timeout=12, markup=False)

    @one_action_at_a_time
    async def action_prune(self, stage: str) -> None:
        """A training run's older checkpoints deleted (the newest few and the resume's kept)."""
        from samai.console.core.resume import NothingToPrune

        try:
            self._report(await self._actions().prune(stage))
        except NothingToPrune as e:  # names checkpoints: box text, never markup
            self.notify(str(e), title="nothing to prune", severity="warning", timeout=12, markup=False)

    @one_action_at_a_time
    async def action_restart(self, stage: str | None = None) -> None:
        stage = stage or self.state.shown_stage
        pre = self.state.preflight(stage) if stage else None
        if stage:
            self._report(await self._actions().restart(stage, clear=pre.poison if pre else (), grace=STOP_GRACE_S))

    async def action_fix(self) -> None:
        """The newest active alert's suggested action, through that action's own confirmation."""
        alert = next((a for a in self.state.alerts if a.action and a.active), None)
        if alert is None or alert.action is None:
            self._no_fix()
            return
        method, args = alert.action.call  # its kind's method here (fixes.FIXES)
        getattr(self, method)(*args)

    def action_kill_pid(self, pid: int, start_time: float) -> None:
        """An alert's process, killed only while it is that process (its pid not taken by another since)."""
        snap = self.state.snapshot
        proc = snap.same_process(pid, start_time) if snap else None
        if proc is None:
            self.notify(f"pid {pid} is gone or is another process now", severity="warning", markup=False)
            return
        self.action_kill(proc)

    def _no_fix(self) -> None:
        resolved = next((a for a in self.state.alerts if a.action), None)
        if resolved is not None and resolved.resolved_at is not None:
            when = units.local_time(resolved.resolved_at)
            self.notify(f"already resolved at {when}: {self.named(resolved).text}", severity="information",
                        markup=False)
        else:
            self.notify("no alert with a suggested action", severity="information", markup=False)

    @one_action_at_a_time
    async def action_uninstall(self, python: str, package: str) -> None:
        """A package removed from a training environment (the §9 fix), then the environments read again."""
        self._report(await self._actions().uninstall(python, package))
        self.read_environments()

    @one_action_at_a_time
    async def action_kill(self, process: Process | None = None) -> None:
        from samai.console.core.actions import Decision  # see _actions
        from samai.console.screens.dialogs import KillDialog  # see confirm

        process = process or self.query_one(ProcessPane).selected()
        snap = self.state.snapshot
        if process is None or snap is None:
            self.notify("select a process in the processes pane first", severity="warning", markup=False)
            return
        # The layer plans first (this process or its group, TERM or KILL); the dialog shows those
        # plans and returns the one chosen; that plan, and nothing rebuilt after it, is what runs.
        actions = self._actions()
        plans = await actions.kill_choices(process.pid, process.start_time, boot=snap.boot, grace=KILL_GRACE_S)
        refused = actions.refusal(plans[0])
        if refused:
            self._report(refused)
            return
        chosen = await self.app.push_screen_wait(KillDialog(process, plans))
        if chosen is None:
            self._report(await actions.run(plans[0], Decision.declined(plans[0], "cancelled in the dialog")))
            return
        self._report(await actions.run(chosen, Decision.confirmed(chosen, "dialog")))

    @one_action_at_a_time
    async def action_clean(self) -> None:
        snap = self.state.snapshot
        if snap is None:
            return
        from samai.console.core.budget import disk_budget  # the poll's modules: loaded with it, after the first paint

        reclaimable = [a for a in disk_budget(self.config, snap).artifacts if a.reclaimable]
        if not reclaimable:
            self.notify("nothing is reclaimable now", severity="information", markup=False)
            return
        why = "reclaimable intermediates: " + ", ".join(a.name for a in reclaimable)
        sizes = {a.path: a.actual for a in reclaimable if a.actual is not None}
        self._report(await self._actions().clean([a.path for a in reclaimable], why=why, sizes=sizes))

    # ------------------------------------------------------------ a GGUF file: surgery on it

    @one_action_at_a_time
    async def gguf_set_kv(self, view: GgufScreen, kv: GgufKv) -> None:
        from samai.console.screens.gguf_dialogs import SetKvDialog  # see confirm

        form = await self.app.push_screen_wait(SetKvDialog(view.path, kv.key, kv.type, kv.value))
        if form is not None:
            await self._gguf_surgery(form.request())

    @one_action_at_a_time
    async def gguf_add_tensors(self, view: GgufScreen) -> None:
        from samai.console.screens.gguf_dialogs import AddTensorsDialog  # see confirm

        form = await self.app.push_screen_wait(AddTensorsDialog(view.path))
        if form is not None:
            await self._gguf_surgery(form.request())

    async def _gguf_surgery(self, request: dict) -> None:
        """Through the action layer: its plan (what is written where, the disk it needs) confirmed
        in the usual dialog, refused read-only or over the disk budget, audited."""
        try:
            outcome = await self._actions().gguf(request)
        except (BoxError, TransportError, ValueError) as e:  # the box could not even plan it
            self.notify(f"gguf {request.get('op')}: {e}", severity="error", timeout=15, markup=False)
            return
        self._report(outcome)

    # ------------------------------------------------------------ reads a key or a pane asks for

    @work(group="runs", exclusive=True, exit_on_error=False)
    async def action_runs(self) -> None:
        """The shown stage's runs, read back from its logs (the history outlives the console)."""
        from samai.console.core.history import read_history
        from samai.console.screens.dialogs import RunsScreen  # see confirm

        stage = self.config.stage(self.state.shown_stage or "")
        if stage is None or self.box is None:
            self.notify("show a stage's log first (l), then H lists its runs", severity="information", markup=False)
            return
        runs, problems = await read_history(self.box, self.state.path_of(stage.log), stage.markers)
        chosen = await self.app.push_screen_wait(RunsScreen(stage.name, runs, "; ".join(problems)))
        if chosen is not None and stage.name == self.state.train_stage and chosen.path:
            await self._reference_from(chosen.path)

    async def _reference_from(self, path: str) -> None:
        """A run picked in H as the followed training run's reference, in place of the last good one."""
        from samai.console.core.checks import Unreadable, check_trainlog
        from samai.console.core.trainref import Reference

        try:
            points = (await check_trainlog(self.session.connected_box(), path)).points
        except (Unreadable, BoxError, TransportError, ValueError) as e:
            self.notify(f"that run's curve was not read: {visible(str(e))}", severity="warning", markup=False)
            return
        label = path.rsplit("/", 1)[-1]
        self.show_beside_poll(self.state.read_reference(Reference(label, points), self.clock(), picked=True))
        self.notify(f"comparing with {visible(label)}", markup=False)

    @work(group="timeline", exclusive=True, exit_on_error=False)
    async def action_timeline(self) -> None:
        """Everything that happened on the box, in order (`timeline`), with this console's alerts;
        Enter on a row opens its log in the log pane."""
        from samai.console.core import paths
        from samai.console.core.timeline import alert_events, line_start, read_timeline
        from samai.console.screens.dialogs import TimelineScreen  # see confirm
        from samai.widgets.logview import LogView

        if self.box is None:
            self.notify("not connected to the box yet", severity="information", markup=False)
            return
        try:
            events = await read_timeline(self.box, self.config, paths.audit_log(),
                                         more=alert_events(self.state.alerts))
        except (BoxError, TransportError) as e:
            self.notify(f"timeline: {visible(str(e))}", severity="warning", markup=False)
            return
        chosen = await self.app.push_screen_wait(TimelineScreen(events))
        if chosen is None or not chosen.path:
            return
        offset, index = None, None
        if chosen.line:
            try:
                offset, index = await line_start(self.box, chosen.path, chosen.line)
            except (BoxError, TransportError) as e:  # its end, then, as `o` opens a file
                self.log.warning("the row's line not found", e)
        self._show_file(chosen.path, offset=offset)
        if index is not None:
            self.query_one(LogView).go_to_line(index)  # the row's own line, once it is read

    @work(group="eval-diff", exclusive=True, exit_on_error=False)
    async def action_eval_diff(self) -> None:
        """The eval run under the cursor against the one before it, read from the box (`eval diff`)."""
        from samai.console.core.evaldiff import diff
        from samai.console.report import describe_diff
        from samai.console.screens.dialogs import EvalDiffScreen  # see confirm
        from samai.widgets.evals import EvalTable

        pair = self.query_one(EvalTable).selected_and_previous()
        if pair is None or self.box is None:
            self.notify("put the cursor on an eval run that has one before it, then d", severity="information",
                        markup=False)
            return
        if any(run.kind == "cu" for run in pair):
            self.notify("d compares eval runs' answers; a computer-use run's episodes are checked with "
                        "`check eval runs/cu/NAME/episodes.jsonl`", severity="information", markup=False)
            return
        from samai.console.core.evalruns import read_run_items  # see action_clean

        runs = []
        for run in reversed(pair):  # A: the older one
            try:
                items = await read_run_items(self.box, run.name, run.items)
            except (BoxError, TransportError) as e:
                items, missing = None, str(e)
            else:
                missing = f"no {run.items} on the box"
            if items is None:
                self.notify(f"eval diff: run {visible(run.name)}: {visible(missing)}", severity="warning",
                            markup=False)
                return
            runs.append(items)
        self.app.push_screen(EvalDiffScreen(describe_diff(diff(*runs))))

    def action_disk_users(self) -> None:
        self.query_one(DiskPane).toggle_largest()

    def on_disk_pane_toggled(self, event: DiskPane.Toggled) -> None:
        if event.largest:
            self.measure_disk_users()

    def disk_users_due(self) -> bool:
        return self.query_one(DiskPane).largest and self.clock() - self._users_measured > USERS_EVERY_S

    @work(group="disk-users", exclusive=True, exit_on_error=False)
    async def measure_disk_users(self) -> None:
        """The workspace's largest users, measured on the box (a walk of the whole workspace:
        asked for when the operator looks, and again every USERS_EVERY_S while they do)."""
        self._users_measured = self.clock()
        pane = self.query_one(DiskPane)
        try:
            if self.box is None:
                raise BoxError("not connected to the box yet")
            users: DiskUsers | str = await self.box.disk_users(top=USERS_SHOWN, budget_s=USERS_BUDGET_S)
        except (BoxError, TransportError) as e:
            users = str(e) or type(e).__name__
        pane.show_users(users, self.clock())

    @work(group="environments", exclusive=True, exit_on_error=False)
    async def read_environments(self) -> None:
        """What is installed beside peft in the training environments (§9), read from their
        site-packages on the box; judged as soon as they are read."""
        from samai.console.core.detectors import WATCHED_PACKAGES, peft_pythons

        pythons = peft_pythons(self.config)
        if not pythons or self.box is None:
            return
        try:
            environments = await self.box.python_packages(list(pythons), WATCHED_PACKAGES)
        except (BoxError, TransportError) as e:
            self.log.warning("training environments not read", e)
            return
        self.show_beside_poll(self.state.read_environments(environments, self.clock()))

    @work(group="eval-check", exclusive=True, exit_on_error=False)
    async def check_eval_run(self, run: EvalRun) -> None:
        """`check eval` on a finished eval run's items, read once from the box (as doctor reads
        them); its problems are alerts as soon as they are read."""
        from samai.console.core.evalruns import check_items  # see action_clean

        if self.box is None:
            return
        try:
            result = await check_items(self.box, run)
        except (BoxError, TransportError) as e:
            self.log.warning("eval items not read", e)
            return
        if result is not None:
            self.show_beside_poll(self.state.read_eval_items(run, result, self.clock()))

    @work(group="curve-reference", exclusive=True, exit_on_error=False)
    async def read_reference(self, path: str) -> None:
        """The followed training run's reference: the last run of its stage that ended well, read
        from the log's kept generations; compared with the run, and drawn beside its curve."""
        from samai.console.core.checks import Unreadable
        from samai.console.core.trainref import last_good_run

        if self.box is None:
            return
        try:
            reference = await last_good_run(self.box, path, self.config.train)
        except (Unreadable, BoxError, TransportError) as e:
            self.log.warning("the training run's reference not read", e)
            return
        self.show_beside_poll(self.state.read_reference(reference, self.clock()))

    @work(group="curve-before", exclusive=True, exit_on_error=False)
    async def read_earlier_curve(self, path: str, step: int) -> None:
        """A resumed run's curve before its resume step: the earlier runs' points, from their logs."""
        from samai.console.core.checks import Unreadable
        from samai.console.core.lineage import earlier_points
        from samai.widgets.curves import CurvesPane

        if self.box is None:
            return
        try:
            points = await earlier_points(self.box, path, step)
        except (Unreadable, BoxError, TransportError) as e:
            self.log.warning("the resumed run's earlier curve not read", e)
            return
        for pane in self.query(CurvesPane):
            pane.show_before(points)

    @work(group="checkpoints", exit_on_error=False)
    async def list_checkpoints(self, stage: str, folder: str) -> None:
        """A running training run's checkpoints, listed (sizes only): does its next one fit?"""
        if self.box is None:
            return
        try:
            listed = await self.box.checkpoints(folder, weights=False)
        except (BoxError, TransportError) as e:
            self.log.warning("checkpoints not listed", e)
            return
        self.show_beside_poll(self.state.read_checkpoints(stage, listed, self.clock()))

    # ------------------------------------------------------------ multi-node stages: every node at once

    async def _on_every_node(self, what: str, stage: str) -> None:
        """Fire or stop a multi-node stage: one dialog over every node's box and command."""
        from samai.console.core.multinode import MultiNodeError

        multi = self.context.nodes().actions()
        try:
            outcome = await (multi.fire(stage) if what == "fire" else multi.stop_all(stage, grace=STOP_GRACE_S))
        except MultiNodeError as e:
            self.notify(str(e), severity="error", markup=False)  # names boxes and paths: never markup
            return
        self.notify(outcome.message, severity="information" if outcome.ok else "error", markup=False)

    @work(group="multinode", exclusive=True, exit_on_error=False)
    async def follow_nodes(self) -> None:
        """The multi-node runs on their nodes: a rank that died while others run is an alert at once;
        its alerts are resolved once the run has ended on every node."""
        while True:
            try:
                await self._follow_nodes_once()
            except Exception as e:  # a bug here must not end the watch: the next reading may be fine
                self.log.error("multi-node watch failed", e)
            await asyncio.sleep(self.config.target.poll_interval)

    async def _follow_nodes_once(self) -> None:
        session = self.context.nodes()
        try:
            findings, ended = await session.poll(self.context.box_name)
        except (BoxError, TransportError, TargetError, OSError) as e:
            self.log.warning("multi-node watch", e)
            findings, ended = [], []
        self.show_beside_poll(self.state.read_nodes(findings, ended, self.clock()))
        curves = self.query_one(CurvesPane)
        marks = session.marks()  # which nodes of the training run are alive
        curves.border_title = inert(f"training · {marks}") if marks else "training"
        training = self.context.fleet_config.role_name("train")
        if self.multi_node(training) and session.curve.version != self._curve_shown:
            curves.show(session.curve.points)  # rank 0's, from whichever box it runs on
            self._curve_shown = session.curve.version
