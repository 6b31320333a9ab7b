"""The top line: target, connection state, age and round trip of the last snapshot."""

from __future__ import annotations

from dataclasses import dataclass

from textual.content import Content

from samai.console.core import units
from samai.remote.visible import visible
from samai.widgets.pane import Pane


@dataclass(frozen=True)
class Connection:
    target: str
    host: str = ""
    state: str = "connecting"  # connecting | connected | lost
    age: float | None = None  # seconds since the last snapshot arrived
    rtt: float | None = None
    stale: bool = False
    readonly: bool = False
    error: str = ""


class StatusBar(Pane):
    DEFAULT_CSS = "StatusBar { height: 1; background: $panel; padding: 0 1; }"

    def show(self, c: Connection) -> None:
        self.set_class(c.stale, "-stale")
        state_style = {"connected": "$success", "connecting": "$warning"}.get(c.state, "$error bold")
        # The host name and the error are the box's words: plain text, control characters as stand-ins.
        parts: list = [("samai-console", "bold $primary"), "  ", (visible(c.target), "bold")]
        if c.host:
            parts += [" (", visible(c.host), ")"]
        parts += ["  ", (f"● {c.state}", state_style)]
        if c.rtt is not None:
            parts += [f"   rtt {c.rtt * 1000:.0f} ms"]
        if c.age is not None:
            parts += ["   snapshot ", (f"{units.duration(c.age)} old", "$error bold" if c.stale else "")]
        if c.stale:
            parts += ["  ", (" STALE: the box is not answering; panes show old data ", "reverse $error")]
        if c.error:
            parts += ["  ", (visible(c.error[:120]), "$error")]
        if c.readonly:
            parts += ["  ", (" READ-ONLY ", "reverse $warning")]
        self.show_content(Content.assemble(*parts), layout=False)  # one line, whatever it says
