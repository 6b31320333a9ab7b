"""The chain speaks on its own channel (issue 46, item 3): a run's header, its disk lines, its
cause of death and its CHAIN_DONE are the chain's only as the first line of the run's log and
with the run's nonce (remote/box/chainline.py). Whatever the stage prints, copies of those lines
included, is its text: it starts no run, ends none, says no rc and no cause, moves no NaN past a
checkpoint. Real stages fired through the box's launcher, read back through the real readers."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from samai.console.core import config
from samai.console.core.disk.feed import DiskView
from samai.console.core.session import BoxSession
from samai.console.core.training import resume
from samai.console.core.training.feed import TrainingFeed, TrainingView
from samai.console.core.training.history import read_history
from samai.console.core.training.lineage import last_run_check
from samai.console.core.update import StateUpdate
from samai.remote.box import chainline
from samai.remote.boxapi import Box
from samai.remote.local import LocalTransport
from samai.remote.model import Snapshot
from tests import chainlog
from tests.helpers import run_cli
from tests.replay_transport import new_points
from tests.test_checkpoints import FOLDER, checkpoint
from tests.test_fuzz_box_input import JSON

STEP = "{{'loss': {loss}, 'grad_norm': {grad}, 'learning_rate': 0.0002, 'epoch': {epoch}}}"
MADE_UP = "f" * 16

# A training run that goes NaN at step 10, then prints what looks like its chain's lines (a new
# run's header with the time now, a copy with a made-up nonce, a disk line, CHAIN_DONE rc=0, a
# death that is not its own), trains on as if healthy, and dies of a KeyError.
FORGER = """import sys, time
def step(i, loss, grad):
    print("{'loss': %s, 'grad_norm': %s, 'learning_rate': 0.0002, 'epoch': %s}" % (loss, grad, i / 10))
for i in range(1, 10):
    step(i, 2.0 - i / 20, 1.2)
for i in range(10, 16):
    step(i, "nan", "nan")
now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
print("=== samai chain sft: pid 1 started " + now)
print("=== samai chain sft: pid 1 started " + now + " [run MADE_UP]")
print("SAMAI_DISK end used=5 avail=5 size=10 (x) path=\\"/\\" [run MADE_UP]")
print("SAMAI_DEATH disk_full: No space left on device")
print("CHAIN_DONE rc=0")
for i in range(16, 21):
    step(i, 1.0, 1.0)
sys.stdout.flush()
{}["labels"]
""".replace("MADE_UP", MADE_UP)


def config_text(ws: Path) -> str:
    return f'''
[workspace]
path = "{ws}"
[stages.sft]
key = "t"
role = "train"
command = "{sys.executable} forger.py"
log = "logs/train.log"
checkpoints = "{FOLDER}"
'''


async def ended(box: Box, stage: str, timeout: float = 60.0) -> Snapshot:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        snap = await box.snapshot()
        rec = snap.state(stage)
        if rec is not None and rec.status != "running":
            return snap
        await asyncio.sleep(0.1)
    raise AssertionError(f"stage {stage} did not end within {timeout} s")


@pytest.mark.slow
async def test_a_stage_that_prints_its_chains_lines_moves_no_run_rc_cause_nan_or_resume(workspace: Path) -> None:
    (workspace / "forger.py").write_text(FORGER)
    (workspace / "samai.toml").write_text(config_text(workspace))
    for step in (4, 8):
        checkpoint(workspace, step)  # written before the run, healthy
    cfg = config.load(workspace / "samai.toml")
    session = BoxSession(cfg, lambda _cfg: Box(LocalTransport(), str(workspace), python=sys.executable))
    box = session.connected_box()
    try:
        await session.poll_once()
        fired = await box.fire("sft", f"{sys.executable} forger.py", "logs/train.log", verify_s=0.2)
        polls = [await poll_until(session, lambda u: u.stages[0].status != "idle")]
        while polls[-1].stages[0].status == "running":
            polls.append(await poll_until(session, lambda u: True))
        polls += [await poll_until(session, lambda u: True) for _ in range(2)]  # the log read to its end
        # The curve, as the polls read it: one run, its NaN kept, never reset by the printed header.
        first = next(i for i, u in enumerate(polls) if new_points(u))
        # (the run's own header starts it)
        assert not any(u.view(TrainingView) and u.view(TrainingView).reset for u in polls[first + 1:])
        curve = [p.step for u in polls for p in new_points(u)]
        assert curve == list(range(1, 21)), curve
        assert 10 in [p.step for p in session.state.feed(TrainingFeed).check.result().problems if p.severity == "error"]
        snap = await ended(box, "sft")
        checkpoint(workspace, 12, settled=False)  # written after the NaN and after the printed header
        rec = snap.state("sft")
        assert rec is not None and rec.rc == 1 and chainline.is_nonce(rec.nonce)
        assert rec.death is not None and rec.death.line.startswith("exception: KeyError: 'labels'"), rec.death

        log = str(workspace / "logs" / "train.log")
        [run], problems = await read_history(box, log, cfg.stage("sft").markers)
        assert not problems and (run.pid, run.rc) == (fired.pid, 1) and run.death.startswith("exception: KeyError")
        assert [m.text.split(" used=")[0] for m in run.marks if m.name == "disk"] == ["SAMAI_DISK start",
                                                                                      "SAMAI_DISK end"]

        [anomaly] = await resume.run_anomalies(box, log)
        assert anomaly.first_anomaly == 10
        choice = await resume.resume_choice(box, cfg, cfg.stage("sft"))
        assert choice.chosen is not None and choice.chosen.name == "checkpoint-8", choice
        assert "written at step 12, after the log's first anomaly at step 10" in choice.passed[0].why

        gate = await last_run_check(box, log)  # the merge gate's reading
        assert [p.step for p in gate.problems if p.severity == "error"][:1] == [10], gate.problems
    finally:
        await box.close()
    doctor = json.loads(run_cli("--config", str(workspace / "samai.toml"), "doctor", "--json").stdout)
    [offered] = [f for f in doctor["findings"] if f["code"] == "resume_available"]
    assert offered["checkpoint"] == f"{FOLDER}/checkpoint-8"


@pytest.mark.slow
async def test_the_console_takes_disk_and_chain_done_lines_only_from_its_chain(workspace: Path) -> None:
    """The disk pane's delta and the stages bar's last marker, as a poll reads them: the stage's
    copies of a disk line and of CHAIN_DONE are text; the chain's own lines still count."""
    (workspace / "samai.toml").write_text(f'[workspace]\npath = "{workspace}"\n[stages.job]\nkey = "j"\n'
                                          'command = "true"\n')
    cfg = config.load(workspace / "samai.toml")
    session = BoxSession(cfg, lambda _cfg: Box(LocalTransport(), str(workspace), python=sys.executable))
    forged = (f'echo "SAMAI_DISK start used=1 avail=9 size=10 (x) path=\\"/\\""; '
              f'echo "SAMAI_DISK end used=7 avail=3 size=10 (x) path=\\"/\\" [run {MADE_UP}]"; '
              f'echo "CHAIN_DONE rc=0 [run {MADE_UP}]"; echo "CHAIN_DONE rc=0"; ')
    try:
        box = session.connected_box()
        await box.fire("job", forged + "while [ ! -e go ]; do sleep 0.05; done", "logs/job.log", verify_s=0.2)
        log = workspace / "logs" / "job.log"
        await poll_until(session, lambda u: u.stages[0].status == "running" and "CHAIN_DONE rc=0\n" in log.read_text())
        for _ in range(2):  # the lines read by the polls that follow
            update = await poll_until(session, lambda u: True)
        [view] = update.stages
        assert view.status == "running" and not (view.last_marker or "").startswith("CHAIN_DONE"), view
        delta = update.view(DiskView).delta
        chain_start = [line for line in log.read_text().splitlines() if line.startswith("SAMAI_DISK start")][0]
        assert delta is not None and delta.end is None and delta.start is not None
        assert f"used={delta.start.used} " in chain_start and chain_start.endswith(f"[run {view_nonce(session)}]")
        (workspace / "go").touch()
        update = await poll_until(session, lambda u: u.stages[0].status == "done" and delta_of(u) is not None
                                  and delta_of(u).end is not None)
        [view] = update.stages
        chain_end = log.read_text().splitlines()[-2]
        assert chain_end.startswith("SAMAI_DISK end ") and f"used={delta_of(update).end.used} " in chain_end
        assert view.last_marker == f"CHAIN_DONE rc=0 [run {view_nonce(session)}]"
    finally:
        if session.box is not None:
            await session.box.close()


async def poll_until(session: BoxSession, predicate, timeout: float = 60.0) -> StateUpdate:
    """The first poll's update for which predicate holds (a failed poll is polled again)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        update = await session.poll_once()
        if isinstance(update, StateUpdate) and predicate(update):
            return update
        await asyncio.sleep(0.05)
    raise AssertionError(f"no poll within {timeout} s did")


def view_nonce(session: BoxSession) -> str:
    snap = session.state.snapshot
    assert snap is not None
    return snap.state("job").nonce


async def test_a_failed_fires_tail_keeps_the_stages_copies_and_drops_its_chains_lines(box, workspace) -> None:
    result = await box.fire("quick", "echo 'CHAIN_DONE rc=0'; echo 'SAMAI_DEATH exit: fine'; echo real words; exit 4",
                            "logs/quick.log", verify_s=5)
    assert result.state == "failed" and result.rc == 4 and chainline.is_nonce(result.nonce)
    assert result.stage_tail == ("CHAIN_DONE rc=0", "SAMAI_DEATH exit: fine", "real words")
    assert result.log_tail[-1] == f"CHAIN_DONE rc=4 [run {result.nonce}]"


async def test_the_stage_never_sees_its_runs_nonce(box, workspace) -> None:
    """Not in its environment, not on its stdin, not as a shell variable of the command."""
    command = "env; echo \"nonce=[$samai_nonce]\"; cat; echo stdin-done"
    await box.fire("env", command, "logs/env.log", verify_s=0.2)
    snap = await ended(box, "env")
    nonce = snap.state("env").nonce
    text = (workspace / "logs" / "env.log").read_text()
    stage_text = "\n".join(line for line in text.splitlines() if chainline.said_by_chain(line, nonce) is None)
    assert chainline.is_nonce(nonce) and nonce not in stage_text and "nonce=[]" in stage_text
    assert "stdin-done" in stage_text


# ------------------------------------------------------------ the class, fuzzed through the real readers

COPIES = st.sampled_from([
    chainlog.header("sft", 1, "2030-01-01T00:00:00Z"), chainlog.header("sft", 2, "2030-01-01T00:00:00Z"),
    chainlog.header("sft", 2, "2030-01-01T00:00:00Z", nonce=MADE_UP), "=== samai chain sft: pid 3 started "
    "2030-01-01T00:00:00Z", "=== samai chain ", chainlog.chain("CHAIN_DONE rc=0", 2, nonce=MADE_UP), "CHAIN_DONE rc=0",
    "SAMAI_DEATH disk_full: No space left on device", chainlog.chain("SAMAI_DISK end used=1 avail=1 size=2", 1),
    STEP.format(loss=1.0, grad=1.0, epoch=0.5)])
STAGE_TEXT = st.lists(st.one_of(COPIES, st.text(max_size=30)), max_size=12)


def planted_run(said: list[str]) -> str:
    """The run of pid 2 as the launcher writes it: healthy steps 1..9, NaN from 10, `said`, more steps."""
    steps = [STEP.format(loss=2.0 - i / 20, grad=1.2, epoch=i / 10) for i in range(1, 10)]
    steps += [STEP.format(loss="nan", grad="nan", epoch=i / 10) for i in range(10, 13)]
    after = [STEP.format(loss=1.0, grad=1.0, epoch=i / 10) for i in range(13, 16)]
    return chainlog.run_log("sft", 2, [chainlog.chain("SAMAI_DISK start used=1 avail=1 size=2", 2), *steps, *said,
                                       *after], rc=3, started="2026-12-02T00:00:00Z", death="exit: exit status 3")


@settings(max_examples=25, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(said=STAGE_TEXT)
def test_no_text_after_a_nan_hides_it_from_resume_the_gate_or_the_runs_list(workspace: Path, said) -> None:
    logs = workspace / "logs"
    logs.mkdir(exist_ok=True)
    (logs / "train.log.1").write_text(chainlog.run_log("sft", 1, [STEP.format(loss=2.0, grad=1.0, epoch=0.1)]))
    log = str(logs / "train.log")

    async def read() -> tuple:
        box = Box(LocalTransport(), str(workspace), python=sys.executable)
        try:
            runs, _ = await read_history(box, log, ())
            gate = await last_run_check(box, log)
            return (await resume.run_anomalies(box, log), [(r.pid, r.rc, r.death) for r in runs],
                    min((p.step for p in gate.problems if p.severity == "error" and p.step is not None), default=None))
        finally:
            await box.close()

    (logs / "train.log").write_text(planted_run([]))
    plain = asyncio.run(read())
    (logs / "train.log").write_text(planted_run(said))
    noisy = asyncio.run(read())
    assert plain[0] == noisy[0] and [r.first_anomaly for r in noisy[0]] == [None, 10]
    assert plain[1] == noisy[1] == [(1, 0, ""), (2, 3, "exit: exit status 3")]
    assert plain[2] == noisy[2] == 10


@settings(max_examples=300, deadline=None, database=None)
@given(said=STAGE_TEXT, cuts=st.lists(st.integers(0, 40), max_size=5))
def test_the_followed_curve_starts_anew_only_at_its_files_first_line(said, cuts) -> None:
    """The live curve (newest_run_points, as the poll feeds it): however the lines come in reads,
    a run starts only at a file's first line, where the follower says one is."""
    from samai.console.core.training.trainlog import TrainLogCheck, newest_run_points

    lines = planted_run(said).splitlines()
    edges = sorted({0, len(lines), *(min(c, len(lines)) for c in cuts)})
    check, points, restarts = TrainLogCheck(), [], 0
    for start, end in zip(edges, edges[1:], strict=False):
        check, restarted, new = newest_run_points(check, lines[start:end], 0 if start == 0 else None)
        points, restarts = (new if restarted else points + new), restarts + restarted
    assert restarts == 1 and [p.step for p in points][:12] == list(range(1, 13))
    assert min(p.step for p in check.result().problems if p.severity == "error" and p.step) == 10


@settings(max_examples=300, deadline=None, database=None)
@given(nonce=JSON, line=st.text(max_size=80) | COPIES)
def test_a_records_nonce_of_any_shape_costs_its_chain_lines_their_trust_not_the_reply(nonce, line) -> None:
    from samai.remote import model

    raw = {"stage": "s", "pid": 1, "pgid": 1, "start_time": 1.0, "log": "l", "cmd": "c", "fired_at": 1.0,
           "nonce": nonce}
    rec = model._stage_record(raw)
    fire = model.fire_result(dict(raw, ok=False, state="failed", log_tail=[line]), "s")
    assert rec.nonce == fire.nonce == (nonce if chainline.is_nonce(nonce) else "")
    said = rec.said_by_chain(line)
    assert said is None or (line.rstrip("\r") == chainline.signed(said, rec.nonce) and chainline.looks_like_chain(line))
    assert fire.stage_tail == (() if said is not None or not line.strip() else (line,))
    chainline.read_header(line)  # never raises


@pytest.mark.slow
async def test_a_disk_line_stays_the_chains_in_a_workspace_of_a_long_path(tmp_path: Path) -> None:
    """The probe keeps 400 bytes of a marker's line: the disk line's path is cut short enough
    that its run's tag, which makes it the chain's, is still there."""
    workspace = tmp_path / ("w" * 200) / ("s" * 200)
    workspace.mkdir(parents=True)
    (workspace / "samai.toml").write_text(f'[workspace]\npath = "{workspace}"\n[stages.job]\nkey = "j"\n'
                                          'command = "true"\n')
    session = BoxSession(config.load(workspace / "samai.toml"),
                         lambda _cfg: Box(LocalTransport(), str(workspace), python=sys.executable))
    try:
        await session.connected_box().fire("job", "echo wrote", "logs/job.log", verify_s=0.2)
        update = await poll_until(session, lambda u: delta_of(u) is not None and delta_of(u).end is not None)
        assert delta_of(update).start is not None and update.stages[0].status == "done"
        assert all(len(line.encode()) < 400 for line in (workspace / "logs" / "job.log").read_text().splitlines())
    finally:
        if session.box is not None:
            await session.box.close()


def delta_of(update):
    """What the last fired stage did to the disk, as the disk pane is handed it."""
    view = update.view(DiskView)
    return view.delta if view else None
