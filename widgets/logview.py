"""The log pane: one log's lines, followed, filtered, marked and wrapped. It does no I/O.

The app feeds lines with `append` (cheap: it only buffers); the buffer moves into the view
at most every FLUSH_INTERVAL seconds (on the next loop pass after a quiet spell), so a flood
costs one layout per tick, not one per line. Lines are kept as plain `str` under absolute numbers (`_base` is the number
of the first kept line), so marker and filter indices survive the oldest lines being dropped.
Rows are rendered on demand (Line API) from an LRU cache of strips; a line's text is never
parsed as markup.
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate
from time import monotonic
from typing import ClassVar

from rich.cells import cell_len, chop_cells
from rich.segment import Segment
from rich.style import Style
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.cache import LRUCache
from textual.content import Content
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.timer import Timer
from textual.widgets import Input

from samai.remote.model import Marker
from samai.remote.visible import CONTROL_PICTURES, visible

FLUSH_INTERVAL = 0.1  # seconds: the most often buffered lines reach the screen
DEFAULT_MAX_LINES = 20_000
PROMPT_ROWS = 3  # the filter prompt's height; the view scrolls that much further while it is open
TAB_SIZE = 8

_RANKS = {"info": 1, "warning": 2, "error": 3}
_RANK_CLASSES = ("", "logview--info", "logview--warning", "logview--error")

# Patterns that refer to their own groups by number cannot be joined into one alternation.
_GROUP_REFERENCE = re.compile(r"\\[1-9]|\(\?P=|\(\?\(")
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


class _Notice(str):
    """A system line (not from the log), kept in order with the log's lines while pending."""


class LinesView(Sequence[str]):
    """A read-only view of the lines a LogView keeps, oldest first."""

    def __init__(self, lines: list[str]) -> None:
        self._lines = lines

    def __len__(self) -> int:
        return len(self._lines)

    def __getitem__(self, index):  # type: ignore[override]
        return self._lines[index]

    def __iter__(self) -> Iterator[str]:
        return iter(self._lines)


class _Markers:
    """Declared markers, compiled: a line's most severe match, as a rank (0: none)."""

    def __init__(self, markers: Sequence[Marker]) -> None:
        compiled: list[tuple[int, re.Pattern[str]]] = []
        for marker in markers:
            try:
                compiled.append((_RANKS.get(marker.severity, 1), re.compile(marker.pattern)))
            except re.error:
                continue  # the config layer reports bad patterns; the pane just can't colour them
        compiled.sort(key=lambda item: -item[0])
        self._by_rank = compiled
        # One alternation rejects the (many) unmarked lines in a single search.
        self._any: re.Pattern[str] | None = None
        if len(compiled) > 1 and not any(_GROUP_REFERENCE.search(rx.pattern) for _, rx in compiled):
            try:
                self._any = re.compile("|".join(f"(?:{rx.pattern})" for _, rx in compiled))
            except re.error:
                self._any = None  # e.g. a global inline flag inside one pattern: test one by one

    def __bool__(self) -> bool:
        return bool(self._by_rank)

    def rank(self, line: str) -> int:
        if self._any is not None and self._any.search(line) is None:
            return 0
        for rank, rx in self._by_rank:
            if rx.search(line) is not None:
                return rank
        return 0


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


class LogFilterInput(Input):
    """The filter prompt, docked at the bottom of its LogView while it is open."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Cancel", show=False, id="log.filter_cancel"),
    ]

    class Cancelled(Message):
        """Escape in the prompt: close it, keep the filter as it was."""

    def action_cancel(self) -> None:
        self.post_message(self.Cancelled())


class LogView(ScrollView, can_focus=True):
    """One log's lines, following the end, with a regex filter, markers and wrapping.

    Call `reset`, `append` and `notice` from the app's event loop (a thread worker uses
    `app.call_from_thread`)."""

    ALLOW_SELECT = False  # rows carry no selection offsets; ctrl+s hands the lines out instead

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("f", "follow", "Follow", id="log.follow"),
        Binding("slash", "open_filter", "Filter", id="log.filter"),
        Binding("escape", "clear_filter", "Clear filter", id="log.clear_filter", show=False),
        Binding("n", "next_marker", "Next marker", id="log.next_marker"),
        Binding("N", "prev_marker", "Previous marker", id="log.prev_marker"),
        Binding("w", "toggle_wrap", "Wrap", id="log.wrap"),
        Binding("ctrl+s", "save", "Save shown lines", id="log.save"),
        Binding("g,home", "top", "Top", id="log.top", show=False),
        Binding("G,end", "bottom", "Bottom (follow)", id="log.bottom", show=False),
    ]

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "logview--info",
        "logview--warning",
        "logview--error",
        "logview--notice",
        "logview--match",
        "logview--cursor",
    }

    DEFAULT_CSS = """
    LogView {
        background: $surface;
        color: $foreground;
        overflow-x: auto;
        overflow-y: scroll;
        border: round $foreground 25%;
        border-subtitle-color: $text-muted;
        &:focus-within { border: round $accent; }
        &.-paused { border-subtitle-color: $text-warning; }
        & > .logview--info { color: $text-success; }
        & > .logview--warning { color: $text-warning; }
        & > .logview--error { color: $text-error; text-style: bold; }
        & > .logview--notice { color: $text-muted; text-style: italic; }
        & > .logview--match { background: $warning 45%; text-style: bold; }
        & > .logview--cursor { background: $accent 30%; }
        & > LogFilterInput {
            dock: bottom;
            display: none;
            height: 3;  /* PROMPT_ROWS */
            &.-open { display: block; }
        }
    }
    """

    class SaveRequested(Message):
        """ctrl+s: the lines shown now (filtered, oldest first); the app writes the file."""

        def __init__(self, log_view: LogView, lines: tuple[str, ...]) -> None:
            super().__init__()
            self.log_view = log_view
            self.lines = lines

        @property
        def control(self) -> LogView:
            return self.log_view

    class FollowChanged(Message):
        """Following the end was switched on or off."""

        def __init__(self, log_view: LogView, following: bool) -> None:
            super().__init__()
            self.log_view = log_view
            self.following = following

        @property
        def control(self) -> LogView:
            return self.log_view

    def __init__(self, *, max_lines: int = DEFAULT_MAX_LINES, name: str | None = None,
                 id: str | None = None, classes: str | None = None, disabled: bool = False) -> None:
        super().__init__(name=name, id=id, classes=classes, disabled=disabled)
        if max_lines < 1:
            raise ValueError("max_lines must be at least 1")
        self.max_lines = max_lines
        # Kept lines, parallel lists indexed by (absolute number - _base).
        self._lines: list[str] = []  # as given: what `lines` and SaveRequested hand out
        self._text: list[str] = []  # as shown (clean_line); the same object when already clean
        self._widths: list[int] = []  # cells of _text
        self._base = 0
        self._notices: set[int] = set()
        # Marker lines: sorted absolute numbers and their ranks.
        self._mark_lines: list[int] = []
        self._mark_ranks: list[int] = []
        self._markers = _Markers(())
        # Shown lines: None when every kept line is shown, else their sorted absolute numbers.
        self._filter: LineFilter | None = None
        self._shown: list[int] | None = None
        # Wrap: _cum[k] - _cum[0] is the first row of shown line k (one extra entry at the end).
        self._wrap = False
        self._cum: list[int] | None = None
        self._wrap_width = 0
        self._max_width = 0
        # Follow and the paused counter.
        self._following = True
        self._new_since_pause = 0
        self._programmatic = 0  # >0 while the widget itself scrolls: not a user's scroll
        self._cursor: int | None = None  # the marker line n/N landed on
        # The pending buffer and its timer.
        self._pending: list[str] = []
        self._flush_timer: Timer | None = None
        self._flush_scheduled = False
        self._last_flush = 0.0
        # Render caches: row strips per (line, wrapped row or scroll x, width, wrap, cursor),
        # filter match spans per line, wrap cuts per (line, width).
        self._strips: LRUCache[tuple[int, int, int, bool, bool], Strip] = LRUCache(1024)
        self._spans_cache: LRUCache[int, tuple[list[int], list[int]]] = LRUCache(256)
        self._cuts_cache: LRUCache[tuple[int, int], list[int]] = LRUCache(1024)
        self._styles: dict[str, Style] = {}
        self._prompt_open = False

    # ------------------------------------------------------------ public API

    @property
    def lines(self) -> LinesView:
        """The kept lines (at most max_lines, notices included), oldest first; pending ones
        appear after the next flush."""
        return LinesView(self._lines)

    @property
    def first_line_number(self) -> int:
        """The absolute number (0 = first line since reset) of lines[0]."""
        return self._base

    @property
    def following(self) -> bool:
        return self._following

    @property
    def wrap(self) -> bool:
        return self._wrap

    @property
    def new_since_pause(self) -> int:
        """Lines that arrived while follow was paused."""
        return self._new_since_pause

    @property
    def filter_text(self) -> str | None:
        """The active filter as typed, or None."""
        return self._filter.source if self._filter else None

    @property
    def shown_lines(self) -> tuple[str, ...]:
        """The kept lines the filter shows, oldest first, as given."""
        base, lines = self._base, self._lines
        if self._shown is None:
            return tuple(lines)
        return tuple(lines[a - base] for a in self._shown)

    @property
    def shown_count(self) -> int:
        return len(self._lines) if self._shown is None else len(self._shown)

    @property
    def marker_lines(self) -> list[int]:
        """Indices into `lines` of the kept lines that match a marker, shown or not."""
        return [a - self._base for a in self._mark_lines]

    @property
    def cursor_line(self) -> int | None:
        """Index into `lines` of the marker line n/N landed on, or None."""
        return None if self._cursor is None else self._cursor - self._base

    @property
    def top_line(self) -> int | None:
        """Index into `lines` of the line in the first visible row, or None when empty."""
        located = self._locate(self.scroll_offset.y)
        return None if located is None else self._abs_at(located[0]) - self._base

    def row_of_line(self, index: int) -> int | None:
        """The virtual row where lines[index] starts, or None if it is not shown."""
        k = self._index_of(self._base + index)
        return None if k is None else self._row_of(k)

    def reset(self, title: str, markers: Sequence[Marker] = ()) -> None:
        """Start a new log: forget the lines, set the title and markers. Wrap and the filter
        are the user's settings and stay; follow starts again."""
        self._cancel_timer()
        self._pending.clear()
        self._lines, self._text, self._widths = [], [], []
        self._base = 0
        self._notices = set()
        self._mark_lines, self._mark_ranks = [], []
        self._markers = _Markers(markers)
        self._shown = None if self._filter is None else []
        self._cursor = None
        self._clear_caches()
        self._rebuild_rows()
        self._max_width = 0
        self.border_title = Content(visible(title))  # a path on the box: literal, control characters shown
        self._update_virtual_size()
        self._scroll_to_row(0, x=0)
        self._set_following(True)
        self._new_since_pause = 0
        self._update_subtitle()
        self.refresh()

    def append(self, lines: Sequence[str]) -> None:
        """Queue lines (without line breaks); they reach the view on the next flush tick."""
        if lines:
            self._pending.extend(lines)
            self._schedule_flush()

    def notice(self, text: str) -> None:
        """Queue a dim system line, e.g. that the file was truncated."""
        self._pending.append(_Notice(text))
        self._schedule_flush()

    def flush_now(self) -> None:
        """Move pending lines into the view now (the timer does this on its own)."""
        self._cancel_timer()
        pending, self._pending = self._pending, []
        self._last_flush = monotonic()
        if not pending:
            return
        arrived = sum(type(line) is not _Notice for line in pending)
        rows_dropped = 0
        if len(pending) > self.max_lines:
            # More than fits: the kept lines and the oldest pending ones would all be dropped.
            skipped = len(pending) - self.max_lines
            rows_dropped = self._drop_front(len(self._lines))
            self._base += skipped
            pending = pending[skipped:]
        self._add(pending)
        rows_dropped += self._drop_front(len(self._lines) - self.max_lines)
        self._update_virtual_size()
        if self._following:
            self._scroll_to_row(self.max_scroll_y)
        else:
            self._new_since_pause += arrived
            if rows_dropped:  # keep the lines being read where they are on screen
                self._scroll_to_row(self.scroll_offset.y - rows_dropped)
        self._update_subtitle()
        self.refresh()

    def set_filter(self, source: str | None) -> None:
        """Apply a filter (as typed in the prompt; None or "" clears it). Raises re.error."""
        self._apply_filter(LineFilter.parse(source) if source else None)

    # ------------------------------------------------------------ actions

    def action_follow(self) -> None:
        self._set_following(True)
        self._scroll_to_row(self.max_scroll_y)

    def action_bottom(self) -> None:
        self.action_follow()

    def action_top(self) -> None:
        self._set_following(False)
        self._scroll_to_row(0)

    def action_toggle_wrap(self) -> None:
        top = self.top_line
        self._wrap = not self._wrap
        self._relayout(top)
        self._update_subtitle()

    def action_open_filter(self) -> None:
        prompt = self.query_one(LogFilterInput)
        prompt.value = self._filter.source if self._filter else ""
        prompt.border_title = "filter: regex · !inverts · Enter applies (empty clears) · Esc cancels"
        prompt.border_subtitle = None
        prompt.remove_class("-invalid")
        prompt.add_class("-open")
        self._prompt_open = True
        self._update_virtual_size()
        if self._following:
            self._scroll_to_row(self.max_scroll_y)
        prompt.focus()

    def action_clear_filter(self) -> None:
        self._apply_filter(None)

    def action_next_marker(self) -> None:
        self._jump_marker(forward=True)

    def action_prev_marker(self) -> None:
        self._jump_marker(forward=False)

    def action_save(self) -> None:
        self.flush_now()
        self.post_message(self.SaveRequested(self, self.shown_lines))

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "clear_filter":
            return self._filter is not None  # otherwise escape goes on to the app
        return True

    # ------------------------------------------------------------ Textual hooks

    @property
    def is_container(self) -> bool:
        return True  # only so that the docked filter prompt is laid out

    def compose(self) -> ComposeResult:
        yield LogFilterInput(placeholder="e.g. loss|nan   !heartbeat   CUDA")

    def on_mount(self) -> None:
        self._update_subtitle()
        self.flush_now()

    def on_resize(self) -> None:
        if self._wrap and self._content_width() != self._wrap_width:
            self._relayout(self.top_line)
        elif self._following:
            self._scroll_to_row(self.max_scroll_y)

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._styles.clear()
        self._strips.clear()

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        if self._programmatic:
            return
        # A user's scroll: up pauses; reaching the very bottom resumes. A shrinking view
        # clamps scroll_y down to the bottom, which is neither.
        bottom = self.max_scroll_y
        if new_value < old_value and new_value < bottom:
            self._set_following(False)
        elif new_value > old_value and new_value >= bottom:
            self._set_following(True)

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        self._show_filter_error(event.input, event.value)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        try:
            self.set_filter(event.value)
        except re.error:
            self._show_filter_error(event.input, event.value)
            self.app.bell()
            return  # stay open; the previous filter stays active
        self._close_prompt()

    def on_log_filter_input_cancelled(self, event: LogFilterInput.Cancelled) -> None:
        event.stop()
        self._close_prompt()

    def on_input_blurred(self, event: Input.Blurred) -> None:
        event.stop()
        if self._prompt_open:  # focus went elsewhere: drop the edit, leave focus where it went
            self._close_prompt(refocus=False)

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        width = self._content_width()
        base_style = self._base_style()
        located = self._locate(scroll_y + y)
        if located is None:
            return Strip.blank(width, base_style)
        k, sub = located
        a = self._abs_at(k)
        key = (a, sub if self._wrap else scroll_x, width, self._wrap, a == self._cursor)
        strip = self._strips.get(key)
        if strip is not None:
            return strip
        i = a - self._base
        text, cells = self._text[i], self._widths[i]
        fill = self._line_style(a) if a == self._cursor else base_style
        if self._wrap:
            start, end = self._row_range(a, text, cells, sub)
            strip = self._piece(a, start, end).extend_cell_length(width, fill)
        elif cells == len(text):  # one cell per character: render only what is visible
            strip = self._piece(a, scroll_x, scroll_x + width).extend_cell_length(width, fill)
        else:  # wide characters: cells are not characters, let Strip find the window
            strip = self._piece(a, 0, len(text)).crop_extend(scroll_x, scroll_x + width, fill)
        self._strips[key] = strip  # only row-sized strips are kept, however long the line
        return strip

    # ------------------------------------------------------------ storage

    def _add(self, pending: list[str]) -> None:
        """Append lines to the kept buffer, classifying and filtering only the new ones."""
        start = self._base + len(self._lines)
        texts = [clean_line(line) for line in pending]
        widths = [len(t) if t.isascii() else cell_len(t) for t in texts]
        notices = [start + n for n, line in enumerate(pending) if type(line) is _Notice]
        self._lines.extend(pending)
        self._text.extend(texts)
        self._widths.extend(widths)
        self._notices.update(notices)
        if self._markers:  # markers match the line as given, as the box's probe does
            rank = self._markers.rank
            for n, line in enumerate(pending):
                if (r := rank(line)) and type(line) is not _Notice:
                    self._mark_lines.append(start + n)
                    self._mark_ranks.append(r)
        if self._shown is None:
            shown = range(start, start + len(texts))
            self._max_width = max(self._max_width, max(widths))
        else:
            assert self._filter is not None  # _shown is a list only while a filter is set
            keeps = self._filter.keeps
            notice_set = set(notices)
            shown = [start + n for n, t in enumerate(texts) if keeps(t) or start + n in notice_set]
            self._shown.extend(shown)
            if shown:
                self._max_width = max(self._max_width, max(widths[a - start] for a in shown))
        if self._cum is not None:
            ends = accumulate((self._rows_of(a) for a in shown), initial=self._cum[-1])
            next(ends)  # the initial value is already the last entry
            self._cum.extend(ends)

    def _drop_front(self, count: int) -> int:
        """Drop the oldest `count` kept lines; returns how many view rows went with them."""
        if count <= 0:
            return 0
        del self._lines[:count], self._text[:count], self._widths[:count]
        self._base += count
        base = self._base
        gone = bisect_left(self._mark_lines, base)
        del self._mark_lines[:gone], self._mark_ranks[:gone]
        if self._notices:
            self._notices = {a for a in self._notices if a >= base}
        if self._cursor is not None and self._cursor < base:
            self._cursor = None
        if self._shown is None:
            shown_gone = count
        else:
            shown_gone = bisect_left(self._shown, base)
            del self._shown[:shown_gone]
        rows = shown_gone
        if self._cum is not None:
            rows = self._cum[shown_gone] - self._cum[0]
            del self._cum[:shown_gone]
        self._max_width = self._shown_max_width()
        return rows

    def _shown_max_width(self) -> int:
        if self._shown is None:
            return max(self._widths, default=0)
        base, widths = self._base, self._widths
        return max((widths[a - base] for a in self._shown), default=0)

    # ------------------------------------------------------------ shown lines and rows

    def _abs_at(self, k: int) -> int:
        return self._base + k if self._shown is None else self._shown[k]

    def _index_of(self, a: int) -> int | None:
        """The shown index of absolute line a, or None if it is not shown (or not kept)."""
        if not self._base <= a < self._base + len(self._lines):
            return None
        if self._shown is None:
            return a - self._base
        k = bisect_left(self._shown, a)
        return k if k < len(self._shown) and self._shown[k] == a else None

    def _row_of(self, k: int) -> int:
        return k if self._cum is None else self._cum[k] - self._cum[0]

    def _total_rows(self) -> int:
        return self.shown_count if self._cum is None else self._cum[-1] - self._cum[0]

    def _locate(self, row: int) -> tuple[int, int] | None:
        """(shown index, row within that line) of a virtual row, or None past the end."""
        if row < 0:
            return None
        if self._cum is None:
            return (row, 0) if row < self.shown_count else None
        target = row + self._cum[0]
        if target >= self._cum[-1]:
            return None
        k = bisect_right(self._cum, target) - 1
        return k, target - self._cum[k]

    def _content_width(self) -> int:
        return max(1, self.scrollable_content_region.width)

    def _rows_of(self, a: int) -> int:
        """Rows that absolute line a takes when wrapped at _wrap_width."""
        i = a - self._base
        cells, width = self._widths[i], self._wrap_width
        if cells <= width:
            return 1
        if cells == len(self._text[i]):
            return -(-cells // width)
        return len(self._wide_cuts(a, self._text[i])) - 1

    def _wide_cuts(self, a: int, text: str) -> list[int]:
        """Character offsets where the wrapped rows of a line with wide characters start
        (and its end): a wide character is never split between two rows."""
        key = (a, self._wrap_width)
        cuts = self._cuts_cache.get(key)
        if cuts is None:
            cuts = list(accumulate((len(part) for part in chop_cells(text, self._wrap_width)), initial=0))
            self._cuts_cache[key] = cuts
        return cuts

    def _row_range(self, a: int, text: str, cells: int, sub: int) -> tuple[int, int]:
        """The characters of row `sub` of a wrapped line."""
        width = self._wrap_width
        if cells <= width:
            return 0, len(text)
        if cells == len(text):
            return sub * width, (sub + 1) * width
        cuts = self._wide_cuts(a, text)
        return cuts[sub], cuts[sub + 1]

    def _rebuild_rows(self) -> None:
        """Recompute the wrapped-row index (on wrap, width or filter changes)."""
        if not self._wrap:
            self._cum = None
            return
        self._wrap_width = self._content_width()
        width, base = self._wrap_width, self._base
        widths = self._widths
        shown = range(base, base + len(widths)) if self._shown is None else self._shown
        rows_of = self._rows_of
        # Most lines fit in one row: only longer ones need a closer look.
        rows = [1 if widths[a - base] <= width else rows_of(a) for a in shown]
        self._cum = list(accumulate(rows, initial=0))

    def _relayout(self, top: int | None) -> None:
        """Rebuild rows and scroll so that lines[top] stays the first visible line."""
        self._strips.clear()
        self._rebuild_rows()
        self._update_virtual_size()
        if self._following:
            self._scroll_to_row(self.max_scroll_y)
        elif top is not None:
            k = self._nearest_shown(self._base + top)
            self._scroll_to_row(0 if k is None else self._row_of(k), x=0 if self._wrap else None)
        self.refresh()

    def _nearest_shown(self, a: int) -> int | None:
        """The shown index of line a, or of the first shown line after it (else the last)."""
        count = self.shown_count
        if not count:
            return None
        k = max(0, a - self._base) if self._shown is None else bisect_left(self._shown, a)
        return min(k, count - 1)

    def _update_virtual_size(self) -> None:
        rows = self._total_rows() + (PROMPT_ROWS if self._prompt_open else 0)
        width = self._content_width() if self._wrap else self._max_width
        self.virtual_size = Size(width, rows)

    # ------------------------------------------------------------ filter

    def _apply_filter(self, line_filter: LineFilter | None) -> None:
        top = self.top_line
        self._filter = line_filter
        if line_filter is None:
            self._shown = None
        else:
            keeps, base, notices = line_filter.keeps, self._base, self._notices
            self._shown = [base + n for n, t in enumerate(self._text) if keeps(t) or base + n in notices]
        self._spans_cache.clear()
        self._max_width = self._shown_max_width()
        self._relayout(top)
        self._update_subtitle()

    def _show_filter_error(self, prompt: Input, value: str) -> None:
        try:
            LineFilter.parse(value)
        except re.error as error:
            prompt.border_subtitle = Content(visible(f"invalid regex: {error} · the previous filter stays"))
            prompt.add_class("-invalid")
        else:
            prompt.border_subtitle = None
            prompt.remove_class("-invalid")

    def _close_prompt(self, refocus: bool = True) -> None:
        prompt = self.query_one(LogFilterInput)
        prompt.remove_class("-open")
        self._prompt_open = False
        self._update_virtual_size()
        if self._following:
            self._scroll_to_row(self.max_scroll_y)
        if refocus:
            self.focus()

    def _spans(self, a: int) -> tuple[list[int], list[int]] | None:
        """Starts and ends of the filter's matches in line a's shown text."""
        if self._filter is None or self._filter.invert:
            return None
        spans = self._spans_cache.get(a)
        if spans is None:
            starts: list[int] = []
            ends: list[int] = []
            for match in self._filter.regex.finditer(self._text[a - self._base]):
                if match.end() > match.start():
                    starts.append(match.start())
                    ends.append(match.end())
            spans = (starts, ends)
            self._spans_cache[a] = spans
        return spans

    # ------------------------------------------------------------ markers

    def _rank_of(self, a: int) -> int:
        k = bisect_left(self._mark_lines, a)
        return self._mark_ranks[k] if k < len(self._mark_lines) and self._mark_lines[k] == a else 0

    def _jump_marker(self, *, forward: bool) -> None:
        self.flush_now()
        marks = self._mark_lines
        top = self.scroll_offset.y
        height = self.scrollable_content_region.height - (PROMPT_ROWS if self._prompt_open else 0)
        anchor = self._cursor
        k = None if anchor is None else self._index_of(anchor)
        if k is None or not top <= self._row_of(k) < top + height:
            # No current marker in view: search from the first (n) or last (N) visible line.
            row = top if forward else top + height - 1
            located = self._locate(row) if forward else self._locate(min(row, self._total_rows() - 1))
            if located is None:
                start = 0 if forward else len(marks) - 1
            else:
                a = self._abs_at(located[0])
                start = bisect_left(marks, a) if forward else bisect_right(marks, a) - 1
        else:
            start = bisect_right(marks, anchor) if forward else bisect_left(marks, anchor) - 1
        candidates = range(start, len(marks)) if forward else range(start, -1, -1)
        target = next((marks[j] for j in candidates if self._index_of(marks[j]) is not None), None)
        if target is None:
            self.app.bell()
            self.notify("No further marker lines" if marks else "No marker lines", timeout=2, markup=False)
            return
        self._set_following(False)
        self._cursor = target
        row = self._row_of(self._index_of(target))  # type: ignore[arg-type]
        if not top <= row < top + height:
            self._scroll_to_row(row - height // 3)
        self.refresh()

    # ------------------------------------------------------------ follow

    def _set_following(self, following: bool) -> None:
        if following == self._following:
            return
        self._following = following
        self._new_since_pause = 0
        if following:
            self._cursor = None
        self.set_class(not following, "-paused")
        self._update_subtitle()
        self.post_message(self.FollowChanged(self, following))

    def _scroll_to_row(self, y: float, x: float | None = None) -> None:
        if not self.is_mounted:
            return
        self._programmatic += 1
        try:
            self.scroll_to(x=x, y=max(0, y), animate=False, force=True, immediate=True)
        finally:
            self._programmatic -= 1

    def _update_subtitle(self) -> None:
        parts: list[str] = []
        if self._filter is not None:
            parts.append(f"/{visible(self._filter.source)}/ {self.shown_count:,} of {len(self._lines):,}")
        if self._wrap:
            parts.append("wrap")
        if self._following:
            parts.append("FOLLOW")
        else:
            parts.append(f"PAUSED · {self._new_since_pause:,} new · {self._follow_key()} to follow")
        self.border_subtitle = Content(" · ".join(parts))

    def _follow_key(self) -> str:
        """The key that resumes follow, as the app's keymap (App.set_keymap) has it."""
        # Textual keeps the keymap private; without it the hint falls back to the default key.
        keys = getattr(self.app, "_keymap", {}).get("log.follow") if self.is_attached else None
        if not keys:
            return "f"
        return self.app.get_key_display(Binding(keys.split(",")[0].strip(), "follow"))

    # ------------------------------------------------------------ flush timer

    def _schedule_flush(self) -> None:
        if self._flush_scheduled or not self.is_mounted:
            return  # on_mount flushes what came before
        self._flush_scheduled = True
        delay = self._last_flush + FLUSH_INTERVAL - monotonic()
        if delay > 0:
            self._flush_timer = self.set_timer(delay, self._scheduled_flush, name="logview-flush")
        else:  # quiet for a while: show it on the next loop pass (appends in this one batch up)
            self.call_later(self._scheduled_flush)

    def _scheduled_flush(self) -> None:
        if self._flush_scheduled:  # else flush_now already ran
            self.flush_now()

    def _cancel_timer(self) -> None:
        self._flush_scheduled = False
        if self._flush_timer is not None:
            self._flush_timer.stop()
            self._flush_timer = None

    # ------------------------------------------------------------ rendering

    def _clear_caches(self) -> None:
        self._strips.clear()
        self._spans_cache.clear()
        self._cuts_cache.clear()

    def _component_style(self, name: str) -> Style:
        """Only what the component's rules set (so styles stack: a cursor keeps a marker's
        colour), with colours as the full style resolves them (alpha blended, `$text-*`)."""
        style = self._styles.get(name)
        if style is None:
            partial = self.get_component_rich_style(name, partial=True)
            full = self.get_component_rich_style(name, partial=False)
            style = partial + Style(color=full.color if partial.color else None,
                                    bgcolor=full.bgcolor if partial.bgcolor else None)
            self._styles[name] = style
        return style

    def _base_style(self) -> Style:
        """The widget's own style (rich_style walks the DOM: worth keeping per style update)."""
        style = self._styles.get("")
        if style is None:
            style = self._styles[""] = self.rich_style
        return style

    def _line_style(self, a: int) -> Style:
        style = self._base_style()
        if a in self._notices:
            style += self._component_style("logview--notice")
        elif rank := self._rank_of(a):
            style += self._component_style(_RANK_CLASSES[rank])
        if a == self._cursor:
            style += self._component_style("logview--cursor")
        return style

    def _piece(self, a: int, start: int, end: int) -> Strip:
        """Characters start..end of line a's shown text, styled, highlights included."""
        i = a - self._base
        text = self._text[i]
        narrow = self._widths[i] == len(text)
        style = self._line_style(a)
        segments: list[Segment] = []
        spans = self._spans(a)
        pos = start
        if spans:
            starts, ends = spans
            match_style = style + self._component_style("logview--match")
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
