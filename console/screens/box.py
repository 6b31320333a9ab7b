"""The box screen: one box's live panes, its keys and its workers.

Its session (samai.console.core.session) polls the box in a worker of this screen; each poll's
StateUpdate goes to every pane through one protocol (ShowsUpdates.show_update), each pane drawn
on its own so a bug in one costs only that pane. Switching box or target replaces the screen:
its workers end with it, and nothing of the old box is left on show."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from importlib import import_module
from typing import TYPE_CHECKING

from textual import work
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical

from samai.console.core.commands import CHANGES_BOX
from samai.console.core.redact import redact
from samai.console.screens.box_actions import ActionKeys, one_action_at_a_time
from samai.remote.errors import BoxError
from samai.remote.transport import TransportError
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
    from samai.console.core.state import StateUpdate
    from samai.console.screens.box_base import BoxScreenContext
    from samai.remote.model import Snapshot

STALE_POLLS = 3  # a snapshot older than this many poll intervals is stale
LATE_POLLS = 2  # its age is said from this many intervals on: a figure that changes each second repaints the line
RTT_EVERY_S = 10.0  # the round trip said at most this often, for the same reason
PANE_TITLES = {"#stages": "stages", "#disk": "disk budget", "#gpus": "GPUs", "#serving": "serving",
               "#processes": "processes & ports", "#curves": "training", "#evals": "eval runs", "#alerts": "alerts"}


class BoxScreen(ActionKeys):
    BINDINGS = bindings("box") + bindings("disk")

    def __init__(self, context: BoxScreenContext) -> None:
        super().__init__(context)
        self.connection = Connection(self.target_label(), readonly=self.readonly)
        self.rtt_said_at = 0.0
        self.status_bar = StatusBar(id="status")

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
            self._show_stage_log(self.config.stages[0].name)
        if self.context.polling:
            self.poll()
            if any(s.nodes for s in self.context.fleet_config.stages):
                self.follow_nodes()

    async def on_unmount(self) -> None:
        if self.box is not None:  # (none made: nothing to end)
            await self.session.close()  # the SSH connection and the probe on the box end with the screen

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Read-only: the keys that change the box are shown greyed and do nothing (the app says why)."""
        return None if self.readonly and action in CHANGES_BOX else True

    # ------------------------------------------------------------ polling

    def poll(self) -> None:
        self.run_worker(self.session.run(self._polled, lambda e: self.internal_error("reading the snapshot", e)),
                        name="poll", group="poll", exclusive=True, exit_on_error=False)

    def _polled(self, result: StateUpdate | PollFailed) -> None:
        from samai.console.core.session import PollFailed  # loaded with the session, after the first paint

        if isinstance(result, PollFailed):
            self._poll_failed(result)
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
        self.show_update(self.state.apply(snap, followers, self.clock()))

    def show_update(self, u: StateUpdate) -> None:
        if self.connection.state == "lost":
            self.notify("the box answers again", title="reconnected", markup=False)
        # The first snapshot after a (re)connect timed the handshake too: said as such, not as a round trip.
        first = self.connection.state != "connected"
        if first:
            self.read_environments()
        run = self.state.eval_to_check(u.evals)
        if run is not None:
            self.check_eval_run(run)
        if u.curve_resumed_at is not None and self.state.train_log is not None:
            self.read_earlier_curve(self.state.train_log.path, u.curve_resumed_at)
        if (first or u.curve_reset) and self.state.train_log is not None:
            self.read_reference(self.state.train_log.path)
        for stage in self.state.checkpoints_due(self.clock()):
            self.list_checkpoints(stage.name, stage.checkpoints or "")
        if self.state.watchers_due(self.clock()):
            self.read_watchers()
        snap = u.snapshot
        self.connection = Connection(self.target_label(), snap.host, "connected", 0.0, self._rtt_to_say(snap, first),
                                     False, self.readonly, connect_s=snap.rtt if first else self.connection.connect_s,
                                     watched=self.connection.watched, watched_ok=self.connection.watched_ok)
        self._follow_busiest_stage(u.stages)
        self._stage_views = u.stages
        self.show_panes(u)
        if self.disk_users_due():
            self.measure_disk_users()
        for a in u.new_alerts:
            if a.severity == "error":
                self.notify(self.named(a).text, severity="error", timeout=8, markup=False)  # never markup
        self.tick()

    def _rtt_to_say(self, snap: Snapshot, first: bool) -> float | None:
        """This poll's round trip when the last one said is RTT_EVERY_S old, else that one; none
        for the first snapshot after a (re)connect, which timed the handshake too."""
        now = self.clock()
        if first or self.connection.rtt is None or now - self.rtt_said_at >= RTT_EVERY_S:
            self.rtt_said_at = now
            return None if first else snap.rtt
        return self.connection.rtt

    @work(group="watchers", exclusive=True, exit_on_error=False)
    async def read_watchers(self) -> None:
        """Who watches the box with nobody at the keys (the status line), and what is acknowledged."""
        from samai.console.core.watch.seen import watched_words

        if self.box is None:
            return
        try:
            shared = await self.box.watchers()
        except (BoxError, TransportError) as e:
            self.log.warning("watchers not read", e)
            return
        self.state.read_watchers(shared)
        words, ok = watched_words(shared, shared.now)
        self.connection = replace(self.connection, watched=words, watched_ok=ok)
        self.tick()

    @one_action_at_a_time
    async def action_acknowledge(self) -> None:
        """Every active alert acknowledged on the box: no watcher of it repeats them (audited)."""
        from samai.console.core.watch.policy import alert_identity

        active = self.state.active_alerts()
        if not active:
            self.notify("no active alert to acknowledge", severity="information", markup=False)
            return
        texts = {alert_identity(a): a.text[:300] for a in active}
        ok, message = await self._actions().acknowledge(list(texts), texts)
        self.notify(message, severity="information" if ok else "error", markup=False)
        if ok:
            self.read_watchers()

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
