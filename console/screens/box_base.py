"""What the box screen and its helpers share: the box's session, its config, the one way an
action is run and reported, and how an update reaches the panes. The screen (box.py) composes
the panes and binds the keys; its helpers do the work of a group of keys: which log is shown
(box_logs.py LogChoice), the actions (box_actions.py BoxActions), the reads the operator asks
for (box_reads.py OperatorReads). Each is handed this base, never the screen's private state."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol, cast

from textual import work
from textual.notifications import SeverityLevel
from textual.screen import Screen
from textual.widget import Widget
from textual.worker import Worker, WorkerState

from samai.widgets.pane import ShowsUpdates

if TYPE_CHECKING:
    from samai.console.core.actions import ActionOutcome, ActionPlan, Actions, Decision
    from samai.console.core.alertbook import Alert
    from samai.console.core.audit import AuditLog
    from samai.console.core.config import Config
    from samai.console.core.logcursor import LogCursor
    from samai.console.core.multinode.session import MultiNodeSession
    from samai.console.core.session import BoxSession, OpenBox, PollFailed
    from samai.console.core.state import ConsoleState
    from samai.console.core.update import StateUpdate
    from samai.console.screens.gguf import GgufScreen
    from samai.remote.boxapi import Box

FAILED_TAIL_LINES = 5  # of a chain that failed at once, shown with the failure


@dataclass(frozen=True)
class BoxScreenContext:
    """What the app hands each box screen it opens: the fleet's config, which box, and the console's settings."""

    fleet_config: Config  # every box; the screen's own config is this as seen on its box
    box_name: str | None  # the [boxes.NAME] shown; None: the config's one target
    audit: AuditLog
    readonly: bool
    clock: Callable[[], float]
    polling: bool  # off only to render recorded snapshots (screenshots, snapshot tests)
    nodes: Callable[[], MultiNodeSession]  # the app's connections to the nodes of multi-node stages
    open_box: OpenBox  # a config to its Box (tests hand in a recorded box)
    after_first_paint: Callable[[Callable[[], object]], None]  # a callback once the first frame is shown

    @property
    def config(self) -> Config:
        return self.fleet_config.on_box(self.box_name) if self.box_name else self.fleet_config


class ChoosesLogs(Protocol):
    """What the screen's helpers ask of its log choice (box_logs.py LogChoice)."""

    def open_stage_log(self, name: str) -> None: ...

    def show_file(self, path: str, *, record: bool = True, offset: int | None = None) -> None: ...

    async def read_gguf(self, screen: GgufScreen) -> None: ...


@functools.cache
def _shows_updates(cls: type) -> bool:
    """Whether a widget class is a pane (a runtime Protocol check costs tens of microseconds: once per class)."""
    return issubclass(cls, ShowsUpdates)


class BoxScreenBase(Screen[None]):
    def __init__(self, context: BoxScreenContext) -> None:
        super().__init__()
        self.context = context
        self.config = context.config
        self.readonly = context.readonly
        self.clock = context.clock
        self._session: BoxSession | None = None
        self._action_running = False
        self.logs: ChoosesLogs  # which log the log pane shows (the screen's LogChoice)
        self._errors_said: set[tuple[str, str, str]] = set()  # internal errors already shown (each once)

    @property
    def session(self) -> BoxSession:
        """The box's session, made on first use: its modules (the state, the detectors, the Box)
        are loaded after the first paint, when the poll starts, not before it."""
        if self._session is None:
            from samai.console.core.feeds import Surroundings
            from samai.console.core.session import BoxSession

            around = Surroundings(self.context.box_name, self.context.nodes)
            self._session = BoxSession(self.config, self.context.open_box, clock=self.clock, around=around, log=True)
        return self._session

    @property
    def state(self) -> ConsoleState:
        return self.session.state

    @property
    def cursor(self) -> LogCursor:
        """The log pane's: which log it shows."""
        cursor = self.session.cursor
        assert cursor is not None  # (the box screen's session is made with one)
        return cursor

    @property
    def shown_stage(self) -> str | None:
        """Whose log the log pane shows (None: a file, or none yet)."""
        return self._session.cursor.stage if self._session is not None and self._session.cursor else None

    @property
    def box(self) -> Box | None:
        return self._session.box if self._session is not None else None

    @property
    def busy(self) -> bool:
        """Whether an action (fire, stop, kill, clean, fix) is in flight: a second one is refused meanwhile."""
        return self._action_running

    def multi_node(self, stage: str) -> bool:
        found = self.context.fleet_config.stage(stage)
        return found is not None and bool(found.nodes)

    def report(self, result: StateUpdate | PollFailed) -> None:
        """What the session reports (a poll, a read beside it): the box screen shows it."""
        raise NotImplementedError

    @work(group="gguf", exit_on_error=False)  # one per screen: a second one opened leaves the first's alone
    async def read_gguf(self, screen: GgufScreen) -> None:
        await self.logs.read_gguf(screen)

    def read_bug(self, e: Exception) -> None:
        self.internal_error("reading the box", e)

    # ------------------------------------------------------------ the action layer

    def actions(self) -> Actions:
        from samai.console.core.actions import Actions  # with psutil: needed only once an action runs, not to start

        return Actions(self.session.connected_box(), self.config, self.context.audit, readonly=self.readonly,
                       confirm=self.confirm)

    async def confirm(self, plan: ActionPlan) -> Decision:
        from samai.console.core.actions import Decision  # see actions()
        from samai.console.screens.dialogs import ConfirmDialog  # each dialog's module is imported when one opens

        if not await self.app.push_screen_wait(ConfirmDialog(plan, plan.checks)):
            return Decision.declined(plan, "cancelled in the dialog")
        # The dialog showed this plan's checks; for a blocked plan its button is the override ("… anyway").
        return Decision.override(plan, "dialog") if plan.blocked else Decision.confirmed(plan, "dialog")

    def say_outcome(self, outcome: ActionOutcome) -> None:
        self.state.sizer.refresh_all()  # whatever the action made or removed is sized in the next poll
        severity: SeverityLevel = "information" if outcome.ok else "warning" if outcome.status == "cancelled" \
            else "error"
        tail = getattr(outcome.result, "stage_tail", ()) if not outcome.ok else ()
        message = "\n".join([outcome.message, *(line[:100] for line in tail[-FAILED_TAIL_LINES:])])
        # Box text (stage output, commands): never markup (notify redacts its secrets).
        self.notify(message, severity=severity, timeout=6 if outcome.ok else 15, markup=False)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """The one place a failed worker of this screen is reported: nothing fails silently."""
        if event.state == WorkerState.ERROR:
            self.notify(f"{event.worker.name} failed: {event.worker.error!r}", severity="error", timeout=15,
                        markup=False)

    # ------------------------------------------------------------ alerts

    def named(self, alert: Alert) -> Alert:
        """With [boxes], an alert says whose box it is about."""
        name = self.context.box_name
        if not self.context.fleet_config.boxes or not name:
            return alert
        return replace(alert, text=f"{name}: {alert.text}")

    # ------------------------------------------------------------ the panes

    def show_panes(self, u: StateUpdate) -> None:
        """Every pane is handed the update (as the panes take it), each on its own."""
        u = self._for_panes(u)
        for pane in self.walk_children(Widget):
            if _shows_updates(type(pane)):
                try:
                    cast(ShowsUpdates, pane).show_update(u)
                except Exception as e:  # a bug in one pane costs that pane, never the others or the poll
                    self.internal_error(f"showing {pane.id or type(pane).__name__}", e)

    def show_beside_poll(self, u: StateUpdate | None) -> None:
        """What the state made of a read outside the poll (a failed fire, a rank that died, the
        box gone quiet): the panes are handed it as they are a poll's. None: nothing to show now."""
        if u is not None:
            self.show_panes(u)

    def _for_panes(self, u: StateUpdate) -> StateUpdate:
        """The update as the panes take it: no lines of a log the pane no longer shows (this very
        update may have switched it to the running stage's), and the log pane's notices said for
        this screen."""
        log, cursor = u.log, self.session.cursor
        if log is None or cursor is None:
            return u
        if log.source is not cursor.follower:
            log = replace(log, lines=[], notice=None)
        if log.notice:
            log = replace(log, notice=self.log_notice(log.notice))
        return replace(u, log=log)

    def log_notice(self, notice: str) -> str:
        """The follower's notice, said for this pane: a stage log that is not there yet is one
        its stage has not written, and its key writes it."""
        from samai.remote.follow import missing_notice  # with the poll's modules, after the first paint

        cursor = self.session.cursor
        stage = self.config.stage(cursor.stage or "") if cursor else None
        if stage is None or cursor is None or cursor.path is None or notice != missing_notice(cursor.path):
            return notice
        if self.readonly:
            return f"no log yet: {stage.name} has not run here ({stage.log})"
        return f"no log yet — press {stage.key} to fire {stage.name} ({stage.log})"

    def internal_error(self, doing: str, e: Exception) -> None:
        """A bug met while showing the box: logged each time, said once per kind (not every second)."""
        self.log.error(f"internal error {doing}", e)
        said = (doing, type(e).__name__, str(e)[:200])
        if said not in self._errors_said:
            self._errors_said.add(said)
            self.notify(f"internal error {doing}: {type(e).__name__}: {e}"[:300], severity="error", markup=False)
