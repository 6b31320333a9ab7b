"""Rows of the log pane: which screen row shows which line, wrapped or not.

A shown line is one row, unless it wraps: every line does while wrap is on, and a notice
always does (it is the console speaking: said whole, never cut at the pane's edge). `cum`
maps shown lines to rows: cum[k] - cum[0] is the first row of shown line k (one extra entry
at the end); it is None while every shown line is one row.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from itertools import accumulate
from typing import TYPE_CHECKING

from rich.cells import chop_cells
from textual.cache import LRUCache

if TYPE_CHECKING:
    from samai.widgets.logview.buffer import Appended, LineBuffer


class RowLayout:
    def __init__(self, buffer: LineBuffer) -> None:
        self.buffer = buffer
        self.wrap = False
        self.width = 1  # cells a wrapped row holds
        self.cum: list[int] | None = None
        self._cuts: LRUCache[tuple[int, int], list[int]] = LRUCache(1024)

    def clear(self) -> None:
        self._cuts.clear()
        self.cum = None

    # ------------------------------------------------------------ lines -> rows

    def wraps(self, a: int) -> bool:
        return self.wrap or a in self.buffer.notices

    def rows_of(self, a: int) -> int:
        """Rows that absolute line a takes."""
        if not self.wraps(a):
            return 1
        buffer = self.buffer
        i = a - buffer.base
        cells, width = buffer.widths[i], self.width
        if cells <= width:
            return 1
        if cells == len(buffer.text[i]):
            return -(-cells // width)
        return len(self._wide_cuts(a)) - 1

    def row_range(self, a: int, sub: int) -> tuple[int, int]:
        """The characters of row `sub` of wrapped line a."""
        buffer = self.buffer
        i = a - buffer.base
        text, cells, width = buffer.text[i], buffer.widths[i], self.width
        if cells <= width:
            return 0, len(text)
        if cells == len(text):
            return sub * width, (sub + 1) * width
        cuts = self._wide_cuts(a)
        return cuts[sub], cuts[sub + 1]

    def _wide_cuts(self, a: int) -> list[int]:
        """Character offsets where the wrapped rows of a line with wide characters start
        (and its end): a wide character is never split between two rows."""
        key = (a, self.width)
        cuts = self._cuts.get(key)
        if cuts is None:
            text = self.buffer.text[a - self.buffer.base]
            cuts = list(accumulate((len(part) for part in chop_cells(text, self.width)), initial=0))
            self._cuts[key] = cuts
        return cuts

    # ------------------------------------------------------------ keeping up with the buffer

    def rebuild(self, width: int) -> None:
        """Recompute the row index (on wrap, width or filter changes)."""
        self.width = max(1, width)
        buffer = self.buffer
        shown = buffer.shown_numbers()
        if not self.wrap and not any(a in buffer.notices for a in shown):
            self.cum = None
            return
        widths, base, width = buffer.widths, buffer.base, self.width
        rows_of = self.rows_of
        # Most lines fit in one row: only longer ones need a closer look.
        self.cum = list(accumulate((1 if widths[a - base] <= width else rows_of(a) for a in shown), initial=0))

    def appended(self, change: Appended) -> int:
        """Follow one LineBuffer.add; returns how many rows went with the lines it dropped."""
        if self.cum is None:
            if any(a in self.buffer.notices for a in change.shown):
                self.rebuild(self.width)  # the first notice: rows stop being lines
            return change.dropped
        rows = self.cum[change.dropped] - self.cum[0]
        del self.cum[:change.dropped]
        ends = accumulate((self.rows_of(a) for a in change.shown), initial=self.cum[-1])
        next(ends)  # the initial value is already the last entry
        self.cum.extend(ends)
        return rows

    # ------------------------------------------------------------ rows -> lines

    def row_of(self, k: int) -> int:
        """The first row of shown line k."""
        return k if self.cum is None else self.cum[k] - self.cum[0]

    def total_rows(self) -> int:
        return self.buffer.shown_count if self.cum is None else self.cum[-1] - self.cum[0]

    def locate(self, row: int) -> tuple[int, int] | None:
        """(shown index, row within that line) of a row, or None past the end."""
        if row < 0:
            return None
        if self.cum is None:
            return (row, 0) if row < self.buffer.shown_count else None
        target = row + self.cum[0]
        if target >= self.cum[-1]:
            return None
        k = bisect_right(self.cum, target) - 1
        return k, target - self.cum[k]

    # ------------------------------------------------------------ markers

    def next_marker(self, anchor: int | None, top: int, height: int, *, forward: bool) -> int | None:
        """The shown marker line (absolute number) n (forward) or N lands on: the one after (or
        before) anchor, the line n/N last landed on, while that is in view; else the first from
        the top of the view (n) or the last from its bottom (N). None when there is none."""
        buffer = self.buffer
        marks = buffer.mark_lines
        k = None if anchor is None else buffer.index_of(anchor)
        if anchor is None or k is None or not top <= self.row_of(k) < top + height:
            row = top if forward else min(top + height - 1, self.total_rows() - 1)
            located = self.locate(row)
            if located is None:
                start = 0 if forward else len(marks) - 1
            else:
                a = buffer.abs_at(located[0])
                start = bisect_left(marks, a) if forward else bisect_right(marks, a) - 1
        else:
            start = bisect_right(marks, anchor) if forward else bisect_left(marks, anchor) - 1
        candidates = range(start, len(marks)) if forward else range(start, -1, -1)
        return next((marks[j] for j in candidates if buffer.index_of(marks[j]) is not None), None)
