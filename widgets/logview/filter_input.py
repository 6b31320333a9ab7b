"""The filter prompt, docked at the bottom of its LogView while it is open."""

from __future__ import annotations

import re
from typing import ClassVar

from textual.binding import BindingType
from textual.content import Content
from textual.message import Message
from textual.widgets import Input

from samai.remote.safe_text import visible
from samai.widgets.keys import bindings
from samai.widgets.logview.buffer import LineFilter

PROMPT_ROWS = 3  # its height; the view scrolls that much further while it is open
TITLE = "filter: regex · !inverts · Enter applies (empty clears) · Esc cancels"


class LogFilterInput(Input):
    """A regex as typed; it says at once when the pattern is invalid."""

    BINDINGS: ClassVar[list[BindingType]] = bindings("log-filter")

    class Cancelled(Message):
        """Escape in the prompt: close it, keep the filter as it was."""

    def action_cancel(self) -> None:
        self.post_message(self.Cancelled())

    def open_with(self, value: str) -> None:
        """Show the prompt holding value (the active filter) and take focus."""
        self.value = value
        self.border_title = TITLE
        self.show_error(None)
        self.add_class("-open")
        self.focus()

    def close_prompt(self) -> None:
        self.remove_class("-open")

    def check_filter(self, value: str) -> bool:
        """Whether value is a valid filter; if not, the prompt says why."""
        try:
            LineFilter.parse(value)
        except re.error as error:
            self.show_error(f"invalid regex: {error} · the previous filter stays")
            return False
        self.show_error(None)
        return True

    def show_error(self, text: str | None) -> None:
        self.border_subtitle = None if text is None else Content(visible(text))
        self.set_class(text is not None, "-invalid")
