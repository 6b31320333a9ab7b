"""Modal dialogs. Every dialog that leads to a change on the box shows the exact command and
target and opens with Cancel focused: Enter on a dialog you did not read does nothing."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Button, DataTable, Input, Label, OptionList, RadioButton, RadioSet, Static
from textual.widgets.option_list import Option

from samai.console.core.redact import redact
from samai.remote.safe_text import visible
from samai.widgets.pane import inert, inert_lines
from samai.widgets.path_completion import MAX_SHOWN, complete, folder_of
from samai.widgets.stages import stage_item

if TYPE_CHECKING:  # annotations only: the action layer (and psutil) is not imported with the TUI
    from samai.console.core.actions import ActionPlan, KillPlan
    from samai.console.core.preflight import Check
    from samai.console.core.timeline import Event
    from samai.console.core.training.history import RunRecord
    from samai.console.core.update import StageView
    from samai.remote.model import Listing, Process
    from samai.widgets.logview.history import ShownLog

MARKER_STYLE = {"warning": "yellow", "error": "bold red"}  # rich styles: DataTable cells are rich Text
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
    """The plan as literal text: a command, a path or a target may hold markup or control characters
    (and no secret: the plan's shown fields are redacted where it is built)."""
    return [
        Label(inert(f"{plan.action} {plan.subject} on {plan.target}"), classes="title"),
        Static(inert_lines(plan.command), classes="command"),
        *(Static(inert(line)) for line in plan.details),
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
                    for c in self.checks:  # a plan's checks, or a preflight's: they name processes' commands
                        glyph, style = CHECK_STYLE[c.severity]
                        yield Static(Content.assemble((f"{glyph} ", style), visible(redact(c.text))))
            blocked = any(c.severity == "error" for c in self.checks)
            with Horizontal():
                yield Button("Cancel", id="cancel", variant="primary")
                yield Button(f"{self.plan.action.capitalize()} anyway" if blocked else f"Confirm {self.plan.action}",
                             id="confirm",
                             variant="error")

    def on_mount(self) -> None:
        self.query_one("#cancel", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "confirm")

    def action_cancel(self) -> None:
        self.dismiss(False)


class ChoiceButton(RadioButton):
    """A radio button whose state reads without colour: a dot when on, a ring when off. (Textual
    draws the same dot for both and only colours it: on a dark panel both looked filled.)"""

    BUTTON_INNER = "○"

    def watch_value(self) -> None:
        self.BUTTON_INNER = "●" if self.value else "○"
        super().watch_value()


class KillDialog(ModalScreen["KillPlan | None"]):
    """The kill plans the action layer built for one process: this process alone or its whole
    process group, each with TERM or KILL. The chosen scope's exact commands and target are
    shown; the button pressed returns that very plan (it is what runs). Cancel is focused."""

    DEFAULT_CSS = DIALOG_CSS.format(name="KillDialog") + """
    KillDialog RadioSet { margin-bottom: 1; }
    KillDialog RadioSet > ChoiceButton > .toggle--button { color: $foreground 60%; }
    """
    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, process: Process, plans: Sequence[KillPlan]) -> None:
        super().__init__()
        self.process = process
        self.plans = {(p.group, p.signal): p for p in plans}
        self.group = False

    def selected(self, signal: str) -> KillPlan:
        """The plan that the button for this signal runs, in the scope chosen now."""
        return self.plans[(self.group, signal)]

    def compose(self) -> ComposeResult:
        p = self.process
        with Vertical():
            yield Label(Content(visible(f"kill pid {p.pid} ({p.user})")), classes="title")
            yield Static(Content(visible(redact(p.command)[:1000])), classes="command")
            with RadioSet(id="scope"):
                yield ChoiceButton("this process only", value=True, id="scope-process")
                yield ChoiceButton("its whole process group", id="scope-group")
            yield Static(id="plan")
            with Horizontal():
                yield Button("Cancel", id="cancel", variant="primary")
                yield Button("TERM", id="TERM", variant="warning")
                yield Button("KILL", id="KILL", variant="error")

    def on_mount(self) -> None:
        self._show_scope()
        self.query_one("#cancel", Button).focus()

    def on_radio_set_changed(self, event: RadioSet.Changed) -> None:
        self.group = event.pressed.id == "scope-group"
        self._show_scope()

    def _show_scope(self) -> None:
        term, kill = self.selected("TERM"), self.selected("KILL")
        lines = [Content(visible(f"on {term.target}:")), Content.assemble(("TERM: ", "bold"), visible(term.command)),
                 Content.assemble(("KILL: ", "bold"), visible(kill.command)),
                 *(Content(visible(line)) for line in term.details)]
        self.query_one("#plan", Static).update(Content("\n").join(lines))

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(None if event.button.id == "cancel" else self.selected(str(event.button.id)))

    def action_cancel(self) -> None:
        self.dismiss(None)


class PathDialog(ModalScreen[str | None]):
    """Ask for a path (or URL) on the box. With completes=True, Tab asks the app (through
    CompletionRequested) for the folder's listing on the box and completes from it."""

    DEFAULT_CSS = DIALOG_CSS.format(name="PathDialog") + "PathDialog #candidates { color: $text-muted; }"
    BINDINGS = [Binding("escape", "cancel", "Cancel"),
                Binding("tab", "complete", "Complete", show=False, priority=True)]

    class CompletionRequested(Message):
        """Tab: the app lists `folder` on the box and answers with `offer`."""

        def __init__(self, dialog: PathDialog, text: str, folder: str) -> None:
            super().__init__()
            self.dialog, self.text, self.folder = dialog, text, folder

    def __init__(self, title: str, placeholder: str = "", value: str = "", *, completes: bool = False) -> None:
        super().__init__()
        self.title_text, self.placeholder, self.value = title, placeholder, value
        self.completes = completes

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(inert(self.title_text), classes="title")
            yield Input(value=self.value, placeholder=self.placeholder)
            yield Static(id="candidates")

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return self.completes if action == "complete" else True  # else Tab moves focus as usual

    def action_complete(self) -> None:
        text = self.query_one(Input).value
        self.post_message(self.CompletionRequested(self, text, folder_of(text)))

    def offer(self, text: str, listing: Listing | str) -> None:
        """The box's listing of the folder of `text` (or why there is none): complete the
        path, unless it was edited meanwhile, and list what it could still become. A listing the
        box cut says so: a name past the cut is not "no match"."""
        field = self.query_one(Input)
        if field.value != text:
            return
        hint = self.query_one("#candidates", Static)
        if isinstance(listing, str):
            hint.update(inert(listing))
            return
        completed, candidates = complete(text, listing.names, whole=listing.complete)
        field.value = completed
        field.cursor_position = len(completed)
        more = len(candidates) - MAX_SHOWN
        shown = "  ".join(candidates[:MAX_SHOWN]) + (f"  (+{more} more)" if more > 0 else "")
        if not listing.complete:
            shown += f"  (the box listed only the first {len(listing.names)} names: type more of the name)"
        hint.update(inert(shown if candidates or completed != text or not listing.complete else "no match"))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip() or None)

    def action_cancel(self) -> None:
        self.dismiss(None)


class LogPicker(ModalScreen["ShownLog | None"]):
    """Every stage's log with its status, then the files opened recently; Enter opens one."""

    DEFAULT_CSS = DIALOG_CSS.format(name="LogPicker") + "LogPicker OptionList { height: auto; max-height: 24; }"
    BINDINGS = [Binding("escape,q", "cancel", "Cancel")]

    def __init__(self, stages: Sequence[tuple[ShownLog, StageView | None]], files: Sequence[ShownLog],
                 current: ShownLog | None, now: float) -> None:
        super().__init__()
        self.choices = [log for log, _ in stages] + list(files)
        self.stages, self.files, self.current, self.now = stages, files, current, now

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(Content("logs · Enter opens · Esc closes"), classes="title")
            options: list[Option | None] = []
            for n, (log, view) in enumerate(self.stages):
                status = stage_item(view, self.now) if view else Content(visible(log.stage or ""))
                options.append(Option(Content.assemble(status, ("  " + visible(log.path), "dim")), id=str(n)))
            if self.files:
                options.append(None)
            for n, log in enumerate(self.files, start=len(self.stages)):
                options.append(Option(Content.assemble(("file ", "dim"), visible(log.path)), id=str(n)))
            yield OptionList(*options, markup=False)

    def on_mount(self) -> None:
        picker = self.query_one(OptionList)
        if self.current in self.choices:
            picker.highlighted = picker.get_option_index(str(self.choices.index(self.current)))
        picker.focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(self.choices[int(event.option_id or 0)])

    def action_cancel(self) -> None:
        self.dismiss(None)


class HelpScreen(ModalScreen[None]):
    """Every binding, grouped by where it works (the console, the stage keys, each pane), with ids."""

    DEFAULT_CSS = DIALOG_CSS.format(name="HelpScreen") + "HelpScreen DataTable { height: auto; max-height: 32; }"
    BINDINGS = [Binding("escape,q,question_mark", "close", "Close")]

    def __init__(self, rows: list[tuple[str, str, str, str]]) -> None:
        super().__init__()
        self.rows = rows

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(Content("keys (remap any id under [ui.keys] in samai.toml)"), classes="title")
            table: DataTable[str | Text] = DataTable(cursor_type="row")
            table.add_columns("where", "key", "what", "id")
            group = None
            for where, *cells in self.rows:  # a stage's description names it: cells as text, never markup
                shown = Text(visible(where), style="bold", no_wrap=True, end="") if where != group else ""
                group = where
                table.add_row(shown, *(Text(visible(cell), no_wrap=True, end="") for cell in cells))
            yield table

    def action_close(self) -> None:
        self.dismiss(None)


class RunsScreen(ModalScreen["RunRecord | None"]):
    """A stage's runs as its log holds them, newest first (see console/core/training/history.py); Enter
    on a training stage's run makes it the run the current one is compared with."""

    DEFAULT_CSS = DIALOG_CSS.format(name="RunsScreen") + "RunsScreen DataTable { height: auto; max-height: 30; }"
    BINDINGS = [Binding("escape,q,H", "close", "Close")]

    def __init__(self, stage: str, runs: Sequence[RunRecord], note: str = "") -> None:
        super().__init__()
        self.stage, self.runs, self.note = stage, runs, note

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(inert(f"runs of {self.stage} in its log, newest first"), classes="title")
            if self.note:
                yield Static(inert(self.note))
            table: DataTable[str | Text] = DataTable(cursor_type="row")
            table.add_columns("#", "started (UTC)", "pid", "ended", "lines", "last marker", "cause")
            for run in reversed(self.runs):
                ended = ("—" if run.rc is None else f"rc={run.rc}", "" if run.rc in (None, 0) else "bold red")
                marker = Text(visible(run.last_marker), style=MARKER_STYLE.get(run.severity, ""),
                              no_wrap=True, end="")
                table.add_row(str(run.number), Text(visible(run.started), no_wrap=True, end=""),
                              "" if run.pid is None else str(run.pid), Text(*ended), str(run.lines), marker,
                              Text(visible(run.death), no_wrap=True, end=""))
            if not self.runs:
                table.add_row("", "", "", "", "", Text("the log holds no run yet", style="dim"), "")
            yield table

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        newest_first = list(reversed(self.runs))
        if 0 <= event.cursor_row < len(newest_first):
            self.dismiss(newest_first[event.cursor_row])

    def action_close(self) -> None:
        self.dismiss(None)


class EvalDiffScreen(ModalScreen[None]):
    """Two eval runs compared (console/core/evals/diff.py), as `eval diff` prints it."""

    DEFAULT_CSS = (DIALOG_CSS.format(name="EvalDiffScreen")
                   + "EvalDiffScreen VerticalScroll { height: auto; max-height: 34; }")
    BINDINGS = [Binding("escape,q,d", "close", "Close")]

    def __init__(self, report: str) -> None:
        super().__init__()
        self.report = report  # visible() text already: shown as text, never markup

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(inert("eval diff: the run under the cursor against the one before it"), classes="title")
            with VerticalScroll():
                yield Static(Text(self.report, no_wrap=False))

    def action_close(self) -> None:
        self.dismiss(None)


class TimelineScreen(ModalScreen["Event | None"]):
    """What happened on the box, in order (console/core/timeline.py); `/` filters the rows by
    any text in them, Enter opens the row's log in the log pane."""

    DEFAULT_CSS = (DIALOG_CSS.format(name="TimelineScreen")
                   + "TimelineScreen DataTable { height: auto; max-height: 32; } "
                   + "TimelineScreen Input { display: none; } TimelineScreen Input.-open { display: block; }")
    BINDINGS = [Binding("escape,q,T", "close", "Close"), Binding("slash", "filter", "Filter")]

    def __init__(self, events: Sequence[Event]) -> None:
        super().__init__()
        self.events = list(events)
        self.shown: list[Event] = []

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(inert("timeline, oldest first (~: a log line's time is its run's start) · / filter · "
                              "Enter opens its log"), classes="title")
            yield Input(placeholder="filter: any text of a row", id="timeline-filter")
            table: DataTable[str | Text] = DataTable(cursor_type="row")
            table.add_columns("time (UTC)", "source", "kind", "what")
            yield table

    def on_mount(self) -> None:
        self.show_rows("")
        table = self.query_one(DataTable)
        table.focus()
        if table.row_count:
            table.move_cursor(row=table.row_count - 1)  # the newest: where an incident is read back from

    def show_rows(self, needle: str) -> None:
        table = self.query_one(DataTable)
        table.clear()
        needle = needle.lower()
        self.shown = [e for e in self.events if not needle or needle in
                      f"{e.source} {e.stage} {e.kind} {e.text}".lower()]
        for e in self.shown:
            stamp = ("~" if e.approx else "") + time.strftime("%m-%d %H:%M:%S", time.gmtime(e.time))
            where = f"{e.source}:{e.stage}" if e.stage else e.source
            style = {"error": "bold red", "warning": "yellow"}.get(e.severity, "")
            table.add_row(stamp, Text(visible(where), no_wrap=True, end=""),
                          Text(visible(e.kind), style=style, no_wrap=True, end=""),
                          Text(visible(e.text), no_wrap=True, end=""))
        if not self.shown:
            table.add_row("", "", "", Text("nothing on the timeline" + (" matches" if needle else " yet"),
                                           style="dim"))

    def action_filter(self) -> None:
        field = self.query_one(Input)
        field.add_class("-open")
        field.focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        self.show_rows(event.value)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.query_one(DataTable).focus()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if 0 <= event.cursor_row < len(self.shown):
            self.dismiss(self.shown[event.cursor_row])

    def action_close(self) -> None:
        self.dismiss(None)
