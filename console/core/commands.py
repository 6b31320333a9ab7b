"""Every key of the console in one table: what it does, where it works, whether it changes the box.

The screens' and panes' bindings, the read-only set, the help screen's groups and the keys a stage
may not take are all read from here, so a key added in one place is a key everywhere (a test
fails when a binding is missing from the table). Pure data: the Textual side is
samai.widgets.keys."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# Where a command works: the app (any screen), the box screen, or one pane or screen's widget.
Scope = Literal["app", "box", "stage", "log", "log-filter", "processes", "process-rows", "disk", "fleet", "fleet-rows",
                "gguf", "gguf-filter", "evals"]

# The help screen's group for each scope, in the order it lists them.
SCOPE_TITLES: dict[Scope, str] = {"app": "console", "box": "console", "stage": "stages", "log": "log pane",
                                  "log-filter": "log pane", "processes": "processes pane",
                                  "process-rows": "processes pane", "disk": "disk pane", "fleet": "fleet screen",
                                  "fleet-rows": "fleet screen", "gguf": "GGUF screen", "gguf-filter": "GGUF screen",
                                  "evals": "eval runs pane"}
# Where a stage's own key works: a stage may not take a key these scopes use.
# (Not the eval pane's d: a stage may keep it, and the pane takes it only while focused.)
BOX_SCREEN_SCOPES: frozenset[Scope] = frozenset({"app", "box", "stage", "log", "processes", "process-rows", "disk"})


@dataclass(frozen=True)
class Command:
    id: str  # the binding id: [ui.keys] in samai.toml remaps it, so an id, once shipped, stays
    scope: Scope
    key: str  # Textual's key names, comma-separated; "" for a command with no key of its own
    action: str  # the action it runs (on its screen or widget)
    description: str
    changes_box: bool = False  # read-only mode greys it out
    show: bool = True  # in the footer


COMMANDS: tuple[Command, ...] = (
    Command("app.quit", "app", "q", "quit", "Quit"),
    Command("app.help", "app", "question_mark", "help", "Help"),
    Command("app.fleet", "app", "F", "fleet", "Fleet"),
    Command("app.next_log", "box", "l", "next_log", "Next log"),
    Command("app.open", "box", "o", "open_file", "Open file"),
    Command("app.pick_log", "box", "L", "pick_log", "Logs…"),
    Command("app.log_back", "box", "left_square_bracket", "log_back", "Back to the log shown before", show=False),
    Command("app.log_forward", "box", "right_square_bracket", "log_forward", "Forward to the log shown after",
            show=False),
    Command("app.kill", "box", "k", "kill", "Kill", changes_box=True),
    Command("app.stop", "box", "s", "stop", "Stop stage", changes_box=True),
    Command("app.restart", "box", "r", "restart", "Restart", changes_box=True),
    Command("app.clean", "box", "c", "clean", "Clean", changes_box=True),
    Command("app.fix", "box", "x", "fix", "Fix alert", changes_box=True),
    Command("app.acknowledge", "box", "A", "acknowledge", "Acknowledge alerts (no watcher repeats them)",
            changes_box=True, show=False),
    Command("app.runs", "box", "H", "runs", "Runs of the shown stage", show=False),
    Command("app.timeline", "box", "T", "timeline", "Timeline: what happened, in order", show=False),
    Command("stage.fire", "stage", "", "fire", "Fire a stage (its key), or restart it while it runs", changes_box=True),
    Command("disk.largest", "disk", "u", "disk_users", "Largest disk users", show=False),
    Command("log.follow", "log", "f", "follow", "Follow"),
    Command("log.filter", "log", "slash", "open_filter", "Filter"),
    Command("log.clear_filter", "log", "escape", "clear_filter", "Clear filter", show=False),
    Command("log.filter_cancel", "log-filter", "escape", "cancel", "Cancel", show=False),
    Command("log.next_marker", "log", "n", "next_marker", "Next marker"),
    Command("log.prev_marker", "log", "N", "prev_marker", "Previous marker"),
    Command("log.wrap", "log", "w", "toggle_wrap", "Wrap"),
    Command("log.copy", "log", "Y", "copy_line", "Copy line", show=False),
    Command("log.save", "log", "ctrl+s", "save", "Save shown lines"),
    Command("log.top", "log", "g,home", "top", "Top", show=False),
    Command("log.bottom", "log", "G,end", "bottom", "Bottom (follow)", show=False),
    Command("processes.filter", "processes", "slash", "filter", "Filter"),
    Command("processes.sort", "processes", "S", "cycle_sort", "Sort"),
    Command("processes.all", "processes", "a", "toggle_all", "All/kernel"),
    Command("processes.up", "process-rows", "up", "cursor_by(-1)", "Cursor up", show=False),
    Command("processes.down", "process-rows", "down", "cursor_by(1)", "Cursor down", show=False),
    Command("processes.page_up", "process-rows", "pageup", "page(-1)", "Page up", show=False),
    Command("processes.page_down", "process-rows", "pagedown", "page(1)", "Page down", show=False),
    Command("processes.first", "process-rows", "home,ctrl+home", "cursor_to(0)", "First row", show=False),
    Command("processes.last", "process-rows", "end,ctrl+end", "cursor_to(-1)", "Last row", show=False),
    Command("fleet.open", "fleet-rows", "enter", "select_cursor", "Open box"),
    Command("fleet.back", "fleet", "escape", "back", "Back to the box"),
    Command("gguf.close", "gguf", "escape", "close", "Back"),
    Command("gguf.filter", "gguf", "slash", "open_filter", "Filter"),
    Command("gguf.edit", "gguf", "e", "gguf_edit", "Set KV", changes_box=True),
    Command("gguf.add", "gguf", "a", "gguf_add", "Add tensors", changes_box=True),
    Command("gguf.open", "gguf", "o", "app.open_file", "Open another file"),  # the box screen's o, from here
    Command("gguf.filter_cancel", "gguf-filter", "escape", "cancel", "Clear the filter", show=False),
    Command("evals.diff", "evals", "d", "screen.eval_diff", "Diff with the run before"),
)

BY_ID: dict[str, Command] = {c.id: c for c in COMMANDS}
# The actions read-only mode refuses, whatever key or screen they are pressed on.
CHANGES_BOX: frozenset[str] = frozenset(c.action for c in COMMANDS if c.changes_box)
_KEY_CHARACTERS = {"question_mark": "?", "slash": "/", "left_square_bracket": "[", "right_square_bracket": "]"}


def commands(scope: Scope) -> tuple[Command, ...]:
    return tuple(c for c in COMMANDS if c.scope == scope)


def key_characters(key: str) -> list[str]:
    """The printable characters a binding's keys are (Textual names some: question_mark is ?)."""
    names = [_KEY_CHARACTERS.get(k.strip(), k.strip()) for k in key.split(",")]
    return [k for k in names if len(k) == 1]


# A stage's key may not be one the box screen already uses.
RESERVED_KEYS: frozenset[str] = frozenset(ch for c in COMMANDS if c.scope in BOX_SCREEN_SCOPES
                                          for ch in key_characters(c.key))
