"""The Textual app: one screen of live panes over the Box, every stage one key away.

All I/O happens in workers: the poll loop (one snapshot at a time, the next scheduled when
the last completes) and one worker per action. Widgets only render what they are handed.
Every change to the box goes through the action layer (samai.console.core.actions)."""

from __future__ import annotations

import asyncio
import functools
import gc
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from textual import events, work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.notifications import SeverityLevel
from textual.screen import Screen
from textual.worker import Worker, WorkerState

from samai.console import prefs
from samai.console.connect import open_box
from samai.console.core import paths
from samai.console.core.audit import AuditLog
from samai.console.core.budget import disk_budget, project
from samai.console.core.config import Config
from samai.console.core.evalcheck import check_eval
from samai.console.core.evalruns import EvalRun
from samai.console.core.fleet import BOX_ERRORS, MAX_BACKOFF_S, error_text
from samai.console.core.redact import redact
from samai.console.core.state import Alert, ConsoleState, StageView, StateUpdate
from samai.remote.boxapi import Box, BoxError
from samai.remote.follow import missing_notice
from samai.remote.model import DiskUsers, GgufKv, Listing, Process, Snapshot
from samai.remote.targets import TargetError, open_transport
from samai.remote.transport import TransportError
from samai.remote.visible import visible
from samai.themes import DEFAULT_THEME, THEMES, stylesheet
from samai.widgets.alerts import AlertsPane
from samai.widgets.curves import CurvesPane
from samai.widgets.disk import DiskPane
from samai.widgets.evals import EvalTable
from samai.widgets.footer import KeysFooter
from samai.widgets.gpus import GpuPane
from samai.widgets.logview import LogView
from samai.widgets.logview.history import LogHistory, ShownLog
from samai.widgets.pane import inert, literal_markup
from samai.widgets.processes import ProcessPane
from samai.widgets.stages import StagesBar
from samai.widgets.status import Connection, StatusBar

if TYPE_CHECKING:
    from samai.console.core.actions import ActionOutcome, ActionPlan, Actions, Decision
    from samai.console.fleet_screen import FleetScreen
    from samai.console.multinode_session import MultiNodeSession
    from samai.widgets.dialogs import PathDialog
    from samai.widgets.gguf_view import GgufScreen

STALE_POLLS = 3  # a snapshot older than this many poll intervals is stale
KILL_GRACE_S = 5.0
STOP_GRACE_S = 10.0
FAILED_TAIL_LINES = 5  # of a chain that failed at once, shown with the failure
USERS_SHOWN = 12  # the largest users of the workspace the disk pane lists
EVAL_ITEMS_READ = 4 << 20  # of a finished eval's items.jsonl, checked once: thousands of items
USERS_EVERY_S = 30.0  # while it lists them: a walk of the whole workspace, so not every poll
USERS_BUDGET_S = 3.0  # the box stops a walk after this long (and says the sizes are partial)
FLEET_SCREEN = "fleet"  # the installed fleet screen's name: it and its pollers live as long as the console
FLEET_ACTIONS = {"quit", "help", "command_palette", "fleet"}  # the app's keys that work on the fleet screen
# Workers that read the box the screen shows: cancelled when it shows another box.
BOX_WORKERS = ("poll", "environments", "eval-check", "disk-users", "complete", "runs", "gguf")
# Actions that change the box: in read-only mode their keys are shown greyed and say why when pressed.
DANGEROUS = {"kill", "stop", "restart", "clean", "fire", "fix", "gguf_edit", "gguf_add"}
HELP_GROUPS = {"app": "console", "stage": "stages", "log": "log pane", "processes": "processes pane",
               "disk": "disk pane", "fleet": "fleet screen"}  # binding id prefix -> the group the help lists it under


def _one_action_at_a_time(method):
    """Run an action in a worker, refusing a second while one is in flight: cancelling an action
    half-way would lose its result and its audit line, and queueing one stacks up surprises."""

    @functools.wraps(method)
    async def guarded(self: SamaiApp, *args):
        if self._action_running:
            self.notify("another action is still running; wait for its result", severity="warning", markup=False)
            return
        self._action_running = True
        try:
            await method(self, *args)
        finally:
            self._action_running = False

    return work(guarded, group="action", exit_on_error=False)



class SamaiApp(App[None]):
    TITLE = "samai-console"
    CSS = stylesheet()
    BINDINGS = [
        Binding("q", "quit", "Quit", id="app.quit"),
        Binding("question_mark", "help", "Help", id="app.help"),
        Binding("l", "next_log", "Next log", id="app.next_log"),
        Binding("o", "open_file", "Open file", id="app.open"),
        Binding("L", "pick_log", "Logs…", id="app.pick_log"),
        Binding("left_square_bracket", "log_back", "Back to the log shown before", id="app.log_back", show=False),
        Binding("right_square_bracket", "log_forward", "Forward to the log shown after", id="app.log_forward",
                show=False),
        Binding("k", "kill", "Kill", id="app.kill"),
        Binding("s", "stop", "Stop stage", id="app.stop"),
        Binding("r", "restart", "Restart", id="app.restart"),
        Binding("c", "clean", "Clean", id="app.clean"),
        Binding("x", "fix", "Fix alert", id="app.fix"),
        Binding("u", "disk_users", "Largest disk users", id="disk.largest", show=False),
        Binding("H", "runs", "Runs of the shown stage", id="app.runs", show=False),
        Binding("F", "fleet", "Fleet", id="app.fleet"),
    ]

    def __init__(self, config: Config, *, readonly: bool = False, theme: str | None = None,
                 audit: AuditLog | None = None, poll: bool = True, clock: Callable[[], float] = time.time,
                 box: str | None = None) -> None:
        """box: the [boxes.NAME] box to open at once; None: with 2+ boxes the fleet screen comes first."""
        super().__init__()
        self.fleet_config = config  # every box; self.config is the config as seen on the box shown
        self.box_name = box or (config.boxes[0].name if config.boxes else None)
        self._fleet_first = box is None and len(config.boxes) >= 2
        config = config.on_box(self.box_name) if self.box_name else config
        self.config = config
        self._action_running = False
        self._log_chosen = False  # the operator picked a log: stop choosing one for them
        self._log_hint_taken: Alert | None = None  # the alert whose stage log `l` last opened
        self._logs = LogHistory()  # the logs shown: [ and ] go back and forward, L lists recent files
        self._stage_views: list = []  # the stages as last polled: the log picker shows their status
        self._users_measured = 0.0  # when the workspace's largest users were last asked for
        self._errors_said: set[tuple[str, str, str]] = set()  # internal errors already shown (each once)
        self.polling = poll  # off only to render recorded snapshots (screenshots, snapshot tests)
        self.clock = clock
        self.readonly = readonly
        self.state = ConsoleState(config)
        self.box: Box | None = None
        self.multinode: MultiNodeSession | None = None  # the nodes of multi-node stages, connected when needed
        self._curve_shown: tuple | None = None  # the version of rank 0's curve on show (multi-node training)
        self.audit = audit or AuditLog(paths.audit_log())
        self.connection = Connection(self._target_label(), readonly=readonly)
        self._bind_stage_keys()
        self.set_keymap(dict(config.ui.keys))
        for t in THEMES:
            self.register_theme(t)
        chosen = theme or prefs.load().get("theme") or config.ui.theme
        self.theme = chosen if chosen in self.available_themes else DEFAULT_THEME

    @property
    def busy(self) -> bool:
        """Whether an action (fire, stop, kill, clean, fix) is in flight: a second one is refused meanwhile."""
        return self._action_running

    def notify(self, message: str, *, title: str = "", severity: SeverityLevel = "information",
               timeout: float | None = None, markup: bool = False) -> None:
        """Textual's toast, literal unless a caller asks for markup: a toast mostly says what the box
        said (a path, a stage's output, an error quoting a URL), so its secrets are redacted and its
        control characters shown as stand-ins, whoever calls."""
        message = "\n".join(visible(redact(line)) for line in message.split("\n"))
        super().notify(message, title=visible(redact(title)), severity=severity, timeout=timeout, markup=markup)

    # ------------------------------------------------------------ layout

    def compose(self) -> ComposeResult:
        yield StatusBar(id="status")
        yield StagesBar(id="stages")
        with Horizontal(id="middle"):
            with Vertical(id="left"):
                yield DiskPane(id="disk")
                yield GpuPane(id="gpus")
                yield ProcessPane(id="processes")
            yield LogView(id="log", max_lines=self.config.ui.max_log_lines)
        with Horizontal(id="bottom"):
            yield CurvesPane(id="curves")
            yield EvalTable(id="evals")
            yield AlertsPane(id="alerts", readonly=self.readonly)
        yield KeysFooter()

    def on_mount(self) -> None:
        self._set_up_panes()
        self.theme_changed_signal.subscribe(self, lambda theme: self._save_theme(theme.name))
        self.set_interval(1.0, self._tick)
        if self.polling and self._fleet_first:
            self.call_after_refresh(self.action_fleet)  # the box screen polls once a box is chosen
        elif self.polling:
            self.call_after_refresh(self.poll)  # the screen first: the box's first answer is painted after it
        if self.polling and any(s.nodes for s in self.fleet_config.stages):
            self.call_after_refresh(self.follow_nodes)

    def _set_up_panes(self) -> None:
        titles = {"#stages": "stages", "#disk": "disk budget", "#gpus": "GPUs", "#processes": "processes & ports",
                  "#curves": "training", "#evals": "eval runs", "#alerts": "alerts"}
        for selector, title in titles.items():
            self.query_one(selector).border_title = title
        self.query_one(StatusBar).show(self.connection)
        self.query_one(AlertsPane).show([])
        if self.config.stages:
            self._show_stage_log(self.config.stages[0].name)
        self.query_one(LogView).focus()  # `/` filters the log, where an operator expects it

    async def on_unmount(self) -> None:
        if self.box is not None:
            await self.box.close()  # the SSH connection and the probe on the box end with the console
        if self.multinode is not None:
            await self.multinode.close()

    # ------------------------------------------------------------ polling

    @work(group="poll", exclusive=True, exit_on_error=False)
    async def poll(self) -> None:
        backoff = self.config.target.poll_interval
        while True:
            try:
                if self.box is None:
                    self.box = self._open_box()
                followers = self.state.followers()
                snap = await self.box.snapshot(**self.state.request(followers))  # each call has a deadline
            except Exception as e:  # nothing read from the box ends the poll: the box is greyed, and asked again
                if not isinstance(e, BOX_ERRORS):
                    self.log.error("poll failed", e)
                self._poll_failed(error_text(e))
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
                continue
            backoff = self.config.target.poll_interval
            try:
                self.show_snapshot(snap, followers)
            except Exception as e:  # a bug in folding it in must not stop the polling
                self._internal_error("reading the snapshot", e)
            # A log pane behind a flood catches up at once; everything else waits for the interval.
            behind = bool(followers) and followers[-1] is self.state.shown and snap.logs[-1].more
            await asyncio.sleep(0.05 if behind else self.config.target.poll_interval)

    def _open_box(self) -> Box:
        return open_box(self.config, readonly=self.readonly)

    def _poll_failed(self, error: str) -> None:
        was = self.connection.state
        self.connection = replace(self.connection, state="connecting" if was == "connecting" else "lost",
                                  error=error)
        if was == "connected":
            self.state.failed_poll(error, self.clock())
            self._show_alerts()
        self._tick()

    def show_snapshot(self, snap: Snapshot, followers: list) -> None:
        """Fold in and render one snapshot taken with these followers' cursors."""
        self._show_update(self.state.apply(snap, followers, self.clock()))

    def _show_update(self, u: StateUpdate) -> None:
        snap = u.snapshot
        if self.connection.state == "lost":
            self.notify("the box answers again", title="reconnected", markup=False)
        # The first snapshot after a (re)connect timed the handshake too: said as such, not as a round trip.
        first = self.connection.state != "connected"
        if first:
            self.read_environments()
        run = self.state.eval_to_check(u.evals)
        if run is not None:
            self.check_eval_run(run)
        self.connection = Connection(self._target_label(), snap.host, "connected", 0.0,
                                     None if first else snap.rtt, False, self.readonly,
                                     connect_s=snap.rtt if first else self.connection.connect_s)
        if not self._log_chosen:
            self._follow_busiest_stage(u)
        self._stage_views = u.stages
        for show in (self._show_stages, self._show_disk, self._show_gpus_and_processes, self._show_log_lines,
                     self._show_curves, self._show_evals, self._show_new_alerts):
            try:
                show(u)
            except Exception as e:  # a bug in one pane costs that pane, never the others or the poll
                self._internal_error(f"showing {show.__name__.removeprefix('_show_').replace('_', ' ')}", e)
        self._tick()

    def _show_stages(self, u: StateUpdate) -> None:
        self.query_one(StagesBar).show(u.stages, self.clock())
        self._title_log(u.stages)

    def _show_disk(self, u: StateUpdate) -> None:
        disk = self.query_one(DiskPane)
        disk.show(u.budget, self._next_projection(u), u.disk_delta)
        if disk.largest and self.clock() - self._users_measured > USERS_EVERY_S:
            self.measure_disk_users()

    def _show_gpus_and_processes(self, u: StateUpdate) -> None:
        self.query_one(GpuPane).show(u.snapshot.gpus)
        self.query_one(ProcessPane).show(u.processes, u.snapshot.time, u.snapshot.gpus)

    def _show_log_lines(self, u: StateUpdate) -> None:
        log = self.query_one(LogView)
        if u.log_restarted and self.state.shown is not None:
            log.reset(self.state.shown.path, self.state.shown_markers())
            when = time.strftime("%H:%M:%S", time.localtime(self.clock()))
            log.notice(f"a new run of {u.log_restarted} started at {when}: "
                       f"its log from the start (the last run's is {self.state.shown.path}.1; H lists the runs)")
        if u.log_source is not None and u.log_source is self.state.shown:  # not a log replaced since
            if u.log_notice:
                log.notice(self._log_notice(u.log_notice, u.log_source.path))
            if u.log_lines:
                log.append(u.log_lines)

    def _show_curves(self, u: StateUpdate) -> None:
        curves = self.query_one(CurvesPane)
        if not self._multi_node("train"):  # on several nodes, rank 0's curve (follow_nodes)
            if u.curve_reset:
                curves.reset()  # a new training run: its curve alone
            curves.add(u.new_points)
        curves.show_gpu_util(self.state.gpu.utilization())

    def _show_evals(self, u: StateUpdate) -> None:
        self.query_one(EvalTable).show(u.evals)

    def _show_new_alerts(self, u: StateUpdate) -> None:
        if u.alerts_changed:
            self._show_alerts()
            for a in u.new_alerts:
                if a.severity == "error":
                    self.notify(self._named(a).text, severity="error", timeout=8, markup=False)  # never markup

    def _internal_error(self, doing: str, e: Exception) -> None:
        """A bug met while showing the box: logged each time, said once per kind (not every second)."""
        self.log.error(f"internal error {doing}", e)
        said = (doing, type(e).__name__, str(e)[:200])
        if said not in self._errors_said:
            self._errors_said.add(said)
            self.notify(f"internal error {doing}: {type(e).__name__}: {e}"[:300], severity="error", markup=False)

    def _follow_busiest_stage(self, u: StateUpdate) -> None:
        """Until the operator picks a log, show the running stage's (else the last one fired)."""
        fired = sorted((v for v in u.stages if v.since), key=lambda v: (v.status == "running", v.since))
        if fired and fired[-1].name != self.state.shown_stage:
            self._show_stage_log(fired[-1].name)

    def _next_projection(self, u: StateUpdate):
        upcoming = next((self.config.stage(v.name) for v in u.stages if v.status in ("idle", "blocked")), None)
        return project(self.config, u.budget, upcoming) if upcoming else None

    def _tick(self) -> None:
        age = max(self.clock() - self.state.received_at, 0.0) if self.state.received_at else None
        stale = age is not None and age > STALE_POLLS * self.config.target.poll_interval
        self.connection = replace(self.connection, age=age, stale=stale)
        if not self.screen_stack:  # the app is closing (a fleet poll may still end after its screens)
            return
        self.screen.set_class(stale, "-stale")
        for bar in self.query(StatusBar):  # none once the app is closing and its widgets are gone
            bar.show(self.connection)

    # ------------------------------------------------------------ keys

    def _bind_stage_keys(self) -> None:
        for stage in self.config.stages:
            self.bind(stage.key, f"fire('{stage.name}')", description=f"Fire {stage.name}", show=False)

    def _stage_bindings(self) -> list[Binding]:
        return [Binding(s.key, f"fire('{s.name}')", f"Fire {s.name}", id=f"stage.{s.name}") for s in self.config.stages]

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Read-only: the keys that change the box are shown greyed and do nothing (on_key says why)."""
        if self.readonly and action in DANGEROUS:
            return None
        if action == "fleet" and (not self.fleet_config.boxes or self._on_fleet()):
            return False  # one box: no fleet to show; on the fleet: there already
        if self._on_fleet() and action not in FLEET_ACTIONS:
            return False  # the box screen's keys act on its box: not from the fleet, where none is shown
        return True

    def _on_fleet(self) -> bool:
        return self.is_screen_installed(FLEET_SCREEN) and self.screen is self.get_screen(FLEET_SCREEN)

    def on_key(self, event: events.Key) -> None:
        if not self.readonly:
            return
        active = self.screen.active_bindings.get(event.key)
        if active is not None and active.binding.action.split("(")[0] in DANGEROUS:
            self.notify(f"read-only: {event.key} ({active.binding.description.lower() or active.binding.action}) "
                        "would change the box; start the console without --readonly to act",
                        severity="warning", markup=False)

    def _actions(self) -> Actions:
        from samai.console.core.actions import Actions  # with psutil: needed only once an action runs, not to start

        if self.box is None:
            self.box = self._open_box()
        return Actions(self.box, self.config, self.audit, readonly=self.readonly, confirm=self._confirm)

    async def _confirm(self, plan: ActionPlan) -> Decision:
        from samai.console.core.actions import Decision  # see _actions
        from samai.widgets.dialogs import ConfirmDialog  # each dialog's module is imported when one opens, not to start

        if not await self.push_screen_wait(ConfirmDialog(plan, plan.checks)):
            return Decision.declined(plan, "cancelled in the dialog")
        # The dialog showed this plan's checks; for a blocked plan its button is the override ("… anyway").
        return Decision.override(plan, "dialog") if plan.blocked else Decision.confirmed(plan, "dialog")

    def _current_stage(self) -> str | None:
        return self.state.shown_stage

    def open_stage_log(self, name: str) -> None:
        self._log_chosen = True
        self._show_stage_log(name)

    def _show_stage_log(self, name: str, *, record: bool = True) -> None:
        if name == self.state.shown_stage:
            return  # already shown: starting over would blank what the operator is reading
        shown = self.state.show_stage_log(name)
        self.query_one(LogView).reset(shown.path, self.state.shown_markers())
        self.query_one(LogView).border_title = inert(f"log · {name}")
        if record:
            self._logs.visit(ShownLog(shown.path, name))

    def _title_log(self, stages: list[StageView]) -> None:
        """The shown stage's log pane title, with how far the stage is while it runs."""
        view = next((v for v in stages if v.name == self.state.shown_stage), None)
        if view is None:
            return
        title = inert(f"log · {view.name}" + (f" · {view.progress.text}" if view.progress else ""))
        log = self.query_one(LogView)
        if str(log.border_title) != str(title):
            log.border_title = title

    def _show_file(self, path: str, *, record: bool = True) -> None:
        """A file on the box by path (relative: in the workspace); the alarms mark its lines."""
        self._log_chosen = True
        follower = self.state.show_log(path)
        self.query_one(LogView).reset(follower.path, ())
        self.query_one(LogView).border_title = inert(f"file · {path}")
        if record:
            self._logs.visit(ShownLog(path))

    def _show_logged(self, log: ShownLog, *, record: bool) -> None:
        """A log from the history (not recorded again) or the picker, by what it was: a stage's
        (while the config still has that stage) or a file."""
        self._log_chosen = True
        if log.stage is not None and self.config.stage(log.stage):
            self._show_stage_log(log.stage, record=record)
        else:
            self._show_file(log.path, record=record)

    def _log_notice(self, notice: str, path: str) -> str:
        """The follower's notice, said for this pane: a stage log that is not there yet is one
        its stage has not written, and its key writes it."""
        stage = self.config.stage(self.state.shown_stage or "")
        if stage is None or notice != missing_notice(path):
            return notice
        if self.readonly:
            return f"no log yet: {stage.name} has not run here ({stage.log})"
        return f"no log yet — press {stage.key} to fire {stage.name} ({stage.log})"

    def action_log_back(self) -> None:
        log = self._logs.back()
        if log is None:
            self.bell()
            return
        self._show_logged(log, record=False)

    def action_log_forward(self) -> None:
        log = self._logs.forward()
        if log is None:
            self.bell()
            return
        self._show_logged(log, record=False)

    @work(group="dialog", exclusive=True)
    async def action_pick_log(self) -> None:
        from samai.widgets.dialogs import LogPicker  # see _confirm

        views = {v.name: v for v in self._stage_views}
        stages = [(ShownLog(self.state.path_of(s.log), s.name), views.get(s.name)) for s in self.config.stages]
        files = [ShownLog(path) for path in self._logs.recent_files]
        chosen = await self.push_screen_wait(LogPicker(stages, files, self._logs.current, self.clock()))
        if chosen is not None:
            self._show_logged(chosen, record=True)

    def action_next_log(self) -> None:
        self._log_chosen = True
        hinted = self._alert_log()
        if hinted:
            self._show_stage_log(hinted)
            return
        names = [s.name for s in self.config.stages]
        if names:
            current = self._current_stage()
            nxt = names[(names.index(current) + 1) % len(names)] if current in names else names[0]
            self._show_stage_log(nxt)

    def _alert_log(self) -> str | None:
        """The stage of the newest active alert that offers `l log`, the first time `l` is pressed
        after it came (then `l` goes on to the next stage's log as usual)."""
        alert = next((a for a in self.state.alerts if a.active and "l log" in a.hint and a.stage), None)
        if alert is None or alert.stage is None or alert == self._log_hint_taken or not self.config.stage(alert.stage):
            return None
        self._log_hint_taken = alert
        return alert.stage

    @work(group="dialog", exclusive=True)
    async def action_open_file(self) -> None:
        from samai.widgets.dialogs import PathDialog  # see _confirm

        path = await self.push_screen_wait(PathDialog("open a file on the box in the log pane (a .gguf: its header "
                                                      "and tensors) · Tab completes",
                                                      "/path/on/box.log (relative: inside the workspace)",
                                                      completes=True))
        if path and path.lower().endswith(".gguf"):
            await self._open_gguf(path)
        elif path:
            from samai.widgets.gguf_view import GgufScreen

            while isinstance(self.screen, GgufScreen):
                await self.pop_screen()  # `o` on a GGUF's screen: back to the log pane that shows the file
            self._show_file(path)

    def on_path_dialog_completion_requested(self, event: PathDialog.CompletionRequested) -> None:
        self._complete_path(event.dialog, event.text, event.folder)

    @work(group="complete", exclusive=True, exit_on_error=False)
    async def _complete_path(self, dialog: PathDialog, text: str, folder: str) -> None:
        """Tab in the path dialog: the folder's entries that start with the name typed, as the box lists them."""
        try:
            if self.box is None:
                raise BoxError("not connected to the box yet")
            listing: Listing | str = await self.box.list_dir(folder or ".", prefix=text[len(folder):])
        except (BoxError, TransportError) as e:
            listing = str(e) or type(e).__name__
        if dialog.is_attached:
            dialog.offer(text, listing)

    # ------------------------------------------------------------ a GGUF file: its header, and surgery on it

    async def _open_gguf(self, path: str) -> None:
        """A .gguf opened with `o`: its header and tables on their own screen (Esc returns), read
        in a worker while the screen is already up."""
        from samai.widgets.gguf_view import GgufScreen  # see _confirm

        screen = GgufScreen(path, readonly=self.readonly)
        await self.push_screen(screen)
        self._read_gguf(screen)

    @work(group="gguf", exit_on_error=False)  # one per screen: a second one opened leaves the first's alone
    async def _read_gguf(self, screen: GgufScreen) -> None:
        try:
            if self.box is None:
                self.box = self._open_box()
            header = await self.box.gguf_show(screen.path)
        except (BoxError, TransportError, TargetError) as e:
            if screen.is_attached:
                screen.show_error(str(e) or type(e).__name__)
            return
        if screen.is_attached:  # not closed meanwhile
            screen.show_header(header)

    def on_gguf_screen_edit_requested(self, event: GgufScreen.EditRequested) -> None:
        self._gguf_set_kv(event.view, event.kv)

    def on_gguf_screen_add_requested(self, event: GgufScreen.AddRequested) -> None:
        self._gguf_add_tensors(event.view)

    @_one_action_at_a_time
    async def _gguf_set_kv(self, view: GgufScreen, kv: GgufKv) -> None:
        from samai.widgets.gguf_dialogs import SetKvDialog  # see _confirm

        form = await self.push_screen_wait(SetKvDialog(view.path, kv.key, kv.type, kv.value))
        if form is not None:
            await self._gguf_surgery(form.request())

    @_one_action_at_a_time
    async def _gguf_add_tensors(self, view: GgufScreen) -> None:
        from samai.widgets.gguf_dialogs import AddTensorsDialog  # see _confirm

        form = await self.push_screen_wait(AddTensorsDialog(view.path))
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

    @work(group="runs", exclusive=True, exit_on_error=False)
    async def action_runs(self) -> None:
        """The shown stage's runs, read back from its logs (the history outlives the console)."""
        from samai.console.core.history import read_history
        from samai.widgets.dialogs import RunsScreen  # see _confirm

        stage = self.config.stage(self.state.shown_stage or "")
        if stage is None or self.box is None:
            self.notify("show a stage's log first (l), then H lists its runs", severity="information", markup=False)
            return
        runs, problems = await read_history(self.box, self.state.path_of(stage.log), stage.markers)
        self.push_screen(RunsScreen(stage.name, runs, "; ".join(problems)))

    def action_help(self) -> None:
        from samai.widgets.dialogs import HelpScreen  # see _confirm

        self.push_screen(HelpScreen(self._help_rows()))

    def _help_rows(self) -> list[tuple[str, str, str, str]]:
        """(group, key, what, id) of every binding: the console's, each pane's and the stage keys,
        with the keys as the keymap ([ui.keys]) has them."""
        from samai.widgets.processes import ProcessTable

        keymap = dict(self.config.ui.keys)
        declared = [*self.BINDINGS, *self._stage_bindings(), *LogView.BINDINGS, *ProcessPane.BINDINGS,
                    *ProcessTable.BINDINGS]
        if self.fleet_config.boxes:
            from samai.console.fleet_screen import FleetScreen
            from samai.widgets.fleet import FleetTable

            declared += [*FleetTable.BINDINGS, *FleetScreen.BINDINGS]
        rows, seen = [], set()
        for b in Binding.make_bindings(declared):
            if not b.description or (b.id or b.action) in seen or (b.action == "fleet" and not self.fleet_config.boxes):
                continue
            seen.add(b.id or b.action)
            key = keymap.get(b.id or "", b.key)
            group = HELP_GROUPS.get((b.id or "app.").split(".")[0], "console")
            off = " (read-only: off)" if self.readonly and b.action.split("(")[0] in DANGEROUS else ""
            rows.append((group, self.get_key_display(replace(b, key=key)), b.description + off, b.id or ""))
        rows.append(("console", "ctrl+p", "command palette: fire, stop, open log, theme, target", ""))
        return sorted(rows, key=lambda r: list(HELP_GROUPS.values()).index(r[0]))

    # ------------------------------------------------------------ actions (each in its own worker)

    @_one_action_at_a_time
    async def action_fire(self, stage: str) -> None:
        """A stage's key: fire it, or, while it runs, restart it (its own dialog says so)."""
        if self._multi_node(stage):
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
        self._log_chosen = True
        self._show_stage_log(stage)

    async def _alert_failed_fire(self, outcome: ActionOutcome) -> None:
        from samai.console.core.state import run_error

        # The stage's own last words, not the chain's bookkeeping around them.
        tail = [line[:200] for line in getattr(outcome.result, "stage_tail", ())]
        text = " · ".join([outcome.message, *tail[-2:]])
        stage = outcome.plan.stage or ""
        self.state.raise_alerts([run_error(self.clock(), text, stage, await self._run_fired(outcome))])
        self._show_alerts()

    async def _run_fired(self, outcome: ActionOutcome) -> float | None:
        """The run (fired_at) a fire launched: its alert belongs to it and resolves with the next run."""
        pid = getattr(outcome.result, "pid", None)
        try:
            rec = (await self.box.snapshot()).state(outcome.plan.stage or "") if pid and self.box else None
        except (BoxError, TransportError):
            return None
        return rec.fired_at if rec and rec.pid == pid else None

    @_one_action_at_a_time
    async def action_stop(self, stage: str | None = None) -> None:
        stage = stage or self._current_stage()
        if stage and self._multi_node(stage):
            await self._on_every_node("stop", stage)
        elif stage:
            self._report(await self._actions().stop(stage, grace=STOP_GRACE_S))

    @_one_action_at_a_time
    async def action_restart(self, stage: str | None = None) -> None:
        stage = stage or self._current_stage()
        pre = self.state.preflight(stage) if stage else None
        if stage:
            self._report(await self._actions().restart(stage, clear=pre.poison if pre else (), grace=STOP_GRACE_S))

    async def action_fix(self) -> None:
        """The newest active alert's suggested action, through that action's own confirmation."""
        alert = next((a for a in self.state.alerts if a.action and a.active), None)
        if alert is None:
            resolved = next((a for a in self.state.alerts if a.action), None)
            if resolved is not None and resolved.resolved_at is not None:
                when = time.strftime("%H:%M:%S", time.localtime(resolved.resolved_at))
                self.notify(f"already resolved at {when}: {self._named(resolved).text}", severity="information",
                            markup=False)
            else:
                self.notify("no alert with a suggested action", severity="information", markup=False)
            return
        if alert.action is not None:
            method, args = alert.action.call  # its kind's app method (fixes.FIXES)
            getattr(self, method)(*args)

    def action_kill_pid(self, pid: int, start_time: float) -> None:
        """An alert's process, killed only while it is that process (its pid not taken by another since)."""
        snap = self.state.snapshot
        proc = snap.same_process(pid, start_time) if snap else None
        if proc is None:
            self.notify(f"pid {pid} is gone or is another process now", severity="warning", markup=False)
            return
        self.action_kill(proc)

    @_one_action_at_a_time
    async def action_uninstall(self, python: str, package: str) -> None:
        """A package removed from a training environment (the §9 fix), then the environments read again."""
        self._report(await self._actions().uninstall(python, package))
        self.read_environments()

    @_one_action_at_a_time
    async def action_kill(self, process: Process | None = None) -> None:
        from samai.widgets.dialogs import KillDialog  # see _confirm

        process = process or self.query_one(ProcessPane).selected()
        snap = self.state.snapshot
        if process is None or snap is None:
            self.notify("select a process in the processes pane first", severity="warning", markup=False)
            return
        from samai.console.core.actions import Decision  # see _actions

        # The layer plans first (this process or its group, TERM or KILL); the dialog shows those
        # plans and returns the one chosen; that plan, and nothing rebuilt after it, is what runs.
        actions = self._actions()
        plans = await actions.kill_choices(process.pid, process.start_time, boot=snap.boot, grace=KILL_GRACE_S)
        refused = actions.refusal(plans[0])
        if refused:
            self._report(refused)
            return
        chosen = await self.push_screen_wait(KillDialog(process, plans))
        if chosen is None:
            self._report(await actions.run(plans[0], Decision.declined(plans[0], "cancelled in the dialog")))
            return
        self._report(await actions.run(chosen, Decision.confirmed(chosen, "dialog")))

    @_one_action_at_a_time
    async def action_clean(self) -> None:
        snap = self.state.snapshot
        if snap is None:
            return
        reclaimable = [a for a in disk_budget(self.config, snap).artifacts if a.reclaimable]
        if not reclaimable:
            self.notify("nothing is reclaimable now", severity="information", markup=False)
            return
        why = "reclaimable intermediates: " + ", ".join(a.name for a in reclaimable)
        sizes = {a.path: a.actual for a in reclaimable if a.actual is not None}
        self._report(await self._actions().clean([a.path for a in reclaimable], why=why, sizes=sizes))

    def action_disk_users(self) -> None:
        self.query_one(DiskPane).toggle_largest()

    def on_disk_pane_toggled(self, event: DiskPane.Toggled) -> None:
        if event.largest:
            self.measure_disk_users()

    @work(group="environments", exclusive=True, exit_on_error=False)
    async def read_environments(self) -> None:
        """What is installed beside peft in the training environments (§9), read from their
        site-packages on the box; its finding comes with the next poll's."""
        from samai.console.core.detectors import WATCHED_PACKAGES, peft_pythons

        pythons = peft_pythons(self.config)
        if not pythons or self.box is None:
            return
        try:
            self.state.environments = await self.box.python_packages(list(pythons), WATCHED_PACKAGES)
        except (BoxError, TransportError) as e:
            self.log.warning("training environments not read", e)

    @work(group="eval-check", exclusive=True, exit_on_error=False)
    async def check_eval_run(self, run: EvalRun) -> None:
        """`check eval` on a finished eval run's items, read once from the box (the first
        EVAL_ITEMS_READ bytes); its problems come as alerts with the next poll's."""
        if self.box is None:
            return
        try:
            chunk = await self.box.tail(run.items, offset=0, max_bytes=EVAL_ITEMS_READ)
        except (BoxError, TransportError) as e:
            self.log.warning("eval items not read", e)
            return
        if chunk.error or chunk.missing:
            return
        whole = chunk.data if not chunk.more or chunk.line_end is None else chunk.data[:chunk.line_end]
        result = await asyncio.to_thread(check_eval, whole.decode("utf-8", "replace").splitlines())
        if self.state.eval_checked and self.state.eval_checked[0] == run:  # not a newer run meanwhile
            self.state.eval_checked = (run, result)

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

    def _report(self, outcome: ActionOutcome) -> None:
        self.state.sizer.refresh_all()  # whatever the action made or removed is sized in the next poll
        severity: SeverityLevel = "information" if outcome.ok else "warning" if outcome.status == "cancelled" \
            else "error"
        tail = getattr(outcome.result, "stage_tail", ()) if not outcome.ok else ()
        message = "\n".join([outcome.message, *(line[:100] for line in tail[-FAILED_TAIL_LINES:])])
        # Box text (stage output, commands): never markup (notify redacts its secrets).
        self.notify(message, severity=severity, timeout=6 if outcome.ok else 15, markup=False)

    # ------------------------------------------------------------ palette, theme, target, save

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        # The palette takes a command's title and help only as markup: what the config and the box
        # wrote there (a command's "[ -f x ]", a log named "[/x].log") is escaped to show as written.
        for stage in self.config.stages:
            name = stage.name
            yield SystemCommand(literal_markup(f"Open log: {name}"), literal_markup(stage.log),
                                lambda n=name: self.open_stage_log(n))
            if not self.readonly:
                yield SystemCommand(literal_markup(f"Fire {name}"), literal_markup(redact(stage.command)),
                                    lambda n=name: self.action_fire(n))
                yield SystemCommand(literal_markup(f"Stop {name}"), "its process group: TERM, then KILL",
                                    lambda n=name: self.action_stop(n))
                yield SystemCommand(literal_markup(f"Restart {name}"), "stop, clear poison files, fire",
                                    lambda n=name: self.action_restart(n))
        yield SystemCommand("Open file…", "any file on the box, in the log pane", self.action_open_file)
        if self.fleet_config.boxes:
            yield SystemCommand("Fleet", "every box on one line each (F)", self.action_fleet)
        for spec in self.fleet_config.boxes:
            yield SystemCommand(literal_markup(f"Switch to box {spec.name}"), literal_markup(redact(spec.target.url)),
                                lambda n=spec.name: self.open_box_screen(n))
        yield SystemCommand("Switch target…", "local, ssh://user@host[:port]", self.switch_target)
        for theme in THEMES:
            yield SystemCommand(f"Theme: {theme.name}", "switch the colours", lambda n=theme.name: self._set_theme(n))

    def _set_theme(self, name: str) -> None:
        self.theme = name

    @work(thread=True, group="prefs", exit_on_error=False)
    def _save_theme(self, name: str) -> None:
        prefs.save(theme=name)

    @work(group="dialog", exclusive=True)
    async def switch_target(self) -> None:
        from samai.widgets.dialogs import PathDialog  # see _confirm

        url = await self.push_screen_wait(PathDialog("switch target", "local or ssh://user@host[:port]",
                                                     self.config.target.url))
        if not url or url == self.config.target.url:
            return
        try:
            open_transport(url)
        except TargetError as e:
            self.notify(str(e), severity="error", markup=False)
            return
        old, self.box = self.box, None
        if old:
            await old.close()
        self.config = self.config.with_target(url)
        self.state = ConsoleState(self.config)
        self.connection = Connection(self._target_label(), readonly=self.readonly)
        if self.config.stages:
            self._show_stage_log(self.config.stages[0].name)
        self.poll()

    # ------------------------------------------------------------ multi-node stages: every node at once

    def _multi_node(self, stage: str) -> bool:
        found = self.fleet_config.stage(stage)
        return found is not None and bool(found.nodes)

    def _node_session(self) -> MultiNodeSession:
        from samai.console.multinode_session import MultiNodeSession  # connects only once a stage needs it

        if self.multinode is None:
            self.multinode = MultiNodeSession(self.fleet_config, self.audit, readonly=self.readonly,
                                              confirm=self._confirm)
        return self.multinode

    async def _on_every_node(self, what: str, stage: str) -> None:
        """Fire or stop a multi-node stage: one dialog over every node's box and command."""
        from samai.console.core.multinode import MultiNodeError

        multi = self._node_session().actions()
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
        try:
            findings, ended = await self._node_session().poll(self.box_name)
        except (BoxError, TransportError, TargetError, OSError) as e:
            self.log.warning("multi-node watch", e)
            findings, ended = [], []
        now = self.clock()
        self.state.alerts[:] = [replace(a, resolved_at=now) if a.code == "rank_died" and a.active
                                and a.action and a.action.stage in ended else a for a in self.state.alerts]
        shown = {(a.code, a.text) for a in self.state.alerts}  # this box screen's: another box's shows them again
        new = [f for f in findings if (f.code, f.message) not in shown]
        self.state.raise_alerts([Alert(now, f.severity, f.message, code=f.code, action=f.action,
                                       hint="x stop all" if f.action else "") for f in new])
        if new or ended:
            self._show_alerts()
        session = self._node_session()
        curves = self.query_one(CurvesPane)
        marks = session.marks()  # which nodes of the training run are alive
        curves.border_title = inert(f"training · {marks}") if marks else "training"
        if self._multi_node("train") and session.curve.version != self._curve_shown:
            curves.show(session.curve.points)  # rank 0's, from whichever box it runs on
            self._curve_shown = session.curve.version

    # ------------------------------------------------------------ the fleet: every box, and switching between them

    def _target_label(self) -> str:
        """The status bar's target: with [boxes], the box's name before its url (a password in it masked)."""
        url = redact(self.config.target.url)
        return f"{self.box_name}: {url}" if self.fleet_config.boxes and self.box_name else url

    def _named(self, alert: Alert) -> Alert:
        """With [boxes], an alert says whose box it is about."""
        if not self.fleet_config.boxes or not self.box_name:
            return alert
        return replace(alert, text=f"{self.box_name}: {alert.text}")

    def _show_alerts(self) -> None:
        self.query_one(AlertsPane).show([self._named(a) for a in self.state.alerts])

    def action_fleet(self) -> None:
        """F: the fleet screen (made once; its pollers run as long as the console)."""
        from samai.console.core.fleet import Fleet
        from samai.console.fleet_screen import FleetScreen

        if not self.fleet_config.boxes or isinstance(self.screen, FleetScreen):
            return
        if not self.is_screen_installed(FLEET_SCREEN):
            fleet = Fleet(self.fleet_config, lambda cfg: open_box(cfg, readonly=True), clock=self.clock)
            self.install_screen(FleetScreen(fleet), FLEET_SCREEN)
        self.push_screen(FLEET_SCREEN)

    def on_fleet_screen_box_chosen(self, event: FleetScreen.BoxChosen) -> None:
        self.open_box_screen(event.name or self.box_name or "")

    @work(group="switch", exclusive=True, exit_on_error=False)
    async def open_box_screen(self, name: str) -> None:
        """The box screen, for box `name` (Enter on the fleet, the palette): the screens above it closed."""
        while len(self.screen_stack) > 1:
            await self.pop_screen()
        await self.switch_box(name)

    async def switch_box(self, name: str) -> None:
        """Point the box screen at another box: its own Box, state and poller; the old box's
        connection closed, and every pane composed afresh (nothing of the old box stays on show)."""
        if name == self.box_name and self._polled_box:
            return
        if self._action_running:
            self.notify("an action is still running on this box; switch once it is done", severity="warning")
            return
        for group in BOX_WORKERS:
            self.workers.cancel_group(self, group)
        old, self.box = self.box, None
        if old is not None:
            await old.close()
        self.box_name = name
        self.config = self.fleet_config.on_box(name)
        self.state = ConsoleState(self.config)
        self.connection = Connection(self._target_label(), readonly=self.readonly)
        self._log_chosen, self._log_hint_taken, self._logs, self._stage_views = False, None, LogHistory(), []
        self._curve_shown = None  # the new panes show rank 0's curve whole
        await self.recompose()
        self._set_up_panes()
        self.poll()

    @property
    def _polled_box(self) -> bool:
        return any(w.group == "poll" and not w.is_finished for w in self.workers)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """The one place a failed worker is reported: nothing fails silently."""
        if event.state == WorkerState.ERROR:
            self.notify(f"{event.worker.name} failed: {event.worker.error!r}", severity="error", timeout=15,
                        markup=False)

    def on_log_view_save_requested(self, event: LogView.SaveRequested) -> None:
        self._save_lines(event.lines)

    @work(thread=True, group="save", exit_on_error=False)
    def _save_lines(self, lines: tuple[str, ...]) -> None:
        folder = paths.saved_logs_dir()
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / f"{self.state.shown_stage or 'file'}-{time.strftime('%Y%m%d-%H%M%S')}.log"
        Path(target).write_text("\n".join(redact(line) for line in lines) + "\n", "utf-8")  # no secrets kept
        self.call_from_thread(self.notify, f"saved {len(lines)} lines to {target}", markup=False)


def run_app(config: Config, *, readonly: bool = False, theme: str | None = None, box: str | None = None) -> int:
    # What the imports built lives as long as the console: no garbage collection need walk it again
    # (a full one during start-up walked all of it, delaying the first paint, and each later one would).
    gc.freeze()
    gc.enable()  # the CLI turns it off while the TUI's modules load
    SamaiApp(config, readonly=readonly, theme=theme, box=box).run()
    return 0
