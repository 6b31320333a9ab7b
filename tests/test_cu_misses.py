"""A computer-use run's failed answers told apart (issue 47): an answer in the action format that
names no element on the page (a misspelt name: "gren", "click yele") is an action that missed,
and a low score made of those is a real one; an answer that is no action at all is the format
problem, the computer-use fake 0 %. Each episode here is recorded by the stage's own code
(cu_eval.answered, on vlm-tiny's own task file), and judged by `check eval` as a user runs it and
by the detectors `doctor` runs on the box."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from samai.console.core.evals.cucheck import check_episodes
from samai.console.core.evals.runs import eval_run
from samai.remote.box.stages import cu_eval, vision
from samai.remote.box.stages.webtasks import (
    ACTION,
    MISSED,
    NO_ACTION,
    Task,
    answer_kind,
    read_answer,
    read_tasks,
    summarize,
)
from samai.remote.model import Report
from tests.helpers import run_cli

# What vlm-tiny answered on its run: the right colour, another colour, misspelt and blended names
# (in the action format, naming no button of the page), and answers that are no action at all.
MISSES = ("gren", "yele", "orple", "purplurple", "Gren.", "click gren", "press the yele button", "tap orple",
          "<think>green?</think> gren")
NOT_ACTIONS = ("", "I see a shape", "the colour is unclear", "no idea", "<think>click gren</think>",
               "it is a square")


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> Task:
    folder = tmp_path_factory.mktemp("vlm")
    vision.write_cu_tasks(str(folder))
    first = next(read_tasks(str(folder / "cu" / "tasks.jsonl")))
    assert isinstance(first, Task)
    return first


def recorded(task: Task, answer: str, *, legacy: bool = False) -> dict:
    """One episode's record as cu_eval writes it: its answer read by the stage's own code, the
    task's assertions passing only for the right button (legacy: as recorded before an episode
    said its answer_kind)."""
    row = cu_eval.blank_row(0, task)
    action = cu_eval.answered(row, answer, task)
    passed = action is not None and action.element == task.checks[0].expected
    row.update(sent=[224, 224], original=[224, 224], seconds=0.5,
               assertions=[{"check": c.check, "passed": passed, "actual": None, "wait_s": 0.0} for c in task.checks],
               reward=int(passed))
    if legacy:
        del row["answer_kind"]
    return row


def wrong(task: Task) -> str:
    return next(e.name for e in task.elements if e.name != task.checks[0].expected)


@pytest.mark.parametrize("answer", MISSES)
def test_an_action_naming_no_element_on_the_page_is_a_miss(task: Task, answer: str) -> None:
    read = read_answer(answer, task)
    assert (read.action, read.kind) == (None, MISSED) and "no such element" in (read.error or "")
    assert answer_kind(answer) == MISSED  # told alike without the task (an episode that does not say it)


@pytest.mark.parametrize("answer", NOT_ACTIONS)
def test_an_answer_that_is_no_action_at_all_is_told_apart(task: Task, answer: str) -> None:
    read = read_answer(answer, task)
    assert (read.action, read.kind) == (None, NO_ACTION) and answer_kind(answer) == NO_ACTION


def test_an_action_the_page_takes_is_an_action(task: Task) -> None:
    for answer in (task.checks[0].expected, f"press the {wrong(task)} button"):
        assert read_answer(answer, task).kind == ACTION


@given(answer=st.text(max_size=200) | st.lists(st.sampled_from(MISSES + NOT_ACTIONS + ("click", "the", "x")),
                                                 max_size=4).map(" ".join))
@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_answer_has_one_kind_and_the_shape_tells_it_where_no_name_is_said(task: Task, answer: str) -> None:
    read = read_answer(answer, task)
    assert read.kind in (ACTION, MISSED, NO_ACTION) and (read.action is None) == (read.kind != ACTION)
    if read.kind != ACTION and not any(task.element(w.lower()) for w in answer.replace("<", " ").split()):
        assert answer_kind(answer) == read.kind


KINDS = st.sampled_from(["right", "wrong", "missed", "no_action"])


# An episode of a run: what kind of answer, which of that kind, recorded before episodes said their kind.
EPISODES = st.lists(st.tuples(KINDS, st.integers(0, 20), st.booleans()), min_size=1, max_size=40)


def _answer(task: Task, kind: str, index: int) -> str:
    pick = {"right": (task.checks[0].expected,), "wrong": (wrong(task),), "missed": MISSES, "no_action": NOT_ACTIONS}
    return pick[kind][index % len(pick[kind])]


def _expected_code(kinds: list[str]) -> str | None:
    """What `check eval` must say of such a run: most failures no action of their task, worded by
    which kind most of them are (a tie: the format, the stricter reading); else nothing."""
    failed = len([k for k in kinds if k != "right"])
    missed, none = kinds.count("missed"), kinds.count("no_action")
    if not failed or missed + none <= failed / 2:
        return None
    return "missed_actions" if missed > none else "parse_failures"


@given(episodes=EPISODES)
@settings(max_examples=200, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_a_run_s_failures_are_judged_by_which_kind_they_are(task: Task, episodes: list[tuple[str, int, bool]]) -> None:
    kinds = [kind for kind, _, _ in episodes]
    rows = [recorded(task, _answer(task, kind, i), legacy=old) for kind, i, old in episodes]
    result = check_episodes(json.dumps(r) for r in rows)
    assert (result.n, result.successes, result.missed, result.no_action) == (
        len(kinds), kinds.count("right"), kinds.count("missed"), kinds.count("no_action"))
    codes = {p.code: p for p in result.problems}
    assert [c for c in codes if c in ("missed_actions", "parse_failures")] == [
        c for c in [_expected_code(kinds)] if c]
    if "missed_actions" in codes:
        p = codes["missed_actions"]
        assert p.severity == "warning" and "real low score" in p.message and "fake" not in p.message.split("not")[0]
        assert "the model acts and misses" in p.message and "fix the prompt" not in p.message
    if "parse_failures" in codes:
        p = codes["parse_failures"]
        assert p.severity == "error" and "does not speak the action format" in p.message
    said = [row for row in rows if "answer_kind" in row]  # the stage's own summary counts alike
    assert summarize(said)["missed"] == sum(1 for kind, _, old in episodes if kind == "missed" and not old)


def _write(path: Path, task: Task, answers: list[str]) -> Path:
    path.write_text("".join(json.dumps(recorded(task, a)) + "\n" for a in answers))
    return path


def _vlm_tiny_run(task: Task) -> list[str]:
    """vlm-tiny's cu_eval as it went: 28 episodes, 6 right (21.4 %), the rest mostly misspelt names."""
    return [task.checks[0].expected] * 6 + [wrong(task)] * 5 + ["gren", "yele", "orple", "click gren"] * 4 + \
        ["I see a shape"]


def test_check_eval_says_a_run_of_misspelt_names_is_a_real_low_score(task: Task, tmp_path: Path) -> None:
    r = run_cli("check", "eval", str(_write(tmp_path / "episodes.jsonl", task, _vlm_tiny_run(task))), "--json")
    shown = json.loads(r.stdout)
    assert r.returncode == 0, r.stdout + r.stderr  # a warning: the score is real
    assert (shown["n"], shown["successes"], shown["parse_failures"], shown["missed"], shown["no_action"]) == (
        28, 6, 17, 16, 1)
    [problem] = shown["problems"]
    assert problem["code"] == "missed_actions" and problem["severity"] == "warning"
    assert '"gren", "yele", "orple"' in problem["message"] and "not a fake one" in problem["message"]
    assert "fix the prompt" not in problem["message"] and "1 more answered no action at all" in problem["message"]
    text = run_cli("check", "eval", str(tmp_path / "episodes.jsonl"))
    assert "missed 16" in text.stdout and "no_action 1" in text.stdout and "missed_actions" in text.stdout


def test_check_eval_says_a_run_of_answers_that_are_no_action_is_the_format(task: Task, tmp_path: Path) -> None:
    answers = [task.checks[0].expected] * 2 + ["I see a shape", "the colour is unclear"] * 8 + ["gren"] * 3
    r = run_cli("check", "eval", str(_write(tmp_path / "episodes.jsonl", task, answers)), "--json")
    shown = json.loads(r.stdout)
    assert r.returncode == 1 and (shown["missed"], shown["no_action"]) == (3, 16)
    [problem] = shown["problems"]
    assert problem["code"] == "parse_failures" and problem["severity"] == "error"
    assert "does not speak the action format" in problem["message"] and "fix the prompt" in problem["message"]
    assert "3 more were actions naming no element on the page" in problem["message"]


@given(episodes=EPISODES)
@settings(max_examples=6, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
def test_check_eval_on_any_mix_from_the_command_line(task: Task, tmp_path_factory: pytest.TempPathFactory,
                                                    episodes: list[tuple[str, int, bool]]) -> None:
    path = tmp_path_factory.mktemp("mix") / "episodes.jsonl"
    path.write_text("".join(json.dumps(recorded(task, _answer(task, kind, i), legacy=old)) + "\n"
                            for kind, i, old in episodes))
    r = run_cli("check", "eval", str(path), "--json")
    shown = json.loads(r.stdout)
    expected = _expected_code([kind for kind, _, _ in episodes])
    assert [p["code"] for p in shown["problems"]] == ([expected] if expected else [])
    assert r.returncode == (1 if expected == "parse_failures" else 0)


def _doctor(tmp_path: Path, task: Task, answers: list[str]) -> dict[str, dict]:
    """doctor --json on a workspace holding one cu run (its summary, as the stage writes it, and
    its episodes): the findings by code."""
    ws = tmp_path / "ws"
    run = ws / "runs" / "cu" / "vlm-tiny"
    run.mkdir(parents=True)
    rows = [recorded(task, a) for a in answers]
    (run / "episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "summary.json").write_text(json.dumps(summarize(rows)))
    cfg = tmp_path / "samai.toml"
    cfg.write_text(f'[workspace]\npath = "{ws}"\n[stages.job]\nkey = "j"\ncommand = "true"\n')
    r = run_cli("--config", str(cfg), "doctor", "--json")
    return {f["code"]: f for f in json.loads(r.stdout)["findings"]}


def test_doctor_raises_the_finding_that_fits_the_run(task: Task, tmp_path: Path) -> None:
    found = _doctor(tmp_path / "misses", task, _vlm_tiny_run(task))
    assert "parse_failures" not in found and found["missed_actions"]["severity"] == "warning"
    assert "real low score" in found["missed_actions"]["message"]
    found = _doctor(tmp_path / "prose", task, ["I see a shape"] * 10 + [task.checks[0].expected])
    assert "missed_actions" not in found and found["parse_failures"]["severity"] == "error"


def test_the_eval_pane_counts_each_kind() -> None:
    from samai.widgets.evals import _figures

    summary = {"n": 28, "successes": 6, "success_rate": 0.2143, "parse_failures": 17, "missed": 16, "errors": 0}
    run = eval_run(Report("runs/cu/*/summary.json", "/w/runs/cu/vlm-tiny/summary.json", 5.0, json.dumps(summary)))
    assert run.missed == 16 and _figures(run) == ("cu", "21.4 %", "1 no action, 16 missed, 0 errors")
    summary.update(missed=0)
    run = eval_run(Report("runs/cu/*/summary.json", "/w/runs/cu/vlm-tiny/summary.json", 5.0, json.dumps(summary)))
    assert _figures(run) == ("cu", "21.4 %", "17 no action, 0 missed, 0 errors (no actions?)")
