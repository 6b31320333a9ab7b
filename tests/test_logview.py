"""The log pane, driven through Pilot: follow and pause, filter, markers, wrap, bounds, safety."""

from __future__ import annotations

import math

import pytest
from rich.cells import cell_len
from textual import events
from textual.app import App, ComposeResult

from samai.remote.model import Marker
from samai.widgets.logview import LogFilterInput, LogView
from tests.helpers import pilot_until

SIZE = (100, 30)
MARKERS = (Marker("oom", r"ERROR", "error"), Marker("slow", r"WARN", "warning"),
           Marker("ckpt", r"saved checkpoint", "info"))


class HostApp(App):
    """One LogView, focused; the messages it posts are kept for the test to read."""

    def __init__(self, max_lines: int = 20_000) -> None:
        super().__init__()
        self.max_lines = max_lines
        self.saved: list[tuple[str, ...]] = []
        self.follow_changes: list[bool] = []

    def compose(self) -> ComposeResult:
        yield LogView(max_lines=self.max_lines, id="log")

    def on_mount(self) -> None:
        self.query_one(LogView).focus()

    def on_log_view_save_requested(self, message: LogView.SaveRequested) -> None:
        self.saved.append(message.lines)

    def on_log_view_follow_changed(self, message: LogView.FollowChanged) -> None:
        self.follow_changes.append(message.following)


def numbered(count: int, start: int = 0) -> list[str]:
    return [f"line {i:05d}" for i in range(start, start + count)]


def height(view: LogView) -> int:
    return view.scrollable_content_region.height


def rows(view: LogView) -> list[str]:
    """What the pane shows now, row by row, right-trimmed."""
    return [view.render_line(y).text.rstrip() for y in range(height(view))]


def shown(view: LogView) -> list[str]:
    return [row for row in rows(view) if row]


async def fill(pilot, view: LogView, lines: list[str]) -> None:
    view.append(lines)
    view.flush_now()
    await pilot.pause()


async def settle(pilot) -> None:
    await pilot.wait_for_scheduled_animations()
    await pilot.pause()


# ------------------------------------------------------------ follow


async def test_follow_then_scroll_up_pauses_counts_and_f_resumes() -> None:
    app = HostApp()
    async with app.run_test(size=SIZE) as pilot:
        view = app.query_one(LogView)
        view.reset("train.log", MARKERS)
        await fill(pilot, view, numbered(200))
        assert view.following
        assert rows(view)[-1] == "line 00199"
        assert view.border_subtitle == "FOLLOW"

        await pilot.press("up")
        await settle(pilot)
        assert not view.following
        top = view.top_line
        assert rows(view)[-1] == "line 00198"

        await fill(pilot, view, numbered(1234, start=200))
        assert view.new_since_pause == 1234
        assert "PAUSED · 1,234 new · f to follow" in view.border_subtitle
        assert view.top_line == top  # the reader's place stays put
        assert rows(view)[-1] == "line 00198"

        await pilot.press("f")
        await settle(pilot)
        assert view.following
        assert rows(view)[-1] == "line 01433"
        assert view.border_subtitle == "FOLLOW"
        assert app.follow_changes == [False, True]


@pytest.mark.slow
async def test_pageup_and_scroll_up_pause_and_reaching_the_bottom_resumes() -> None:
    app = HostApp()
    async with app.run_test(size=SIZE) as pilot:
        view = app.query_one(LogView)
        await fill(pilot, view, numbered(300))
        await pilot.press("pageup")
        await settle(pilot)
        assert not view.following
        assert rows(view)[-1] < "line 00299"

        await pilot.press("end")
        await settle(pilot)
        assert view.following

        view.scroll_up(animate=False)
        await settle(pilot)
        assert not view.following
        await pilot.press("down")  # one row down is the bottom again
        await settle(pilot)
        assert view.following

        view.post_message(events.MouseScrollUp(view, 5, 5, 0, -1, 0, False, False, False))
        await settle(pilot)
        assert not view.following
        assert app.follow_changes == [False, True, False, True, False]
        await pilot.press("G")
        await fill(pilot, view, numbered(5, start=300))
        assert rows(view)[-1] == "line 00304"


@pytest.mark.slow
async def test_lines_arrive_through_the_flush_timer() -> None:
    app = HostApp()
    async with app.run_test(size=SIZE) as pilot:
        view = app.query_one(LogView)
        for n in range(50):
            view.append([f"burst {n}"])
        assert len(view.lines) == 0  # append only buffers
        await pilot_until(pilot, lambda: len(view.lines) == 50)
        assert rows(view)[-1] == "burst 49"
        await pilot.pause(0.3)  # not a wait for anything: the quiet spell the next append comes after
        view.append(["after a quiet spell"])  # flushed on the next loop pass, not 100 ms later
        await pilot.pause()
        assert rows(view)[-1] == "after a quiet spell"
        view.append(["x"])
        view.append(["y"])  # within 100 ms of the last flush: the timer takes it
        await pilot_until(pilot, lambda: rows(view)[-2:] == ["x", "y"])


# ------------------------------------------------------------ filter


def mixed(count: int) -> list[str]:
    return [f"step {i} loss=NaN" if i % 10 == 3 else f"step {i} loss=0.{i:03d}" for i in range(count)]


@pytest.mark.slow
async def test_filter_shows_only_matching_lines_and_highlights_them() -> None:
    app = HostApp()
    async with app.run_test(size=SIZE) as pilot:
        view = app.query_one(LogView)
        await fill(pilot, view, mixed(100))
        await pilot.press("slash")
        assert isinstance(app.focused, LogFilterInput)
        await pilot.press(*"nan", "enter")  # lowercase: case-insensitive
        await pilot.pause()
        assert app.focused is view
        assert shown(view) == [f"step {i} loss=NaN" for i in range(3, 100, 10)]
        assert "/nan/ 10 of 100" in view.border_subtitle

        strip = view.render_line(0)
        plain = strip.text.rstrip()
        match = [seg for seg in strip if seg.text == "NaN"]
        assert match, "the match is a segment of its own"
        other = next(seg for seg in strip if seg.text.startswith("step"))
        assert match[0].style.bgcolor != other.style.bgcolor
        assert plain == "step 3 loss=NaN"

        view.set_filter("nan$|NAN")  # a capital: case-sensitive, so only the first branch...
        await pilot.pause()
        assert shown(view) == []  # ...which cannot match "NaN" either


@pytest.mark.slow
async def test_leading_bang_inverts_the_filter() -> None:
    app = HostApp()
    async with app.run_test(size=SIZE) as pilot:
        view = app.query_one(LogView)
        await fill(pilot, view, mixed(20))
        await pilot.press("slash", *"!nan", "enter")
        await pilot.pause()
        assert shown(view) == [line for line in mixed(20) if "NaN" not in line]


@pytest.mark.slow
async def test_filter_survives_wrap_new_lines_and_reset() -> None:
    app = HostApp()
    async with app.run_test(size=SIZE) as pilot:
        view = app.query_one(LogView)
        await fill(pilot, view, mixed(50))
        await pilot.press("slash", *"nan", "enter", "w")
        await pilot.pause()
        assert view.wrap and view.filter_text == "nan"
        view.notice("— file truncated —")  # system lines pass any filter
        await fill(pilot, view, ["step 50 fine", "step 51 loss=nan " + "z" * 150, "step 52 fine"])
        assert view.filter_text == "nan"
        width = view.scrollable_content_region.width
        long_match = "step 51 loss=nan " + "z" * 150
        assert shown(view) == [f"step {i} loss=NaN" for i in range(3, 50, 10)] + [
            "— file truncated —", long_match[:width], long_match[width:]]  # new match: 2 rows

        view.reset("next.log", MARKERS)
        await fill(pilot, view, ["a", "b nan", "c"])
        assert view.filter_text == "nan"
        assert shown(view) == ["b nan"]


@pytest.mark.slow
async def test_invalid_regex_keeps_the_previous_filter_and_says_why() -> None:
    app = HostApp()
    async with app.run_test(size=SIZE) as pilot:
        view = app.query_one(LogView)
        await fill(pilot, view, mixed(30))
        await pilot.press("slash", *"nan", "enter")
        await pilot.pause()
        before = shown(view)

        await pilot.press("slash", "ctrl+u", *"(oops", "enter")
        await pilot.pause()
        prompt = view.query_one(LogFilterInput)
        assert prompt.has_class("-open") and app.focused is prompt
        assert "invalid regex" in prompt.border_subtitle
        assert "missing )" in prompt.border_subtitle
        assert view.filter_text == "nan"
        assert shown(view) == before

        await pilot.press("escape")  # cancel the edit: the filter stays
        await pilot.pause()
        assert not prompt.has_class("-open") and app.focused is view
        assert view.filter_text == "nan"

        await pilot.press("escape")  # on the pane: an explicit clear
        await pilot.pause()
        assert view.filter_text is None
        assert len(shown(view)) == min(30, height(view))


# ------------------------------------------------------------ markers


def with_markers(count: int, errors: set[int], warnings: set[int] = frozenset()) -> list[str]:
    return [f"line {i:05d} ERROR oom" if i in errors else f"line {i:05d} WARN slow" if i in warnings
            else f"line {i:05d}" for i in range(count)]


def cursor_row_text(view: LogView) -> str:
    """The text of the cursor's line as rendered, asserting that it is on screen."""
    row = view.row_of_line(view.cursor_line)
    top = view.scroll_offset.y
    assert top <= row < top + height(view), "the marker line is scrolled into view"
    return view.render_line(row - top).text.rstrip()


@pytest.mark.slow
async def test_n_and_N_land_on_marker_lines_and_pause_follow() -> None:
    app = HostApp()
    async with app.run_test(size=SIZE) as pilot:
        view = app.query_one(LogView)
        view.reset("train.log", MARKERS)
        await fill(pilot, view, with_markers(300, errors={20, 120, 250}, warnings={200}))

        await pilot.press("N")
        await pilot.pause()
        assert not view.following
        assert view.cursor_line == 250
        assert cursor_row_text(view) == "line 00250 ERROR oom"
        for expected in (200, 120, 20):
            await pilot.press("N")
            await pilot.pause()
            assert view.cursor_line == expected
            assert cursor_row_text(view).startswith(f"line {expected:05d}")
        await pilot.press("N")  # none before the first: stays, rings the bell
        await pilot.pause()
        assert view.cursor_line == 20
        await pilot.press("n", "n")
        await pilot.pause()
        assert view.cursor_line == 200
        assert cursor_row_text(view) == "line 00200 WARN slow"

        # Severity colours: error, warning and plain lines differ.
        error = next(iter(view.render_line(view.row_of_line(250) - view.scroll_offset.y)))
        plain = next(iter(view.render_line(view.row_of_line(199) - view.scroll_offset.y)))
        warning = next(iter(view.render_line(view.row_of_line(200) - view.scroll_offset.y)))
        assert len({error.style.color, warning.style.color, plain.style.color}) == 3

        # Among shown lines only: with errors filtered out, n finds the warning.
        view.set_filter("!ERROR")
        await pilot.press("g", "n")
        await pilot.pause()
        assert view.cursor_line == 200


@pytest.mark.slow
async def test_max_lines_bounds_memory_and_markers_still_work() -> None:
    app = HostApp(max_lines=100)
    async with app.run_test(size=SIZE) as pilot:
        view = app.query_one(LogView)
        view.reset("big.log", MARKERS)
        errors = {i for i in range(1000) if i % 37 == 0}
        everything = with_markers(1000, errors)
        for start in range(0, 1000, 90):
            await fill(pilot, view, everything[start:start + 90])
        assert len(view.lines) == 100
        assert view.lines[0] == everything[900] and view.first_line_number == 900
        assert view.marker_lines == [i - 900 for i in sorted(errors) if i >= 900]  # old ones gone
        assert rows(view)[-1] == everything[999]

        kept_errors = sorted(i for i in errors if i >= 900)  # 925, 962, 999
        landed = []
        for _ in range(len(kept_errors) + 1):
            await pilot.press("N")
            await pilot.pause()
            landed.append(view.first_line_number + view.cursor_line)
        assert landed == sorted(kept_errors, reverse=True) + [kept_errors[0]]
        assert cursor_row_text(view) == everything[kept_errors[0]]

        # Paused, more lines push old ones out: the line being read stays where it was.
        await pilot.press("G", "up")
        await settle(pilot)
        assert not view.following
        top_text = rows(view)[0]
        await fill(pilot, view, with_markers(1040, errors={1030})[1000:])
        assert view.lines[0] == everything[940]
        assert rows(view)[0] == top_text
        for expected in ("line 00999 ERROR oom", "line 01030 ERROR oom"):
            await pilot.press("n")
            await pilot.pause()
            assert view.lines[view.cursor_line] == expected
            assert cursor_row_text(view) == expected

        # A filter keeps its indices correct as lines are dropped under it.
        view.set_filter("ERROR")
        await fill(pilot, view, with_markers(1100, errors={1050, 1090})[1040:])
        assert view.shown_lines == ("line 01030 ERROR oom", "line 01050 ERROR oom", "line 01090 ERROR oom")
        assert view.lines[0] == "line 01000"

        # A flood bigger than max_lines in one flush keeps only the newest lines.
        view.set_filter(None)
        await fill(pilot, view, numbered(250, start=2000))
        assert list(view.lines) == numbered(100, start=2150)
        assert view.first_line_number == 1100 + 150


# ------------------------------------------------------------ text safety, wrap, save


@pytest.mark.slow
async def test_markup_and_control_characters_render_literally() -> None:
    app = HostApp()
    async with app.run_test(size=SIZE) as pilot:
        view = app.query_one(LogView)
        view.reset("[bold]weird[/].log", MARKERS)
        tricky = ["[bold]x[/]", "[red", "\x1b[31mred\x1b[0m", "a\tb", "nul\x00end", "bad \ufffd byte",
                  "[link=http://x]y[/link] ERROR", "50% done\r75% done\r100% done", "\\[escaped]"]
        view.notice("— file truncated; reading from its start —")
        await fill(pilot, view, tricky)
        assert rows(view)[:10] == [
            "— file truncated; reading from its start —",
            "[bold]x[/]",
            "[red",
            "\u241b[31mred\u241b[0m",
            "a       b",
            "nul\u2400end",
            "bad \ufffd byte",
            "[link=http://x]y[/link] ERROR",
            "100% done",
            "\\[escaped]",
        ]
        assert list(view.lines)[1:] == tricky  # kept as given
        await pilot.press("slash", *"[red", "enter")  # an invalid regex typed literally
        await pilot.pause()
        assert view.filter_text is None
        view.set_filter(r"\[red")
        await pilot.pause()
        assert shown(view) == ["— file truncated; reading from its start —", "[red"]


@pytest.mark.slow
async def test_ctrl_s_posts_the_filtered_lines() -> None:
    app = HostApp()
    async with app.run_test(size=SIZE) as pilot:
        view = app.query_one(LogView)
        await fill(pilot, view, mixed(40) + ["tab\tnan"])
        await pilot.press("slash", *"nan", "enter", "ctrl+s")
        await pilot.pause()
        assert app.saved == [tuple(line for line in mixed(40) if "NaN" in line) + ("tab\tnan",)]


@pytest.mark.slow
async def test_a_million_character_line_scrolls_and_wraps() -> None:
    app = HostApp()
    async with app.run_test(size=SIZE) as pilot:
        view = app.query_one(LogView)
        huge = "x" * 1_000_000 + "END"
        await fill(pilot, view, ["before", huge, "after"])
        width = view.scrollable_content_region.width
        assert rows(view)[1] == "x" * width
        assert view.virtual_size.width == len(huge)

        await pilot.press("w")
        await pilot.pause()
        expected_rows = math.ceil(len(huge) / width)
        assert view.virtual_size.height == expected_rows + 2
        assert rows(view)[-1] == "after"  # following: the end is in view
        tail = rows(view)[-2]
        assert tail.endswith("END") and set(tail[:-3]) == {"x"}
        assert len(tail) == len(huge) - (expected_rows - 1) * width

        await pilot.press("g")
        await pilot.pause()
        assert rows(view)[:3] == ["before", "x" * width, "x" * width]

        await pilot.press("w")  # and back, at the top still
        await pilot.pause()
        assert rows(view)[:3] == ["before", "x" * width, "after"]


async def test_wrap_never_splits_wide_characters() -> None:
    app = HostApp()
    async with app.run_test(size=(99, 30)) as pilot:  # an odd width: wide rows lose a cell
        view = app.query_one(LogView)
        width = view.scrollable_content_region.width
        assert width % 2 == 1
        wide = ("日本語のログ" * 40)[:236]
        digits = "".join(str(i % 10) for i in range(250))
        await fill(pilot, view, [wide, digits])
        await pilot.press("w")
        await pilot.pause()
        got = shown(view)
        per_row = width // 2  # two cells each: a row holds one character less than width / 2
        assert got[:-3] == [wide[i:i + per_row] for i in range(0, len(wide), per_row)]
        assert len(got) - 3 == math.ceil(len(wide) / per_row) > math.ceil(cell_len(wide) / width)
        assert got[-3:] == [digits[:width], digits[width:2 * width], digits[2 * width:]]
        assert view.virtual_size.height == len(got)


async def test_bindings_have_ids_and_follow_the_keymap() -> None:
    ids = {binding.id for binding in LogView.BINDINGS}
    assert {"log.follow", "log.filter", "log.next_marker", "log.prev_marker", "log.wrap",
            "log.save", "log.top", "log.bottom"} <= ids
    app = HostApp()
    async with app.run_test(size=SIZE) as pilot:
        app.set_keymap({"log.follow": "F"})
        view = app.query_one(LogView)
        await fill(pilot, view, numbered(100))
        await pilot.press("g")
        await pilot.pause()
        assert not view.following and "F to follow" in view.border_subtitle
        await pilot.press("f")
        await pilot.pause()
        assert not view.following
        await pilot.press("F")
        await pilot.pause()
        assert view.following and rows(view)[-1] == "line 00099"
