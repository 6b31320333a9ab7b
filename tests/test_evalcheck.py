"""check_eval on built items.jsonl fixtures, and on what the real eval stage writes against a local server."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from samai.console.core.evals.check import EvalResult, check_eval, has_errors
from samai.console.core.problems import Problem
from tests.box_tools import stage_argv, stage_env
from tests.chatserver import ChatServer, serving
from tests.helpers import run_cli

UNCLOSED_THINK = "<think>Let me compute 17*23. 17*20 = 340, 17*3 = 51, so 391"
# The eval stage takes the first number of content + reasoning_content: no other number before 391.
SERVER_THINK = "<think>the product is 391"


def row(i: int, *, gold: str = "391", pred: str | None = "391", finish: str = "stop",
        content: str = "The answer is 391.", reasoning: str = "", **extra: object) -> str:
    """One items.jsonl line as the eval stage writes it; `correct` follows pred unless given."""
    item = {"id": i, "prompt": "17*23=", "gold": gold, "pred": pred, "correct": pred == gold,
            "finish_reason": finish, "content": content, "reasoning_content": reasoning}
    item.update(extra)
    return json.dumps(item)


def codes(result: EvalResult) -> dict[str, str]:
    return {problem.code: problem.severity for problem in result.problems}


def problem(result: EvalResult, code: str) -> Problem:
    return next(p for p in result.problems if p.code == code)


def test_a_healthy_run_has_its_accuracy_and_no_problems() -> None:
    lines = [row(i) for i in range(9)] + [row(9, pred="390", content="The answer is 390.")]
    result = check_eval(lines)
    assert result.n == 10 and result.correct == 9 and result.accuracy == pytest.approx(0.9)
    assert result.problems == () and not has_errors(result)
    assert result.pred_none == result.truncated == result.empty_content == 0
    json.dumps(result.to_json())  # JSON-ready


def test_the_reasoning_split_shape_is_a_fake_zero_with_truncation_and_empty_content() -> None:
    split = [row(i, pred=None, content="", reasoning=UNCLOSED_THINK, finish="length") for i in range(8)]
    closed = [row(8 + i, pred=None, content="", reasoning="<think>hmm</think>") for i in range(2)]
    result = check_eval(split + closed)
    assert result.accuracy == 0 and result.pred_none == 10
    assert result.reasoning_only == 10 and result.empty_content == 10 and result.truncated == 8
    assert codes(result) == {"fake_zero": "error", "truncation": "error", "empty_content": "error"}
    fake_zero = problem(result, "fake_zero")
    assert fake_zero.count == 10
    assert "--reasoning-format none" in fake_zero.message and "reasoning_content" in fake_zero.message
    assert "2048" in problem(result, "truncation").message
    assert has_errors(result)


def test_a_real_zero_with_answers_in_content_is_not_called_fake() -> None:
    lines = [row(i, pred=None, content="I cannot tell.") for i in range(10)]
    result = check_eval(lines)
    assert result.accuracy == 0 and result.pred_none == 10
    assert "fake_zero" not in codes(result)


def test_a_fake_zero_needs_most_predictions_missing() -> None:
    missing = [row(i, pred=None, content="", reasoning=UNCLOSED_THINK) for i in range(4)]
    wrong = [row(4 + i, pred="7", content="7") for i in range(6)]
    assert "fake_zero" not in codes(check_eval(missing + wrong))
    assert "fake_zero" in codes(check_eval(missing + [row(9, pred="7", content="7")]))


def test_thinking_in_content_with_no_answer_after_it_is_a_leak() -> None:
    leaks = [row(0, pred=None, content="<think>17*23 is 39"), row(1, pred=None, content="<think>17*23 is 391</think>")]
    # what --reasoning-format none sends: the thinking closed, then the answer (with or without the opening tag)
    answered = [row(2, content="<think>17*23 is 391</think> 391"), row(3, content="so 391</think>391")]
    result = check_eval(leaks + answered + [row(i) for i in range(4, 10)])
    assert result.think_leaks == 2
    assert codes(result) == {"think_leak": "warning"}
    assert problem(result, "think_leak").count == 2


@pytest.mark.parametrize(("truncated", "expected"), [(1, None), (2, "warning"), (5, "warning"), (6, "error")])
def test_truncation_is_judged_against_the_threshold(truncated: int, expected: str | None) -> None:
    lines = [row(i, finish="length" if i < truncated else "stop") for i in range(20)]
    result = check_eval(lines, truncation_threshold=0.05)  # 1/20 = 5 %: not above; 6/20 = 30 % > 25 %
    assert result.truncated == truncated
    assert codes(result).get("truncation") == expected


def test_the_truncation_threshold_can_be_raised() -> None:
    lines = [row(i, finish="length" if i < 2 else "stop") for i in range(20)]
    assert "truncation" not in codes(check_eval(lines, truncation_threshold=0.1))
    assert "truncation" in codes(check_eval(lines, truncation_threshold=0.09))


def test_empty_content_is_a_warning_until_it_is_the_majority() -> None:
    few = [row(i, content="", pred="391", reasoning="391") for i in range(3)] + [row(i) for i in range(3, 10)]
    result = check_eval(few)
    assert codes(result) == {"empty_content": "warning"} and result.reasoning_only == 3
    many = [row(i, content="  ", pred="391") for i in range(6)] + [row(i) for i in range(6, 10)]
    assert codes(check_eval(many)) == {"empty_content": "error"}


def test_malformed_lines_are_counted_with_their_numbers_and_not_fatal() -> None:
    lines = [
        row(0),
        "this is not json",
        "[1, 2, 3]",
        json.dumps({"id": 3, "gold": "391"}),  # no pred
        json.dumps({"id": 4, "pred": "391"}),  # nothing to score against
        "",  # blank: skipped, not malformed
        row(6),
        row(7)[:25],  # the writer died mid-line
    ]
    result = check_eval(lines)
    assert result.n == 2 and result.accuracy == 1.0
    assert result.malformed == 5 and result.malformed_lines == (2, 3, 4, 5, 8)
    assert codes(result) == {"malformed": "warning"} and not has_errors(result)
    message = problem(result, "malformed").message
    assert "2, 3, 4, 5, 8" in message


def test_only_the_first_malformed_line_numbers_are_listed() -> None:
    result = check_eval(["garbage"] * 12 + [row(12)])
    assert result.malformed == 12 and result.malformed_lines == (1, 2, 3, 4, 5)
    assert problem(result, "malformed").count == 12


@pytest.mark.parametrize("lines", [[], ["\n", "  "]])
def test_an_empty_file_has_no_items(lines: list[str]) -> None:
    result = check_eval(lines)
    assert result.n == 0 and result.accuracy is None
    assert codes(result) == {"no_items": "error"} and has_errors(result)
    assert "empty" in problem(result, "no_items").message


def test_a_file_of_only_garbage_has_no_items_and_says_why() -> None:
    result = check_eval(["{", "nope"])
    assert codes(result) == {"no_items": "error", "malformed": "warning"}
    assert "malformed" in problem(result, "no_items").message


def test_accuracy_is_recomputed_from_pred_and_gold_when_correct_is_missing() -> None:
    items = [{"id": 0, "gold": "391", "pred": " 391 "}, {"id": 1, "gold": 391, "pred": "391"},
             {"id": 2, "gold": "391", "pred": "390"}, {"id": 3, "gold": "391", "pred": None}]
    result = check_eval(json.dumps(item) for item in items)
    assert result.n == 4 and result.correct == 2 and result.accuracy == 0.5
    assert result.pred_none == 1


def test_a_written_correct_wins_over_pred_and_gold() -> None:
    lines = [row(0, pred="391", correct=False), row(1, pred="7", correct=True)]
    assert check_eval(lines).correct == 1


# --- the real eval stage against a local OpenAI-compatible server --------------------------


@pytest.fixture
def chat_server() -> Iterator[ChatServer]:
    with serving(finish_reason="length") as server:
        yield server


def run_eval_stage(server: ChatServer, tmp_path: Path, n: int = 4) -> Path:
    data, out = tmp_path / "eval.jsonl", tmp_path / "out"
    data.write_text("".join(json.dumps({"id": i, "prompt": "17*23=", "gold": "391"}) + "\n" for i in range(n)))
    argv = stage_argv("stages.eval", "--url", server.url, "--data", data, "--out", out, "--max-tokens", 8,
                      "--timeout", 5)
    done = subprocess.run(argv, env=stage_env(), capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "EVAL_RC=0" in done.stdout
    return out / "items.jsonl"


@pytest.mark.slow
def test_the_eval_stage_joins_reasoning_content_so_a_split_answer_is_no_fake_zero(
        chat_server: ChatServer, tmp_path: Path) -> None:
    chat_server.message = {"content": "", "reasoning_content": SERVER_THINK}
    items = run_eval_stage(chat_server, tmp_path)
    result = check_eval(items.read_text().splitlines())
    # the client-side join found 391 in reasoning_content: the fix working
    assert result.n == 4 and result.accuracy == 1.0 and result.pred_none == 0
    assert result.reasoning_only == 4
    assert codes(result) == {"empty_content": "error", "truncation": "error"}
    assert "fake_zero" not in codes(result)


@pytest.mark.slow
def test_the_eval_stage_reads_vllm_s_reasoning_field_too(chat_server: ChatServer, tmp_path: Path) -> None:
    """vLLM puts the thinking in `reasoning` (not `reasoning_content`): read, it is no fake 0 %."""
    chat_server.message = {"content": "", "reasoning": SERVER_THINK}
    items = run_eval_stage(chat_server, tmp_path)
    result = check_eval(items.read_text().splitlines())
    assert result.accuracy == 1.0 and result.reasoning_only == 4 and "fake_zero" not in codes(result)


@pytest.mark.slow
def test_the_eval_stage_against_a_server_that_answers_nothing_is_a_fake_zero(
        chat_server: ChatServer, tmp_path: Path) -> None:
    chat_server.message = {"content": "", "reasoning_content": ""}
    items = run_eval_stage(chat_server, tmp_path)
    with items.open() as lines:
        result = check_eval(lines)
    assert result.n == 4 and result.accuracy == 0 and result.pred_none == 4
    assert result.reasoning_only == 0 and result.empty_content == 4
    assert codes(result)["fake_zero"] == "error" and has_errors(result)


# --- fake zero by its signature -------------------------------------------------------------


def test_a_split_run_that_scores_10_percent_is_still_a_fake_zero_and_says_what_the_fix_recovers() -> None:
    """A handful close </think> in time and score; nine in ten have their text only in reasoning_content."""
    answered = [row(0, content="</think> 391", reasoning="<think>17*23")]
    found = [row(1 + i, pred=None, content="", reasoning="<think>17*23 = 391, so") for i in range(6)]
    cut = [row(7 + i, pred=None, content="", reasoning="<think>17*20 is", finish="length") for i in range(3)]
    result = check_eval(answered + found + cut)
    assert result.accuracy == pytest.approx(0.1) and result.split == 9 and result.recoverable == 6
    assert codes(result)["fake_zero"] == "error"
    fake_zero = problem(result, "fake_zero")
    assert fake_zero.count == 9
    message = fake_zero.message
    assert "accuracy 10 %" in message and "9/10" in message
    assert "recovers 6" in message and "accuracy up to 70 %" in message
    assert "3 of those hold no gold answer" in message and "max_tokens" in message
    assert "--reasoning-format none" in message
    assert "empty_content" in codes(result)  # still said: its meaning has not changed


def test_a_minority_of_split_items_is_no_fake_zero_whatever_the_accuracy() -> None:
    split = [row(i, pred=None, content="", reasoning="<think>17*23 = 391") for i in range(4)]
    wrong = [row(4 + i, pred="7", content="7") for i in range(6)]
    result = check_eval(split + wrong)
    assert result.accuracy == 0 and result.split == 4
    assert "fake_zero" not in codes(result)


def test_items_with_no_text_anywhere_are_told_apart_from_the_reasoning_split() -> None:
    result = check_eval([row(i, pred=None, content="", reasoning="") for i in range(5)])
    message = problem(result, "fake_zero").message
    assert result.split == 5 and result.recoverable == 0
    assert "5 have no text at all" in message and "chat template" in message
    assert "--reasoning-format" not in message  # nothing was split: that fix would not help


# --- chat-completion responses, as a server sends them ---------------------------------------

RECORDED = Path(__file__).parent / "data" / "eval" / "llama_cpp_python"
RECORDED_LLAMA_SERVER = Path(__file__).parent / "data" / "eval" / "llama_server"


def recorded(name: str, where: Path = RECORDED, count: int = 12) -> list[dict]:
    """The real responses of where/name, each with its gold and messages beside it at the top level."""
    folder = where / name
    responses = [json.loads(line) for line in (folder / "responses.jsonl").read_text().splitlines()]
    requests = [json.loads(line) for line in (folder / "requests.jsonl").read_text().splitlines()]
    assert len(responses) == len(requests) == count, "the recorded fixtures are missing or cut"
    return [dict(response, gold=request["gold"], messages=request["messages"])
            for response, request in zip(responses, requests, strict=True)]


def test_a_real_server_that_sent_no_text_is_a_fake_zero_read_from_its_raw_responses() -> None:
    """llama-cpp-python with a GGUF that has no chat template: content "" and finish_reason "stop", 12 times."""
    with open(RECORDED / "no_template" / "responses.jsonl") as lines:
        result = check_eval(lines)
    assert (result.format, result.layout) == ("chat-completion", "jsonl")
    assert result.n == 12 and result.malformed == 0
    assert result.scored == 0 and result.accuracy is None  # no gold: nothing to score
    assert result.empty_content == result.pred_none == result.split == 12 and result.truncated == 0
    assert codes(result) == {"fake_zero": "error", "empty_content": "error"}
    assert "12 have no text at all" in problem(result, "fake_zero").message


def test_real_responses_with_gold_beside_them_are_a_real_zero_cut_at_max_tokens() -> None:
    """A base model that repeats the question: content there and wrong, every reply at finish_reason "length"."""
    lines = [json.dumps(record) for record in recorded("gemma")]
    result = check_eval(lines)
    assert (result.format, result.layout) == ("chat-completion", "jsonl")
    assert result.n == result.scored == 12 and result.correct == 0 and result.accuracy == 0
    assert result.truncated == 12 and result.empty_content == result.pred_none == result.split == 0
    assert codes(result) == {"truncation": "error"}  # a real zero: no fake_zero


def test_llama_servers_own_reasoning_split_is_a_fake_zero_and_room_to_answer_is_not() -> None:
    """llama-server with its default reasoning format, the tiny thinking model: 8 questions at
    max_tokens 64 (the answer after </think>, in content) then the same at 16 (cut inside <think>)."""
    replies = recorded("reasoning_split", RECORDED_LLAMA_SERVER, 16)
    room, cut = replies[:8], replies[8:]
    assert all(r["choices"][0]["message"]["reasoning_content"] for r in replies)  # the server split every one

    answered = check_eval([json.dumps(r) for r in room])
    assert answered.format == "chat-completion" and answered.accuracy == 1 and answered.problems == ()

    zero = check_eval([json.dumps(r) for r in cut])
    assert zero.accuracy == 0 and zero.pred_none == zero.empty_content == zero.truncated == zero.split == 8
    assert zero.split_reasoning == 8 and zero.recoverable == 0  # cut before the answer: joining alone recovers none
    assert codes(zero) == {"fake_zero": "error", "truncation": "error", "empty_content": "error"}
    assert "raise max_tokens" in problem(zero, "fake_zero").message

    # a score between 5 % and 100 %, as when some items close their </think> in time: still the signature
    mixed = check_eval([json.dumps(r) for r in room[:1] + cut])
    assert mixed.accuracy == pytest.approx(1 / 9) and "fake_zero" in codes(mixed)


def test_llama_server_without_the_split_leaves_the_thinking_in_content() -> None:
    """The same questions with --reasoning-format none: the fix on the server's side. The cut replies
    are a real truncation with the thinking in content, not a fake zero."""
    replies = recorded("reasoning_none", RECORDED_LLAMA_SERVER, 16)
    assert not any("reasoning_content" in r["choices"][0]["message"] for r in replies)
    result = check_eval([json.dumps(r) for r in replies])
    assert result.correct == 8 and result.truncated == 8 and result.think_leaks == 8  # the cut ones: unclosed
    assert result.empty_content == 0 and set(codes(result)) == {"truncation", "think_leak"}


@pytest.mark.parametrize(("layout", "text"), [
    ("json-array", lambda records: json.dumps(records, indent=2)),
    ("json-array", lambda records: json.dumps(records)),  # the whole array on one line
    ("jsonl", lambda records: "\n".join(json.dumps(r) for r in records) + "\n"),
])
def test_the_same_responses_read_the_same_in_every_layout(layout: str, text) -> None:
    records = recorded("gemma")[:5] + recorded("no_template")[:5]
    result = check_eval(text(records).splitlines())
    assert (result.format, result.layout) == ("chat-completion", layout)
    assert (result.n, result.truncated, result.empty_content, result.split) == (10, 5, 5, 5)


def test_one_pretty_printed_response_is_one_record() -> None:
    result = check_eval(json.dumps(recorded("gemma")[0], indent=2).splitlines())
    assert (result.format, result.layout, result.n, result.truncated) == ("chat-completion", "json", 1, 1)
    assert result.malformed == 0 and result.accuracy == 0


def test_a_recorded_request_and_response_pair_is_read_too() -> None:
    raw = json.loads((RECORDED / "gemma" / "responses.jsonl").read_text().splitlines()[0])
    pair = {"request": {"messages": [{"role": "user", "content": "17*23?"}]}, "response": raw, "gold": "391"}
    result = check_eval([json.dumps(pair)])
    assert (result.format, result.n, result.scored, result.truncated) == ("chat-completion", 1, 1, 1)


def test_a_response_with_gold_and_pred_added_by_hand_is_read_as_a_response_not_an_item() -> None:
    """The top-level id (chatcmpl-...) once made it pass as an item: content read as empty, "length" missed."""
    response = dict(recorded("gemma")[0], pred="391")
    result = check_eval([json.dumps(response)])
    assert result.format == "chat-completion" and result.n == 1
    assert result.empty_content == 0 and result.truncated == 1 and result.correct == 1


def test_a_response_scores_by_its_answer_after_the_thinking() -> None:
    def response(content: object, reasoning: str = "", gold: str = "391") -> str:
        message = {"role": "assistant", "content": content, "reasoning_content": reasoning}
        return json.dumps({"id": "chatcmpl-1", "object": "chat.completion", "gold": gold,
                           "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]})

    lines = [response("<think>17*23 is 390? no</think>The answer is 391."), response("391"),
             response("Paris", gold="Paris"), response("<think>391</think>390"),
             response("", "<think>17*23 = 391"), response([{"type": "text", "text": "391"}])]
    result = check_eval(lines)
    assert result.n == 6 and result.correct == 4 and result.think_leaks == 0  # each thinking closed, answer after
    assert result.split == 1 and result.recoverable == 1 and result.reasoning_only == 1


def test_a_chatcmpl_id_never_makes_an_item_of_a_record_without_choices() -> None:
    lines = [json.dumps({"id": "chatcmpl-abc", "pred": "391", "gold": "391", "correct": True}),
             json.dumps({"id": 7, "object": "chat.completion", "pred": "391", "gold": "391"})]
    result = check_eval(lines)
    assert result.n == 0 and result.malformed == 2 and result.format is None
    assert codes(result) == {"no_items": "error", "malformed": "warning"}
    assert "choices[0].message" in problem(result, "no_items").message  # what was expected


def test_records_of_the_other_kind_than_the_first_are_malformed_with_what_was_expected() -> None:
    response = json.dumps(recorded("gemma")[0])
    result = check_eval([row(0), response, row(2)])
    assert (result.format, result.n, result.malformed, result.malformed_lines) == ("items", 2, 1, (2,))
    assert "eval items" in problem(result, "malformed").message
    result = check_eval([response, row(1)])
    assert (result.format, result.n, result.malformed) == ("chat-completion", 1, 1)
    assert "chat-completion responses" in problem(result, "malformed").message


def test_a_streamed_chunk_or_another_api_is_malformed_with_a_hint() -> None:
    chunk = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [{"delta": {"content": "3"}}]}
    legacy = {"id": "cmpl-1", "object": "text_completion", "choices": [{"text": "391", "finish_reason": "stop"}]}
    result = check_eval([json.dumps(chunk), json.dumps(legacy), json.dumps({"content": "391"})])
    assert result.n == 0 and result.malformed == 3 and result.malformed_lines == (1, 2, 3)
    assert "expected eval items" in problem(result, "no_items").message


def test_a_json_array_that_is_not_records_says_so_by_element() -> None:
    result = check_eval(json.dumps([1, {"choices": []}, recorded("gemma")[0]], indent=1).splitlines())
    assert (result.layout, result.n, result.malformed, result.malformed_lines) == ("json-array", 1, 2, (1, 2))
    assert "element 1, 2" in problem(result, "malformed").message
    assert codes(check_eval(["[]"])) == {"no_items": "error"}


def test_a_cut_pretty_printed_response_is_read_line_by_line_as_malformed() -> None:
    cut = json.dumps(recorded("gemma")[0], indent=2).splitlines()[:-3]
    result = check_eval(cut)
    assert result.layout == "jsonl" and result.n == 0 and result.malformed == sum(1 for line in cut if line.strip())


@pytest.mark.slow
def test_the_cli_says_which_format_it_read(tmp_path: Path) -> None:
    array = tmp_path / "responses.json"
    array.write_text(json.dumps(recorded("no_template"), indent=2))
    done = run_cli("check", "eval", str(array))
    assert done.returncode == 1, done.stderr
    assert "format chat-completion  layout json-array  n 12" in done.stdout and "fake_zero" in done.stdout
    assert "  accuracy 0.0 %  " in done.stdout  # as a person reads it; the JSON keeps the exact value
    shown = json.loads(run_cli("check", "eval", str(array), "--json").stdout)
    assert (shown["format"], shown["layout"], shown["n"], shown["split"]) == ("chat-completion", "json-array", 12, 12)


# --- fuzz: any file of responses, items or garbage, in any layout ----------------------------

FUZZ = settings(max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
                      lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=3), kids, max_size=3),
                      max_leaves=8)
TEXT = (st.sampled_from(["", " ", "391", "<think>391", "</think> 391", "The answer is 391.", "Paris"])
        | st.text(max_size=8))
CONTENT = TEXT | VALUES | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": TEXT}), max_size=2)
MESSAGE = st.dictionaries(st.sampled_from(["role", "content", "reasoning_content", "reasoning"]), CONTENT, max_size=4)
CHOICE = st.dictionaries(st.sampled_from(["index", "message", "delta", "finish_reason", "text"]),
                         MESSAGE | st.sampled_from(["stop", "length", None]) | VALUES, max_size=4)
IDS = st.sampled_from(["chatcmpl-1", "chatcmpl-", "cmpl-1"]) | st.integers(0, 9) | VALUES
GOLD = st.sampled_from(["391", "Paris", " 391 ", 391, None, "-1.5"]) | VALUES
RESPONSE = st.dictionaries(
    st.sampled_from(["id", "object", "choices", "gold", "pred", "correct", "messages", "prompt", "usage"]),
    IDS | GOLD | st.lists(CHOICE, max_size=2) | st.sampled_from(["chat.completion", "chat.completion.chunk"]),
    max_size=8)
SIZE = st.integers(-2, 5000) | st.sampled_from([1120, 1121, 10**30]) | VALUES
IMAGE = st.dictionaries(st.sampled_from(["path", "width", "height", "sent_width", "sent_height", "sent_bytes",
                                         "resized"]), SIZE | st.booleans(), max_size=7) | VALUES
ITEM = st.dictionaries(st.sampled_from(["id", "pred", "gold", "correct", "content", "reasoning_content",
                                        "finish_reason", "image"]), TEXT | GOLD | IDS | IMAGE, max_size=8)
RECORD = RESPONSE | ITEM | st.fixed_dictionaries({"response": RESPONSE, "gold": GOLD}) | st.fixed_dictionaries(
    {"id": st.just("chatcmpl-x"), "choices": st.lists(CHOICE, min_size=1, max_size=1), "gold": GOLD})


def assert_sound(result: EvalResult) -> None:
    json.dumps(result.to_json(), allow_nan=False)
    assert {p.code for p in result.problems} <= {"no_items", "fake_zero", "truncation", "empty_content",
                                                  "think_leak", "malformed", "image_over_cap"}
    assert 0 <= result.correct <= result.scored <= result.n
    assert 0 <= result.over_cap <= result.images <= result.n
    assert 0 <= result.recoverable <= result.split_reasoning <= result.split <= result.pred_none <= result.n
    assert result.format in (None, "items", "chat-completion")


def figures(result: EvalResult) -> tuple:
    return (result.n, result.scored, result.correct, result.pred_none, result.truncated, result.empty_content,
            result.reasoning_only, result.think_leaks, result.split, result.recoverable, result.malformed,
            result.malformed_lines, result.format, result.images, result.over_cap,
            result.largest_over)  # one record a line: line numbers are element numbers


@pytest.mark.slow
@FUZZ
@given(records=st.lists(RECORD, min_size=2, max_size=8), indent=st.sampled_from([None, 1, 2]))
def test_any_records_read_the_same_as_jsonl_and_as_a_json_array(records: list[dict], indent: int | None) -> None:
    jsonl = check_eval(json.dumps(record) for record in records)
    array = check_eval(json.dumps(records, indent=indent).splitlines())
    assert_sound(jsonl)
    assert_sound(array)
    assert (jsonl.layout, array.layout) == ("jsonl", "json-array")
    assert figures(jsonl) == figures(array)
    assert jsonl.n + jsonl.malformed == len(records)


@pytest.mark.slow
@FUZZ
@given(records=st.lists(RECORD, max_size=6), cut=st.integers(0, 400), junk=st.text(max_size=12))
def test_any_cut_or_spliced_file_gives_a_result(records: list[dict], cut: int, junk: str) -> None:
    text = json.dumps(records, indent=1)
    lines = (text[:cut] + junk + text[cut:]).splitlines()
    assert_sound(check_eval(lines))
    assert_sound(check_eval(lines[: len(lines) // 2]))


@pytest.mark.slow
@FUZZ
@given(records=st.lists(RESPONSE | ITEM, min_size=1, max_size=6))
def test_a_record_with_a_chatcmpl_id_is_never_read_as_an_item(records: list[dict]) -> None:
    marked = [dict(record, id="chatcmpl-" + str(i)) for i, record in enumerate(records)]
    result = check_eval(json.dumps(record) for record in marked)
    assert_sound(result)
    assert result.format != "items"
