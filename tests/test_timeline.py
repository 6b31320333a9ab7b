"""The timeline (console/core/timeline.py, `samai-console timeline`): every stage's runs from its
logs with their markers and ends, the operator's stops and the audit log's actions, merged in
time order; box text kept literal; what is not an event left out."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from samai.console.app import SamaiApp
from samai.console.core import config
from samai.console.core.timeline import audit_events, header_time, merged, run_events
from samai.console.core.training.history import Mark, RunHistory, RunRecord
from samai.console.screens.dialogs import TimelineScreen
from samai.remote.boxapi import Box
from samai.remote.model import Marker
from samai.widgets.logview import LogView
from tests import chainlog
from tests.helpers import pilot_until, run_cli, wait_for
from tests.replay_transport import ReplayTransport

HOSTILE = "\x1b]0;pwned\x07[b]x[/b]"


def test_a_run_s_events_take_their_times_from_its_header_and_its_file() -> None:
    history = RunHistory([Marker("TRAIN_DONE", "TRAIN_DONE", "info"), Marker("NAN", "nan", "error")])
    history.start_file("logs/train.log.1")
    history.feed([chainlog.header("train", 7, "2026-12-03T10:00:00Z"), chainlog.chain("SAMAI_DISK start used=1", 7),
                  "step 1", "loss nan", "TRAIN_DONE", chainlog.chain("SAMAI_DEATH nan_guard: stopped at step 3", 7),
                  chainlog.chain("SAMAI_DISK end used=2", 7), chainlog.chain("CHAIN_DONE rc=3", 7)])
    history.end_file(mtime=1796292000.0 + 600)
    [run] = history.runs()
    events = run_events("train", [run])
    start = header_time("2026-12-03T10:00:00Z")
    assert [(e.kind, e.time, e.approx) for e in events] == [  # the markers by their place among the 7 lines
        ("started", start, False), ("disk", start, False), ("marker", pytest.approx(start + 600 * 3 / 7), True),
        ("marker", pytest.approx(start + 600 * 4 / 7), True), ("disk", start + 600, False),
        ("died", start + 600, False)]
    assert events[2].line == 4 and events[2].severity == "error" and events[2].until == start + 600
    assert events[-1].text == "train ended rc=3: nan_guard: stopped at step 3"


def test_a_running_run_has_no_end_and_garbage_headers_no_time() -> None:
    running = RunRecord(1, "2026-12-03T10:00:00Z", 7, None, 3, marks=(Mark(2, "X", "info", "x"),))
    assert [e.kind for e in run_events("s", [running])] == ["started", "marker"]
    assert header_time("yesterday") is None and run_events("s", [RunRecord(1, "?", None, 0, 1)]) == []


def test_the_audit_log_s_outcomes_and_nothing_else(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    log.write_text("\n".join([
        json.dumps({"id": "1", "phase": "intent", "time": 10.0, "action": "fire", "subject": "train"}),
        json.dumps({"id": "1", "phase": "outcome", "time": 11.0, "action": "fire", "subject": "train",
                    "user": "op", "result": "ok"}),
        '{"torn": ', "[]", json.dumps({"phase": "outcome", "time": "soon"}),
        json.dumps({"id": "2", "phase": "outcome", "time": 12.0, "action": "stop", "subject": HOSTILE,
                    "result": "error"})]) + "\n")
    events = audit_events(log)
    assert [(e.time, e.kind, e.text) for e in events] == [(10.0, "fire", "fire train by op: ok"),  # its intent's
                                                           (12.0, "stop", f"stop {HOSTILE}: error")]
    assert events[1].severity == "error" and audit_events(tmp_path / "none.jsonl") == []


@given(st.lists(st.text(max_size=60) | st.sampled_from(["=== samai chain s: pid 1 started 2026-12-03T10:00:00Z",
                                                        "CHAIN_DONE rc=0", "SAMAI_DISK end x", "MARK"]),
                max_size=40), st.floats(0, 2e9) | st.none())
@settings(max_examples=200, deadline=None)
def test_any_log_gives_events_in_order(lines: list[str], mtime: float | None) -> None:
    history = RunHistory([Marker("MARK", "MARK", "warning")])
    history.start_file("l")
    history.feed(lines)
    history.end_file(mtime)
    events = merged(run_events("s", history.runs()))
    assert [e.time for e in events] == sorted(e.time for e in events)
    json.dumps([e.to_json() for e in events])


def _config(tmp_path: Path, workspace: Path) -> Path:
    f = tmp_path / "t.toml"
    prep = json.dumps("printf 'PREP_DONE \\033]0;x\\007[b]y\\n'")  # box text with a terminal escape
    f.write_text(f'[workspace]\npath = "{workspace}"\n'
                 f'[stages.prep]\nkey = "p"\ncommand = {prep}\n'
                 'markers = [{ name = "PREP_DONE" }]\n'
                 '[stages.job]\nkey = "j"\ncommand = "echo JOB_UP; sleep 60"\nmarkers = [{ name = "JOB_UP" }]\n')
    return f


def test_the_command_on_stages_fired_and_stopped_through_the_action_layer(tmp_path: Path, workspace: Path) -> None:
    cfg = _config(tmp_path, workspace)
    assert run_cli("--config", str(cfg), "fire", "prep", "--yes").returncode == 0
    wait_for(lambda: "CHAIN_DONE" in (workspace / "logs" / "prep.log").read_text(), timeout=30)
    time.sleep(1.1)  # run headers have whole seconds: the next run starts in a later one
    assert run_cli("--config", str(cfg), "fire", "job", "--yes").returncode == 0
    wait_for(lambda: "JOB_UP" in (workspace / "logs" / "job.log").read_text(), timeout=30)
    assert run_cli("--config", str(cfg), "stop", "job", "--yes").returncode == 0
    r = run_cli("--config", str(cfg), "timeline", "--json")
    assert r.returncode == 0, r.stderr
    events = json.loads(r.stdout)["events"]
    said = [(e["source"], e["kind"], e["stage"]) for e in events]
    order = [said.index(e) for e in [("log", "started", "prep"), ("log", "marker", "prep"), ("log", "ended", "prep"),
                                     ("log", "started", "job"), ("log", "marker", "job")]]
    assert order == sorted(order), said
    assert ("record", "stopped", "job") in said and ("log", "died", "job") in said
    audit = [e for e in events if e["source"] == "audit"]
    assert [e["kind"] for e in audit] == ["fire", "fire", "stop"], audit
    assert said.index(("audit", "stop", "")) > said.index(("log", "started", "job"))
    assert [e["time"] for e in events] == sorted(e["time"] for e in events)
    text = run_cli("--config", str(cfg), "timeline").stdout
    assert "prep ended rc=0" in text and "\x1b" not in text and "\x07" not in text
    assert run_cli("--config", str(cfg), "timeline", "--since", "1h", "--json").returncode == 0
    bad = run_cli("--config", str(cfg), "timeline", "--since", "soon")
    assert bad.returncode == 2 and "--since" in bad.stderr


async def test_t_shows_the_timeline_filters_it_and_enter_opens_the_row_s_log(recorded_box: ReplayTransport) -> None:
    """The recorded box: its running train stage's log (a header of 2026-11-30 05:31:10, a hidden
    NaN's line) and the alerts the console raised on it."""
    tiny = config.load_builtin("tiny")
    cfg = replace(tiny, workspace=recorded_box.workspace, target=replace(tiny.target, poll_interval=0.05))
    app = SamaiApp(cfg, open_box=lambda _cfg: Box(recorded_box, recorded_box.workspace))
    async with app.run_test(size=(150, 48)) as pilot:
        await pilot_until(pilot, lambda: app.state.active_alerts())
        await pilot.press("T")
        screen = await pilot_until(pilot, lambda: isinstance(app.screen, TimelineScreen) and app.screen)
        kinds = {(e.source, e.kind, e.stage) for e in screen.events}
        assert ("log", "started", "train") in kinds and ("alert", "raised", "train") in kinds, kinds
        assert [e.time for e in screen.events] == sorted(e.time for e in screen.events)
        await pilot.press("slash", *"started")
        await pilot_until(pilot, lambda: screen.shown and all("started" in e.kind for e in screen.shown))
        await pilot.press("enter", "enter")  # the filter closed, then the row opened
        log = app.box_screen.query_one(LogView)
        await pilot_until(pilot, lambda: not isinstance(app.screen, TimelineScreen))
        await pilot_until(pilot, lambda: "train.log" in str(log.border_title))


async def test_a_line_is_found_by_its_raw_line_breaks(box: Box, workspace: Path, monkeypatch) -> None:
    import samai.console.core.timeline as timeline

    monkeypatch.setattr(timeline, "SCAN_READ", 64)  # many reads, a line break across their edges
    lines = [f"line {i} \xff\xfe".encode("latin-1") + b"\x00" * (i % 7) for i in range(1, 301)]
    log = workspace / "big.log"
    log.write_bytes(b"\n".join(lines) + b"\n")
    offset, index = await timeline.line_start(box, str(log), 150)
    assert log.read_bytes()[offset:].split(b"\n")[index].startswith(b"line 150 ")
    assert index == timeline.LINES_BEFORE and await timeline.line_start(box, str(log), 5) == (0, 4)
    assert await timeline.line_start(box, str(log), 9999) == (0, 9998)  # past its end: from its start


async def test_enter_on_a_marker_row_opens_its_log_at_its_line(recorded_box: ReplayTransport) -> None:
    recorded_box.write_log("logs/train.log.1", "\n".join(
        ["=== samai chain train: pid 7 started 2026-11-30T04:00:00Z"] + [f"step {i}" for i in range(1, 400)]
        + ["TRAIN_DONE adapter saved", "step 400", "CHAIN_DONE rc=0"]) + "\n")
    tiny = config.load_builtin("tiny")
    cfg = replace(tiny, workspace=recorded_box.workspace, target=replace(tiny.target, poll_interval=0.05))
    app = SamaiApp(cfg, open_box=lambda _cfg: Box(recorded_box, recorded_box.workspace))
    async with app.run_test(size=(150, 48)) as pilot:
        await pilot_until(pilot, lambda: app.state.snapshot is not None)
        await pilot.press("T")
        screen = await pilot_until(pilot, lambda: isinstance(app.screen, TimelineScreen) and app.screen)
        await pilot.press("slash", *"TRAIN_DONE", "enter")
        await pilot_until(pilot, lambda: [e.line for e in screen.shown] == [401])
        await pilot.press("enter")
        log = app.box_screen.query_one(LogView)
        await pilot_until(pilot, lambda: log.cursor_line is not None)
        assert log.lines[log.cursor_line] == "TRAIN_DONE adapter saved" and not log.following
