"""Property-based fuzzing of the checks that read files from the box or payloads for it: the
training log (check trainlog), an eval's items.jsonl (check eval) and the payload linter.

Invariants: a result (JSON-ready) or the documented error, never another exception; the same
result for a log fed whole or in batches."""

from __future__ import annotations

import contextlib
import io
import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from samai.console.core.evalcheck import check_eval
from samai.console.core.trainlog import TrainLogCheck, TrainLogResult, check_trainlog
from samai.remote.payload_lint import Violation, lint, main

FUZZ = settings(max_examples=150, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# ---------------------------------------------------------------- training logs

NUMBER_TEXT = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(-10 ** 30, 10 ** 30).map(str),
    st.sampled_from(["nan", "inf", "-inf", "NaN", "Infinity", "1e999", "-1e999", "1e-999", "9" * 400, "0.0", "-0",
                     "1e+308", "4.9e-324", "1_000", "0x10", ".5", "5.", "--1", "+1", "", "None", "True"]),
)
VALUE_TEXT = st.recursive(
    NUMBER_TEXT | NUMBER_TEXT.map(lambda n: f"'{n}'") | NUMBER_TEXT.map(lambda n: f"tensor({n}, device='cuda:0')")
    | st.text(max_size=8).map(repr),
    lambda kids: st.lists(kids, max_size=3).map(lambda xs: "[" + ", ".join(xs) + "]")
    | st.dictionaries(st.sampled_from(["'loss'", "'a'", "'eval_loss'"]), kids, max_size=2).map(
        lambda d: "{" + ", ".join(f"{k}: {v}" for k, v in d.items()) + "}"),
    max_leaves=6)
KEYS = st.sampled_from(["loss", "grad_norm", "learning_rate", "epoch", "step", "train_runtime", "train_loss",
                        "eval_loss", "eval_accuracy", "x", "loss'", ""])
TRAINER_DICT = st.dictionaries(KEYS, VALUE_TEXT, max_size=5).map(
    lambda d: "{" + ", ".join(f"'{k}': {v}" for k, v in d.items()) + "}")
KNOWN_LINES = st.sampled_from([
    "steps: 10 loss: 0.5 iter time (s): 1.0", "[deepspeed] step=3, skipped=1, lr=[0.1]",
    "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768",
    "Current loss scale already at minimum", "ValueError: Attempting to unscale FP16 gradients.",
    "TRAIN_NAN step=5 loss=nan", "TRAIN_NAN", "steps: x loss: nan", "{'loss': nan}\r{'loss': 1.0}",
    "\x1b[31m{'loss': 2.0, 'grad_norm': inf}\x1b[0m", "{", "{'loss'", "'loss': 1.0}"])
LOG_LINES = st.lists(st.one_of(TRAINER_DICT, KNOWN_LINES, st.text(max_size=30),
                               st.tuples(st.text(max_size=8), TRAINER_DICT).map("".join),
                               st.lists(TRAINER_DICT, max_size=3).map("\r".join)), max_size=25)


def assert_trainlog_result(result: TrainLogResult) -> None:
    json.dumps(result.to_json(), allow_nan=False)  # JSON-ready: NaN and inf are null
    assert {"points", "anomalies", "summary", "lines", "unparsed"} <= set(result.to_json())
    assert result.points or result.summary is not None or result.problems  # never a silent "no problems"


@FUZZ
@given(lines=LOG_LINES)
def test_any_training_log_gives_a_result(lines) -> None:
    assert_trainlog_result(check_trainlog(lines))


@FUZZ
@given(lines=LOG_LINES, data=st.data())
def test_a_training_log_fed_in_batches_gives_the_same_result(lines, data) -> None:
    cuts = sorted(data.draw(st.lists(st.integers(0, len(lines)), max_size=5)))
    check, start = TrainLogCheck(), 0
    for cut in [*cuts, len(lines)]:
        check.feed(lines[start:cut])
        start = cut
    assert check.result().to_json() == check_trainlog(lines).to_json()  # NaN != NaN: compare as JSON


@FUZZ
@given(text=st.text(max_size=400))
def test_any_text_gives_a_result(text) -> None:
    assert_trainlog_result(check_trainlog(text))


JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
                           lambda kids: st.lists(kids, max_size=3) | st.dictionaries(
                               st.sampled_from(["loss", "step", "grad_norm", "epoch", "train_loss", "x"]), kids,
                               max_size=4), max_leaves=10)


@FUZZ
@given(history=st.lists(JSON_VALUES, max_size=6) | JSON_VALUES)
def test_any_trainer_state_gives_a_result_or_says_it_is_not_one(history) -> None:
    """A trainer_state.json is parsed whole: one that is not readable is a ValueError, as documented."""
    text = json.dumps({"log_history": history}, indent=1)
    try:
        result = check_trainlog(text)
    except ValueError as e:
        assert "trainer_state.json" in str(e)
        return
    assert_trainlog_result(result)
    assert_trainlog_result(check_trainlog(["{'loss': 1.0}"], trainer_state={"log_history": [h for h in (
        history if isinstance(history, list) else []) if isinstance(h, dict)]}))


# ---------------------------------------------------------------- eval items

EVAL_PROBLEMS = {"no_items", "fake_zero", "truncation", "empty_content", "think_leak", "malformed"}
ITEM = st.dictionaries(
    st.sampled_from(["id", "pred", "gold", "correct", "content", "reasoning_content", "finish_reason", "x"]),
    JSON_VALUES | st.sampled_from(["<think>", "</think> 42", "length", "", " "]), max_size=7)
EVAL_LINES = st.lists(st.one_of(ITEM.map(json.dumps), JSON_VALUES.map(json.dumps), st.text(max_size=20),
                                st.integers(1, 5000).map(lambda d: "[" * d + "]" * d),
                                st.integers(1, 5000).map(lambda d: '{"id": 1, "gold": 1, "pred": ' + "[" * d)),
                      max_size=20)


@FUZZ
@given(lines=EVAL_LINES, threshold=st.floats(0, 1))
def test_any_eval_items_give_a_result(lines, threshold) -> None:
    result = check_eval(lines, truncation_threshold=threshold)
    json.dumps(result.to_json(), allow_nan=False)
    assert {p.code for p in result.problems} <= EVAL_PROBLEMS
    if result.layout == "jsonl":  # in one JSON document the records are its elements, not its lines
        assert result.n + result.malformed == sum(1 for line in lines if line.strip())
    assert 0 <= result.correct <= result.n


# ---------------------------------------------------------------- payload lint

STATEMENTS = st.sampled_from([
    "import os", "import os.path as p", "from m import *", "from m import a, b as c", "x = 1", "x += y",
    "print(x)", "print(os.getpid())", "def f(a=b):\n    return a", "async def g():\n    await h()",
    "lambda: y", "f = lambda q: q", "class C(B):\n    z = 1", "[n * k for n in r]", "{a: b for a, b in r}",
    "(i for i in r)", "for i in range(3):\n    y.append(i)", "if a:\n    pass\nelse:\n    b = 2",
    "while False:\n    break", "try:\n    pass\nexcept E as e:\n    print(e)", "with open(p) as fh:\n    fh.read()",
    "global g", "del x", "(w := 3)", "f'{q!r:>{width}}'", "match x:\n    case [a, *rest]:\n        pass",
    "x: int = 1", "a, *b = c", "raise SystemExit", "assert x, 'msg'", "import", "def", ")", "\t\tx", "nonlocal z",
    "return 5", "yield 3", "@dec\ndef d():\n    pass", "if x:\npass", "é = 1", "x = '''unterminated", "\x00",
])
PAYLOADS = st.lists(STATEMENTS, max_size=8).map("\n".join) | st.text(max_size=60)


@FUZZ
@given(source=PAYLOADS)
def test_any_payload_is_linted_or_is_a_syntax_error(source) -> None:
    try:
        violations = lint(source)
    except (SyntaxError, ValueError):  # documented: not valid Python (ValueError: a NUL in the source)
        return
    lines = source.split("\n")
    for v in violations:
        assert isinstance(v, Violation) and 1 <= v.line <= len(lines) + 1 and v.col >= 1
    assert violations == sorted(violations)


@FUZZ
@given(source=st.binary(max_size=60) | PAYLOADS.map(str.encode))
def test_the_command_line_exits_0_1_or_2_with_one_line_per_finding(tmp_path_factory, source) -> None:
    path = tmp_path_factory.mktemp("lint") / "payload.py"
    path.write_bytes(source)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(path)])
    assert code in (0, 1, 2)
    printed = out.getvalue().splitlines() + err.getvalue().splitlines()
    assert (code == 0) == (not printed)
    assert all(line.startswith((str(path), "lint-payload: cannot read")) for line in printed)
