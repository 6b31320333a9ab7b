"""The top line: target, connection state, age and round trip of the last snapshot."""

from __future__ import annotations

from dataclasses import dataclass

from textual.content import Content

from samai.console.core import units
from samai.remote.safe_text import visible
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
    connect_s: float | None = None  # the first snapshot after a (re)connect: the handshake, not a round trip
    watched: str = ""  # who watches the box with nobody at the keys (console/core/watch/seen.py)
    watched_ok: bool = True


class StatusBar(Pane):
    DEFAULT_CSS = "StatusBar { height: 1; background: $panel; padding: 0 1; }"

    def show(self, c: Connection) -> None:
        """Safety state first (target, read-only, connection), then what may be cut at the edge:
        the line is one row, and an outage's banner must not push READ-ONLY off it."""
        self.set_class(c.stale, "-stale")
        state_style = {"connected": "$success", "connecting": "$warning"}.get(c.state, "$error bold")
        # The host name and the error are the box's words: plain text, control characters as stand-ins.
        parts: list = [("samai-console", "bold $primary"), "  ", (visible(c.target), "bold")]
        if c.host:
            parts += [" (", visible(c.host), ")"]
        if c.readonly:
            parts += ["  ", (" READ-ONLY ", "reverse $warning")]
        parts += ["  ", (f"● {c.state}", state_style)]
        if c.stale:
            parts += ["  ", (" STALE ", "reverse $error")]
        if c.age is not None:
            parts += ["  snapshot ", (f"{units.duration(c.age)} old", "$error bold" if c.stale else "")]
        if c.rtt is not None:
            parts += [f"  rtt {c.rtt * 1000:.0f} ms"]
        elif c.connect_s is not None:
            parts += [f"  connected in {c.connect_s:.1f} s"]
        if c.watched:  # a watcher's name and error are the box's words (its watch folder)
            parts += ["  ", (visible(c.watched[:100]), "" if c.watched_ok else "$warning")]
        if c.stale:
            parts += [("  the box is not answering: the panes show old data", "$error")]
        if c.error:
            parts += ["  ", (visible(c.error[:120]), "$error")]
        self.show_content(Content.assemble(*parts), layout=False)  # one line, whatever it says
