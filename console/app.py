"""The Textual app: the config, the audit log, themes, the palette, and which screen is shown.

The box screen (samai.console.screens.box) shows one box and holds its session and workers; the
fleet screen every box. Switching box or target replaces the box screen, so nothing of the old
one survives. Every change to the box goes through the action layer (samai.console.core.actions).

A replay (an incident bundle, `recording=`) has no box: every box it could open is opened by its
one factory, which refuses (samai.console.replay), and its keys that would reach a box say so.
What the console shows or writes passes through the config's SecretMask (a replay's: redact only,
no variable a bundle names is read)."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from textual import events, work
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.notifications import SeverityLevel
from textual.screen import Screen
from textual.worker import Worker, WorkerState

from samai.console import prefs
from samai.console.core import paths
from samai.console.core.audit import AuditLog
from samai.console.core.commands import BY_ID, CHANGES_BOX, SCOPE_TITLES, Command
from samai.console.core.redact import redact
from samai.console.core.secret_mask import SecretMask
from samai.console.screens.box import BoxScreen
from samai.console.screens.box_base import BoxScreenContext
from samai.remote.safe_text import visible
from samai.remote.targets import TargetError, open_transport
from samai.themes import DEFAULT_THEME, THEMES, stylesheet
from samai.widgets.keys import bindings
from samai.widgets.pane import literal_markup

if TYPE_CHECKING:
    from collections.abc import Mapping

    from textual.actions import ActionParseResult
    from textual.dom import DOMNode

    from samai.console.core.config import Config
    from samai.console.core.incident import Bundle
    from samai.console.core.multinode.session import MultiNodeSession
    from samai.console.core.session import OpenBox
    from samai.console.core.state import ConsoleState
    from samai.console.screens.dialogs import PathDialog
    from samai.console.screens.fleet import FleetScreen
    from samai.console.screens.gguf import GgufScreen
    from samai.remote.boxapi import Box
    from samai.widgets.status import Connection

FLEET_SCREEN = "fleet"  # the installed fleet screen's name: it and its pollers live as long as the console


def _open_box(cfg: Config, readonly: bool) -> Box:
    """The Box on cfg's target; its modules load with the first poll, after the first paint."""
    from samai.console.core import connect

    return connect.open_box(cfg, readonly=readonly)


class SamaiApp(App[None]):
    TITLE = "samai-console"
    CSS = stylesheet()
    BINDINGS = bindings("app")

    def __init__(self, config: Config, *, readonly: bool = False, theme: str | None = None,
                 audit: AuditLog | None = None, poll: bool = True, clock: Callable[[], float] = time.time,
                 box: str | None = None, open_box: OpenBox | None = None, recording: dict | None = None) -> None:
        """box: the [boxes.NAME] box to open at once; None: with 2+ boxes the fleet screen comes first.
        open_box: a config to its Box (by default on the config's target; tests hand in a recorded box).
        recording: a recorded box (console/replay.py, an incident bundle) shown instead of polling: a
        replay, which opens no box (no open_box with it)."""
        super().__init__()
        self.recording = recording
        self.replay = recording is not None
        if self.replay and open_box is not None:
            raise ValueError("a replay opens no box")
        # The secrets the console masks wherever its text goes: a replay's config is data, its variables unread.
        self.secret_mask = SecretMask() if self.replay else SecretMask.of_config(config)
        self.fleet_config = config  # every box; the box screen's config is this as seen on its box
        self._first_box = box or (config.boxes[0].name if config.boxes else None)
        self._fleet_first = box is None and len(config.boxes) >= 2
        self.polling = poll  # off only to render recorded snapshots (screenshots, snapshot tests)
        self.clock = clock
        self.readonly = readonly
        self.audit = audit or AuditLog(paths.audit_log(), self.secret_mask)
        self.multinode: MultiNodeSession | None = None  # the nodes of multi-node stages, connected when needed
        self.open_box: OpenBox = open_box or self._box_factory(readonly)
        self._painted = False  # see after_first_paint
        self._after_paint: list[Callable[[], object]] = []
        # the fleet first: the box chosen there is polled
        self.box_screen = self._new_box_screen(self._first_box, self.fleet_config,
                                               polling=self.polling and not self._fleet_first)
        self._bind_stage_keys()
        self.set_keymap(dict(self.box_screen.config.ui.keys))
        for t in THEMES:
            self.register_theme(t)
        chosen = theme or prefs.load().get("theme") or config.ui.theme
        self.theme = chosen if chosen in self.available_themes else DEFAULT_THEME

    @classmethod
    def replaying(cls, bundle: Bundle, *, theme: str | None = None) -> SamaiApp:
        """An incident bundle shown as the console showed the box: read-only, nothing polled, no box."""
        return cls(bundle.config, readonly=True, theme=theme, poll=False, clock=lambda: bundle.made_at,
                   recording=bundle.data)

    def _box_factory(self, readonly: bool) -> OpenBox:
        """How this console opens a box (its screen's, the fleet's rows'): a replay's refuses."""
        if self.replay:
            from samai.console.replay import no_box

            return no_box
        return lambda cfg: _open_box(cfg, readonly)

    def _refuse_in_replay(self) -> bool:
        """In a replay: say that there is no box, and True (the caller does nothing more)."""
        if self.replay:
            from samai.console.replay import REFUSAL

            self.notify(REFUSAL, severity="warning")
        return self.replay

    # ------------------------------------------------------------ what the box screen shows (tests read these)

    @property
    def config(self) -> Config:
        return self.box_screen.config

    @property
    def box_name(self) -> str | None:
        return self.box_screen.context.box_name

    @property
    def state(self) -> ConsoleState:
        return self.box_screen.state

    @property
    def box(self) -> Box | None:
        return self.box_screen.box

    @property
    def connection(self) -> Connection:
        return self.box_screen.connection

    @property
    def busy(self) -> bool:
        return self.box_screen.busy

    def show_snapshot(self, snap, followers: list) -> None:
        self.box_screen.show_snapshot(snap, followers)

    # ------------------------------------------------------------ screens

    def _new_box_screen(self, box_name: str | None, fleet_config: Config, *, polling: bool) -> BoxScreen:
        return BoxScreen(BoxScreenContext(fleet_config, box_name, self.audit, self.readonly, self.clock, polling,
                                          self.nodes, self.open_box, self.after_first_paint))

    def after_first_paint(self, callback: Callable[[], object]) -> None:
        """callback once the console's first frame is on the terminal (after the next refresh, if it
        is already). Textual writes that frame only when the start's batch ends, after the callbacks
        of the first refresh: what a screen loads there would hold the frame back."""
        if self._painted:
            self.call_after_refresh(callback)
        else:
            self._after_paint.append(callback)

    def on_ready(self) -> None:
        """The DOM is ready and the first frame is being written."""
        self._painted = True
        for callback in self._after_paint:
            self.call_after_refresh(callback)
        self._after_paint.clear()

    async def on_mount(self) -> None:
        # Above Textual's own (empty) base screen, so that replacing it never leaves the stack empty.
        await self.push_screen(self.box_screen)
        if self.recording is not None:
            from samai.console import replay

            self.call_after_refresh(replay.show, self, self.recording)
        self.theme_changed_signal.subscribe(self, lambda theme: self._save_theme(theme.name))
        if self.polling and self._fleet_first:
            self.call_after_refresh(self.action_fleet)  # the box screen polls once a box is chosen

    async def on_unmount(self) -> None:
        if self.multinode is not None:
            await self.multinode.close()

    def nodes(self) -> MultiNodeSession:
        """The connections to every node of the multi-node stages: one set for the console, opened when needed."""
        from samai.console.core.multinode.session import MultiNodeSession  # connects only once a stage needs it

        if self.replay:
            from samai.console.replay import REFUSAL, NoBox

            raise NoBox(REFUSAL)
        if self.multinode is None:
            self.multinode = MultiNodeSession(self.fleet_config, self.audit, readonly=self.readonly,
                                              confirm=lambda plan: self.box_screen.confirm(plan))
        return self.multinode

    @work(group="switch", exclusive=True, exit_on_error=False)
    async def open_box_screen(self, name: str) -> None:
        """The box screen, for box `name` (Enter on the fleet, the palette): the screens above it closed."""
        if self._refuse_in_replay():
            return
        await self._pop_to_box_screen()
        await self.switch_box(name)

    async def _pop_to_box_screen(self) -> None:
        while len(self.screen_stack) > 2:  # Textual's base screen, then the box screen
            await self.pop_screen()

    async def switch_box(self, name: str) -> None:
        """Show another box: a new box screen, with its own session; the old one, its workers and its
        connection end with it."""
        if name == self.box_name and self.box_screen.context.polling:
            return
        await self._replace_box_screen(name, self.fleet_config)

    async def _replace_box_screen(self, name: str | None, fleet_config: Config) -> None:
        if self.box_screen.busy:
            self.notify("an action is still running on this box; switch once it is done", severity="warning")
            return
        self.box_screen = screen = self._new_box_screen(name, fleet_config, polling=self.polling)
        await self._pop_to_box_screen()
        await self.switch_screen(screen)

    @work(group="dialog", exclusive=True)
    async def switch_target(self) -> None:
        from samai.console.screens.dialogs import PathDialog  # each dialog's module is imported when one opens

        if self._refuse_in_replay():
            return
        url = await self.push_screen_wait(PathDialog("switch target", "local or ssh://user@host[:port]",
                                                     self.config.target.url))
        if not url or url == self.config.target.url:
            return
        try:
            open_transport(url)
        except TargetError as e:
            self.notify(str(e), severity="error", markup=False)
            return
        await self._replace_box_screen(self.box_name, self.fleet_config.with_target(url))

    def action_fleet(self) -> None:
        """F: the fleet screen (made once; its pollers run as long as the console)."""
        from samai.console.core.fleet import Fleet
        from samai.console.screens.fleet import FleetScreen

        if not self.fleet_config.boxes or isinstance(self.screen, FleetScreen) or self._refuse_in_replay():
            return
        if not self.is_screen_installed(FLEET_SCREEN):
            fleet = Fleet(self.fleet_config, self._box_factory(True), clock=self.clock)
            self.install_screen(FleetScreen(fleet), FLEET_SCREEN)
        self.push_screen(FLEET_SCREEN)

    def on_fleet_screen_box_chosen(self, event: FleetScreen.BoxChosen) -> None:
        self.open_box_screen(event.name or self.box_name or "")

    # Keys and messages from screens above the box screen, for the box they are about.

    def action_open_file(self) -> None:
        self.box_screen.action_open_file()

    def on_gguf_screen_edit_requested(self, event: GgufScreen.EditRequested) -> None:
        self.box_screen.gguf_set_kv(event.view, event.kv)

    def on_gguf_screen_add_requested(self, event: GgufScreen.AddRequested) -> None:
        self.box_screen.gguf_add_tensors(event.view)

    def on_path_dialog_completion_requested(self, event: PathDialog.CompletionRequested) -> None:
        self.box_screen.complete_path(event.dialog, event.text, event.folder)

    # ------------------------------------------------------------ keys

    def _bind_stage_keys(self) -> None:
        """A stage's key works on the box screen (the action runs on the screen shown)."""
        for stage in self.fleet_config.stages:
            self.bind(stage.key, f"screen.fire('{stage.name}')", description=f"Fire {stage.name}", show=False)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "fleet" and (not self.fleet_config.boxes or self._on_fleet()):
            return False  # one box: no fleet to show; on the fleet: there already
        return True

    def _on_fleet(self) -> bool:
        return self.is_screen_installed(FLEET_SCREEN) and self.screen is self.get_screen(FLEET_SCREEN)

    async def run_action(self, action: str | ActionParseResult, default_namespace: DOMNode | None = None,
                         namespaces: Mapping[str, DOMNode] | None = None) -> bool:
        """Every key's and click's action: in a replay, one that would reach a box says so instead."""
        if self.replay:
            from samai.console.replay import refuses

            if refuses(action if isinstance(action, str) else action[1]):
                self._refuse_in_replay()
                return True
        return await super().run_action(action, default_namespace, namespaces)

    def on_key(self, event: events.Key) -> None:
        """Read-only: a key that would change the box says why it does nothing (a replay's: run_action)."""
        if not self.readonly or self.replay:
            return
        active = self.screen.active_bindings.get(event.key)
        if active is not None and active.binding.action.split("(")[0].split(".")[-1] in CHANGES_BOX:
            self.notify(f"read-only: {event.key} ({active.binding.description.lower() or active.binding.action}) "
                        "would change the box; start the console without --readonly to act",
                        severity="warning", markup=False)

    def action_help(self) -> None:
        from samai.console.screens.dialogs import HelpScreen  # see switch_target

        self.push_screen(HelpScreen(self._help_rows()))

    def _help_rows(self) -> list[tuple[str, str, str, str]]:
        """(group, key, what, id) of every command with a key, and the stage keys, with the keys as
        the keymap ([ui.keys]) has them."""
        keymap = dict(self.config.ui.keys)
        stages = [Command(f"stage.{s.name}", "stage", s.key, "fire", f"Fire {s.name}", changes_box=True)
                  for s in self.config.stages]
        rows = []
        for c in [*BY_ID.values(), *stages]:
            if not c.key or (c.scope.startswith("fleet") or c.id == "app.fleet") and not self.fleet_config.boxes:
                continue
            key = keymap.get(c.id, c.key)
            off = " (read-only: off)" if self.readonly and c.changes_box else ""
            if self.replay:
                from samai.console.replay import refuses

                off = " (replay: no box)" if refuses(c.action) else ""
            shown = self.get_key_display(Binding(key.split(",")[0], c.action))
            rows.append((SCOPE_TITLES[c.scope], shown, c.description + off, c.id))
        rows.append(("console", "ctrl+p", "command palette: fire, stop, open log, theme, target", ""))
        order = list(dict.fromkeys(SCOPE_TITLES.values()))
        return sorted(rows, key=lambda r: order.index(r[0]))

    # ------------------------------------------------------------ toasts, the palette, themes

    def notify(self, message: str, *, title: str = "", severity: SeverityLevel = "information",
               timeout: float | None = None, markup: bool = False) -> None:
        """Textual's toast, literal unless a caller asks for markup: a toast mostly says what the box
        said (a path, a stage's output, an error quoting a URL), so its secrets are redacted and its
        control characters shown as stand-ins, whoever calls."""
        message = "\n".join(visible(self.secret_mask(line)) for line in message.split("\n"))
        super().notify(message, title=visible(self.secret_mask(title)), severity=severity, timeout=timeout,
                       markup=markup)

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        # The palette takes a command's title and help only as markup: what the config and the box
        # wrote there (a command's "[ -f x ]", a log named "[/x].log") is escaped to show as written.
        box = self.box_screen
        for stage in self.config.stages:
            name = stage.name
            yield SystemCommand(literal_markup(f"Open log: {name}"), literal_markup(stage.log),
                                lambda n=name: box.open_stage_log(n))
            if not self.readonly:
                yield SystemCommand(literal_markup(f"Fire {name}"), literal_markup(redact(stage.command)),
                                    lambda n=name: box.action_fire(n))
                yield SystemCommand(literal_markup(f"Stop {name}"), "its process group: TERM, then KILL",
                                    lambda n=name: box.action_stop(n))
                yield SystemCommand(literal_markup(f"Restart {name}"), "stop, clear poison files, fire",
                                    lambda n=name: box.action_restart(n))
        if self.replay:  # no box: nothing below could be done
            yield from self._theme_commands()
            return
        yield SystemCommand("Open file…", "any file on the box, in the log pane", box.action_open_file)
        if self.fleet_config.boxes:
            yield SystemCommand("Fleet", "every box on one line each (F)", self.action_fleet)
        for spec in self.fleet_config.boxes:
            yield SystemCommand(literal_markup(f"Switch to box {spec.name}"), literal_markup(redact(spec.target.url)),
                                lambda n=spec.name: self.open_box_screen(n))
        yield SystemCommand("Switch target…", "local, ssh://user@host[:port]", self.switch_target)
        yield from self._theme_commands()

    def _theme_commands(self) -> Iterable[SystemCommand]:
        for theme in THEMES:
            yield SystemCommand(f"Theme: {theme.name}", "switch the colours", lambda n=theme.name: self._set_theme(n))

    def _set_theme(self, name: str) -> None:
        self.theme = name

    @work(thread=True, group="prefs", exit_on_error=False)
    def _save_theme(self, name: str) -> None:
        prefs.save(theme=name)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """The one place a failed worker is reported: nothing fails silently."""
        if event.state == WorkerState.ERROR:
            self.notify(f"{event.worker.name} failed: {event.worker.error!r}", severity="error", timeout=15,
                        markup=False)


def run_replay(bundle: Bundle, *, theme: str | None = None) -> int:
    """An incident bundle shown as the console showed the box: read-only, nothing polled, no box."""
    gc.freeze()
    gc.enable()
    SamaiApp.replaying(bundle, theme=theme).run()
    return 0


def run_app(config: Config, *, readonly: bool = False, theme: str | None = None, box: str | None = None) -> int:
    # What the imports built lives as long as the console: no garbage collection need walk it again
    # (a full one during start-up walked all of it, delaying the first paint, and each later one would).
    gc.freeze()
    gc.enable()  # the CLI turns it off while the TUI's modules load
    SamaiApp(config, readonly=readonly, theme=theme, box=box).run()
    return 0
