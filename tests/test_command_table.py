"""The command table is the one list of keys: every binding of every screen and pane is a row of
it, every row's action exists where its scope says, and the sets read from it are the ones the
console has always had."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

from textual.binding import Binding
from textual.dom import DOMNode
from textual.screen import ModalScreen

import samai.console.screens
import samai.widgets
from samai.console.app import SamaiApp
from samai.console.core.commands import BY_ID, CHANGES_BOX, COMMANDS, RESERVED_KEYS, SCOPE_TITLES
from samai.console.screens.box import BoxScreen
from samai.console.screens.fleet import FleetScreen
from samai.console.screens.gguf import FilterInput, GgufScreen
from samai.widgets.fleet import FleetTable
from samai.widgets.logview import LogView
from samai.widgets.logview.filter_input import LogFilterInput
from samai.widgets.processes import ProcessPane, ProcessTable

WHERE = {"app": SamaiApp, "box": BoxScreen, "disk": BoxScreen, "stage": BoxScreen, "log": LogView,
         "log-filter": LogFilterInput, "processes": ProcessPane, "process-rows": ProcessTable, "fleet": FleetScreen,
         "fleet-rows": FleetTable, "gguf": GgufScreen, "gguf-filter": FilterInput,
         "evals": BoxScreen}  # the eval pane's d runs the screen's action (it reads the box)
NAMESPACES = {"app": SamaiApp, "screen": None}


def _classes_with_bindings() -> list[type[DOMNode]]:
    found = [SamaiApp]
    for package in (samai.console.screens, samai.widgets):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            module = importlib.import_module(info.name)
            found += [c for _, c in inspect.getmembers(module, inspect.isclass)
                      if c.__module__ == module.__name__ and issubclass(c, DOMNode) and "BINDINGS" in vars(c)]
    return found


def test_every_binding_of_a_screen_or_pane_is_a_row_of_the_table() -> None:
    """Dialogs (modal screens) keep their own Escape/Enter: they are not the console's keys."""
    checked = 0
    for cls in _classes_with_bindings():
        if issubclass(cls, ModalScreen):
            continue
        for b in vars(cls)["BINDINGS"]:
            assert isinstance(b, Binding) and b.id in BY_ID, f"{cls.__name__}: {b} is not in the command table"
            row = BY_ID[b.id]
            assert (b.key, b.action, b.description) == (row.key, row.action, row.description), b.id
            checked += 1
    assert checked == sum(1 for c in COMMANDS if c.key)  # and every row with a key is bound somewhere


def test_every_row_names_an_action_where_its_scope_works() -> None:
    for c in COMMANDS:
        assert c.scope in SCOPE_TITLES
        namespace, _, action = c.action.split("(")[0].rpartition(".")
        where = NAMESPACES.get(namespace) or WHERE[c.scope]
        assert hasattr(where, f"action_{action}"), f"{c.id}: {where.__name__} has no action_{action}"
    assert len(BY_ID) == len(COMMANDS)  # ids are unique: [ui.keys] remaps by id


def test_the_sets_read_from_the_table() -> None:
    assert RESERVED_KEYS == frozenset("q ? / k s r o c x l f n N w g G a S u H L Y [ ] F A T".split())
    assert CHANGES_BOX == {"kill", "stop", "restart", "clean", "fire", "fix", "gguf_edit", "gguf_add", "acknowledge"}
