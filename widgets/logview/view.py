"""The log pane: one log's lines, followed, filtered, marked and wrapped. It does no I/O.

The app feeds lines with `append` (cheap: it only buffers); the buffer moves into the view
at most every FLUSH_INTERVAL seconds (on the next loop pass after a quiet spell), so a flood
costs one layout per tick, not one per line. The lines live in a LineBuffer (buffer.py),
rows are mapped to lines by a RowLayout (layout.py) and rendered on demand (Line API) by a
LineStyler (styles.py) into an LRU cache of strips; a line's text is never parsed as markup.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from time import monotonic
from typing import TYPE_CHECKING, ClassVar

from textual.app import ComposeResult
from textual.binding import BindingType
from textual.cache import LRUCache
from textual.content import Content
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.timer import Timer
from textual.widgets import Input

from samai.console.core import units
from samai.remote.safe_text import visible
from samai.widgets.keys import bindings
from samai.widgets.logview.buffer import LineBuffer, LineFilter, LinesView, Notice
from samai.widgets.logview.filter_input import PROMPT_ROWS, LogFilterInput
from samai.widgets.logview.layout import RowLayout
from samai.widgets.logview.markers import with_alarms
from samai.widgets.logview.styles import COMPONENT_CLASSES, LineStyler
from samai.widgets.pane import inert

if TYPE_CHECKING:
    from samai.console.core.update import StateUpdate
    from samai.remote.model import Marker

FLUSH_INTERVAL = 0.1  # seconds: the most often buffered lines reach the screen
DEFAULT_MAX_LINES = 20_000


class LogView(ScrollView, can_focus=True):
    """One log's lines, following the end, with a regex filter, markers and wrapping.

    Call `reset`, `append` and `notice` from the app's event loop (a thread worker uses
    `app.call_from_thread`)."""

    ALLOW_SELECT = False  # rows carry no selection offsets; ctrl+s and Y hand the lines out instead

    BINDINGS: ClassVar[list[BindingType]] = bindings("log")

    COMPONENT_CLASSES: ClassVar[set[str]] = COMPONENT_CLASSES

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
        self._buffer = LineBuffer(max_lines)
        self._rows = RowLayout(self._buffer)
        self._styler = LineStyler(self, self._buffer)
        self._max_width = 0
        # Follow and the paused counter.
        self._following = True
        self._new_since_pause = 0
        self._programmatic = 0  # >0 while the widget itself scrolls: not a user's scroll
        self._cursor: int | None = None  # the marker line n/N landed on (absolute number)
        self._goto: int | None = None  # the line to put the cursor on once it arrives (go_to_line)
        # The pending buffer and its timer.
        self._pending: list[str] = []
        self._flush_timer: Timer | None = None
        self._flush_scheduled = False
        self._last_flush = 0.0
        # Row strips per (line, wrapped row or scroll x, width, wrap, cursor).
        self._strips: LRUCache[tuple[int, int, int, bool, bool], Strip] = LRUCache(1024)
        self._prompt_open = False
        self._follow_display = "f"  # the follow key as last seen in the active bindings

    # ------------------------------------------------------------ public API

    @property
    def max_lines(self) -> int:
        return self._buffer.max_lines

    @property
    def lines(self) -> LinesView:
        """The kept lines (at most max_lines, notices included), oldest first; pending ones
        appear after the next flush."""
        return LinesView(self._buffer.lines)

    @property
    def first_line_number(self) -> int:
        """The absolute number (0 = first line since reset) of lines[0]."""
        return self._buffer.base

    @property
    def following(self) -> bool:
        return self._following

    @property
    def wrap(self) -> bool:
        return self._rows.wrap

    @property
    def new_since_pause(self) -> int:
        """Lines that arrived while follow was paused."""
        return self._new_since_pause

    @property
    def filter_text(self) -> str | None:
        """The active filter as typed, or None."""
        return self._buffer.filter.source if self._buffer.filter else None

    @property
    def shown_lines(self) -> tuple[str, ...]:
        """The kept lines the filter shows, oldest first, as given."""
        return self._buffer.shown_lines()

    @property
    def shown_count(self) -> int:
        return self._buffer.shown_count

    @property
    def marker_lines(self) -> list[int]:
        """Indices into `lines` of the kept lines that match a marker, shown or not."""
        return [a - self._buffer.base for a in self._buffer.mark_lines]

    @property
    def cursor_line(self) -> int | None:
        """Index into `lines` of the marker line n/N landed on, or None."""
        return None if self._cursor is None else self._cursor - self._buffer.base

    @property
    def top_line(self) -> int | None:
        """Index into `lines` of the line in the first visible row, or None when empty."""
        located = self._rows.locate(self.scroll_offset.y)
        return None if located is None else self._buffer.abs_at(located[0]) - self._buffer.base

    @property
    def current_line(self) -> int | None:
        """Index into `lines` of the line `Y` copies: the marker line n/N landed on, else the
        newest shown line while following, else the first visible one."""
        if self._cursor is not None and self._buffer.index_of(self._cursor) is not None:
            return self.cursor_line
        if self._following and self._buffer.shown_count:
            return self._buffer.abs_at(self._buffer.shown_count - 1) - self._buffer.base
        return self.top_line

    def row_of_line(self, index: int) -> int | None:
        """The virtual row where lines[index] starts, or None if it is not shown."""
        k = self._buffer.index_of(self._buffer.base + index)
        return None if k is None else self._rows.row_of(k)

    def show_update(self, update: StateUpdate) -> None:
        """A poll's lines of the shown log; a new run of its stage starts the pane again; the
        title says how far the shown stage is while it runs."""
        log = update.log
        if log is None:
            return
        if log.restarted:
            self.reset(log.path, log.markers)
            when = units.local_time(update.now)
            self.notice(f"a new run of {log.restarted} started at {when}: its log from the start "
                        f"(the last run's is {log.path}.1; H lists the runs)")
        if log.notice:
            self.notice(log.notice)
        if log.lines:
            self.append(log.lines)
        view = next((v for v in update.stages if v.name == log.stage), None)
        if view is not None:
            title = inert(f"log · {view.name}" + (f" · {view.progress.text}" if view.progress else ""))
            if str(self.border_title) != str(title):
                self.border_title = title

    def go_to_line(self, index: int) -> None:
        """Put the cursor on the line numbered index (0: the first since reset) as soon as it has
        arrived: a log opened at a line is read after this is asked."""
        self._goto = index
        self._try_goto()

    def _try_goto(self) -> None:
        at = None if self._goto is None else self._buffer.index_of(self._goto)
        row = None if at is None else self._rows.row_of(at)
        if self._goto is None or row is None:
            return
        self._cursor, self._goto = self._goto, None
        self._set_following(False)
        self._scroll_to_row(row - self.scrollable_content_region.height // 3)
        self.refresh()

    def reset(self, title: str, markers: Sequence[Marker] = ()) -> None:
        """Start a new log: forget the lines, set the title and markers (the alarms of any log
        come with them). Wrap and the filter are the user's settings and stay; follow starts again."""
        self._cancel_timer()
        self._pending.clear()
        self._buffer.clear(with_alarms(markers))
        self._cursor = self._goto = None
        self._clear_caches()
        self._rows.rebuild(self._content_width())
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
        """Queue a dim system line, e.g. that the file was truncated; it is shown whole (wrapped)."""
        self._pending.append(Notice(text))
        self._schedule_flush()

    def flush_now(self) -> None:
        """Move pending lines into the view now (the timer does this on its own)."""
        self._cancel_timer()
        pending, self._pending = self._pending, []
        self._last_flush = monotonic()
        if not pending:
            return
        change = self._buffer.add(pending)
        rows_dropped = self._rows.appended(change)
        if self._cursor is not None and self._cursor < self._buffer.base:
            self._cursor = None
        self._max_width = self._buffer.max_width() if change.dropped else max(
            self._max_width, self._buffer.max_width_of(change.shown))
        self._update_virtual_size()
        if self._following:
            self._scroll_to_row(self.max_scroll_y)
        else:
            self._new_since_pause += change.arrived
            if rows_dropped:  # keep the lines being read where they are on screen
                self._scroll_to_row(self.scroll_offset.y - rows_dropped)
        self._update_subtitle()
        self.refresh()
        self._try_goto()

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
        self._rows.wrap = not self._rows.wrap
        self._relayout(top)
        self._update_subtitle()

    def action_open_filter(self) -> None:
        self._prompt_open = True
        self._update_virtual_size()
        if self._following:
            self._scroll_to_row(self.max_scroll_y)
        self.query_one(LogFilterInput).open_with(self.filter_text or "")

    def action_clear_filter(self) -> None:
        self._apply_filter(None)

    def action_next_marker(self) -> None:
        self._jump_marker(forward=True)

    def action_prev_marker(self) -> None:
        self._jump_marker(forward=False)

    def action_save(self) -> None:
        self.flush_now()
        self.post_message(self.SaveRequested(self, self.shown_lines))

    def action_copy_line(self) -> None:
        """The current line to the clipboard as the pane shows it: text, control characters
        as their stand-ins (a pasted line must not be able to drive a terminal)."""
        self.flush_now()
        index = self.current_line
        if index is None:
            self.app.bell()
            return
        text = self._buffer.text[index]
        self.app.copy_to_clipboard(text)
        self.notify(f"copied line {self._buffer.base + index + 1:,} ({len(text):,} characters)",
                    timeout=2, markup=False)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "clear_filter":
            return self._buffer.filter is not None  # otherwise escape goes on to the app
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
        if self._rows.cum is not None and self._content_width() != self._rows.width:
            self._relayout(self.top_line)  # wrapped rows (or a notice's) change with the width
        else:
            self._rows.width = self._content_width()
            if self._following:
                self._scroll_to_row(self.max_scroll_y)

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._styler.clear_styles()
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
        self.query_one(LogFilterInput).check_filter(event.value)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        try:
            self.set_filter(event.value)
        except re.error:
            self.query_one(LogFilterInput).check_filter(event.value)
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
        base_style = self._styler.base()
        located = self._rows.locate(scroll_y + y)
        if located is None:
            return Strip.blank(width, base_style)
        k, sub = located
        a = self._buffer.abs_at(k)
        wraps = self._rows.wraps(a)
        cursor = a == self._cursor
        key = (a, sub if wraps else scroll_x, width, wraps, cursor)
        strip = self._strips.get(key)
        if strip is not None:
            return strip
        i = a - self._buffer.base
        text, cells = self._buffer.text[i], self._buffer.widths[i]
        fill = self._styler.line_style(a, cursor) if cursor else base_style
        if wraps:
            start, end = self._rows.row_range(a, sub)
            strip = self._styler.piece(a, start, end, cursor).extend_cell_length(width, fill)
        elif cells == len(text):  # one cell per character: render only what is visible
            strip = self._styler.piece(a, scroll_x, scroll_x + width, cursor).extend_cell_length(width, fill)
        else:  # wide characters: cells are not characters, let Strip find the window
            strip = self._styler.piece(a, 0, len(text), cursor).crop_extend(scroll_x, scroll_x + width, fill)
        self._strips[key] = strip  # only row-sized strips are kept, however long the line
        return strip

    # ------------------------------------------------------------ layout

    def _content_width(self) -> int:
        return max(1, self.scrollable_content_region.width)

    def _relayout(self, top: int | None) -> None:
        """Rebuild rows and scroll so that lines[top] stays the first visible line."""
        self._strips.clear()
        self._rows.rebuild(self._content_width())
        self._update_virtual_size()
        if self._following:
            self._scroll_to_row(self.max_scroll_y)
        elif top is not None:
            k = self._buffer.nearest_shown(self._buffer.base + top)
            self._scroll_to_row(0 if k is None else self._rows.row_of(k), x=0 if self._rows.wrap else None)
        self.refresh()

    def _update_virtual_size(self) -> None:
        rows = self._rows.total_rows() + (PROMPT_ROWS if self._prompt_open else 0)
        width = self._content_width() if self._rows.wrap else self._max_width
        self.virtual_size = Size(width, rows)

    # ------------------------------------------------------------ filter

    def _apply_filter(self, line_filter: LineFilter | None) -> None:
        top = self.top_line
        self._buffer.set_filter(line_filter)
        self._styler.clear_matches()
        self._max_width = self._buffer.max_width()
        self._relayout(top)
        self._update_subtitle()

    def _close_prompt(self, refocus: bool = True) -> None:
        self.query_one(LogFilterInput).close_prompt()
        self._prompt_open = False
        self._update_virtual_size()
        if self._following:
            self._scroll_to_row(self.max_scroll_y)
        if refocus:
            self.focus()

    # ------------------------------------------------------------ markers

    def _jump_marker(self, *, forward: bool) -> None:
        self.flush_now()
        top = self.scroll_offset.y
        height = self.scrollable_content_region.height - (PROMPT_ROWS if self._prompt_open else 0)
        target = self._rows.next_marker(self._cursor, top, height, forward=forward)
        if target is None:
            self.app.bell()
            self.notify("No further marker lines" if self._buffer.mark_lines else "No marker lines",
                        timeout=2, markup=False)
            return
        self._set_following(False)
        self._cursor = target
        row = self._rows.row_of(self._buffer.index_of(target))  # type: ignore[arg-type]
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
        line_filter = self._buffer.filter
        if line_filter is not None:
            parts.append(f"/{visible(line_filter.source)}/ {self.shown_count:,} of {len(self._buffer):,}")
        if self._rows.wrap:
            parts.append("wrap")
        if self._following:
            parts.append("FOLLOW")
        else:
            parts.append(f"PAUSED · {self._new_since_pause:,} new · {self._follow_key()} to follow")
        self.border_subtitle = Content(" · ".join(parts))

    def _follow_key(self) -> str:
        """The key that resumes follow, as the app's keymap (App.set_keymap) has it: read from
        the screen's active bindings (public), so only while this pane is in the focus chain;
        otherwise the key last seen there, or the default."""
        if self.is_attached:
            for active in self.screen.active_bindings.values():
                if active.binding.id == "log.follow" and active.node is self:
                    self._follow_display = self.app.get_key_display(active.binding)
                    break
        return self._follow_display

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

    def _clear_caches(self) -> None:
        self._strips.clear()
        self._styler.clear_matches()
        self._rows.clear()
