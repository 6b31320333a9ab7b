"""The box screen: one box's live panes, its keys and its workers.

Its session (samai.console.core.session) polls the box and reads beside the poll in a worker of
this screen; each update goes to every pane through one protocol (ShowsUpdates.show_update), each
pane drawn on its own so a bug in one costs only that pane. Its keys are the helpers' (box_logs,
box_actions, box_reads): an action runs in the one action worker, a dialog or a read the operator
asks for in the one dialog worker. Switching box or target replaces the screen: its workers end
with it, and nothing of the old box is left on show."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import replace
from importlib import import_module
from typing import TYPE_CHECKING, Any

from textual import work
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical

from samai.console.core.commands import CHANGES_BOX
from samai.console.core.redact import redact
from samai.console.screens.box_actions import BoxActions
from samai.console.screens.box_base import BoxScreenBase
from samai.console.screens.box_logs import LogChoice
from samai.console.screens.box_reads import OperatorReads
from samai.widgets.alerts import AlertsPane
from samai.widgets.curves import CurvesPane
from samai.widgets.disk import DiskPane
from samai.widgets.evals import EvalTable
from samai.widgets.footer import KeysFooter
from samai.widgets.gpus import GpuPane
from samai.widgets.keys import bindings
from samai.widgets.logview import LogView
from samai.widgets.processes import ProcessPane
from samai.widgets.serving import ServePane
from samai.widgets.stages import StagesBar
from samai.widgets.status import Connection, StatusBar

if TYPE_CHECKING:
    from samai.console.core.session import PollFailed
    from samai.console.core.update import StateUpdate
    from samai.console.screens.box_base import BoxScreenContext
    from samai.console.screens.dialogs import PathDialog
    from samai.console.screens.gguf import GgufScreen
    from samai.remote.model import GgufKv, Process, Snapshot

STALE_POLLS = 3  # a snapshot older than this many poll intervals is stale
LATE_POLLS = 2  # its age is said from this many intervals on: a figure that changes each second repaints the line
RTT_EVERY_S = 10.0  # the round trip said at most this often, for the same reason
PANE_TITLES = {"#stages": "stages", "#disk": "disk budget", "#gpus": "GPUs", "#serving": "serving",
               "#processes": "processes & ports", "#curves": "training", "#evals": "eval runs", "#alerts": "alerts"}


class BoxScreen(BoxScreenBase):
    BINDINGS = bindings("box") + bindings("disk")
    logs: LogChoice

    def __init__(self, context: BoxScreenContext) -> None:
        super().__init__(context)
        self.connection = Connection(self.target_label(), readonly=self.readonly)
        self.rtt_said_at = 0.0
        self.status_bar = StatusBar(id="status")
        self.logs = LogChoice(self)
        self.do = BoxActions(self)
        self.reads = OperatorReads(self)

    def target_label(self) -> str:
        """The status bar's target: with [boxes], the box's name before its url (a password in it masked)."""
        url, name = redact(self.config.target.url), self.context.box_name
        return f"{name}: {url}" if self.context.fleet_config.boxes and name else url

    def compose(self) -> ComposeResult:
        name = self.context.box_name if self.context.fleet_config.boxes else None
        yield self.status_bar
        yield StagesBar(id="stages")
        with Horizontal(id="middle"):
            with Vertical(id="left"):
                yield DiskPane(id="disk")
                yield GpuPane(id="gpus")
                yield ServePane(id="serving")
                yield ProcessPane(id="processes")
            yield LogView(id="log", max_lines=self.config.ui.max_log_lines)
        with Horizontal(id="bottom"):
            yield CurvesPane(id="curves")
            yield EvalTable(id="evals")
            yield AlertsPane(id="alerts", readonly=self.readonly, box_name=name)
        yield KeysFooter()

    def on_mount(self) -> None:
        for selector, title in PANE_TITLES.items():
            self.query_one(selector).border_title = title
        self.status_bar.show(self.connection)
        self.query_one(AlertsPane).show([])
        self.query_one(LogView).focus()  # `/` filters the log, where an operator expects it
        self.set_interval(1.0, self.tick)
        # The screen first: its session (the state, the detectors, the Box) and the plot are made
        # after the first frame, and the box's first answer is painted after them.
        self.context.after_first_paint(self._start)

    def _start(self) -> None:
        self.query_one(CurvesPane).mount_plot()
        self._load_then_start()

    @work(name="start", group="start", exit_on_error=False)
    async def _load_then_start(self) -> None:
        await asyncio.to_thread(import_module, "samai.console.core.session")  # the keys answer meanwhile
        if self.config.stages:
            self.logs.show_stage_log(self.config.stages[0].name)
        if self.context.polling:
            self.poll()

    async def on_unmount(self) -> None:
        if self.box is not None:  # (none made: nothing to end)
            await self.session.close()  # the SSH connection and the probe on the box end with the screen

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Read-only: the keys that change the box are shown greyed and do nothing (the app says why)."""
        return None if self.readonly and action in CHANGES_BOX else True

    # ------------------------------------------------------------ polling

    def poll(self) -> None:
        self.run_worker(self.session.run(self.report, self.read_bug),
                        name="poll", group="poll", exclusive=True, exit_on_error=False)

    def report(self, result: StateUpdate | PollFailed) -> None:
        from samai.console.core.session import PollFailed  # loaded with the session, after the first paint

        if isinstance(result, PollFailed):
            self._poll_failed(result)
        elif result.beside:
            self.show_beside_poll(result)  # a feed's read beside the poll: its alerts and its view
        else:
            self.show_update(result)

    def _poll_failed(self, failed: PollFailed) -> None:
        if failed.bug:
            self.log.error("poll failed", failed.exception)
        was = self.connection.state
        self.connection = replace(self.connection, state="connecting" if was == "connecting" else "lost",
                                  error=failed.error)
        self.show_beside_poll(failed.update)  # the outage alert, when the box had been answering
        self.tick()

    def show_snapshot(self, snap, followers: list) -> None:
        """Fold in and render one snapshot taken with these followers' cursors (a recorded box)."""
        self.show_update(self.state.apply(snap, followers, self.clock(), cursor=self.session.cursor))

    def show_update(self, u: StateUpdate) -> None:
        if self.connection.state == "lost":
            self.notify("the box answers again", title="reconnected", markup=False)
        # The first snapshot after a (re)connect timed the handshake too: said as such, not as a round trip.
        first = self.connection.state != "connected"
        snap = u.snapshot
        self.connection = Connection(self.target_label(), snap.host, "connected", 0.0, self._rtt_to_say(snap, first),
                                     False, self.readonly, connect_s=snap.rtt if first else self.connection.connect_s,
                                     watched=self.connection.watched, watched_ok=self.connection.watched_ok)
        self.logs.follow_busiest_stage(u.stages)
        self.show_panes(u)
        for a in u.new_alerts:
            if a.severity == "error":
                self.notify(self.named(a).text, severity="error", timeout=8, markup=False)  # never markup
        self.tick()

    def show_beside_poll(self, u: StateUpdate | None) -> None:
        """A read beside the poll (a feed's, a failed fire, the box gone quiet): the panes are
        handed it as they are a poll's; who watches the box goes to the status line."""
        if u is None:
            return
        from samai.console.core.feeds.watchers import Watched

        watched = u.view(Watched)
        if watched is not None:
            self.connection = replace(self.connection, watched=watched.words, watched_ok=watched.ok)
            self.tick()
        self.show_panes(u)
        for a in u.new_alerts:
            if a.severity == "error":
                self.notify(self.named(a).text, severity="error", timeout=8, markup=False)

    def _rtt_to_say(self, snap: Snapshot, first: bool) -> float | None:
        """This poll's round trip when the last one said is RTT_EVERY_S old, else that one; none
        for the first snapshot after a (re)connect, which timed the handshake too."""
        now = self.clock()
        if first or self.connection.rtt is None or now - self.rtt_said_at >= RTT_EVERY_S:
            self.rtt_said_at = now
            return None if first else snap.rtt
        return self.connection.rtt

    def tick(self) -> None:
        received = self.state.received_at
        age = max(self.clock() - received, 0.0) if received else None
        interval = self.config.target.poll_interval
        stale = age is not None and age > STALE_POLLS * interval
        late = age is not None and age >= LATE_POLLS * interval
        self.connection = replace(self.connection, age=age if late else None, stale=stale)
        self.set_class(stale, "-stale")
        if self.status_bar.is_attached:  # not once the screen is being taken down
            self.status_bar.show(self.connection)

    # ------------------------------------------------------------ the workers its keys run in

    @work(group="action", exit_on_error=False)
    async def act(self, action: Callable[..., Awaitable[None]], *args: Any) -> None:
        """An action, refusing a second while one is in flight: cancelling an action half-way would
        lose its result and its audit line, and queueing one stacks up surprises."""
        if self._action_running:
            self.notify("another action is still running; wait for its result", severity="warning", markup=False)
            return
        self._action_running = True
        try:
            await action(*args)
        finally:
            self._action_running = False

    @work(group="dialog", exclusive=True, exit_on_error=False)
    async def ask(self, step: Callable[..., Awaitable[None]], *args: Any) -> None:
        """A dialog, or a read the operator asked for (the runs list, the timeline, an eval diff)."""
        await step(*args)

    @work(group="complete", exclusive=True, exit_on_error=False)
    async def complete_path(self, dialog: PathDialog, text: str, folder: str) -> None:
        await self.logs.complete(dialog, text, folder)

    @work(thread=True, group="save", exit_on_error=False)
    def _save_lines(self, lines: tuple[str, ...], name: str) -> None:
        self.app.call_from_thread(self.notify, self.logs.save(lines, name), markup=False)

    def on_log_view_save_requested(self, event: LogView.SaveRequested) -> None:
        self._save_lines(event.lines, self.shown_stage or "file")

    # ------------------------------------------------------------ the keys (the command table's actions)

    def action_fire(self, stage: str) -> None:
        self.act(self.do.fire, stage)

    def action_stop(self, stage: str | None = None) -> None:
        self.act(self.do.stop, stage)

    def action_restart(self, stage: str | None = None) -> None:
        self.act(self.do.restart, stage)

    def action_resume(self, stage: str) -> None:
        self.act(self.do.resume, stage)

    def action_prune(self, stage: str) -> None:
        self.act(self.do.prune, stage)

    def action_kill(self, process: Process | None = None) -> None:
        self.act(self.do.kill, process)

    def action_kill_pid(self, pid: int, start_time: float) -> None:
        process = self.do.process(pid, start_time)
        if process is not None:
            self.action_kill(process)

    def action_clean(self) -> None:
        self.act(self.do.clean)

    def action_uninstall(self, python: str, package: str) -> None:
        self.act(self.do.uninstall, python, package)

    def action_acknowledge(self) -> None:
        self.act(self.do.acknowledge)

    def action_fix(self) -> None:
        self.do.fix()

    def gguf_set_kv(self, view: GgufScreen, kv: GgufKv) -> None:
        self.act(self.do.gguf_set_kv, view, kv)

    def gguf_add_tensors(self, view: GgufScreen) -> None:
        self.act(self.do.gguf_add_tensors, view)

    def action_runs(self) -> None:
        self.ask(self.reads.runs)

    def action_timeline(self) -> None:
        self.ask(self.reads.timeline)

    def action_eval_diff(self) -> None:
        self.ask(self.reads.eval_diff)

    def action_pick_log(self) -> None:
        self.ask(self.logs.pick)

    def action_open_file(self) -> None:
        self.ask(self.logs.open_file)

    def action_next_log(self) -> None:
        self.logs.next_log()

    def action_log_back(self) -> None:
        self.logs.step_to(self.logs.history.back())

    def action_log_forward(self) -> None:
        self.logs.step_to(self.logs.history.forward())

    def open_stage_log(self, name: str) -> None:
        self.logs.open_stage_log(name)

    def action_disk_users(self) -> None:
        self.query_one(DiskPane).toggle_largest()

    def on_disk_pane_toggled(self, event: DiskPane.Toggled) -> None:
        """The disk pane lists the largest users (the disk feed measures them while it does) or the budget."""
        from samai.console.core.disk.feed import DiskFeed

        disk = self.state.feed(DiskFeed)
        if disk is not None:
            disk.list_users(event.largest)
            self.session.start_reads(self.report, self.read_bug)
