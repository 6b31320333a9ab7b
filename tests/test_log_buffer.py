"""The log pane's line buffer and row layout on their own (no widget, no app): bounds, markers, filter, notices."""

from __future__ import annotations

import re
import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from samai.remote.model import Marker
from samai.remote.safe_text import HIDDEN_CATEGORIES
from samai.widgets.logview.buffer import LineBuffer, LineFilter, Notice, clean_line
from samai.widgets.logview.layout import RowLayout
from samai.widgets.logview.markers import ALARMS, RANKS, Markers, with_alarms

MARKERS = (Marker("oom", r"ERROR", "error"), Marker("slow", r"WARN", "warning"))

# Log-ish text: anything, with the characters that matter over-represented.
line_text = st.text(st.one_of(st.characters(), st.sampled_from("\r\t\x1b[ERROR WARN nan 界")), max_size=40)
lines_st = st.lists(line_text, max_size=60)


def contents(buffer: LineBuffer) -> tuple:
    return (tuple(buffer.lines), buffer.base, tuple(buffer.mark_lines), tuple(buffer.mark_ranks),
            buffer.shown_lines(), tuple(buffer.text), tuple(buffer.widths))


@settings(max_examples=150, deadline=None)
@given(lines=lines_st, cuts=st.lists(st.integers(0, 60), max_size=6), max_lines=st.integers(1, 30))
def test_appending_in_chunks_is_appending_whole(lines: list[str], cuts: list[int], max_lines: int) -> None:
    whole = LineBuffer(max_lines)
    whole.clear(MARKERS)
    whole.add(lines)
    chunked = LineBuffer(max_lines)
    chunked.clear(MARKERS)
    bounds = sorted({0, len(lines), *(min(c, len(lines)) for c in cuts)})
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        chunked.add(lines[lo:hi])
    assert contents(chunked) == contents(whole)


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(chunks=st.lists(lines_st, max_size=6), max_lines=st.integers(1, 25))
def test_max_lines_keeps_the_newest_lines_and_numbers_them(chunks: list[list[str]], max_lines: int) -> None:
    buffer = LineBuffer(max_lines)
    buffer.clear(MARKERS)
    everything: list[str] = []
    for chunk in chunks:
        change = buffer.add(chunk)
        everything.extend(chunk)
        assert change.arrived == len(chunk)
        assert len(buffer) <= max_lines
    assert list(buffer.lines) == everything[-max_lines:] if everything else list(buffer.lines) == []
    assert buffer.base == len(everything) - len(buffer)
    ranks = Markers(MARKERS)
    expected = [buffer.base + i for i, line in enumerate(buffer.lines) if ranks.rank(line)]
    assert buffer.mark_lines == expected  # marker numbers survive the oldest lines going


@settings(max_examples=150, deadline=None)
@given(lines=lines_st, pattern=st.sampled_from(["err", "!err", "N", "a|b", "^$", r"\d", "界", "!."]),
       max_lines=st.integers(1, 80), before=st.booleans())
def test_a_filter_over_any_text_shows_exactly_what_it_keeps(lines: list[str], pattern: str, max_lines: int,
                                                              before: bool) -> None:
    line_filter = LineFilter.parse(pattern)
    buffer = LineBuffer(max_lines)
    if before:  # set before the lines come, or after: the same lines are shown
        buffer.set_filter(line_filter)
    buffer.add(lines)
    buffer.add([Notice("— file truncated —")])
    if not before:
        buffer.set_filter(line_filter)
    kept = list(buffer.lines)
    expected = [line for line in kept if type(line) is Notice or line_filter.keeps(clean_line(line))]
    assert list(buffer.shown_lines()) == expected
    assert buffer.shown_count == len(expected)
    for k in range(buffer.shown_count):
        assert buffer.index_of(buffer.abs_at(k)) == k


@given(line=line_text)
def test_a_shown_line_is_one_printable_row(line: str) -> None:
    shown = clean_line(line)
    # no escape, break, carriage return or invisible format character left
    assert not any(unicodedata.category(c) in HIDDEN_CATEGORIES for c in shown)


def test_notices_pass_any_filter_are_never_marked_and_do_not_widen_the_view() -> None:
    buffer = LineBuffer(10)
    buffer.clear(MARKERS)
    buffer.set_filter(LineFilter.parse("loss"))
    buffer.add(["loss 1", "ERROR boom", Notice("ERROR: no such file on the box: " + "x" * 200)])
    assert buffer.shown_lines() == ("loss 1", "ERROR: no such file on the box: " + "x" * 200)
    assert buffer.mark_lines == [1]  # the log's ERROR line, not the notice
    assert buffer.max_width() == len("loss 1")


def test_more_lines_than_fit_in_one_add_keep_the_newest() -> None:
    buffer = LineBuffer(3)
    buffer.add(["a", "b"])
    change = buffer.add([str(i) for i in range(10)])
    assert list(buffer.lines) == ["7", "8", "9"]
    assert buffer.base == 9
    assert change.dropped == 2 and change.arrived == 10 and change.shown == [9, 10, 11]


def test_max_lines_must_be_positive() -> None:
    with pytest.raises(ValueError):
        LineBuffer(0)


@pytest.mark.parametrize("line", [
    "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB",
    "Traceback (most recent call last):",
    "2024-01-01 ERROR something broke",
    "CRITICAL: disk full",
    "Killed",
    "{'loss': 'nan', 'grad_norm': 'nan'}",
    "loss NaN at step 4",
    "llama-server: OOM while loading",
])
def test_alarms_mark_the_usual_signs_of_trouble_in_any_file(line: str) -> None:
    assert Markers(ALARMS).rank(line) > 0


@pytest.mark.parametrize("line", ["step 4 loss 0.83", "nano is an editor", "errors=0", "skilled"])
def test_alarms_leave_ordinary_lines_alone(line: str) -> None:
    assert Markers(ALARMS).rank(line) == 0


def test_a_stage_keeps_its_own_markers_with_the_alarms() -> None:
    ranks = Markers(with_alarms((Marker("done", r"TRAIN_DONE", "info"),)))
    assert ranks.rank("TRAIN_DONE") == 1
    assert ranks.rank("Traceback (most recent call last):") == 3


def test_a_pattern_with_a_global_flag_still_ranks() -> None:
    ranks = Markers((Marker("a", r"(?i)boom", "error"), *ALARMS))
    assert ranks.rank("BOOM") == 3
    assert re.compile(r"(?i)boom")  # the pattern itself is valid; only the joined one is not


@settings(max_examples=300, deadline=None)
@given(line=st.lists(st.one_of(st.text(max_size=3), st.sampled_from(["ERROR", "nan", "NaN", "OOM", "Killed", "Trace",
                                                                    "CUDA out of memory", " ", "_", "x"])),
                     max_size=12).map("".join))
def test_a_rank_is_the_most_severe_marker_that_matches(line: str) -> None:
    markers = with_alarms(MARKERS)
    expected = max((RANKS[m.severity] for m in markers if re.search(m.pattern, line)), default=0)
    assert Markers(markers).rank(line) == expected  # the needles turn away only lines no marker matches


def test_n_and_N_search_from_the_view_or_from_the_last_landing() -> None:
    buffer = LineBuffer(100)
    buffer.clear(MARKERS)
    buffer.add([f"ERROR {i}" if i in (3, 10, 25, 40) else f"line {i}" for i in range(50)])
    rows = RowLayout(buffer)
    rows.rebuild(80)
    assert rows.next_marker(None, 5, 10, forward=True) == 10  # the first in view (rows 5..14)
    assert rows.next_marker(None, 5, 10, forward=False) == 10  # the last in view
    assert rows.next_marker(10, 5, 10, forward=True) == 25  # after the one landed on, while in view
    assert rows.next_marker(10, 5, 10, forward=False) == 3
    assert rows.next_marker(40, 5, 10, forward=True) == 10  # landed out of view: from the view again
    assert rows.next_marker(40, 0, 50, forward=True) is None
    buffer.set_filter(LineFilter.parse("!ERROR 25"))  # a hidden marker line is skipped
    rows.rebuild(80)
    assert rows.next_marker(10, 0, 49, forward=True) == 40
