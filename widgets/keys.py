"""The Textual bindings of one scope of the command table (samai.console.core.commands)."""

from __future__ import annotations

from textual.binding import Binding, BindingType

from samai.console.core.commands import Scope, commands


def bindings(scope: Scope) -> list[BindingType]:
    return [Binding(c.key, c.action, c.description, show=c.show, id=c.id) for c in commands(scope) if c.key]
