"""The computer-use half as the console knows it: task files and answers read as untrusted input
(fuzzed), `check eval` on cu_eval's episodes, the eval pane's cu rows, and a missing browser
said by doctor and by the stage's dialog before the stage is fired (the real probe, this PATH)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from samai.console.core import config
from samai.console.core.browsers import browser_missing, browser_names, browser_stages
from samai.console.core.detectors import declared_binaries, detect
from samai.console.core.evals.cucheck import check_episodes, looks_like_episodes
from samai.console.core.evals.runs import eval_run
from samai.console.core.preflight import preflight
from samai.remote.box.stages import vision
from samai.remote.box.stages.webtasks import TaskError, parse_action, parse_task, read_tasks, summarize
from samai.remote.boxapi import Box
from samai.remote.local import LocalTransport
from samai.remote.model import Report
from tests.helpers import run_cli

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=20)
TASK = {"id": "t", "page": "pages/t.html", "instruction": "press the colour?",
        "elements": {"red": {"selector": "#red"}, "name": {"selector": "#n", "action": "type"},
                     "size": {"selector": "#s", "action": "select"}},
        "assert": [{"check": "text", "selector": "#r", "equals": "red"}]}


def episode(**kw) -> dict:
    row = {"task": "t", "instruction": "press", "sample": 0, "sent": [224, 224], "original": [224, 224],
           "answer": "red", "action": {"do": "click", "element": "red", "selector": "#red"}, "parse_error": None,
           "error": None, "assertions": [{"check": "x", "passed": True}], "reward": 1, "seconds": 0.1}
    row.update(kw)
    return row


# ---------------------------------------------------------------- task files and answers


@given(raw=JSON)
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
def test_any_decoded_line_is_a_task_or_a_task_error(raw, tmp_path_factory) -> None:
    try:
        parse_task(raw, str(tmp_path_factory.getbasetemp()))
    except TaskError:
        pass


@given(data=st.binary(max_size=3000))
@settings(max_examples=200, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_task_file_reads_as_tasks_and_errors(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_bytes(data)
    for item in read_tasks(str(path)):
        assert isinstance(item, TaskError) or item.id


@given(answer=st.text(max_size=400))
@settings(max_examples=400)
def test_any_answer_is_one_of_the_tasks_actions_or_none_with_why(answer: str) -> None:
    task = parse_task(TASK, "/nonexistent")
    action, why = parse_action(answer, task)
    if action is None:
        assert why
    else:
        element = task.element(action.element)
        assert element is not None and element.selector == action.selector and element.action == action.do


@pytest.mark.parametrize(("answer", "expected"), [
    ("red", ("click", "red", None)), ("RED.", ("click", "red", None)), ("Click red", ("click", "red", None)),
    ("I would press the red one", ("click", "red", None)), ("<think>name?</think> red", ("click", "red", None)),
    ("type name Ada Lovelace", ("type", "name", "Ada Lovelace")), ("select size large", ("select", "size", "large")),
    ("blue", None), ("", None), ("click", None), ("click blue", None), ("type red hello", None),
    ("type name", None), ("purplurplurple", None),
])
def test_answers_read_as_actions(answer: str, expected) -> None:
    action, why = parse_action(answer, parse_task(TASK, "/nonexistent"))
    got = None if action is None else (action.do, action.element, action.text)
    assert got == expected, why


@pytest.mark.parametrize("page", ["/etc/passwd", "../out.html", "", "a\x00b"])
def test_a_task_page_outside_its_folder_is_refused(page: str, tmp_path: Path) -> None:
    with pytest.raises(TaskError):
        parse_task({**TASK, "page": page}, str(tmp_path))


@pytest.mark.parametrize("broken", [{"assert": []}, {"elements": {}}, {"elements": {"two words": {"selector": "x"}}},
                                    {"assert": [{"check": "text", "selector": "#r"}]},
                                    {"assert": [{"check": "url", "equals": "a", "contains": "b"}]},
                                    {"assert": [{"check": "script", "equals": "a"}]}, {"split": "test"},
                                    {"elements": {"red": {"selector": "#r", "action": "drag"}}}, {"id": True}])
def test_a_task_that_cannot_be_run_says_why(broken: dict, tmp_path: Path) -> None:
    with pytest.raises(TaskError) as e:
        parse_task({**TASK, **broken}, str(tmp_path))
    assert "task" in str(e.value) or "id" in str(e.value)


def test_vlm_tinys_tasks_are_all_runnable_and_each_has_its_answer(tmp_path: Path) -> None:
    vision.write_cu_tasks(str(tmp_path))
    tasks = list(read_tasks(str(tmp_path / "cu" / "tasks.jsonl")))
    assert not [t for t in tasks if isinstance(t, TaskError)]
    assert {t.split for t in tasks} == {"train", "heldout"} and len(tasks) == 84
    for t in tasks:
        colour = t.checks[0].expected
        assert t.element(colour) is not None and (tmp_path / "cu" / t.page).is_file()
        assert f"rgb({', '.join(map(str, vision.COLOURS[colour]))})" in (tmp_path / "cu" / t.page).read_text()


# ---------------------------------------------------------------- check eval on episodes


def test_a_run_whose_failures_are_mostly_no_action_is_a_fake_score() -> None:
    rows = [episode()] + [episode(action=None, reward=0, answer="I see a shape", parse_error="no action")] * 6 + \
        [episode(reward=0, assertions=[{"check": "x", "passed": False}])]
    result = check_episodes(json.dumps(r) for r in rows)
    assert (result.n, result.successes, result.parse_failures, result.errors) == (8, 1, 6, 0)
    assert [p.code for p in result.problems] == ["parse_failures"] and result.problems[0].severity == "error"
    assert summarize(rows)["parse_failures"] == 6  # the stage's own summary counts alike


def test_screenshots_over_the_cap_and_browser_errors_are_said() -> None:
    rows = [episode(sent=[1600, 1000]), episode(error="the page crashed its renderer: Page crashed", reward=0,
                                                  action=None, sent=None), episode()]
    result = check_episodes([json.dumps(r) for r in rows] + ["not json", "[]", "{\"x\": 1"])
    codes = {p.code: p for p in result.problems}
    assert set(codes) == {"screenshot_over_cap", "cu_errors", "malformed"}
    assert result.largest_over == (1600, 1000) and "crashed its renderer" in codes["cu_errors"].message
    assert result.malformed == 3 and result.n == 3


def test_a_good_run_has_no_problems_and_an_empty_file_has_no_episodes() -> None:
    assert check_episodes([json.dumps(episode())] * 3).problems == ()
    assert [p.code for p in check_episodes([]).problems] == ["no_episodes"]


@given(lines=st.lists(st.one_of(st.text(max_size=200), JSON.map(json.dumps),
                                st.dictionaries(st.sampled_from(["task", "assertions", "reward", "error", "action",
                                                                 "sent"]), JSON).map(json.dumps)), max_size=30))
@settings(max_examples=300)
def test_any_episodes_file_is_checked_without_raising(lines: list[str]) -> None:
    result = check_episodes(lines)
    assert result.n + result.malformed <= len(lines)
    looks_like_episodes(lines)
    json.dumps(result.to_json())


def test_check_eval_reads_episodes_from_the_cli(tmp_path: Path) -> None:
    bad = tmp_path / "episodes.jsonl"
    bad.write_text("".join(json.dumps(episode(action=None, reward=0, answer="no idea")) + "\n" for _ in range(4)))
    r = run_cli("check", "eval", str(bad), "--json")
    shown = json.loads(r.stdout)
    assert r.returncode == 1 and shown["format"] == "episodes" and shown["parse_failures"] == 4
    assert [p["code"] for p in shown["problems"]] == ["parse_failures"]
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps(episode()) + "\n")
    r = run_cli("check", "eval", str(good))
    assert r.returncode == 0 and "success_rate 100.0 %" in r.stdout and "no problems found" in r.stdout


def test_a_cu_runs_summary_is_an_eval_pane_row_with_its_own_figures() -> None:
    summary = {"n": 28, "successes": 12, "success_rate": 0.4286, "parse_failures": 15, "errors": 1}
    run = eval_run(Report("runs/cu/*/summary.json", "/w/runs/cu/rft-1-after/summary.json", 5.0, json.dumps(summary)))
    assert (run.kind, run.name, run.accuracy, run.parse_failures, run.errors) == ("cu", "rft-1-after", 0.4286, 15, 1)
    assert run.items == "/w/runs/cu/rft-1-after/episodes.jsonl"
    from samai.widgets.evals import _figures

    assert _figures(run) == ("cu", "42.9 %", "15 no action, 0 missed, 1 error (no actions?)")


# ---------------------------------------------------------------- the browser, before the stage is fired


def vlm(tmp_path: Path) -> config.Config:
    return replace(config.load_builtin("vlm-tiny"), workspace=str(tmp_path))


def test_the_stages_that_drive_a_browser_and_what_they_look_for(tmp_path: Path) -> None:
    cfg = vlm(tmp_path)
    assert [s.name for s in browser_stages(cfg)] == ["cu_eval", "rft"]
    assert browser_names(cfg)[0] == "chromium-headless-shell" and set(browser_names(cfg)) <= set(declared_binaries(cfg))
    named = replace(cfg, stages=tuple(replace(s, command=s.command + " --browser /opt/chrome/chrome")
                                      if s.name == "cu_eval" else s for s in cfg.stages))
    assert "/opt/chrome/chrome" in browser_names(named)
    assert browser_stages(config.load_builtin("tiny")) == []


async def _snapshot_with_path(cfg: config.Config, path: str, monkeypatch) -> object:
    monkeypatch.setenv("PATH", path)  # the probe, started from here, looks on this PATH
    box = Box(LocalTransport(), cfg.workspace, python=sys.executable)
    try:
        return await box.snapshot(binaries=declared_binaries(cfg))
    finally:
        await box.close()


async def test_a_missing_browser_is_doctors_finding_and_the_dialogs_blocker(tmp_path: Path, monkeypatch) -> None:
    cfg = vlm(tmp_path)
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    snap = await _snapshot_with_path(cfg, str(empty), monkeypatch)
    (found,) = [f for f in detect(cfg, snap) if f.code == "browser_missing"]
    assert "cu_eval, rft" in found.message and "apt-get install chromium-headless-shell" in found.message
    assert not [f for f in detect(cfg, snap) if f.code == "binary_missing" and "chrom" in f.message]
    blockers = [c.text for c in preflight(cfg, snap, cfg.stage("cu_eval")).checks if c.severity == "error"]
    assert any("no headless Chromium" in t for t in blockers)
    assert not [c for c in preflight(cfg, snap, cfg.stage("eval")).checks if "Chromium" in c.text]

    with_one = tmp_path / "bin"
    with_one.mkdir()
    browser = with_one / "chromium"
    browser.write_text("#!/bin/sh\n")
    browser.chmod(0o755)
    snap = await _snapshot_with_path(cfg, str(with_one), monkeypatch)
    assert browser_missing(cfg, snap) == []
    assert not [c for c in preflight(cfg, snap, cfg.stage("cu_eval")).checks if "Chromium" in c.text]


def test_doctor_json_says_browser_missing(tmp_path: Path) -> None:
    cfg_file = tmp_path / "vlm.toml"
    (tmp_path / "ws").mkdir()
    cfg_file.write_text(config.builtin_text("vlm-tiny") + f'\n[workspace]\npath = "{tmp_path / "ws"}"\n')
    r = run_cli("--config", str(cfg_file), "doctor", "--json", env={"PATH": str(tmp_path / "ws")})
    codes = [f["code"] for f in json.loads(r.stdout)["findings"]]
    assert "browser_missing" in codes and r.returncode != 0


def test_cu_eval_without_a_browser_says_how_to_get_one(tmp_path: Path) -> None:
    from tests.box_tools import stage_argv, stage_env

    r = subprocess.run(stage_argv("stages.cu_eval", "--url", "http://127.0.0.1:9", "--tasks", "t.jsonl", "--out", "o",
                                  "--browser", str(tmp_path / "no-such-browser")),
                       cwd=tmp_path, env=stage_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "CU_EVAL_RC=2" in r.stdout and "apt-get install chromium-headless-shell" in r.stdout
    assert not (tmp_path / "o").exists()  # nothing was written


def test_the_rft_round_serves_what_it_makes_and_is_no_serve_stage_to_check_for_its_projector(tmp_path: Path) -> None:
    from samai.console.core.mmproj import projector_stage

    cfg = vlm(tmp_path)
    assert projector_stage(cfg, cfg.stage("rft")) is None  # its own model and projector, made in the round
    assert projector_stage(cfg, cfg.stage("serve")) is not None
    blind = replace(cfg.stage("serve"), command=cfg.stage("serve").command.replace(
        " --mmproj gguf/vlm-mmproj-f16.gguf", ""))
    assert projector_stage(cfg, blind) is not None and projector_stage(cfg, blind).mmproj is None


def test_the_budget_counts_the_cu_runs_and_the_rounds_folder(tmp_path: Path) -> None:
    cfg = vlm(tmp_path)
    assert {"cu_runs", "rft"} <= {a.name for a in cfg.artifacts}
    assert "rft" in cfg.stage("rft").makes and cfg.artifact("rft").path == "runs/rft"


@pytest.mark.parametrize("pipeline", ["vlm-tiny", "samai-vl"])
def test_the_shipped_cu_eval_and_rft_commands_parse(pipeline: str) -> None:
    import shlex

    from samai.remote.box.stages import cu_eval, rft

    cfg = config.load_builtin(pipeline)
    for name, stage_parser in (("cu_eval", cu_eval.parser()), ("rft", rft.parser())):
        words = shlex.split(cfg.stage(name).command)
        args = stage_parser.parse_args(words[words.index(f"samai_box.stages.{name}") + 1:])
        assert args.tasks == "data/cu/tasks.jsonl" and args.url.endswith(str(cfg.stage("serve").ports[0]))
    assert args.samples == 8 and args.port == cfg.stage("rft").ports[0]
    assert "--smoke-image" in args.serve_arg  # the round's server is smoke-tested as the pipeline's is
