"""Alerts: what the console noticed, newest first, with the key that deals with it."""

from __future__ import annotations

import time

from textual.content import Content
from textual.widgets import Static

from samai.console.state import Alert
from samai.remote.visible import visible

STYLE = {"info": "$success", "warning": "$warning", "error": "$error bold"}
SHOWN = 50


class AlertsPane(Static):
    DEFAULT_CSS = "AlertsPane { height: 1fr; padding: 0 1; overflow-y: auto; }"

    def show(self, alerts: list[Alert]) -> None:
        if not alerts:
            self.update(Content.styled("nothing to report", "$foreground 60%"))
            return
        parts: list = []
        for a in alerts[:SHOWN]:
            # An alert's text quotes the box (paths, log lines): plain text, control characters as stand-ins.
            parts += [time.strftime("%H:%M:%S ", time.localtime(a.time)), (f"{a.severity:<7} ", STYLE[a.severity]),
                      visible(a.text)]
            if a.hint:
                parts += ["  ", (f"[{a.hint}]", "$accent")]
            parts.append("\n")
        self.update(Content.assemble(*parts[:-1]))
        errors = sum(1 for a in alerts if a.severity == "error")
        self.border_subtitle = f"{len(alerts)} · {errors} errors" if errors else f"{len(alerts)}"
