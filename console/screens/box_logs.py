"""Which log the box screen's log pane shows: a stage's, a file, one from its history; the
picker, `o` (a file, or a GGUF's header on its own screen), Tab completion and saving the shown
lines. The session's LogCursor is what the poll reads; this chooses it and resets the pane."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from samai.console.core import paths
from samai.console.core.redact import redact
from samai.remote.errors import BoxError
from samai.remote.targets import TargetError
from samai.remote.transport import TransportError
from samai.widgets.logview import LogView
from samai.widgets.logview.history import LogHistory, ShownLog
from samai.widgets.pane import inert

if TYPE_CHECKING:
    from samai.console.core.alertbook import Alert
    from samai.console.core.update import StageView
    from samai.console.screens.box_base import BoxScreenBase
    from samai.console.screens.dialogs import PathDialog
    from samai.console.screens.gguf import GgufScreen
    from samai.remote.model import Listing


class LogChoice:
    def __init__(self, screen: BoxScreenBase) -> None:
        self.screen = screen
        self.chosen = False  # the operator picked a log: stop choosing one for them
        self._hint_taken: Alert | None = None  # the alert whose stage log `l` last opened
        self.history = LogHistory()  # the logs shown: [ and ] go back and forward, L lists recent files
        self.stage_views: list[StageView] = []  # the stages as last polled: the picker shows their status

    def _pane(self) -> LogView:
        return self.screen.query_one(LogView)

    def open_stage_log(self, name: str) -> None:
        self.chosen = True
        self.show_stage_log(name)

    def show_stage_log(self, name: str, *, record: bool = True) -> None:
        if name == self.screen.shown_stage:
            return  # already shown: starting over would blank what the operator is reading
        cursor = self.screen.cursor
        shown = cursor.show_stage_log(name)
        log = self._pane()
        log.reset(shown.path, cursor.markers())
        log.border_title = inert(f"log · {name}")
        if record:
            self.history.visit(ShownLog(shown.path, name))

    def follow_busiest_stage(self, stages: list[StageView]) -> None:
        """Until the operator picks a log, show the running stage's (else the last one fired)."""
        self.stage_views = stages
        if self.chosen:
            return
        fired = sorted((v for v in stages if v.since), key=lambda v: (v.status == "running", v.since))
        if fired and fired[-1].name != self.screen.shown_stage:
            self.show_stage_log(fired[-1].name)

    def show_file(self, path: str, *, record: bool = True, offset: int | None = None) -> None:
        """A file on the box by path (relative: in the workspace), its last lines or (offset)
        from that byte on; the alarms mark its lines."""
        self.chosen = True
        follower = self.screen.cursor.show_log(path, offset=offset)
        log = self._pane()
        log.reset(follower.path, ())
        log.border_title = inert(f"file · {path}")
        if record:
            self.history.visit(ShownLog(path))

    def show_logged(self, log: ShownLog, *, record: bool) -> None:
        """A log from the history (not recorded again) or the picker, by what it was: a stage's
        (while the config still has that stage) or a file."""
        self.chosen = True
        if log.stage is not None and self.screen.config.stage(log.stage):
            self.show_stage_log(log.stage, record=record)
        else:
            self.show_file(log.path, record=record)

    def step_to(self, log: ShownLog | None) -> None:
        """[ or ]: the log before or after in the history (not recorded again); none there: a bell."""
        if log is None:
            self.screen.app.bell()
        else:
            self.show_logged(log, record=False)

    async def pick(self) -> None:
        from samai.console.screens.dialogs import LogPicker  # each dialog's module is imported when one opens

        views = {v.name: v for v in self.stage_views}
        config = self.screen.config
        stages = [(ShownLog(config.path_of(s.log), s.name), views.get(s.name)) for s in config.stages]
        files = [ShownLog(path) for path in self.history.recent_files]
        chosen = await self.screen.app.push_screen_wait(LogPicker(stages, files, self.history.current,
                                                                  self.screen.clock()))
        if chosen is not None:
            self.show_logged(chosen, record=True)

    def next_log(self) -> None:
        self.chosen = True
        hinted = self._alert_log()
        if hinted:
            self.show_stage_log(hinted)
            return
        names = [s.name for s in self.screen.config.stages]
        if names:
            current = self.screen.shown_stage
            self.show_stage_log(names[(names.index(current) + 1) % len(names)] if current in names else names[0])

    def _alert_log(self) -> str | None:
        """The stage of the newest active alert that offers `l log`, the first time `l` is pressed
        after it came (then `l` goes on to the next stage's log as usual)."""
        alert = next((a for a in self.screen.state.alerts if a.active and "l log" in a.hint and a.stage), None)
        if alert is None or alert.stage is None or alert == self._hint_taken \
                or not self.screen.config.stage(alert.stage):
            return None
        self._hint_taken = alert
        return alert.stage

    async def open_file(self) -> None:
        from samai.console.screens.dialogs import PathDialog  # see pick
        from samai.console.screens.gguf import GgufScreen

        app = self.screen.app
        path = await app.push_screen_wait(PathDialog("open a file on the box in the log pane (a .gguf: its "
                                                     "header and tensors) · Tab completes",
                                                     "/path/on/box.log (relative: inside the workspace)",
                                                     completes=True))
        if path and path.lower().endswith(".gguf"):
            screen = GgufScreen(path, readonly=self.screen.readonly)  # its header read while it is up
            await app.push_screen(screen)
            self.screen.read_gguf(screen)
        elif path:
            while isinstance(app.screen, GgufScreen):
                await app.pop_screen()  # `o` on a GGUF's screen: back to the log pane that shows the file
            self.show_file(path)

    async def complete(self, dialog: PathDialog, text: str, folder: str) -> None:
        """Tab in the path dialog: the folder's entries that start with the name typed, as the box lists them."""
        try:
            box = self.screen.box
            if box is None:
                raise BoxError("not connected to the box yet")
            listing: Listing | str = await box.list_dir(folder or ".", prefix=text[len(folder):])
        except (BoxError, TransportError) as e:
            listing = str(e) or type(e).__name__
        if dialog.is_attached:
            dialog.offer(text, listing)

    async def read_gguf(self, screen: GgufScreen) -> None:
        try:
            header = await self.screen.session.connected_box().gguf_show(screen.path)
        except (BoxError, TransportError, TargetError) as e:
            if screen.is_attached:
                screen.show_error(str(e) or type(e).__name__)
            return
        if screen.is_attached:  # not closed meanwhile
            screen.show_header(header)

    def save(self, lines: tuple[str, ...], name: str) -> str:
        """The lines written to the console's saved logs (no secrets kept); where."""
        folder = paths.saved_logs_dir()
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.log"
        Path(target).write_text("\n".join(redact(line) for line in lines) + "\n", "utf-8")
        return f"saved {len(lines)} lines to {target}"
