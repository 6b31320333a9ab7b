"""Nothing read from the box can end or stall the poll: a file that cannot be read is that file's
finding, and the rest of the snapshot is shown.

Every parser on the poll's path is fed what anyone on the box can write: the probe's own readers
(stage records, stop notes, rc files, eval summaries, logs), the console's folding of a snapshot
(eval summaries, Trainer lines, progress and disk lines, marker hits) and the panes that show it;
through the real probe, and in the TUI with the real probe behind it."""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import fields, is_dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from samai.console.app import SamaiApp
from samai.console.core import config
from samai.console.core.evals.feed import EvalRuns
from samai.console.core.evals.runs import NotASummary, eval_run
from samai.console.core.state import ConsoleState
from samai.remote.boxapi import Box, BoxError
from samai.remote.local import LocalTransport
from samai.remote.model import LogChunk, Snapshot, checked_cursor
from samai.widgets.disk import BAR_WIDTH, usage_bar
from samai.widgets.evals import EvalTable
from samai.widgets.logview import LogView
from tests import factories
from tests.helpers import pilot_until
from tests.replay_transport import ReplayTransport

FUZZ = settings(max_examples=60, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# What a file on the box may hold where a summary, a record or a Trainer line is expected.
HOSTILE_JSON = ['{"n": 1e400}', "[" * 100_000, '{"n": ' + "9" * 5000 + "}", '{"n": 5, "accuracy": NaN}',
                '{"n": 5, "accuracy": 1e400}', '{"n": -1e400}', '{"n": true, "accuracy": "x"}',
                '{"n": 5, "empty_content": 1e300}', "{" * 50_000 + "}" * 50_000, '{"n": 3, "accuracy": -Infinity}',
                '{"n": 2.5}', '{"n": [1]}', "null", "", "\x00\udcff", '{"n": 4, "accuracy": 0.5}']
HOSTILE_LINES = ["{'loss': 1e400, 'grad_norm': nan}", "{'loss': '" + "9" * 5000 + "'}", "{" * 100_000,
                 "{'loss': Infinity, 'learning_rate': -Infinity, 'epoch': 1e400}",
                 "SAMAI_DISK start used=" + "9" * 19 + " avail=" + "9" * 19 + " size=" + "9" * 19,
                 "SAMAI_DISK end used=1 avail=1 size=0",
                 "99999999999999/999999999999999 [999999999:99:99<?, 1e400it/s]",
                 "x: 999999999999999.999999 PiB / 0 B (100%) 999999999999999 PiB/s", "$ " + "x" * 100_000,
                 "\x1b]0;pwn\x07 \u202e\u2066 \x85", "Traceback " * 10_000,
                 "{'loss': 0.5, 'grad_norm': 1e400, 'learning_rate': 1e-400, 'epoch': 1, 'step': 1e400}",
                 "{'eval_loss': 1e400}", "{'loss': tensor(1e400)}", "{'loss': '1.0', 'step': '" + "1" * 5000 + "'}",
                 "[rank0]: Watchdog caught collective operation timeout", "CUDA out of memory. " * 1000]
HOSTILE_BYTES = [b"\xff\xfe\x00" * 100, b"\r" * 10_000 + b"\n", b"x" * 300_000, b"{'loss': 1.0}\n" * 3]
HOSTILE_FLOATS = [float("inf"), float("-inf"), float("nan"), 1e308, -1.0, 0.0, 1e-320]
HOSTILE_INTS = [0, -1, 2**31, 2**63 - 1, -(2**63), 10**18]
MARKERS = ["samai.progress", "samai.disk", "Traceback", "CHAIN_DONE", "TRAIN_NAN", "SMOKE_OK", "EVAL_RC", "x"]

Choose = Callable[[Sequence[Any]], Any]


def hostile(value: Any, choose: Choose, depth: int = 0) -> Any:
    """value with some of its parts replaced by what a hostile box could send in their place:
    of the same type (the reply's types are checked where it is converted), any content."""
    if choose((False, False, True)):
        if isinstance(value, bool) or value is None:
            return value
        if isinstance(value, str):
            return choose(HOSTILE_JSON + HOSTILE_LINES)
        if isinstance(value, bytes):
            return choose(HOSTILE_BYTES) + "\n".join(choose(HOSTILE_LINES) for _ in range(3)).encode("utf-8",
                                                                                                "surrogatepass")
        if isinstance(value, float):
            return choose(HOSTILE_FLOATS)
        if isinstance(value, int):
            return choose(HOSTILE_INTS)
    if isinstance(value, tuple) and depth < 4:
        return tuple(hostile(v, choose, depth + 1) for v in value)
    if is_dataclass(value) and not isinstance(value, type) and depth < 4:
        return replace(value, **{f.name: hostile(getattr(value, f.name), choose, depth + 1) for f in fields(value)
                                 if f.init})
    return value


def hostile_snapshot(snap: Snapshot, choose: Choose) -> Snapshot:
    """snap made hostile, as the box's reply converter would still take it (a log entry whose
    cursor the probe would refuse back is refused there), with marker hits of every kind the
    console reads (progress, disk, a stage's own) on hostile lines."""
    mutated = hostile(replace(snap, processes=snap.processes[:8]), choose)
    logs = tuple(replace(_taken(bad, good), hits=tuple(factories.marker_hit(m, choose(HOSTILE_LINES)) for m in MARKERS))
                 for bad, good in zip(mutated.logs, snap.logs, strict=True))
    return replace(mutated, logs=logs)


def _taken(chunk: LogChunk, instead: LogChunk) -> LogChunk:
    try:
        return checked_cursor(chunk)
    except BoxError:
        return instead


@pytest.fixture
def tiny(workspace: Path) -> config.Config:
    """The tiny pipeline on a workspace with each stage's log, a readable eval run and a bad one."""
    cfg = replace(config.load_builtin("tiny"), workspace=str(workspace))
    (workspace / "logs").mkdir()
    for stage in cfg.stages:
        (workspace / stage.log).write_text("started\n")
    for name, text in (("good", '{"n": 4, "accuracy": 0.5}'), ("bad", '{"n": 1e400}')):
        (workspace / "runs" / "eval" / name).mkdir(parents=True)
        (workspace / "runs" / "eval" / name / "summary.json").write_text(text)
    return cfg


def recorded_box(cfg: config.Config) -> ReplayTransport:
    """The recorded box (its processes, stages and logs) on the workspace, whose eval runs the
    probe's own code reads."""
    transport = ReplayTransport.recorded(Path(cfg.workspace))
    del transport.probe["reports"]
    return transport


async def one_snapshot(cfg: config.Config, state: ConsoleState, box: Box | None = None
                       ) -> tuple[Snapshot, list]:
    """One poll's snapshot and its followers, from box (the recorded box unless given)."""
    box = box or Box(recorded_box(cfg), cfg.workspace)
    try:
        followers = state.followers()
        return await box.snapshot(**state.request(followers)), followers
    finally:
        await box.close()


async def real_snapshot(cfg: config.Config, state: ConsoleState) -> tuple[Snapshot, list]:
    """A snapshot by the real probe on this machine (what it reads of hostile files and processes)."""
    return await one_snapshot(cfg, state, Box(LocalTransport(), cfg.workspace, python=sys.executable))


# ---------------------------------------------------------------- eval summaries


@FUZZ
@given(text=st.sampled_from(HOSTILE_JSON) | st.text(max_size=60) | st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.sampled_from(["n", "accuracy", "truncated"]), kids),
    max_leaves=6).map(json.dumps))
def test_any_summary_text_is_a_sound_run_or_not_a_summary(text: str) -> None:
    try:
        run = eval_run(factories.report("/ws/runs/eval/r/summary.json", text, mtime=1.0))
    except NotASummary as e:
        assert str(e) and len(str(e)) < 200  # said briefly, whatever the file held
        return
    assert type(run.n) is int and 0 <= run.n and 0 <= run.empty_content and 0 <= run.truncated
    assert run.accuracy is None or 0 <= run.accuracy <= 1


@pytest.mark.parametrize("text", ['{"n": 1e400}', "[" * 100_000, '{"n": ' + "9" * 5000 + "}",
                                  '{"n": 5, "accuracy": NaN}', '{"n": 5, "truncated": -3}'],
                         ids=["inf", "deep", "5000 digits", "NaN", "negative"])
async def test_a_hostile_summary_is_its_own_finding_and_the_other_runs_are_shown(tiny, workspace, text) -> None:
    (workspace / "runs" / "eval" / "bad" / "summary.json").write_text(text)
    state = ConsoleState(tiny)
    snap, followers = await one_snapshot(tiny, state)
    update = state.apply(snap, followers, 1.0)
    assert [run.name for run in update.view(EvalRuns).runs] == ["good"]
    found = [a for a in update.new_alerts if a.code == "unreadable_summary"]
    assert len(found) == 1 and "runs/eval/bad/summary.json cannot be read" in found[0].text
    assert len(found[0].text) < 400 and len(update.stages) == len(tiny.stages)


# ---------------------------------------------------------------- the state, folding any snapshot


@pytest.fixture
async def polled(tiny) -> tuple[config.Config, Snapshot]:
    """One snapshot of the recorded box on the tiny workspace (its followers are those of a fresh state)."""
    snap, _ = await one_snapshot(tiny, ConsoleState(tiny))
    return tiny, snap


@pytest.mark.slow
@FUZZ
@given(data=st.data())
def test_any_snapshot_is_folded_in_and_the_next_one_too(polled, data) -> None:
    cfg, real = polled
    choose: Choose = lambda options: data.draw(st.sampled_from(options))  # noqa: E731
    state = ConsoleState(cfg)
    followers = state.followers()
    snap = hostile_snapshot(real, choose)
    update = state.apply(snap, followers, 2.0)
    assert len(update.stages) == len(cfg.stages)
    # and the poll after it folds in the real box again
    again = state.apply(replace(real, time=real.time + 1), state.followers(), 3.0)
    assert len(again.stages) == len(cfg.stages)


# ---------------------------------------------------------------- the probe's own readers


@pytest.mark.parametrize("name, text", ids=["deep", "deep object", "4000-digit pid"], argvalues=[
    ("deep", "[" * 100_000), ("deep_object", '{"a":' * 3000 + "1" + "}" * 3000),
    ("big_pid", '{"stage": "big_pid", "pid": ' + "9" * 4000 + ', "pgid": 1, "start_time": 1.0, "log": "l", '
     '"cmd": "x", "fired_at": 1}'),
])
async def test_a_hostile_stage_record_is_an_error_entry_and_the_others_are_read(tiny, workspace, name, text) -> None:
    state_dir = workspace / ".samai" / "state"
    state_dir.mkdir(parents=True)
    (state_dir / f"{name}.json").write_text(text)
    record = {"stage": "train", "pid": 1, "pgid": 1, "start_time": 1.0, "log": "logs/train.log", "cmd": "x",
              "fired_at": 1.0}
    (state_dir / "train.json").write_text(json.dumps(record))
    (state_dir / "train.stopped").write_text("[" * 1000)  # a stop note nested past the decoder's stack
    (state_dir / "train.rc").write_text("9" * 60)  # no exit status
    snap, _ = await real_snapshot(tiny, ConsoleState(tiny))
    train = snap.state("train")
    assert train is not None and train.rc is None and train.stopped_at is None
    assert [r.stage for r in snap.states] == ["train"]
    error = next(e for e in snap.errors if e["what"].endswith(f"{name}.json"))
    assert len(error["error"]) < 400


# ---------------------------------------------------------------- the TUI, with the real probe behind it


def hostile_workspace(workspace: Path) -> None:
    """Every file the poll reads, written as a hostile box would: beside a readable eval run."""
    evals = workspace / "runs" / "eval"
    for i, text in enumerate(HOSTILE_JSON[:-1]):
        (evals / f"hostile{i}").mkdir(parents=True, exist_ok=True)
        (evals / f"hostile{i}" / "summary.json").write_text(text, errors="surrogatepass")
        (evals / f"hostile{i}" / "items.jsonl").write_text(text + "\n" + "[" * 100_000 + "\n", errors="surrogatepass")
    state_dir = workspace / ".samai" / "state"
    state_dir.mkdir(parents=True)
    (state_dir / "deep.json").write_text("[" * 100_000)
    for log in ("train", "fetch", "serve", "eval"):
        with (workspace / "logs" / f"{log}.log").open("ab") as f:
            f.write(b"\xff\xfe\x00 garbage\n" + b"y" * (10 * 1024 * 1024) + b"\n")
            f.write("\n".join(HOSTILE_LINES).encode("utf-8") + b"\n")


@pytest.mark.slow
async def test_the_tui_shows_the_box_whatever_its_files_hold(tiny, workspace) -> None:
    hostile_workspace(workspace)
    app = SamaiApp(tiny)
    said: list[str] = []
    async with app.run_test(size=(160, 50)) as pilot:
        app.notify = lambda message, **kw: said.append(message)  # type: ignore[method-assign]
        table = app.box_screen.query_one(EvalTable)
        await pilot_until(pilot, lambda: table.row_count == 1, 60)  # the readable run, from the first poll on
        assert app.connection.state == "connected"
        unreadable = await pilot_until(pilot, lambda: [a for a in app.state.alerts if a.code == "unreadable_summary"])
        assert {a.text.split(" cannot")[0].rsplit("/", 2)[-2] for a in unreadable} >= {
            f"hostile{i}" for i in range(len(HOSTILE_JSON) - 2) if HOSTILE_JSON[i] != ""}

        # and the panes go on updating: a new run, and new lines of the log on show
        (workspace / "runs" / "eval" / "later").mkdir()
        (workspace / "runs" / "eval" / "later" / "summary.json").write_text('{"n": 8, "accuracy": 1.0}')
        app.box_screen.open_stage_log("train")
        with (workspace / "logs" / "train.log").open("a") as f:
            f.write("the line after the hostile ones\n")
        await pilot_until(pilot, lambda: table.row_count == 2, 60)
        log = app.box_screen.query_one(LogView)
        await pilot_until(pilot, lambda: any("the line after the hostile ones" in line for line in log.lines), 60)
        assert app.is_running and app.connection.state == "connected"
        assert not [m for m in said if "internal error" in m or "failed" in m], said


# ---------------------------------------------------------------- the panes, shown any snapshot


@FUZZ
@given(used=st.sampled_from(HOSTILE_INTS) | st.integers(), total=st.sampled_from(HOSTILE_INTS) | st.integers(),
       adds=st.sampled_from(HOSTILE_INTS) | st.integers())
def test_the_disk_bar_is_its_width_whatever_the_box_says(used: int, total: int, adds: int) -> None:
    # A negative used once made the free part of the bar 2**63 cells long (half a gigabyte of
    # text for the pane to lay out: the screen froze).
    bar = usage_bar(used, total, adds)
    assert sum(len(text) for text, _ in bar) == BAR_WIDTH


async def test_the_panes_show_any_snapshot_and_the_next_real_one(tiny) -> None:
    """Hostile snapshots made from the recorded box's replies (its logs and the workspace's eval
    runs read by the probe's own code), then an untouched one: the panes show each."""
    transport = recorded_box(tiny)
    app = SamaiApp(tiny, poll=False)
    rng = random.Random(29)
    errors: list[str] = []
    box = Box(transport, tiny.workspace)
    async with app.run_test(size=(160, 50)) as pilot:
        app.notify = lambda message, **kw: errors.append(message)  # type: ignore[method-assign]
        for _ in range(25):
            followers = app.state.followers()
            snap = await box.snapshot(**app.state.request(followers))
            snap = hostile_snapshot(snap, rng.choice)
            app.show_snapshot(snap, followers)
            await pilot.pause()
        followers = app.state.followers()
        app.show_snapshot(await box.snapshot(**app.state.request(followers)), followers)
        await pilot.pause()
        assert app.box_screen.query_one(EvalTable).row_count == 1
        assert not [m for m in errors if "internal error" in m], errors
    await box.close()


async def test_a_process_with_a_megabyte_command_line_costs_the_reply_only_its_start(tiny, spawn) -> None:
    # Linux takes a few MiB of arguments: a thousand such processes would pass any bound on a reply.
    proc = spawn(sys.executable, "-c", "import time; time.sleep(60)", *(["x" * 100_000] * 10))
    snap, _ = await real_snapshot(tiny, ConsoleState(tiny))
    shown = snap.process(proc.pid)
    assert shown is not None and shown.argv[:2] == (sys.executable, "-c")
    assert 16_000 < len(shown.command) <= 16 * 1024
