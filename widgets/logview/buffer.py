"""The log pane's lines, without Textual: kept, bounded, marked and filtered.

Lines are kept as plain `str` under absolute numbers (`base` is the number of the first kept
line, 0 = the first line since the buffer was cleared), so marker and filter indices survive
the oldest lines being dropped. Only new lines are cleaned, measured, marked and filtered.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.cells import cell_len

from samai.remote.safe_text import CONTROL_PICTURES
from samai.widgets.logview.markers import Markers

if TYPE_CHECKING:
    from samai.remote.model import Marker

TAB_SIZE = 8

# What smartcase ignores when it looks for an uppercase letter: escapes (\W, \S) and group syntax.
_NOT_LITERAL = re.compile(r"\\.|\(\?P<\w+>|\(\?P=\w+\)")


def clean_line(line: str) -> str:
    """A log line as the screen shows it: one row of inert text.

    A carriage return shows what a terminal would (the text after the last one: progress
    bars), tabs are expanded and control characters (ANSI escapes included) become visible
    placeholders. Printable lines, nearly all of them, are returned as they are."""
    if line.isprintable():
        return line
    if "\r" in line:
        line = next((part for part in reversed(line.split("\r")) if part), "")
    if "\t" in line:
        line = line.expandtabs(TAB_SIZE)
    return line.translate(CONTROL_PICTURES)


class Notice(str):
    """A system line (not from the log), kept in order with the log's lines."""


class LinesView(Sequence[str]):
    """A read-only view of the kept lines, oldest first."""

    def __init__(self, lines: list[str]) -> None:
        self._lines = lines

    def __len__(self) -> int:
        return len(self._lines)

    def __getitem__(self, index):
        return self._lines[index]

    def __iter__(self) -> Iterator[str]:
        return iter(self._lines)


@dataclass(frozen=True)
class LineFilter:
    """A filter as typed: a regex, `!` first to invert, case-insensitive unless it has capitals.

    It is matched against lines as shown (clean_line), so its highlights land where it matched;
    markers, like the box's probe, match lines as given."""

    source: str
    regex: re.Pattern[str]
    invert: bool

    @classmethod
    def parse(cls, source: str) -> LineFilter:
        """Raises re.error for an invalid pattern."""
        invert = source.startswith("!")
        body = source[1:] if invert else source
        smart = any(c.isupper() for c in _NOT_LITERAL.sub("", body))
        return cls(source, re.compile(body, 0 if smart else re.IGNORECASE), invert)

    def keeps(self, text: str) -> bool:
        return (self.regex.search(text) is None) is self.invert


@dataclass(frozen=True)
class Appended:
    """What one add did: the new shown lines (absolute numbers), how many shown lines the
    bound dropped from the front, and how many log lines (not notices) arrived."""

    shown: list[int]
    dropped: int
    arrived: int


class LineBuffer:
    """At most max_lines lines (notices included), their shown text and width, marker ranks,
    and which of them the filter shows (`shown` is None while every kept line is)."""

    def __init__(self, max_lines: int) -> None:
        if max_lines < 1:
            raise ValueError("max_lines must be at least 1")
        self.max_lines = max_lines
        self.filter: LineFilter | None = None
        self._markers = Markers(())
        self.clear()

    def clear(self, markers: Sequence[Marker] | None = None) -> None:
        """Forget every line (and take new markers); the filter stays."""
        if markers is not None:
            self._markers = Markers(markers)
        # Parallel lists indexed by (absolute number - base).
        self.lines: list[str] = []  # as given
        self.text: list[str] = []  # as shown (clean_line); the same object when already clean
        self.widths: list[int] = []  # cells of text
        self.base = 0
        self.notices: set[int] = set()
        self.mark_lines: list[int] = []  # sorted absolute numbers
        self.mark_ranks: list[int] = []
        self.shown: list[int] | None = None if self.filter is None else []

    # ------------------------------------------------------------ reading

    def __len__(self) -> int:
        return len(self.lines)

    @property
    def end(self) -> int:
        """The absolute number the next line will get."""
        return self.base + len(self.lines)

    @property
    def shown_count(self) -> int:
        return len(self.lines) if self.shown is None else len(self.shown)

    def shown_lines(self) -> tuple[str, ...]:
        """The kept lines the filter shows, oldest first, as given."""
        if self.shown is None:
            return tuple(self.lines)
        base, lines = self.base, self.lines
        return tuple(lines[a - base] for a in self.shown)

    def abs_at(self, k: int) -> int:
        """The absolute number of shown line k."""
        return self.base + k if self.shown is None else self.shown[k]

    def index_of(self, a: int) -> int | None:
        """The shown index of absolute line a, or None if it is not shown (or not kept)."""
        if not self.base <= a < self.end:
            return None
        if self.shown is None:
            return a - self.base
        k = bisect_left(self.shown, a)
        return k if k < len(self.shown) and self.shown[k] == a else None

    def nearest_shown(self, a: int) -> int | None:
        """The shown index of line a, or of the first shown line after it (else the last)."""
        count = self.shown_count
        if not count:
            return None
        k = max(0, a - self.base) if self.shown is None else bisect_left(self.shown, a)
        return min(k, count - 1)

    def shown_numbers(self) -> Sequence[int]:
        return range(self.base, self.end) if self.shown is None else self.shown

    def rank_of(self, a: int) -> int:
        k = bisect_left(self.mark_lines, a)
        return self.mark_ranks[k] if k < len(self.mark_lines) and self.mark_lines[k] == a else 0

    def is_notice(self, a: int) -> bool:
        return a in self.notices

    def max_width(self) -> int:
        """The widest shown log line in cells (notices wrap, so they do not count)."""
        return self.max_width_of(self.shown_numbers())

    def max_width_of(self, numbers: Sequence[int]) -> int:
        """The widest of these kept lines in cells, notices left out."""
        base, widths, notices = self.base, self.widths, self.notices
        if not notices and numbers == range(base, self.end):
            return max(widths, default=0)  # all of them, as they nearly always are: one C-level pass
        return max((widths[a - base] for a in numbers if a not in notices), default=0)

    # ------------------------------------------------------------ writing

    def add(self, pending: Sequence[str]) -> Appended:
        """Append lines (Notice instances are notices), dropping the oldest beyond max_lines."""
        dropped = 0
        arrived = sum(type(line) is not Notice for line in pending)
        if len(pending) > self.max_lines:  # the kept lines and the oldest pending ones all go
            skipped = len(pending) - self.max_lines
            dropped = self.drop_front(len(self.lines))
            self.base += skipped
            pending = pending[skipped:]
        start = self.end
        texts = [clean_line(line) for line in pending]
        self.lines.extend(pending)
        self.text.extend(texts)
        self.widths.extend(len(t) if t.isascii() else cell_len(t) for t in texts)
        notices = {start + n for n, line in enumerate(pending) if type(line) is Notice}
        self.notices.update(notices)
        if self._markers:  # markers match the line as given, as the box's probe does
            rank = self._markers.rank
            for n, line in enumerate(pending):
                if start + n not in notices and (r := rank(line)):
                    self.mark_lines.append(start + n)
                    self.mark_ranks.append(r)
        if self.shown is None:
            added: list[int] = list(range(start, start + len(texts)))
        else:
            assert self.filter is not None  # shown is a list only while a filter is set
            keeps = self.filter.keeps
            added = [start + n for n, t in enumerate(texts) if keeps(t) or start + n in notices]
            self.shown.extend(added)
        # At most max_lines arrived, so only lines kept before them are dropped here.
        dropped += self.drop_front(len(self.lines) - self.max_lines)
        return Appended(added, dropped, arrived)

    def drop_front(self, count: int) -> int:
        """Drop the oldest `count` kept lines; returns how many shown lines went with them."""
        if count <= 0:
            return 0
        del self.lines[:count], self.text[:count], self.widths[:count]
        self.base += count
        base = self.base
        gone = bisect_left(self.mark_lines, base)
        del self.mark_lines[:gone], self.mark_ranks[:gone]
        if self.notices:
            self.notices = {a for a in self.notices if a >= base}
        if self.shown is None:
            return count
        shown_gone = bisect_left(self.shown, base)
        del self.shown[:shown_gone]
        return shown_gone

    def set_filter(self, line_filter: LineFilter | None) -> None:
        """Show only the lines line_filter keeps (notices always), or all of them."""
        self.filter = line_filter
        if line_filter is None:
            self.shown = None
            return
        keeps, base, notices = line_filter.keeps, self.base, self.notices
        self.shown = [base + n for n, t in enumerate(self.text) if keeps(t) or base + n in notices]
