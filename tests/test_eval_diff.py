"""`eval diff` (console/core/evals/diff.py, console/cli_runs.py): two runs' items compared, the change
judged against noise with intervals checked against published values, untrusted files fuzzed,
and the command on a workspace of the box."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from samai.console.app import SamaiApp
from samai.console.core import config
from samai.console.core.evals.diff import diff, mcnemar_exact, paired_interval, read_run, wilson
from samai.console.screens.dialogs import EvalDiffScreen
from samai.remote.boxapi import Box
from samai.widgets.evals import EvalTable
from tests.helpers import pilot_until, run_cli
from tests.replay_transport import ReplayTransport

HOSTILE = "[b]x[/b] \x1b]0;pwned\x07 [@click=app.quit]"


def item(i: object, gold: str, pred: str | None, *, correct: bool | None = None, finish: str = "stop",
         reasoning: str = "") -> str:
    row = {"id": i, "prompt": f"q{i}", "gold": gold, "pred": pred, "finish_reason": finish,
           "content": pred or "", "reasoning_content": reasoning}
    if correct is not None:
        row["correct"] = correct
    return json.dumps(row)


def test_the_paired_interval_matches_newcombe_s_published_example() -> None:
    """Newcombe's square-and-add interval for paired proportions, on the table the contingencytables
    R package tests it with (Cavo et al. 2012: 59 both, 6 first only, 16 second only, 80 neither):
    estimate -0.0621, 95 % CI -0.1186 to -0.0046 for first minus second; ours is second minus first."""
    low, high = paired_interval(59, 6, 16, 80)
    assert (round(low, 4), round(high, 4)) == (0.0046, 0.1186)
    flipped = paired_interval(59, 16, 6, 80)
    assert flipped == pytest.approx((-high, -low))


def test_wilson_and_mcnemar_by_hand() -> None:
    assert wilson(0, 10)[0] == 0 and round(wilson(0, 10)[1], 4) == 0.2775  # the textbook 0/10 upper bound
    assert mcnemar_exact(6, 16) == pytest.approx(2 * 110056 / 2**22)  # sum of C(22, 0..6), both tails
    assert mcnemar_exact(0, 0) == 1.0 and mcnemar_exact(5, 5) == 1.0
    assert 0 < mcnemar_exact(50_000, 51_000) < 0.01  # thousands of changed items: no overflow


def test_88_to_90_percent_on_64_items_is_noise_and_a_big_change_is_not() -> None:
    a = read_run("a", [item(i, "1", "1" if i >= 8 else "0") for i in range(64)])  # 56/64 right
    b = read_run("b", [item(i, "1", "1" if i >= 6 else "0") for i in range(64)])  # 58/64 right
    d = diff(a, b)
    assert (round(a.accuracy * 100), round(b.accuracy * 100)) == (88, 91) and d.noise is True
    worse = read_run("c", [item(i, "1", "1" if i >= 40 else "0") for i in range(64)])
    assert diff(a, worse).noise is False and diff(a, worse).delta == pytest.approx(-32 / 64)


def test_each_kind_of_change_is_listed() -> None:
    a = read_run("a", [item(1, "4", "4"), item(2, "5", "6"), item(3, "7", "7"), item(4, "8", "8"),
                       item(5, "9", "9"), item(6, "1", "1"), "not json", item(7, "2", "2")])
    b = read_run("b", [item(1, "4", "3"), item(2, "5", "5"), item(3, "7", "", correct=False),
                       item(4, "8", "8", finish="length"), item(5, "9", None, reasoning="so it is 9"),
                       item(8, "3", "3"), item(8, "3", "x")])
    d = diff(a, b)
    j = d.to_json()
    assert j["right_to_wrong"] == ["1", "3", "5"] and j["wrong_to_right"] == ["2"]
    assert j["became_empty"] == ["3", "5"] and j["became_truncated"] == ["4"] and j["only_in_reasoning"] == ["5"]
    assert j["only_in_a"] == ["6", "7"] and j["only_in_b"] == ["8"]
    assert (j["unreadable"], j["duplicates"]) == ({"a": 1, "b": 0}, {"a": 0, "b": 1})
    assert j["items"]["right_to_wrong"][0] == {"id": "1", "gold": "4", "a": "4", "b": "3"}
    assert j["accuracy_a"] == pytest.approx(6 / 7) and j["paired"] == 5
    assert j["delta"] == pytest.approx((1 - 3) / 5) and j["interval"][0] <= j["delta"] <= j["interval"][1]


LINES = st.lists(st.one_of(
    st.text(max_size=80),
    st.builds(json.dumps, st.dictionaries(st.sampled_from(["id", "gold", "pred", "correct", "finish_reason",
                                                           "reasoning_content", "x"]),
                                          st.one_of(st.none(), st.booleans(), st.integers(), st.floats(),
                                                    st.text(max_size=30), st.lists(st.integers(), max_size=3)),
                                          max_size=7)),
    st.builds(item, st.integers(0, 20), st.sampled_from(["1", "2", ""]), st.sampled_from(["1", "2", "", None]))),
    max_size=40)


@given(LINES, LINES)
@settings(max_examples=200, deadline=None)
def test_any_two_files_give_a_diff(a: list[str], b: list[str]) -> None:
    d = diff(read_run("a", a), read_run("b", b))
    json.dumps(d.to_json())
    if d.interval is not None:
        assert -1 <= d.interval[0] <= d.delta <= d.interval[1] <= 1 and 0 <= d.p_value <= 1


def _runs(workspace: Path) -> None:
    for name, preds in (("before", ["4", "5", "0"]), ("after", ["4", "0", "6"])):
        folder = workspace / "runs" / "eval" / name
        folder.mkdir(parents=True)
        rows = [item(i, g, p) for i, (g, p) in enumerate(zip(["4", "5", "6"], preds, strict=True))]
        rows.append(item(HOSTILE, "1", HOSTILE))
        (folder / "items.jsonl").write_text("\n".join(rows) + "\n")


def test_the_command_by_names_and_by_folder(tmp_path: Path, workspace: Path) -> None:
    _runs(workspace)
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[workspace]\npath = "{workspace}"\n')
    r = run_cli("--config", str(cfg), "eval", "diff", "before", "runs/eval/after", "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert (got["right_to_wrong"], got["wrong_to_right"], got["paired"]) == (["1"], ["2"], 4)
    text = run_cli("--config", str(cfg), "eval", "diff", "before", "after").stdout
    assert "right → wrong: 1" in text and "within noise" in text and "\x1b" not in text and "\x07" not in text
    missing = run_cli("--config", str(cfg), "eval", "diff", "before", "nope")
    assert missing.returncode == 2 and "eval run 'nope': no " in missing.stderr and "items.jsonl" in missing.stderr


async def test_d_in_the_eval_pane_diffs_the_run_under_the_cursor_with_the_one_before(
        recorded_box: ReplayTransport) -> None:
    """The recorded box's two runs (smoke-0, the fake 0 %, then smoke-1), their items on the box."""
    recorded_box.write_log("runs/eval/smoke-0/items.jsonl", "\n".join(
        [item(1, "4", ""), item(2, "5", ""), item(HOSTILE, "6", "6")]) + "\n")
    recorded_box.write_log("runs/eval/smoke-1/items.jsonl", "\n".join(
        [item(1, "4", "4"), item(2, "5", "5"), item(HOSTILE, "6", "7")]) + "\n")
    tiny = config.load_builtin("tiny")
    cfg = replace(tiny, workspace=recorded_box.workspace, target=replace(tiny.target, poll_interval=0.05))
    app = SamaiApp(cfg, open_box=lambda _cfg: Box(recorded_box, recorded_box.workspace))
    async with app.run_test(size=(150, 48)) as pilot:
        table = app.box_screen.query_one(EvalTable)
        await pilot_until(pilot, lambda: table.row_count == 2)
        table.focus()
        table.move_cursor(row=0)
        await pilot.press("d")
        shown = await pilot_until(pilot, lambda: isinstance(app.screen, EvalDiffScreen) and app.screen.report)
        assert "eval diff smoke-0 → smoke-1" in shown and "wrong → right: 2" in shown and "right → wrong: 1" in shown
        assert "\x1b" not in shown and "\x07" not in shown
        await pilot.press("escape")
        table.move_cursor(row=1)  # the oldest run has none before it: said, nothing opened
        await pilot.press("d")
        await pilot.pause(0.2)
        assert not isinstance(app.screen, EvalDiffScreen)
