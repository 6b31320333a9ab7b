"""What the panes share: they repaint only when what they show has changed, and text from the
box is shown as it is, never as markup and never as terminal control sequences.

Most polls find the box as it was. A repaint is the costliest thing an idle console does
(for a pane of automatic height, a layout pass of the whole screen), so a pane handed what
it already shows does nothing, and one handed new figures in as many lines repaints without a
layout pass.

Everything read from the box (file names, command lines, log lines, stage output) may hold
Textual/Rich markup (`[/x]` alone stops a render with MarkupError, `[@click=…]` is an action)
and ESC sequences. It reaches a widget only as literal Content (`inert`), or, where Textual
takes nothing but markup (the command palette's hits), escaped (`literal_markup`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, cast, runtime_checkable

from textual.content import Content
from textual.widget import Widget
from textual.widgets import Static

from samai.remote.safe_text import visible

if TYPE_CHECKING:
    from textual.css.styles import RulesMap

    from samai.console.core.update import StateUpdate


@runtime_checkable
class ShowsUpdates(Protocol):
    """A pane of the box screen: it is handed each poll's StateUpdate and shows its part of it
    (adding a pane is the widget, one `yield` in the screen and one style rule)."""

    def show_update(self, update: StateUpdate) -> None: ...


def inert(text: str) -> Content:
    """Box text as literal content, one line: control characters (newlines too) as stand-ins."""
    return Content(visible(text))


def inert_lines(text: str) -> Content:
    """Box text as literal content, its lines kept: every other control character as a stand-in."""
    return Content("\n".join(visible(line) for line in text.split("\n")))


def literal_markup(text: str) -> str:
    """Box text as markup that renders exactly as `visible(text)` does, for the APIs that take only
    markup. In Textual's markup a backslash before "[" makes it literal (and is dropped), and no
    other character starts a tag, so escaping each "[" is all it takes (`textual.markup.escape` is not
    enough: it leaves "[B]" and "[$v]" alone)."""
    return visible(text).replace("[", "\\[")


class Pane(Static):
    """A Static that is updated through `show_content`, which skips a content already on show."""

    _shown: Content | None = None

    def show_content(self, content: Content, *, layout: bool | None = None) -> None:
        """layout: False, the pane's size never depends on its content; None, a layout pass only
        when the content's height at the pane's width changes (a pane of automatic height whose
        width its container sets: new figures in as many lines are only a repaint)."""
        if self._shown is not None and content.is_same(self._shown):
            return
        if layout is None:
            width, rules = self.content_size.width, cast("RulesMap", self.styles)  # as Textual measures it
            layout = self._shown is None or not width or \
                self._shown.get_height(rules, width) != content.get_height(rules, width)
        self._shown = content
        self.update(content, layout=layout)


def set_subtitle(widget: Widget, subtitle: str | Content) -> None:
    """Set a border subtitle, a str taken literally; Textual repaints the whole widget even when it is
    the same one. (The border_subtitle property reads back as markup.)"""
    content = subtitle if isinstance(subtitle, Content) else inert(subtitle)
    if widget.border_subtitle != content.markup:
        widget.border_subtitle = content
