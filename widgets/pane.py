"""What the panes share: they repaint only when what they show has changed.

Most polls find the box as it was. A repaint is the costliest thing an idle console does
(for a pane of automatic height, a layout pass of the whole screen), so a pane handed what
it already shows does nothing."""

from __future__ import annotations

from textual.content import Content
from textual.widget import Widget
from textual.widgets import Static


class Pane(Static):
    """A Static that is updated through `show_content`, which skips a content already on show."""

    _shown: Content | None = None

    def show_content(self, content: Content, *, layout: bool = True) -> None:
        """layout=False: the pane's size does not depend on its content (no layout pass needed)."""
        if self._shown is not None and content.is_same(self._shown):
            return
        self._shown = content
        self.update(content, layout=layout)


def set_subtitle(widget: Widget, subtitle: str) -> None:
    """Set a border subtitle; Textual repaints the whole widget even when it is the same one."""
    if widget.border_subtitle != subtitle:
        widget.border_subtitle = subtitle
