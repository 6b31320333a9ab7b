"""How a log line looks: its marker's colour, a notice's, the cursor, the filter's matches.

Styles come from the LogView's component classes (so themes set them) and stack: a cursor
keeps a marker's colour. A line's text is never parsed as markup: it becomes Segments."""

from __future__ import annotations

from bisect import bisect_right
from typing import TYPE_CHECKING

from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style
from textual.cache import LRUCache
from textual.strip import Strip
from textual.widget import Widget

from samai.widgets.logview.markers import RANK_CLASSES

if TYPE_CHECKING:
    from samai.widgets.logview.buffer import LineBuffer

COMPONENT_CLASSES = {
    "logview--info",
    "logview--warning",
    "logview--error",
    "logview--notice",
    "logview--match",
    "logview--cursor",
}


class LineStyler:
    """Renders pieces of the buffer's lines as Strips in the widget's component styles."""

    def __init__(self, widget: Widget, buffer: LineBuffer) -> None:
        self._widget = widget
        self._buffer = buffer
        self._styles: dict[str, Style] = {}
        self._spans: LRUCache[int, tuple[list[int], list[int]]] = LRUCache(256)

    def clear_styles(self) -> None:
        """After a style update (a theme, a class): resolve them again."""
        self._styles.clear()

    def clear_matches(self) -> None:
        """After a filter change or a reset: find the matches again."""
        self._spans.clear()

    def component(self, name: str) -> Style:
        """Only what the component's rules set, with colours as the full style resolves them
        (alpha blended, `$text-*`)."""
        style = self._styles.get(name)
        if style is None:
            partial = self._widget.get_component_rich_style(name, partial=True)
            full = self._widget.get_component_rich_style(name, partial=False)
            style = partial + Style(color=full.color if partial.color else None,
                                    bgcolor=full.bgcolor if partial.bgcolor else None)
            self._styles[name] = style
        return style

    def base(self) -> Style:
        """The widget's own style (rich_style walks the DOM: worth keeping per style update)."""
        style = self._styles.get("")
        if style is None:
            style = self._styles[""] = self._widget.rich_style
        return style

    def line_style(self, a: int, cursor: bool) -> Style:
        style = self.base()
        if self._buffer.is_notice(a):
            style += self.component("logview--notice")
        elif rank := self._buffer.rank_of(a):
            style += self.component(RANK_CLASSES[rank])
        if cursor:
            style += self.component("logview--cursor")
        return style

    def matches(self, a: int) -> tuple[list[int], list[int]] | None:
        """Starts and ends of the filter's matches in line a's shown text."""
        line_filter = self._buffer.filter
        if line_filter is None or line_filter.invert:
            return None
        spans = self._spans.get(a)
        if spans is None:
            starts: list[int] = []
            ends: list[int] = []
            for match in line_filter.regex.finditer(self._buffer.text[a - self._buffer.base]):
                if match.end() > match.start():
                    starts.append(match.start())
                    ends.append(match.end())
            spans = (starts, ends)
            self._spans[a] = spans
        return spans

    def piece(self, a: int, start: int, end: int, cursor: bool) -> Strip:
        """Characters start..end of line a's shown text, styled, highlights included."""
        i = a - self._buffer.base
        text = self._buffer.text[i]
        narrow = self._buffer.widths[i] == len(text)
        style = self.line_style(a, cursor)
        segments: list[Segment] = []
        spans = self.matches(a)
        pos = start
        if spans:
            starts, ends = spans
            match_style = style + self.component("logview--match")
            for j in range(bisect_right(ends, start), len(starts)):
                if starts[j] >= end:
                    break
                lo, hi = max(starts[j], start), min(ends[j], end)
                if lo > pos:
                    segments.append(Segment(text[pos:lo], style))
                segments.append(Segment(text[lo:hi], match_style))
                pos = hi
        if pos < min(end, len(text)):
            segments.append(Segment(text[pos:end], style))
        cells = sum(len(s.text) if narrow else cell_len(s.text) for s in segments)
        return Strip(segments, cells)
