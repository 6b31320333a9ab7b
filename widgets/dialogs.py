"""Modal dialogs. Every dialog that leads to a change on the box shows the exact command and
target and opens with Cancel focused: Enter on a dialog you did not read does nothing."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Button, DataTable, Input, Label, Static

if TYPE_CHECKING:  # annotations only: the action layer (and psutil) is not imported with the TUI
    from samai.console.actions import ActionPlan
    from samai.console.preflight import Check
    from samai.remote.model import Process

CHECK_STYLE = {"ok": ("✓", "$success"), "warning": ("!", "$warning"), "error": ("✗", "$error bold")}

DIALOG_CSS = """
{name} {{ align: center middle; }}
{name} > Vertical {{ width: 90%; max-width: 110; height: auto; max-height: 90%; border: thick $primary;
                     background: $surface; padding: 1 2; }}
{name} .title {{ text-style: bold; color: $primary; margin-bottom: 1; }}
{name} .command {{ background: $panel; padding: 0 1; margin-bottom: 1; }}
{name} VerticalScroll {{ height: auto; max-height: 16; }}
{name} Horizontal {{ height: auto; margin-top: 1; align-horizontal: right; }}
{name} Button {{ margin-left: 2; }}
"""


def _plan_widgets(plan: ActionPlan) -> list:
    return [
        Label(f"{plan.action} {plan.subject} on {plan.target}", classes="title"),
        Static(Content(plan.command), classes="command"),
        *(Static(Content(line)) for line in plan.details),
    ]


class ConfirmDialog(ModalScreen[bool]):
    """Fire, stop, restart, clean: the plan, the preflight checks, Cancel focused."""

    DEFAULT_CSS = DIALOG_CSS.format(name="ConfirmDialog")
    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, plan: ActionPlan, checks: tuple[Check, ...] = ()) -> None:
        super().__init__()
        self.plan, self.checks = plan, checks

    def compose(self) -> ComposeResult:
        with Vertical():
            yield from _plan_widgets(self.plan)
            if self.checks:
                with VerticalScroll():
                    for c in self.checks:
                        glyph, style = CHECK_STYLE[c.severity]
                        yield Static(Content.assemble((f"{glyph} ", style), c.text))
            blocked = any(c.severity == "error" for c in self.checks)
            with Horizontal():
                yield Button("Cancel", id="cancel", variant="primary")
                yield Button("Fire anyway" if blocked else f"Confirm {self.plan.action}", id="confirm",
                             variant="error")

    def on_mount(self) -> None:
        self.query_one("#cancel", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "confirm")

    def action_cancel(self) -> None:
        self.dismiss(False)


class KillDialog(ModalScreen[str | None]):
    """pid, user, start time, command, the children; TERM and KILL as separate choices."""

    DEFAULT_CSS = DIALOG_CSS.format(name="KillDialog")
    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, process: Process, children: list[Process], grace: float) -> None:
        super().__init__()
        self.process, self.child_processes, self.grace = process, children, grace

    def compose(self) -> ComposeResult:
        p = self.process
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(p.start_time))
        with Vertical():
            yield Label(f"kill pid {p.pid} ({p.user})", classes="title")
            yield Static(Content(p.command[:1000]), classes="command")
            yield Static(Content(f"started {started} (start time {p.start_time:.2f}); identity re-checked "
                                 f"on the box right before the signal"))
            yield Static(Content(f"TERM: SIGTERM to pid {p.pid}, SIGKILL after {self.grace:g} s if it lives · "
                                 f"KILL: SIGKILL to pid {p.pid} now"))
            if self.child_processes:
                yield Static(Content(f"its children ({len(self.child_processes)}), which lose their parent:"))
                with VerticalScroll():
                    for c in self.child_processes:
                        yield Static(Content(f"  {c.pid} {c.user} {c.command[:90]}"))
            with Horizontal():
                yield Button("Cancel", id="cancel", variant="primary")
                yield Button("TERM", id="TERM", variant="warning")
                yield Button("KILL", id="KILL", variant="error")

    def on_mount(self) -> None:
        self.query_one("#cancel", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(None if event.button.id == "cancel" else event.button.id)

    def action_cancel(self) -> None:
        self.dismiss(None)


class PathDialog(ModalScreen[str | None]):
    """Ask for a path (or URL) on the box."""

    DEFAULT_CSS = DIALOG_CSS.format(name="PathDialog")
    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, title: str, placeholder: str = "", value: str = "") -> None:
        super().__init__()
        self.title_text, self.placeholder, self.value = title, placeholder, value

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self.title_text, classes="title")
            yield Input(value=self.value, placeholder=self.placeholder)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip() or None)

    def action_cancel(self) -> None:
        self.dismiss(None)


class HelpScreen(ModalScreen[None]):
    """Every binding: the console's, the panes', and the stage keys from the config."""

    DEFAULT_CSS = DIALOG_CSS.format(name="HelpScreen") + "HelpScreen DataTable { height: auto; max-height: 30; }"
    BINDINGS = [Binding("escape,q,question_mark", "close", "Close")]

    def __init__(self, rows: list[tuple[str, str, str]]) -> None:
        super().__init__()
        self.rows = rows

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("keys (remap any id under [ui.keys] in samai.toml)", classes="title")
            table = DataTable(cursor_type="row")
            table.add_columns("key", "what", "id")
            for row in self.rows:
                table.add_row(*row)
            yield table

    def action_close(self) -> None:
        self.dismiss(None)
