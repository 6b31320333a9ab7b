"""No silent cut (issue 46): every reader with a limit reads whole, streaming within bounded
memory, or says that it cut and where. The readers found cutting without saying so: the audit
log in the timeline and the incident bundle (its newest 4 MiB), a stage's runs (its newest 100)
and a run's marker lines (its last 200), the smoke log (its first 1 MiB, the verdict being at its
end), the probe's reports and stage records (64 KiB: a larger one was "not JSON"), the box's
checkpoint listing (its newest 200), the check of a finished eval run's items (a failed read only
logged), and the bundle's own events and processes.

Through the real paths: real files, the real local Box and probe, the command line as a user
runs it, the TUI through App.run_test()."""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from samai.console.app import SamaiApp
from samai.console.core import config, incident, timeline
from samai.console.core.actions import Actions, Decision
from samai.console.core.audit import AuditLog
from samai.console.core.detectors import eval_findings
from samai.console.core.evals.runs import EvalRun, ItemsNotRead, NotASummary, check_items, eval_run, read_eval_runs
from samai.console.core.serving.smoke import read_verdict, smoke
from samai.console.core.timeline import NOT_SHOWN, audit_events, read_timeline
from samai.console.core.training import history, resume
from samai.console.core.training.history import RunHistory, read_history
from samai.console.core.training.resume import NothingToResume
from samai.console.screens.dialogs import TimelineScreen
from samai.remote import model
from samai.remote.box import probe
from samai.remote.box.checkpoints import MAX_CHECKPOINTS
from samai.remote.boxapi import Box, BoxError
from samai.remote.model import Marker
from tests import chainlog
from tests.helpers import pilot_until, run_cli
from tests.replay_transport import ReplayTransport
from tests.test_checkpoints import FOLDER
from tests.test_resume import confirming
from tests.test_resume import ws as ws  # noqa: F401 (the fixture: a dead run, checkpoints 4, 8 and 12)

FUZZ = settings(max_examples=60, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def _config(tmp_path: Path, workspace: Path, stages: str = "") -> Path:
    f = tmp_path / "c.toml"
    f.write_text(f'[workspace]\npath = "{workspace}"\n' + stages)
    return f


def _outcome(i: int, at: float, subject: str = "", pad: str = "") -> str:
    return json.dumps({"id": f"a{i}", "phase": "outcome", "time": at, "action": "fire",
                       "subject": subject or f"stage s{i}", "result": "ok", "message": pad}) + "\n"


# ---------------------------------------------------------------- 1. the audit log


def test_the_timeline_reads_the_whole_audit_log_not_its_newest_4_mib(tmp_path: Path, workspace: Path) -> None:
    """3,000 actions of 2 KB each (6 MB): the oldest was left out of `timeline`, unsaid."""
    state = tmp_path / "state"
    (state / "samai").mkdir(parents=True)
    now = time.time()
    with open(state / "samai" / "audit.jsonl", "w") as f:
        f.writelines(_outcome(i, now - 3000 + i, "stage the-first" if i == 0 else "", "x" * 2000) for i in range(3000))
    r = run_cli("--config", str(_config(tmp_path, workspace)), "timeline", "--json",
                env={"XDG_STATE_HOME": str(state)}, timeout=120)
    assert r.returncode == 0, r.stderr
    audit = [e for e in json.loads(r.stdout)["events"] if e["source"] == "audit"]
    assert len(audit) == 3000 and audit[0]["text"] == "fire stage the-first: ok"


def test_past_its_bound_the_timeline_and_the_bundle_say_how_many_older_events_are_not_shown(
        tmp_path: Path, workspace: Path) -> None:
    """More audit events than are kept: the command's JSON and text, and the incident bundle, say
    how many are not shown, at the cut; --since filters as the log is read (nothing cut, none said)."""
    state = tmp_path / "state"
    (state / "samai").mkdir(parents=True)
    now, old = time.time(), timeline.MAX_AUDIT_EVENTS + 5
    with open(state / "samai" / "audit.jsonl", "w") as f:
        f.writelines(_outcome(i, now - 7200 + i / 100) for i in range(old))
        f.writelines(_outcome(old + i, now - 60 + i) for i in range(10))
    cfg, env = str(_config(tmp_path, workspace)), {"XDG_STATE_HOME": str(state)}
    r = run_cli("--config", cfg, "timeline", "--json", env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    events = json.loads(r.stdout)["events"]
    [note] = [e for e in events if e["kind"] == NOT_SHOWN]
    assert note["source"] == "audit" and note["severity"] == "warning"
    assert note["text"] == f"15 older audit events not shown (the newest {timeline.MAX_AUDIT_EVENTS:,} are)"
    audit = [e for e in events if e["source"] == "audit" and e["kind"] != NOT_SHOWN]
    assert len(audit) == timeline.MAX_AUDIT_EVENTS and audit[0]["text"] == "fire stage s15: ok"
    assert events.index(note) < events.index(audit[0])  # where the cut is
    text = run_cli("--config", cfg, "timeline", env=env, timeout=120).stdout
    assert "15 older audit events not shown" in text
    since = json.loads(run_cli("--config", cfg, "timeline", "--since", "1h", "--json", env=env, timeout=120).stdout)
    assert [e["text"] for e in since["events"] if e["source"] == "audit"] == [
        f"fire stage s{old + i}: ok" for i in range(10)]
    out = tmp_path / "bundle.json"
    made = run_cli("--config", cfg, "incident", "--out", str(out), env=env, timeout=120)
    assert made.returncode == 0, made.stderr
    bundled = json.loads(out.read_text())["timeline"]
    assert len(bundled) == incident.MAX_EVENTS + 1 and bundled[0]["kind"] == NOT_SHOWN
    left = timeline.MAX_AUDIT_EVENTS + 1 - incident.MAX_EVENTS  # its events and the audit's note, past the bundle's
    assert bundled[0]["text"] == f"{left:,} older events not in this bundle (its newest {incident.MAX_EVENTS:,} are)"


ENTRY = st.one_of(
    st.tuples(st.just("intent"), st.integers(0, 5), st.integers(0, 100)),
    st.tuples(st.just("outcome"), st.integers(0, 5), st.integers(0, 100)),
    st.tuples(st.just("torn"), st.just(0), st.just(0)),
    st.tuples(st.just("long"), st.just(0), st.just(0)))


@FUZZ
@given(entries=st.lists(ENTRY, max_size=40), keep=st.integers(1, 8), since=st.none() | st.integers(0, 100))
def test_every_outcome_from_since_on_is_kept_or_counted(tmp_path_factory, monkeypatch, entries, keep, since) -> None:
    """Any audit log (intents, outcomes, torn lines, lines too long to hold): the events shown and
    the count the note says are every outcome from `since` on, the newest kept, none lost unsaid."""
    monkeypatch.setattr(timeline, "MAX_AUDIT_LINE", 300)
    path = tmp_path_factory.mktemp("audit") / "audit.jsonl"
    expected, began, long_lines = [], {}, 0
    with open(path, "w") as f:
        for n, (kind, entry_id, at) in enumerate(entries):
            if kind == "torn":
                f.write('{"id": "x", "phase": "outc\n')
            elif kind == "long":
                f.write(json.dumps({"phase": "outcome", "time": 1, "pad": "y" * 400}) + "\n")
                long_lines += 1
            else:
                f.write(json.dumps({"id": f"i{entry_id}", "phase": kind, "time": at, "action": f"a{n}"}) + "\n")
                if kind == "intent":
                    began[entry_id] = at
                else:
                    t = began.pop(entry_id, at)
                    if since is None or t >= since:
                        expected.append((t, f"a{n}"))
    events = audit_events(path, since, keep)
    shown = [(e.time, e.kind) for e in events if e.kind != NOT_SHOWN]
    notes = [e for e in events if e.kind == NOT_SHOWN]
    assert shown == expected[-keep:]
    older = len(expected) - len(shown)
    said = [e.text for e in notes if "older audit events" in e.text]
    assert said == ([f"{older:,} older audit events not shown (the newest {len(shown):,} are)"] if older else [])
    assert [e.text for e in notes if "not read" in e.text] == (
        [f"{long_lines:,} lines of the audit log over 0 MiB not read"] if long_lines else [])


async def test_the_tui_s_timeline_says_what_the_audit_log_held_that_it_could_not_read(
        recorded_box: ReplayTransport, tmp_path: Path, monkeypatch) -> None:
    state = tmp_path / "state"
    (state / "samai").mkdir(parents=True)
    too_long = b"{" + b"x" * (2 << 20) + b"\n"
    (state / "samai" / "audit.jsonl").write_bytes(_outcome(1, time.time() - 60).encode() + too_long
                                                   + _outcome(2, time.time()).encode())
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    tiny = config.load_builtin("tiny")
    cfg = replace(tiny, workspace=recorded_box.workspace, target=replace(tiny.target, poll_interval=0.05))
    app = SamaiApp(cfg, open_box=lambda _cfg: Box(recorded_box, recorded_box.workspace))
    async with app.run_test(size=(150, 48)) as pilot:
        await pilot_until(pilot, lambda: app.state.snapshot is not None)
        await pilot.press("T")
        screen = await pilot_until(pilot, lambda: isinstance(app.screen, TimelineScreen) and app.screen)
        said = [e for e in screen.events if e.kind == NOT_SHOWN]
        assert [e.text for e in said] == ["1 lines of the audit log over 1 MiB not read"]
        assert [e.text for e in screen.events if e.source == "audit" and e.kind == "fire"] == [
            "fire stage s1: ok", "fire stage s2: ok"]
        await pilot.press("slash", *"not read")
        await pilot_until(pilot, lambda: [e.kind for e in screen.shown] == [NOT_SHOWN])


# ---------------------------------------------------------------- 2. a stage's runs and their marks


def _generations(workspace: Path, runs: int, marks: int = 1) -> str:
    (workspace / "logs").mkdir(exist_ok=True)
    log = workspace / "logs" / "s.log"
    for n in range(runs):  # the oldest kept generation first
        name = log if n == runs - 1 else Path(f"{log}.{runs - 1 - n}")
        name.write_text("".join([chainlog.header("s", 100 + n, f"2026-12-0{1 + n}T00:00:00Z") + "\n",
                                 *(f"MARK {i}\n" for i in range(marks)), chainlog.chain("CHAIN_DONE rc=0", 100 + n)
                                 + "\n"]))
    return str(log)


async def test_the_runs_and_the_timeline_say_how_many_older_runs_are_not_listed(box: Box, workspace: Path,
                                                                                 monkeypatch) -> None:
    monkeypatch.setattr(history, "MAX_RUNS", 2)
    log = _generations(workspace, history.LOG_GENERATIONS + 1)
    runs, problems = await read_history(box, log, [Marker("MARK", "MARK")])
    assert [r.pid for r in runs] == [104, 105] and problems == ["4 older runs not listed (the newest 2 are)"]
    cfg = replace(config.load_builtin("tiny"), workspace=str(workspace))
    stage = replace(cfg.stages[0], name="s", log="logs/s.log")
    events = await read_timeline(box, replace(cfg, stages=(stage,)), workspace / "no-audit.jsonl")
    [note] = [e for e in events if e.kind == NOT_SHOWN]
    assert (note.stage, note.text, note.severity) == ("s", "4 older runs not listed (the newest 2 are)", "warning")


def test_the_history_counts_every_run_it_does_not_keep() -> None:
    whole = RunHistory()
    for pid in range(history.MAX_RUNS + 30):
        whole.start_file(f"l{pid}")
        whole.feed([chainlog.header("s", pid), chainlog.chain("CHAIN_DONE rc=0", pid)])
        whole.end_file()
    assert len(whole.runs()) == history.MAX_RUNS and whole.left_out() == 30
    assert whole.notes() == [f"30 older runs not listed (the newest {history.MAX_RUNS} are)"]
    assert RunHistory().notes() == []


async def test_a_run_s_earlier_marker_lines_are_said_not_shown(box: Box, workspace: Path, monkeypatch) -> None:
    monkeypatch.setattr(history, "MAX_MARKS", 3)
    log = _generations(workspace, 1, marks=10)
    [run], problems = await read_history(box, log, [Marker("MARK", "MARK")])
    assert problems == [] and [m.text for m in run.marks] == ["MARK 7", "MARK 8", "MARK 9"]
    assert run.marks_left_out == 7
    events = timeline.run_events("s", [run])
    [note] = [e for e in events if e.kind == NOT_SHOWN]
    assert note.text == "7 earlier marker lines of this run not shown (its last 3 are)"
    assert note.time == timeline.header_time(run.started)  # before its kept marks: where they begin


# ---------------------------------------------------------------- 3. the smoke log


SERVE = """\
import sys
for i in range(40_000):  # a server's own lines: 2.4 MB before the verdict
    print(f"llama_model_loader: - kv {i:6d}: tokenizer.ggml.tokens arr[str,151936] = ['!', ...]")
print("SMOKE_OK 17*23= -> 391", flush=True)
print("main: server is listening; stopping (--smoke-only)")
"""


async def test_a_long_smoke_log_s_verdict_is_read_at_its_end(tmp_path: Path, box: Box, workspace: Path) -> None:
    serve = tmp_path / "serve.py"
    serve.write_text(SERVE)
    toml = _config(tmp_path, workspace, f'[stages.serve]\nkey = "v"\nrole = "serve"\n'
                                        f'command = "{sys.executable} {serve} --model m.gguf --port 1"\n')

    async def confirm(plan) -> Decision:
        return Decision.confirmed(plan, "test")

    result = await smoke(Actions(box, config.load(toml), AuditLog(tmp_path / "audit.jsonl"), readonly=False,
                                 confirm=confirm), "new.gguf", timeout=120)
    assert result.ok and result.said == "SMOKE_OK 17*23= -> 391", result.said
    assert "stopping (--smoke-only)" in result.log and len(result.log) <= 1 << 20  # its last lines


async def test_a_smoke_log_that_cannot_be_read_whole_gives_no_verdict_and_says_why(box: Box, workspace: Path) -> None:
    os.mkfifo(workspace / "smoke.log")  # a reader would wait on it forever
    verdict, said, _ = await read_verdict(box, str(workspace / "smoke.log"))
    assert verdict is None and said.startswith("no verdict: its log could not be read to its end (")
    assert "not a regular file" in said


# ---------------------------------------------------------------- 4. the probe's reports and records


def _summary(size: int) -> str:
    """A sound eval summary of exactly `size` bytes."""
    head = '{"n": 4, "accuracy": 0.5, "pad": "'
    return head + "x" * (size - len(head) - 2) + '"}'


@FUZZ
@given(over=st.integers(-3, 3))
def test_a_report_is_read_whole_or_said_too_big_with_its_size(tmp_path_factory, over: int) -> None:
    ws = tmp_path_factory.mktemp("ws")
    (ws / "runs" / "eval" / "r").mkdir(parents=True)
    size = probe.MAX_REPORT_BYTES + over
    (ws / "runs" / "eval" / "r" / "summary.json").write_text(_summary(size))
    errors: list = []
    [raw] = probe.reports(str(ws), [{"glob": "runs/eval/*/summary.json"}], errors)
    report = model.Report(**raw)
    if over <= 0:
        assert eval_run(report).n == 4 and not report.too_big
    else:
        assert report.too_big and report.text == ""
        with pytest.raises(NotASummary, match=f"^too big: {size:,} bytes, over the "
                                              f"{probe.MAX_REPORT_BYTES:,} bytes a summary is read up to$"):
            eval_run(report)
    assert errors == []


async def test_a_large_summary_s_finding_says_too_big_not_not_json(box: Box, workspace: Path) -> None:
    (workspace / "runs" / "eval" / "big").mkdir(parents=True)
    (workspace / "runs" / "eval" / "big" / "summary.json").write_text(_summary(70_000))
    snap = await box.snapshot(reports=["runs/eval/*/summary.json"], processes=False)
    runs, [finding] = read_eval_runs(snap.reports)
    assert runs == [] and finding.code == "unreadable_summary"
    assert finding.message.endswith("cannot be read: too big: 70,000 bytes, over the 65,536 bytes a summary is "
                                    "read up to"), finding.message


def test_a_stage_record_over_its_limit_is_said_too_big(workspace: Path) -> None:
    state = workspace / ".samai" / "state"
    state.mkdir(parents=True)
    (state / "s.json").write_text(_summary(70_000))
    (state / "t.json").write_text(json.dumps({"stage": "t", "pid": 1, "pgid": 1, "log": "logs/t.log", "cmd": "x",
                                              "fired_at": 1.0}))
    (state / "t.rc").write_text("0" + " " * 70 + "x")  # no exit status: its first bytes are not one
    errors: list = []
    [rec] = probe.stage_states(str(workspace), {}, probe.boot_time(), errors)
    assert rec["stage"] == "t" and rec["rc"] is None
    assert errors == [{"what": str(state / "s.json"),
                       "error": f"too big: 70000 bytes, over the {probe.MAX_REPORT_BYTES} read of such a file"}]


# ---------------------------------------------------------------- 5. the checkpoints past the newest 200


def _empties(ws: Path, count: int, first: int = 100) -> None:
    """count checkpoint folders newer than the fixture's, each empty (so not whole)."""
    for step in range(first, first + count):
        (ws / FOLDER / f"checkpoint-{step}").mkdir(parents=True)


async def test_the_checkpoints_the_box_did_not_judge_are_said_where_they_are_chosen(ws: Path,  # noqa: F811
                                                                                     tmp_path: Path) -> None:
    _empties(ws, MAX_CHECKPOINTS)
    box, actions, _ = confirming(ws, tmp_path)
    left = f"3 older checkpoint(s) in {FOLDER} beyond the newest {MAX_CHECKPOINTS} were not judged"
    try:
        listed = await box.checkpoints(FOLDER)
        assert listed.unjudged == 3 and listed.left_out() == left
        with pytest.raises(NothingToResume) as refused:
            await actions.plan_resume("sft")
        assert str(refused.value).endswith(f"; {left}"), refused.value
        with pytest.raises(NothingToResume, match=f"checkpoint-8: not among the newest {MAX_CHECKPOINTS} the box "
                                                  "judged"):  # not 'no such checkpoint': it is there, unjudged
            await actions.plan_resume("sft", "checkpoint-8")
        plan = await actions.plan_prune("sft")
        assert f"{left}: none of them is deleted" in plan.details
    finally:
        await box.close()


def test_the_choice_carries_what_the_listing_left_out() -> None:
    ck = model.Checkpoint("checkpoint-9", 9, 1.0, 10, 1, True, finite=True)
    raw = {"folder": "ck", "checkpoints": [ck.__dict__ | {"missing": [], "temporary": [], "nonfinite": [],
                                                          "problems": []}], "unjudged": 7}
    choice = resume.choose(model.checkpoints(raw), [])
    assert choice.chosen == ck and choice.left_out == "7 older checkpoint(s) in ck beyond the newest 1 were not judged"
    assert resume.choose(model.checkpoints(dict(raw, unjudged=0)), []).left_out == ""
    for bad in (-1, True, 1.5, 10**13, "3"):
        with pytest.raises(BoxError):
            model.checkpoints(dict(raw, unjudged=bad))


# ---------------------------------------------------------------- 6. a finished run's items not read whole


def _fifo_run(workspace: Path) -> EvalRun:
    folder = workspace / "runs" / "eval" / "r1"
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text('{"n": 4, "accuracy": 0.5}')
    os.mkfifo(folder / "items.jsonl")  # a reader would wait on it forever
    return EvalRun("r1", 4, 0.5, 0, 0, folder=str(folder))


async def test_items_not_read_whole_are_a_warning_not_nothing(box: Box, workspace: Path) -> None:
    result = await check_items(box, _fifo_run(workspace))
    assert isinstance(result, ItemsNotRead) and "not a regular file" in result.why
    [found] = eval_findings("r1", result)
    assert (found.code, found.severity) == ("items_not_read", "warning")
    assert found.message.startswith("eval r1: its items could not be read whole, so they are not checked: ")


def test_doctor_says_a_run_s_items_were_not_read_whole(tmp_path: Path, workspace: Path) -> None:
    _fifo_run(workspace)
    r = run_cli("--config", str(_config(tmp_path, workspace)), "doctor", "--json", timeout=120)
    [found] = [f for f in json.loads(r.stdout)["findings"] if f["code"] == "items_not_read"]
    assert found["severity"] == "warning" and "not a regular file" in found["message"]


@pytest.mark.slow
async def test_the_tui_raises_a_warning_when_a_run_s_items_cannot_be_read_whole(tmp_path: Path,
                                                                                workspace: Path) -> None:
    _fifo_run(workspace)
    app = SamaiApp(config.load(_config(tmp_path, workspace)))
    async with app.run_test(size=(140, 45)) as pilot:
        alert = await pilot_until(pilot, lambda: next((a for a in app.state.alerts if a.code == "items_not_read"),
                                                      None), 60)
        assert alert.severity == "warning" and alert.active
        assert alert.text.startswith("eval r1: its items could not be read whole, so they are not checked: ")


async def test_a_bundle_says_how_many_processes_it_left_out(box: Box, workspace: Path, tmp_path: Path,
                                                            monkeypatch) -> None:
    monkeypatch.setattr(incident, "MAX_PROCESSES", 1)
    cfg = replace(config.load_builtin("tiny"), workspace=str(workspace))
    content = await incident.make_bundle(box, cfg, tmp_path / "audit.jsonl", since=None, findings=[])
    total = len((await box.snapshot()).processes)  # this machine's: more than one (this test's, at least)
    assert len(content["probe"]["processes"]) == 1
    [said] = [e for e in content["probe"]["errors"] if e["what"] == "processes"]
    assert said["error"].endswith("more not in this bundle (its first 1 are)") and total > 1
