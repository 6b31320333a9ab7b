"""The training-log parser: real transformers-5 output, 4.x dicts, DeepSpeed, noise, and the anomaly contract."""

from __future__ import annotations

import dataclasses
import json
import math
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from samai.console.core import checks
from samai.console.core.chunked_lines import PIECE, PieceDecoder
from samai.console.core.config import load_builtin
from samai.console.core.state import ConsoleState
from samai.console.core.training.feed import TrainingFeed
from samai.console.core.training.trainlog import (
    MAX_ENTRY,
    MAX_PINNED,
    MAX_POINTS,
    MAX_REPORTS,
    SEVERITY,
    HistoryStream,
    TrainLogCheck,
    TrainLogParser,
    TrainLogResult,
    TrainPoint,
    check_trainlog,
    check_trainlog_path,
    has_errors,
    parse_trainer_state,
)
from samai.remote.boxapi import Box
from tests.replay_transport import new_points

DATA = Path(__file__).parent / "data"
REAL_LOG = (DATA / "trainer_v5_tiny.log").read_text()
REAL_STATE = (DATA / "trainer_state_tiny.json").read_text()


def codes(result_or_anomalies) -> list[str]:
    anomalies = result_or_anomalies.problems if isinstance(result_or_anomalies, TrainLogResult) else result_or_anomalies
    return [a.code for a in anomalies]


def dict_line(loss, grad_norm=1.0, lr=1e-4, epoch=0.1) -> str:
    return f"{{'loss': {loss}, 'grad_norm': {grad_norm}, 'learning_rate': {lr}, 'epoch': {epoch}}}"


def same_3_digits(a: float, b: float) -> bool:
    return a == b or math.isclose(a, b, rel_tol=5e-3)


# ------------------------------------------------------------------ the real run


def test_the_real_transformers_5_log_matches_its_trainer_state() -> None:
    result = check_trainlog(REAL_LOG)
    history = [e for e in json.loads(REAL_STATE)["log_history"] if "loss" in e]
    assert [p.step for p in result.points] == list(range(1, 13)) == [e["step"] for e in history]
    for point, entry in zip(result.points, history, strict=True):
        for name in ("loss", "grad_norm", "learning_rate", "epoch"):
            assert same_3_digits(getattr(point, name), entry[name]), (point, entry, name)
    assert result.problems == () and not has_errors(result)
    assert result.summary["train_loss"] == 1.538 and result.summary["train_runtime"] == 0.2835
    # four lines (LoRA banner, a DeepSpeed warning, a transformers notice, TRAIN_DONE) hold no record
    assert result.lines == 17 and result.unparsed == 4


def test_trainer_state_gives_exact_points_and_is_recognised_as_a_state_file() -> None:
    points = parse_trainer_state(REAL_STATE)
    assert [p.step for p in points] == list(range(1, 13))
    assert points[0] == TrainPoint(1, 3.4853992462158203, 10.622142791748047, 0.0, 0.25)
    for text in (REAL_STATE, REAL_STATE.splitlines()):  # the CLI hands over lines
        result = check_trainlog(text)
        assert len(result.points) == 12 and result.problems == () and result.unparsed == 0


@pytest.mark.parametrize("nan, inf", [("NaN", "Infinity"), ("nan", "inf")])
def test_trainer_state_with_non_finite_tokens(nan: str, inf: str) -> None:
    state = ('{"global_step": 3, "best_model_checkpoint": "runs/nan", "log_history": [\n'
             f'  {{"loss": 2.5, "grad_norm": {inf}, "learning_rate": 1e-4, "epoch": 0.1, "step": 1}},\n'
             f'  {{"loss": {nan}, "grad_norm": -{inf}, "learning_rate": 1e-4, "epoch": 0.2, "step": 2}},\n'
             '  {"eval_loss": 2.0, "epoch": 0.2, "step": 2},\n'
             '  {"train_runtime": 9.5, "train_loss": 2.4, "epoch": 0.2, "step": 2}]}')
    points = parse_trainer_state(state)
    assert [p.step for p in points] == [1, 2]
    assert math.isinf(points[0].grad_norm) and math.isnan(points[1].loss) and points[1].grad_norm == -math.inf
    result = check_trainlog(state)
    assert codes(result) == ["nan_grad_norm", "nan_loss"]
    assert result.summary["train_loss"] == 2.4
    json.dumps(result.to_json(), allow_nan=False)


def test_a_broken_trainer_state_says_so() -> None:
    with pytest.raises(ValueError, match="trainer_state"):
        parse_trainer_state('{"log_history": [{"loss": 1.0, "st')


def test_the_state_file_replaces_the_logs_rounded_points_for_its_steps() -> None:
    log = REAL_LOG + dict_line(0.3) + "\n"  # a 13th step logged after the checkpoint
    result = check_trainlog(log, trainer_state=REAL_STATE)
    assert [p.step for p in result.points] == list(range(1, 14))
    assert result.points[0].loss == 3.4853992462158203 and result.points[12].loss == 0.3
    assert result.problems == ()


# ------------------------------------------------------------------ line forms


def test_transformers_4_lines_with_nan_inf_and_tensor_values() -> None:
    parser = TrainLogParser()
    points = parser.feed([
        "{'loss': 1.0778, 'grad_norm': 2.5, 'learning_rate': 2e-05, 'epoch': 0.1}",
        "{'loss': 1.01, 'grad_norm': tensor(1091.0826, device='cuda:0'), 'learning_rate': 2e-05, 'epoch': 0.2}",
        "{'loss': tensor(0.98), 'grad_norm': inf, 'learning_rate': 2e-05, 'epoch': 0.3}",
        "{'loss': 0.97, 'grad_norm': -inf, 'learning_rate': np.float64(2e-05), 'epoch': 0.4}",
        "{'loss': nan, 'grad_norm': nan, 'learning_rate': 2e-05, 'epoch': 0.5}",
        "{'loss': '0.8897', 'grad_norm': '1.14', 'learning_rate': '0.00111', 'epoch': '47.5', 'step': 40}",
        "{'loss': 0.88, 'epoch': 47.6}",
    ])
    assert [p.step for p in points] == [1, 2, 3, 4, 5, 40, 41]  # 'step' resets the count
    assert points[0] == TrainPoint(1, 1.0778, 2.5, 2e-05, 0.1) and not points[0].bad
    assert points[1].grad_norm == 1091.0826 and not points[1].bad
    assert points[2].loss == 0.98 and points[2].grad_norm == math.inf and points[2].bad
    assert points[3].grad_norm == -math.inf and points[3].learning_rate == 2e-05
    assert math.isnan(points[4].loss)
    assert points[5] == TrainPoint(40, 0.8897, 1.14, 0.00111, 47.5)
    assert points[6].grad_norm is None
    assert codes(parser.anomalies) == ["nan_grad_norm", "nan_loss"]  # each once, at its first step
    assert [a.step for a in parser.anomalies] == [3, 5]


def test_eval_lines_and_the_summary_are_not_steps() -> None:
    result = check_trainlog([
        dict_line(1.5),
        "{'eval_loss': 1.4, 'eval_runtime': 3.1, 'eval_samples_per_second': 10.0, 'epoch': 1.0}",
        dict_line(1.3),
        "{'train_runtime': 12.3, 'train_samples_per_second': 5.5, 'train_loss': 1.4, 'epoch': 1.0}",
    ])
    assert [p.step for p in result.points] == [1, 2]
    assert result.summary == {"train_runtime": 12.3, "train_samples_per_second": 5.5, "train_loss": 1.4,
                                 "epoch": 1.0}
    assert result.unparsed == 0


def test_tqdm_segments_and_ansi_escapes() -> None:
    bar = "".join(f"\r {i}%|\u2588         | {i}/100 [00:0{i % 10}<00:10, 9.5it/s]" for i in range(30))
    lines = [
        bar,
        bar + "\r" + " " * 40 + "\r" + dict_line(2.0) + "\r" + bar,  # tqdm.write over a live bar
        "\x1b[A\x1b[32m" + dict_line(1.9) + "\x1b[0m",
        f"\r 5%|\x1b[A | 5/100 \r{dict_line(1.8)}\r{dict_line(1.7)}",  # two records on one line
    ]
    result = check_trainlog(lines)
    assert [(p.step, p.loss) for p in result.points] == [(1, 2.0), (2, 1.9), (3, 1.8), (4, 1.7)]
    assert result.lines == 4 and result.unparsed == 1  # the bare bar


def test_garbage_truncated_and_binary_lines_are_counted_never_raised() -> None:
    lines = [
        "junk \x00\ufffd\ufffd {not a dict",
        "{'loss': 1.07, 'grad_no",  # truncated by a crash
        "{'loss': 'abc', 'epoch': 1}",
        "{'loss': }",
        "\ufffd\ufffd\x7fELF\x02\x01\x01" + "\x00" * 20,
        "steps: x loss: y",
        "step=, skipped=",
        "",
        "   ",
        "loss" * 1000,
        "{" * 500 + "'loss'" + "}" * 500,
        dict_line(1.0),
    ]
    result = check_trainlog(lines)
    assert [p.step for p in result.points] == [1]
    assert result.lines == 12 and result.unparsed == 9  # blank lines are not unparsed
    assert result.problems == ()


# ------------------------------------------------------------------ DeepSpeed


def test_deepspeed_steps_progress_and_a_lone_overflow() -> None:
    parser = TrainLogParser()
    points = parser.feed([
        "[2024-05-01 10:00:00,000] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! Rank 0 "
        "Skipping step. Attempted loss scale: 65536, reducing to 32768",
        "steps: 20 loss: 0.8397 iter time (s): 0.312 samples/sec: 102.6",
        "steps: 30 loss: 0.8100 iter time (s): 0.310 samples/sec: 103.1",
        "[2024-05-01 10:00:09,000] [INFO] [logging.py:96:log_dist] [Rank 0] step=40, skipped=1, "
        "lr=[0.0001], mom=[(0.9, 0.999)]",
        dict_line(0.80),  # the Trainer's dict for the step DeepSpeed just announced
        dict_line(0.79),
    ])
    assert [(p.step, p.loss) for p in points] == [(20, 0.8397), (30, 0.81), (40, 0.8), (41, 0.79)]
    [overflow] = parser.anomalies
    assert (overflow.code, overflow.severity, overflow.step) == ("overflow_skip", "warning", 1)
    assert "65536 → 32768" in overflow.message
    assert parser.overflow_skips == 1 and parser.unparsed == 0


def test_overflows_in_a_row_warn_again_and_the_minimum_scale_is_an_error() -> None:
    scale = 2 ** 16
    lines = [dict_line(1.0)]
    for _ in range(6):  # logged every step: each overflow is followed by its step's dict
        lines.append(f"OVERFLOW! Rank 0 Skipping step. Attempted loss scale: {scale}, reducing to {scale // 2}")
        lines.append(dict_line(1.0))
        scale //= 2
    lines += ["[deepspeed] fp16 dynamic loss scale overflow! Skipping step. Attempted loss scale: 1024.0, "
              "but hysteresis is 2. Reducing hysteresis to 1"] * 2
    lines += ["Current loss scale already at minimum - cannot decrease scale anymore. Exiting run."] * 3
    result = check_trainlog(lines)
    assert codes(result) == ["overflow_skip", "overflow_skip", "loss_scale_min"]
    first, streak, minimum = result.problems
    assert first.step == 2 and streak.step == 6 and "5 steps in a row" in streak.message
    assert minimum.severity == "error" and has_errors(result)
    assert result.unparsed == 0


def test_overflows_far_apart_are_not_a_streak() -> None:
    lines = []
    for i in range(8):  # a run that learns: a flat loss would be a finding of its own
        lines += ["[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768"]
        lines += [dict_line(2.0 - 0.05 * (3 * i + k)) for k in range(3)]
    result = check_trainlog(lines)
    assert codes(result) == ["overflow_skip"] and not has_errors(result)


# ------------------------------------------------------------------ anomalies


def test_a_hidden_nan_run() -> None:
    lines = [dict_line(2.3, 4.1)] + [dict_line(0.0, "nan")] * 3 + [dict_line(0.0, "nan")]
    parser = TrainLogParser()
    points = parser.feed(lines)
    assert [p.bad for p in points] == [False, True, True, True, True]
    assert [(a.code, a.severity, a.step) for a in parser.anomalies] == [
        ("hidden_nan", "error", 2), ("zero_loss_streak", "warning", 2)]
    result = parser.result()
    assert result.points[1].to_json() == {"step": 2, "loss": 0.0, "grad_norm": None, "learning_rate": 1e-4,
                                          "epoch": 0.1}
    assert "nan" in result.problems[0].message and "null" in result.problems[0].message
    assert json.loads(json.dumps(result.to_json(), allow_nan=False)) == result.to_json() and has_errors(result)


def test_zero_loss_needs_three_in_a_row() -> None:
    assert codes(check_trainlog([dict_line(0.0), dict_line(0.0), dict_line(1.0), dict_line(0.0)])) == []
    assert codes(check_trainlog([dict_line(1.0)] + [dict_line(0.0)] * 3)) == ["zero_loss_streak"]


def test_a_loss_spike_is_reported_with_its_factor() -> None:
    losses = [2.0, 1.9, 2.1, 1.8, 1.7, 1.9, 8.5, 8.4, 1.6, 1.7, 9.0]
    result = check_trainlog([dict_line(x) for x in losses])
    assert codes(result) == ["loss_spike", "loss_spike"]  # 8.4 right after 8.5 is the same spike
    first = result.problems[0]
    assert first.step == 7 and first.severity == "warning" and "4.5x" in first.message
    assert not has_errors(result)


def test_jumps_that_are_not_spikes() -> None:
    for losses in ([1.0, 1.0, 9.0],  # too little history for a median
                   [2.0, 2.1, 1.9, 5.9, 2.0],  # under 3x the median
                   [0.1, 0.12, 0.1, 0.11, 0.45]):  # 4x the median, but less than 1.0 above the last
        assert codes(check_trainlog([dict_line(x) for x in losses])) == [], losses


def test_unscale_fp16_and_the_nan_guard_marker() -> None:
    lines = [
        "Traceback (most recent call last):",
        "ValueError: Attempting to unscale FP16 gradients.",
        "TRAIN_REFUSED poison files from an earlier run in runs/train: TRAIN_NAN; clear them first",
        dict_line(0.0, "nan"),
        "TRAIN_NAN 3 of the first 4 logged steps had loss 0/nan or grad_norm nan",
        "[train] TRAIN_NAN again",
    ]
    result = check_trainlog(lines)
    assert codes(result) == ["unscale_fp16", "hidden_nan", "nan_guard_fired"]
    unscale, _, guard = result.problems
    assert unscale.severity == "error" and "bf16" in unscale.message and "§9" in unscale.message
    assert guard.severity == "error" and guard.step == 1 and "3 of the first 4" in guard.message
    assert result.unparsed == 2  # the traceback header, and the refusal: it names TRAIN_NAN, no marker


def test_an_error_level_finding_blocks_the_merge_and_a_warning_does_not() -> None:
    """What the operator sees of a code's severity: every error-level code blocks the merge's
    preflight (and makes `check trainlog` exit 1); a warning is shown and blocks nothing."""
    from samai.console.core.preflight.evidence import run_verdict
    from samai.console.core.problems import Problem, has_errors
    from samai.console.core.training.trainlog import TrainLogResult

    assert set(SEVERITY.values()) == {"error", "warning"}
    for code, severity in SEVERITY.items():
        result = TrainLogResult((), (Problem(code, severity, f"{code} at step 7", step=7),), None, 1, 0)
        checks = run_verdict("train", result)
        blocked = [c.text for c in checks if c.severity == "error"]
        assert has_errors(result) is (severity == "error"), code
        assert blocked == ([f"train's log, last run: {code}: {code} at step 7"] if severity == "error" else []), code


# ------------------------------------------------------------------ the whole run: late deaths and flatlines


def v5_line(loss, grad_norm, step) -> str:
    """transformers 5.x: every value quoted, 4 significant digits."""
    return f"{{'loss': '{loss:.4g}', 'grad_norm': '{grad_norm:.4g}', 'learning_rate': '0.001', 'epoch': '{step / 10}'}}"


def v4_line(loss, grad_norm, step) -> str:
    """transformers 4.x: bare numbers, nan and inf bare too."""
    return f"{{'loss': {loss!r}, 'grad_norm': {grad_norm!r}, 'learning_rate': 0.001, 'epoch': {step / 10!r}}}"


def healthy_losses(n: int) -> list[float]:
    return [3.5 * 0.9 ** i + 0.2 for i in range(n)]


@pytest.mark.parametrize("line", [v5_line, v4_line], ids=["transformers-5", "transformers-4"])
def test_gradients_that_die_after_step_3_are_dead_gradients_and_not_learning(line) -> None:
    """The issue's run: 3 good steps, then grad_norm 0 and the loss flat for the other 77."""
    losses = healthy_losses(3) + [healthy_losses(3)[-1]] * 77
    grads = [2.5, 2.1, 1.8] + [0.0] * 77
    result = check_trainlog([line(x, g, i + 1) for i, (x, g) in enumerate(zip(losses, grads, strict=True))])
    found = {a.code: a for a in result.problems}
    assert set(found) == {"dead_gradients", "not_learning"} and has_errors(result)
    assert found["dead_gradients"].step == 4 and found["dead_gradients"].severity == "error"
    assert "grad_norm exactly 0" in found["dead_gradients"].message
    assert found["not_learning"].step == 3 and "flat at" in found["not_learning"].message


@pytest.mark.parametrize("line", [v5_line, v4_line], ids=["transformers-5", "transformers-4"])
def test_a_run_that_diverges_after_step_4_is_found(line) -> None:
    """A NaN after the first four steps (the train stage's early window) is still an error."""
    losses = healthy_losses(6) + [math.nan] * 3 + [0.0] * 71
    grads = [2.0] * 6 + [math.nan] * 74
    result = check_trainlog([line(x, g, i + 1) for i, (x, g) in enumerate(zip(losses, grads, strict=True))])
    assert [(a.code, a.step) for a in result.problems] == [
        ("nan_loss", 7), ("nan_grad_norm", 7), ("hidden_nan", 10), ("zero_loss_streak", 10), ("not_learning", 10)]
    assert has_errors(result)


def test_flatlines_are_told_from_a_run_that_converges_or_pauses() -> None:
    dead = [v5_line(2.0, 0.0, i + 1) for i in range(10)]
    assert codes(check_trainlog(dead)) == ["dead_gradients", "not_learning"]
    converged = healthy_losses(40) + [healthy_losses(40)[-1]] * 30  # flat for the last 30 of 70: under 3/4
    assert codes(check_trainlog([v5_line(x, 0.5, i + 1) for i, x in enumerate(converged)])) == []
    plateau = [2.0] * 9 + healthy_losses(20)  # 9 flat steps: under the minimum of 10
    assert codes(check_trainlog([v4_line(x, 0.5, i + 1) for i, x in enumerate(plateau)])) == []
    zero_grads = [v4_line(x, 0.0 if i % 5 else 0.7, i + 1) for i, x in enumerate(healthy_losses(30))]
    assert codes(check_trainlog(zero_grads)) == []  # 4 zero norms in a row at most


def test_the_flatline_codes_stream_like_the_one_shot_check() -> None:
    lines = [v5_line(x, g, i + 1) for i, (x, g) in enumerate(zip([2.0, 1.9, 1.8] + [1.8] * 20, [1.0] * 3 + [0.0] * 20,
                                                                  strict=True))]
    whole = check_trainlog(lines)
    parser = TrainLogParser()
    drained = []
    for line in lines:
        parser.feed([line])
        drained += parser.drain_anomalies()
    assert [a.code for a in drained] == codes(whole) == ["dead_gradients", "not_learning"]


# ------------------------------------------------------------------ incremental


MIXED = [
    "LoRA r=16: 71680 trainable parameters",
    "\r 1%|  | 1/100 [00:01<01:39]\r" + dict_line(2.0, 3.0),
    dict_line(1.9, 2.9),
    "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768",
    dict_line(1.8),
    dict_line(1.9),
    dict_line(9.0),
    dict_line(0.0, "nan"), dict_line(0.0, "nan"), dict_line(0.0, "nan"),
    "{'loss': 1.07, 'grad_no",
    "Attempting to unscale FP16 gradients",
    "TRAIN_NAN 3 of the first 4 logged steps had loss 0/nan",
    "{'train_runtime': 1.0, 'train_loss': 1.5, 'epoch': 1.0}",
]


@pytest.mark.slow
def test_feeding_in_pieces_gives_the_one_shot_result_and_each_anomaly_once() -> None:
    whole = check_trainlog(MIXED)
    assert codes(whole) == ["overflow_skip", "loss_spike", "hidden_nan", "zero_loss_streak", "unscale_fp16",
                            "nan_guard_fired"]
    for size in range(1, len(MIXED) + 1):
        parser = TrainLogParser()
        points, drained = [], []
        for start in range(0, len(MIXED), size):
            points += parser.feed(MIXED[start:start + size])
            drained += parser.drain_anomalies()
            assert parser.drain_anomalies() == []
        assert parser.result().to_json() == whole.to_json()  # NaN != NaN: compared as JSON
        assert points == parser.points and drained == parser.anomalies


def test_check_trainlog_path_keeps_tqdm_carriage_returns_in_the_line(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_bytes(b"\r 1%|  | 1/9\r 2%|  | 2/9\r" + dict_line(1.0).encode() + b"\r\n"
                    + b"\xff\xfe binary\n" + dict_line(0.9).encode())
    result = check_trainlog_path(log)
    assert [p.loss for p in result.points] == [1.0, 0.9]
    assert result.lines == 3 and result.unparsed == 1


# ------------------------------------------------------------------ bounded memory (issue 17, item 7)


def as_json(points) -> list[dict]:
    return [p.to_json() for p in points]  # NaN != NaN: points are compared as JSON


@pytest.mark.slow
def test_the_points_kept_are_bounded_and_the_anomalies_and_summary_stay_exact() -> None:
    """100,000 logged steps: a few thousand points kept, evenly, with the last one and those an
    anomaly was found at; every anomaly found over all of them, and counted past MAX_REPORTS."""
    n, spike_every, nan_at = 100_000, 500, 77_777
    lines = []
    for step in range(1, n + 1):
        loss = 10.0 if step % spike_every == 0 else 1.0 + 0.01 * (step * 7919 % 13)  # never flat, never 0
        grad = "nan" if step == nan_at else 0.5
        lines.append(f"{{'loss': {loss}, 'grad_norm': {grad}, 'learning_rate': 0.0001, 'epoch': {step / n}}}")
    lines.append("{'train_runtime': 99.5, 'train_loss': 1.07, 'epoch': 1.0}")
    result = check_trainlog(lines)

    assert result.steps == n and result.lines == n + 1 and result.unparsed == 0
    assert len(result.points) <= MAX_POINTS + MAX_PINNED + 1  # it was n before the bound
    steps = [p.step for p in result.points]
    assert steps == sorted(set(steps)) and steps[0] == 1 and steps[-1] == n
    spikes = n // spike_every
    assert Counter(codes(result)) == {"nan_grad_norm": 1, "loss_spike": MAX_REPORTS + 1}
    note = [a for a in result.problems if a.code == "loss_spike"][-1]
    assert note.count == spikes and f"{spikes} loss_spike findings in all" in note.message
    assert [a.step for a in result.problems if a.code == "loss_spike"][:3] == [500, 1000, 1500]
    assert nan_at in steps and math.isnan(next(p for p in result.points if p.step == nan_at).grad_norm)
    pinned = {a.step for a in result.problems}
    plain = [s for s in steps[:-1] if s not in pinned]
    assert len({b - a for a, b in zip(plain, plain[1:], strict=False)}) == 1  # thinned evenly
    assert result.summary == {"train_runtime": 99.5, "train_loss": 1.07, "epoch": 1.0}
    json.dumps(result.to_json(), allow_nan=False)
    assert result.to_json()["steps"] == n


def test_a_trainer_state_beside_a_long_log_is_merged_over_every_step() -> None:
    """The state's exact points replace the log's as the log streams, so the anomalies are found
    over every merged step, not over the points kept (the merge was over kept points before)."""
    n = 20_000
    log = [f"{{'loss': {1 + step % 7 / 10}, 'grad_norm': 0.5, 'step': {step}}}" for step in range(1, n + 1)]
    state = {"log_history": [{"loss": 1.25, "grad_norm": math.nan, "step": 12_345},
                             {"loss": 0.5, "grad_norm": 0.5, "step": n + 1},
                             {"train_runtime": 10.0, "train_loss": 1.2, "step": n + 1}]}
    result = check_trainlog(log, trainer_state=state)
    assert [(a.code, a.step) for a in result.problems] == [("nan_grad_norm", 12_345)]
    assert result.steps == n + 1 and len(result.points) <= MAX_POINTS + MAX_PINNED + 1
    assert result.points[-1] == TrainPoint(n + 1, 0.5, 0.5) and result.summary["train_loss"] == 1.2
    assert 12_345 in [p.step for p in result.points]


@pytest.mark.slow
def test_streaks_as_long_as_the_run_hold_two_numbers() -> None:
    """100,000 zero losses in a row: reported once, from the step they began at; the streaks were
    lists of every step before."""
    parser = TrainLogParser()
    parser.feed(dict_line(2.0) for _ in range(3))
    for _ in range(10):
        parser.feed(["{'loss': 0.0, 'grad_norm': 0.0}"] * 10_000)
    assert [(a.code, a.step) for a in parser.anomalies] == [
        ("zero_loss_streak", 4), ("dead_gradients", 4), ("not_learning", 4)]
    assert parser.series.seen == 100_003 and len(parser.points) <= MAX_POINTS + MAX_PINNED + 1


STATE_ENTRY = ('    {{\n      "epoch": {epoch},\n      "grad_norm": {grad},\n      "learning_rate": 0.0001,\n'
               '      "loss": {loss},\n      "step": {step}\n    }}')


def big_state(n: int, nan_at: int) -> list[str]:
    entries = [STATE_ENTRY.format(epoch=s / n, grad="NaN" if s == nan_at else 1.5, loss=1.0 + s % 7 / 10, step=s)
               for s in range(1, n + 1)]
    history = ",\n".join(entries)
    text = (f'{{\n  "best_metric": null,\n  "global_step": {n},\n  "log_history": [\n{history}\n  ],\n'
            f'  "max_steps": {n}\n}}\n')
    return text.split("\n")


@pytest.mark.slow
def test_a_trainer_state_json_is_read_one_entry_at_a_time() -> None:
    """Its entries are decoded as their lines come (a point before the file ends) and its points
    are bounded like a log's: the file was held whole before."""
    n = 20_000
    lines = big_state(n, nan_at=12_345)
    check = TrainLogCheck()
    first = check.feed(lines[:40])
    assert [p.step for p in first] == [1, 2, 3, 4, 5]  # 4 lines of header, 7 an entry
    for at in range(40, len(lines), 997):
        check.feed(lines[at:at + 997])
    result = check.result()
    assert result.steps == n == result.lines and result.unparsed == 0
    assert len(result.points) <= MAX_POINTS + MAX_PINNED + 1 and result.points[-1].step == n
    assert [(a.code, a.step) for a in result.problems] == [("nan_grad_norm", 12_345)]


def test_what_is_held_to_tell_a_state_file_from_a_log_is_bounded() -> None:
    """A log opening like JSON is held until it names log_history, 64 lines or 64 KiB at most;
    one that opens like a log is read from its first line."""
    check = TrainLogCheck()
    assert check.feed(["", "{", '  "x": "' + "y" * 70_000 + '",', dict_line(1.0)]) != []  # 64 KiB: a log
    assert [p.step for p in TrainLogCheck().feed([dict_line(1.0)])] == [1]
    check = TrainLogCheck()
    assert check.feed(["{", '  "best_metric": null,'] * 31) == []  # 62 lines of JSON: undecided
    assert check.feed([dict_line(1.0), dict_line(0.9)]) != []  # 64 lines: a log after all


@pytest.mark.parametrize("text, why", [
    ('{"log_history": [{"loss": 1.0, "step": 1}, {"loss": 2.0, "st', "ends inside log_history"),
    ('{\n"log_history": [\n{"loss": 1.0, "step": 1},\n{"loss": }\n]}', "Expecting value"),
    ('{\n"log_history": [\n{"loss": [' + "1,\n" * (MAX_ENTRY // 3) + "1]}]}", "runs over 64 KiB"),
    ('{\n"log_history": [\n' + "[" * 20_000 + "]" * 20_000 + "\n]}", "nested too deep"),
    ('{\n"global_step": 3,\n"log_history": null\n}', "no log_history list"),
], ids=["cut", "not JSON", "an entry over the cap", "nested", "no list"])
def test_a_broken_trainer_state_says_what_is_wrong_and_never_holds_it_whole(text: str, why: str) -> None:
    with pytest.raises(ValueError, match="trainer_state.json") as e:
        check_trainlog(text)
    assert why in str(e.value)


@pytest.mark.slow
async def test_a_line_of_megabytes_is_read_in_pieces_and_its_last_record_is_found(tmp_path: Path, box: Box) -> None:
    """tqdm's bar for a whole run on one line, the NaN loss at its end: the box's 64 KiB line cap
    dropped it (`check trainlog` said nothing), and the local read held the whole line."""
    bar = "".join(f"\r{i % 100:3d}%|{'#' * (i % 10):<10}| {i}/200000 [00:01<00:02,  2.91it/s]"
                  for i in range(160_000))
    log = tmp_path / "train.log"
    log.write_text(dict_line(2.0) + "\n" + bar + "\r" + dict_line("nan", "nan") + "\n" + dict_line(1.0) + "\n")
    assert log.stat().st_size > 8_000_000
    local = check_trainlog_path(log)
    remote = await checks.check_trainlog(box, str(log))
    for result in (local, remote):
        assert [p.loss for p in result.points][::2] == [2.0, 1.0] and math.isnan(result.points[1].loss)
        assert codes(result) == ["nan_loss", "nan_grad_norm"]
    assert local.to_json() == remote.to_json()


# ------------------------------------------------------------------ the training pane reads what check trainlog reads


TQDM_BAR = "".join(f"\r {i % 100}%|\u2588         | {i}/3000 [00:0{i % 10}<00:10, 9.5it/s]" for i in range(3000))
PANE_FORMATS = {
    "transformers-5": REAL_LOG,
    "transformers-4": "".join(line + "\n" for line in [
        "{'loss': 1.0778, 'grad_norm': 2.5, 'learning_rate': 2e-05, 'epoch': 0.1}",
        "{'loss': 1.01, 'grad_norm': tensor(1091.0826, device='cuda:0'), 'learning_rate': 2e-05, 'epoch': 0.2}",
        "{'loss': tensor(0.98), 'grad_norm': inf, 'learning_rate': 2e-05, 'epoch': 0.3}",
        "{'loss': nan, 'grad_norm': nan, 'learning_rate': 2e-05, 'epoch': 0.5}",
        "{'loss': 0.0, 'grad_norm': nan, 'epoch': 0.6}", "{'loss': 0.0, 'grad_norm': nan, 'epoch': 0.7}",
        "{'loss': 0.0, 'grad_norm': nan, 'epoch': 0.8}",
        "{'train_runtime': 12.3, 'train_loss': 0.9, 'epoch': 1.0}"]),
    "trainer_state.json": REAL_STATE,
    "trainer_state.json, nan and inf": "\n".join(big_state(40, nan_at=33)).replace('"loss": 1.6', '"loss": nan'),
    "deepspeed": "".join(line + "\n" for line in [
        "[2024-05-01 10:00:00,000] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! Rank 0 "
        "Skipping step. Attempted loss scale: 65536, reducing to 32768",
        "steps: 20 loss: 0.8397 iter time (s): 0.312 samples/sec: 102.6",
        "[2024-05-01 10:00:09,000] [INFO] [logging.py:96:log_dist] [Rank 0] step=40, skipped=1, lr=[0.0001]",
        dict_line(0.80), dict_line(0.79), *[dict_line(0.79) for _ in range(12)],
        "Current loss scale already at minimum - cannot decrease scale anymore. Exiting run."]),
    "tqdm": "".join(line + "\n" for line in [  # the second line is over the 64 KiB a log pane line keeps
        TQDM_BAR[:2000] + "\r" + dict_line(2.0), TQDM_BAR + "\r" + " " * 40 + "\r" + dict_line(9.5) + TQDM_BAR[:500],
        "\x1b[A\x1b[32m" + dict_line(1.9) + "\x1b[0m", f"\r 5%| 5/100 \r{dict_line(1.8)}\r{dict_line('nan')}"]),
    "mixed": "".join(line + "\n" for line in MIXED),
}


async def pane_reads(box: Box, workspace: Path, data: bytes) -> tuple[list[TrainPoint], list[str], str]:
    """What the training pane gets from a train log written in three appends, polled as the app
    polls: its new points, its train alerts' codes, and the log's path."""
    state = ConsoleState(dataclasses.replace(load_builtin("tiny"), workspace=str(workspace)))
    log = Path(state.feed(TrainingFeed).log.path)
    log.parent.mkdir(parents=True, exist_ok=True)
    points, alerts = [], []
    cuts = [0, len(data) // 3, 2 * len(data) // 3 + 1, len(data)]
    for start, end in zip(cuts, cuts[1:], strict=False):
        with open(log, "ab") as f:
            f.write(data[start:end])
        for _ in range(100):  # a read is at most 256 KiB
            followers = state.followers()
            update = state.apply(await box.snapshot(**state.request(followers)), followers, float(end))
            points += new_points(update)
            alerts += [a.code for a in update.new_alerts if a.stage == "train" and a.code in SEVERITY]
            if state.feed(TrainingFeed).log.offset == end:
                break
        assert state.feed(TrainingFeed).log.offset == end
    return points, alerts, str(log)


@pytest.mark.slow
@pytest.mark.parametrize("name", PANE_FORMATS)
async def test_the_training_pane_reads_every_format_as_check_trainlog_does(name: str, box: Box,
                                                                           workspace: Path) -> None:
    """The pane's ConsoleState read a trainer_state.json as nothing and dropped the end of a tqdm
    line over 64 KiB; it now reads with check trainlog's own code."""
    text = PANE_FORMATS[name]
    points, alerts, log = await pane_reads(box, workspace, text.encode())
    whole, cli = check_trainlog(text), await checks.check_trainlog(box, log)
    assert points and as_json(points) == as_json(whole.points) == as_json(cli.points)
    assert alerts == codes(whole) == codes(cli)
    assert whole.to_json() == cli.to_json()


# ------------------------------------------------------------------ fuzz: the line pieces and the state reader

FUZZ = settings(max_examples=150, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@FUZZ
@given(data=st.binary(max_size=300).map(lambda b: bytes(b"ab\r\n{}'"[x % 7] for x in b)),
       cuts=st.lists(st.integers(0, 300), max_size=6), max_line=st.integers(1, 40))
def test_pieces_of_lines_lose_and_add_nothing(data: bytes, cuts: list[int], max_line: int) -> None:
    """Whatever the chunks and the cap: the text read is the text written (less the line breaks
    and a CR before them), no piece is longer than its chunk and the cap allow, and with a cap no
    line reaches, the lines are those written."""
    chunks = [data[a:b] for a, b in zip([0, *sorted(cuts)], [*sorted(cuts), len(data)], strict=True)]
    decoder, out = PieceDecoder(max_line=max_line), []
    for chunk in chunks:
        out += decoder.feed(chunk)
    last = decoder.flush()
    out += [] if last is None else [last]
    assert "".join(out) == "".join(line.removesuffix("\r") for line in data.decode().split("\n"))
    assert all(len(line) <= max_line + max(map(len, chunks)) for line in out)
    whole = PieceDecoder(max_line=PIECE)
    lines = whole.feed(data) + ([] if (end := whole.flush()) is None else [end])
    expected = data.decode().split("\n")
    expected = expected[:-1] if expected[-1] == "" else expected
    assert lines == [line.removesuffix("\r") for line in expected]


HISTORY_ENTRY = st.dictionaries(
    st.sampled_from(["loss", "grad_norm", "learning_rate", "epoch", "step", "eval_loss", "train_loss", "x"]),
    st.none() | st.booleans() | st.integers(-5, 10**6) | st.floats() | st.text(max_size=6)
    | st.lists(st.integers(), max_size=2), max_size=6)


@pytest.mark.slow
@FUZZ
@given(history=st.lists(HISTORY_ENTRY | st.integers() | st.text(max_size=4), max_size=12),
       indent=st.sampled_from([None, 0, 1, 2, 4]), data=st.data())
def test_a_trainer_state_read_as_it_comes_is_the_one_read_whole(history, indent, data) -> None:
    """The streamed decoder of log_history gives what json.loads of the whole file gives."""
    text = json.dumps({"best_metric": None, "log_history": history, "max_steps": 9}, indent=indent)
    lines = text.split("\n")
    cuts = sorted(data.draw(st.lists(st.integers(0, len(lines)), max_size=4)))
    check = TrainLogCheck()
    for start, end in zip([0, *cuts], [*cuts, len(lines)], strict=True):
        check.feed(lines[start:end])
    parser = TrainLogParser()
    parser.feed_state(json.loads(text)["log_history"])
    expected = parser.result()
    if not history or expected.steps == 0 and expected.summary is None and not expected.problems:
        return  # nothing in it: the streamed check says no_training_data, as a log would
    assert check.result().to_json() == expected.to_json()


@FUZZ
@given(lines=st.lists(st.text(max_size=30) | st.sampled_from(["{", "}", "]", "},", '{"loss": 1.0', '"step": 2}',
                                                               "[", "NaN", "nan,", "\"a\": [", "]}"]), max_size=30))
def test_any_text_in_a_log_history_gives_a_result_or_says_it_is_not_readable(lines: list[str]) -> None:
    check = TrainLogCheck()
    check.feed(["{", '  "log_history": [', *lines])
    try:
        result = check.result()
    except ValueError as e:
        assert "trainer_state.json" in str(e)
        return
    json.dumps(result.to_json(), allow_nan=False)


def test_the_history_stream_closes_only_on_a_whole_log_history() -> None:
    stream = HistoryStream()
    assert list(stream.entries(['{"log_history": [{"loss": 1.0}, 2', ", [3]]", '"rest": }'])) == [{"loss": 1.0}, 2, [3]]
    stream.close()  # what follows log_history is not read
