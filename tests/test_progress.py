"""Progress of a running stage (issue 15, item 17): parsed from the stage's own log lines, which
the probe returns as hits of one more marker; shown in the stages bar while the stage runs."""

from __future__ import annotations

import math
import socket
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from samai.console.app import SamaiApp
from samai.console.core import config
from samai.console.core.progress import PROGRESS_MARKER, PROGRESS_PATTERN, Progress, latest, parse_line
from samai.console.core.update import StageView
from samai.console.screens.dialogs import ConfirmDialog
from samai.remote.box.markers import Markers, marker_hits
from samai.remote.safe_text import visible
from samai.widgets.logview import LogView
from samai.widgets.stages import stage_item
from tests.helpers import confirm_dialog, pilot_until

FETCH_LINE = "base.bin: 1.0 GiB / 4.0 GiB (25%) 100.0 MiB/s"  # as fetch.py's Progress prints it
TQDM_LINE = " 15%|#5        | 12/80 [00:03<00:17,  4.10it/s]"
STEP_LINE = "$ venv/bin/python -m pip wheel --no-deps --no-cache-dir --progress-bar off -w /c/wheels llama.tar.gz"


# ---------------------------------------------------------------- the parser


def test_a_tqdm_bar_gives_steps_eta_and_rate() -> None:
    p = parse_line(TQDM_LINE)
    assert p == Progress("steps", 12, 80, 4.1, 17.0)
    assert p.text == "12/80 15% · 17s left"


def test_a_line_of_carriage_return_updates_counts_its_last_one() -> None:
    line = ("  0%|          | 0/80 [00:00<?, ?it/s]\r 1%|1 | 1/80 [00:01<01:19,  1.00s/it]"
            "\r 50%|#####| 40/80 [1:00:00<1:00:00, 90.0s/it]")
    p = parse_line(line)
    assert (p.done, p.total, p.eta) == (40, 80, 3600.0) and math.isclose(p.rate, 1 / 90)
    assert parse_line("  0%|          | 0/80 [00:00<?, ?it/s]") == Progress("steps", 0, 80, None, None)


def test_fetch_byte_lines_give_bytes_rate_and_eta() -> None:
    p = parse_line(FETCH_LINE)
    assert (p.kind, p.done, p.total, p.rate, p.label) == ("bytes", 2**30, 4 * 2**30, 100 * 2**20, "base.bin")
    assert math.isclose(p.eta, 3 * 2**30 / (100 * 2**20))
    assert p.text == "base.bin: 1.1 GB/4.3 GB 25% · 104.9 MB/s · 30s left"
    assert parse_line("sha256 base.bin: 512 B / 1.0 KiB (50%) 1.0 KiB/s").label == "sha256 base.bin"


def test_a_build_step_names_the_program_its_subcommand_and_its_target() -> None:
    p = parse_line(STEP_LINE)
    assert p.kind == "step" and p.fraction is None
    assert p.text == "step: python -m pip wheel … llama.tar.gz"
    assert parse_line("$ cmake --build .").text == "step: cmake --build ."


@pytest.mark.parametrize("line", ["", "nothing here", "12/0 [00:01<00:02, 1it/s]", "90/80 [00:01<00:02, 1it/s]",
                                  "x: 1 B / 0 B (0%) 1 B/s", "$ ", "step 5/40  loss 1.512  [chars/s 18210]",
                                  "{'loss': '0.5', 'epoch': '1.25'}", "echo $ HOME"])
def test_lines_that_tell_no_progress(line: str) -> None:
    assert parse_line(line) is None


def test_the_newest_progress_of_several_lines() -> None:
    assert latest([FETCH_LINE, "noise", TQDM_LINE, "more noise"]).kind == "steps"
    assert latest(["noise"]) is None


# ---------------------------------------------------------------- the probe finds the lines


def test_the_probe_returns_progress_lines_as_hits_and_keeps_its_fast_scan() -> None:
    markers = Markers([PROGRESS_MARKER.request(), config.CHAIN_DONE.request()])
    assert not markers.every_line and markers.needles  # the memchr path, not a regex on every line
    data = "\n".join(["noise", TQDM_LINE + "\r" + TQDM_LINE, FETCH_LINE, STEP_LINE, "CHAIN_DONE rc=0", ""]).encode()
    hits = [h["line"] for h in marker_hits(data, 0, markers) if h["marker"] == PROGRESS_MARKER.name]
    assert [parse_line(h).kind for h in hits] == ["steps", "bytes", "step"]
    assert PROGRESS_PATTERN == PROGRESS_MARKER.pattern


# ---------------------------------------------------------------- any line: no crash, no markup

SIZES = st.sampled_from(["B", "KiB", "MiB", "GiB", "KB", "GB", "TB"])
NUMBERS = st.one_of(st.integers(0, 10**16).map(str), st.floats(0, 1e9, allow_nan=False).map(lambda f: f"{f:.1f}"))
SHAPED = st.one_of(
    st.builds("{}/{} [{}<{}, {}it/s]".format, NUMBERS, NUMBERS, st.text("0123456789:", max_size=9),
              st.text("0123456789:?", max_size=9), st.one_of(NUMBERS, st.just("?"))),
    st.builds("{}: {} {} / {} {} ({}%) {} {}/s".format, st.text(max_size=30), NUMBERS, SIZES, NUMBERS, SIZES,
              NUMBERS, NUMBERS, SIZES),
    st.builds("$ {}".format, st.text(max_size=200)),
)


@pytest.mark.slow
@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.text(max_size=400), SHAPED, st.lists(SHAPED, max_size=4).map("\r".join)))
def test_any_line_parses_without_a_crash_and_shows_literally(line: str) -> None:
    p = parse_line(line)
    if p is None:
        return
    assert p.kind in ("steps", "bytes", "step")
    assert p.fraction is None or 0.0 <= p.fraction <= 1.0
    assert p.eta is None or p.eta >= 0
    text = p.text
    assert isinstance(text, str)
    view = StageView("train", "3", "running", 1.0, 1, None, None, progress=p)
    shown = stage_item(view, 2.0).plain
    assert visible(text) in shown  # the box's words as they are (control characters as stand-ins), never markup
    assert not any((ord(c) < 32 and c != "\t") or 0x7F <= ord(c) < 0xA0 for c in shown)  # tabs are kept


def test_garbage_that_is_not_a_string_is_no_progress() -> None:
    assert parse_line(None) is None  # type: ignore[arg-type]


# ---------------------------------------------------------------- through the console

HEAD = """
pipeline = "progress"
[target]
poll_interval = 0.2
timeout = 5.0
python = "{python}"
[workspace]
path = "{ws}"
[stages.fetch]
key = "2"
command = "sh fetch.sh"
markers = [{{ name = "FETCH_DONE" }}]
"""

SCRIPT = f"""
echo '{FETCH_LINE}'
while [ ! -e next ]; do sleep 0.1; done
echo '{TQDM_LINE}'
while [ ! -e last ]; do sleep 0.1; done
echo 'FETCH_DONE'
"""


def _bar(app: SamaiApp) -> str:
    return str(app.box_screen.query_one("#stages").render())


@pytest.mark.slow
async def test_the_stages_bar_shows_a_running_stages_progress_and_drops_it_when_done(tmp_path: Path,
                                                                                       workspace: Path) -> None:
    (workspace / "fetch.sh").write_text(SCRIPT)
    cfg_file = tmp_path / "progress.toml"
    cfg_file.write_text(HEAD.format(ws=workspace, python=sys.executable))
    app = SamaiApp(config.load(cfg_file))
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot_until(pilot, lambda: app.state.snapshot)
        await pilot.press("2")
        await pilot_until(pilot, lambda: isinstance(app.screen, ConfirmDialog) and app.focused)
        await confirm_dialog(pilot)
        await pilot_until(pilot, lambda: "base.bin: 1.1 GB/4.3 GB 25%" in _bar(app))
        (workspace / "next").touch()
        await pilot_until(pilot, lambda: "12/80 15% · 17s left" in _bar(app))
        assert "base.bin" not in _bar(app)  # the newest reading only
        log = app.box_screen.query_one(LogView)  # the shown stage's log pane says it too
        await pilot_until(pilot, lambda: str(log.border_title).startswith("log · fetch · 12/80 15%"))
        assert not any("12/80" in a.text for a in app.state.alerts)  # progress is neither an alert
        (workspace / "last").touch()
        await pilot_until(pilot, lambda: "✓ done" in _bar(app) and "CHAIN_DONE rc=0" in _bar(app))
        assert "12/80" not in _bar(app)  # a stage that is not running shows none, and progress is no marker
        await pilot_until(pilot, lambda: str(log.border_title) == "log · fetch")


STEPS = """
pipeline = "steps"
[target]
poll_interval = 0.2
timeout = 5.0
python = "{python}"
[workspace]
path = "{ws}"
[stages.convert]
key = "5"
command = "sh convert.sh"
markers = [{{ name = "CONVERTING" }}]
[stages.serve]
key = "7"
command = "sh serve.sh"
ports = [{port}]
markers = [{{ name = "SERVING" }}]
"""


@pytest.mark.slow
async def test_a_build_step_is_shown_but_a_servers_own_command_line_is_not(tmp_path: Path, workspace: Path) -> None:
    (workspace / "convert.sh").write_text("echo '$ venv/bin/python convert_hf_to_gguf.py merged --outfile f16.gguf'\n"
                                          "echo CONVERTING\nsleep 30\n")
    (workspace / "serve.sh").write_text("echo '$ venv/bin/llama-server -m q.gguf --port 1'\necho SERVING\nsleep 30\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg_file = tmp_path / "steps.toml"
    cfg_file.write_text(STEPS.format(ws=workspace, python=sys.executable, port=port))
    app = SamaiApp(config.load(cfg_file))
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot_until(pilot, lambda: app.state.snapshot)
        for key in ("5", "7"):
            await pilot_until(pilot, lambda: not app.busy)
            await pilot.press(key)
            await pilot_until(pilot, lambda: isinstance(app.screen, ConfirmDialog) and app.focused)
            await confirm_dialog(pilot)
            await pilot_until(pilot, lambda: not isinstance(app.screen, ConfirmDialog) and not app.busy)
        await pilot_until(pilot, lambda: "CONVERTING" in _bar(app) and "SERVING" in _bar(app))
        assert "step: python convert_hf_to_gguf.py merged --outfile f16.gguf" in _bar(app)
        assert "llama-server" not in _bar(app)


def test_the_train_stages_own_progress_line_reads_as_steps_and_time_left() -> None:
    """The tiny pipeline's train stage turns the Trainer's bar off (its carriage returns would
    fill the log) and writes one tqdm-style line per logged step instead."""
    from samai.remote.box.stages import train

    for done, total, elapsed, left in ((12, 80, 3.0, 17), (1, 5000, 4000.0, 4000 * 4999), (0, 80, 0.0, None)):
        found = parse_line(train.progress_line(done, total, elapsed))
        assert found is not None and (found.done, found.total) == (done, total), train.progress_line(done, total,
                                                                                                       elapsed)
        assert found.eta == left
