"""The box screen's log keys: which log the log pane shows (a stage's, a file, one from the
history), the picker, `o` (a file or a GGUF's header), Tab completion and saving shown lines."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from textual import work

from samai.console.core import paths
from samai.console.core.redact import redact
from samai.console.screens.box_base import BoxScreenBase, BoxScreenContext
from samai.remote.errors import BoxError
from samai.remote.targets import TargetError
from samai.remote.transport import TransportError
from samai.widgets.logview import LogView
from samai.widgets.logview.history import LogHistory, ShownLog
from samai.widgets.pane import inert

if TYPE_CHECKING:
    from samai.console.core.state import Alert, StageView
    from samai.console.screens.dialogs import PathDialog
    from samai.console.screens.gguf import GgufScreen
    from samai.remote.model import Listing


class LogKeys(BoxScreenBase):
    def __init__(self, context: BoxScreenContext) -> None:
        super().__init__(context)
        self._log_chosen = False  # the operator picked a log: stop choosing one for them
        self._log_hint_taken: Alert | None = None  # the alert whose stage log `l` last opened
        self._logs = LogHistory()  # the logs shown: [ and ] go back and forward, L lists recent files
        self._stage_views: list[StageView] = []  # the stages as last polled: the log picker shows their status

    def open_stage_log(self, name: str) -> None:
        self._log_chosen = True
        self._show_stage_log(name)

    def _show_stage_log(self, name: str, *, record: bool = True) -> None:
        if name == self.state.shown_stage:
            return  # already shown: starting over would blank what the operator is reading
        shown = self.state.show_stage_log(name)
        log = self.query_one(LogView)
        log.reset(shown.path, self.state.shown_markers())
        log.border_title = inert(f"log · {name}")
        if record:
            self._logs.visit(ShownLog(shown.path, name))

    def _follow_busiest_stage(self, stages: list[StageView]) -> None:
        """Until the operator picks a log, show the running stage's (else the last one fired)."""
        if self._log_chosen:
            return
        fired = sorted((v for v in stages if v.since), key=lambda v: (v.status == "running", v.since))
        if fired and fired[-1].name != self.state.shown_stage:
            self._show_stage_log(fired[-1].name)

    def _show_file(self, path: str, *, record: bool = True, offset: int | None = None) -> None:
        """A file on the box by path (relative: in the workspace), its last lines or (offset)
        from that byte on; the alarms mark its lines."""
        self._log_chosen = True
        follower = self.state.show_log(path, offset=offset)
        log = self.query_one(LogView)
        log.reset(follower.path, ())
        log.border_title = inert(f"file · {path}")
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

    def action_log_back(self) -> None:
        self._step_to(self._logs.back())

    def action_log_forward(self) -> None:
        self._step_to(self._logs.forward())

    def _step_to(self, log: ShownLog | None) -> None:
        """[ or ]: the log before or after in the history (not recorded again); none there: a bell."""
        if log is None:
            self.app.bell()
        else:
            self._show_logged(log, record=False)

    @work(group="dialog", exclusive=True)
    async def action_pick_log(self) -> None:
        from samai.console.screens.dialogs import LogPicker  # each dialog's module is imported when one opens

        views = {v.name: v for v in self._stage_views}
        stages = [(ShownLog(self.state.path_of(s.log), s.name), views.get(s.name)) for s in self.config.stages]
        files = [ShownLog(path) for path in self._logs.recent_files]
        chosen = await self.app.push_screen_wait(LogPicker(stages, files, self._logs.current, self.clock()))
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
            current = self.state.shown_stage
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
        from samai.console.screens.dialogs import PathDialog  # see action_pick_log

        path = await self.app.push_screen_wait(PathDialog("open a file on the box in the log pane (a .gguf: its "
                                                          "header and tensors) · Tab completes",
                                                          "/path/on/box.log (relative: inside the workspace)",
                                                          completes=True))
        if path and path.lower().endswith(".gguf"):
            await self._open_gguf(path)
        elif path:
            from samai.console.screens.gguf import GgufScreen

            while isinstance(self.app.screen, GgufScreen):
                await self.app.pop_screen()  # `o` on a GGUF's screen: back to the log pane that shows the file
            self._show_file(path)

    @work(group="complete", exclusive=True, exit_on_error=False)
    async def complete_path(self, dialog: PathDialog, text: str, folder: str) -> None:
        """Tab in the path dialog: the folder's entries that start with the name typed, as the box lists them."""
        try:
            if self.box is None:
                raise BoxError("not connected to the box yet")
            listing: Listing | str = await self.box.list_dir(folder or ".", prefix=text[len(folder):])
        except (BoxError, TransportError) as e:
            listing = str(e) or type(e).__name__
        if dialog.is_attached:
            dialog.offer(text, listing)

    async def _open_gguf(self, path: str) -> None:
        """A .gguf opened with `o`: its header and tables on their own screen (Esc returns), read
        in a worker while the screen is already up."""
        from samai.console.screens.gguf import GgufScreen  # see action_pick_log

        screen = GgufScreen(path, readonly=self.readonly)
        await self.app.push_screen(screen)
        self._read_gguf(screen)

    @work(group="gguf", exit_on_error=False)  # one per screen: a second one opened leaves the first's alone
    async def _read_gguf(self, screen: GgufScreen) -> None:
        try:
            header = await self.session.connected_box().gguf_show(screen.path)
        except (BoxError, TransportError, TargetError) as e:
            if screen.is_attached:
                screen.show_error(str(e) or type(e).__name__)
            return
        if screen.is_attached:  # not closed meanwhile
            screen.show_header(header)

    def on_log_view_save_requested(self, event: LogView.SaveRequested) -> None:
        self._save_lines(event.lines, self.state.shown_stage or "file")

    @work(thread=True, group="save", exit_on_error=False)
    def _save_lines(self, lines: tuple[str, ...], name: str) -> None:
        folder = paths.saved_logs_dir()
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.log"
        Path(target).write_text("\n".join(redact(line) for line in lines) + "\n", "utf-8")  # no secrets kept
        self.app.call_from_thread(self.notify, f"saved {len(lines)} lines to {target}", markup=False)
