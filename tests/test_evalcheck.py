"""check_eval on built items.jsonl fixtures, and on what the real eval stage writes against a local server."""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from samai.console.core.evalcheck import EvalResult, check_eval, has_errors
from samai.console.core.problems import Problem
from tests.box_tools import stage_argv, stage_env

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


def test_think_tags_inside_content_are_counted_as_leaks() -> None:
    leaks = [row(0, content="<think>17*23 is 391</think> 391"), row(1, content="so 391</think>391")]
    result = check_eval(leaks + [row(i) for i in range(2, 10)])
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


class _FakeChatServer(ThreadingHTTPServer):
    message: dict = {}


class _ChatHandler(BaseHTTPRequestHandler):
    server: _FakeChatServer

    def do_POST(self) -> None:  # noqa: N802 (the http.server name)
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path != "/v1/chat/completions":
            self.send_error(404)
            return
        body = json.dumps({"choices": [{"message": self.server.message, "finish_reason": "length"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass  # keep the test output quiet


@pytest.fixture
def chat_server() -> Iterator[_FakeChatServer]:
    server = _FakeChatServer(("127.0.0.1", 0), _ChatHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(5)


def run_eval_stage(server: _FakeChatServer, tmp_path: Path, n: int = 4) -> Path:
    data, out = tmp_path / "eval.jsonl", tmp_path / "out"
    data.write_text("".join(json.dumps({"id": i, "prompt": "17*23=", "gold": "391"}) + "\n" for i in range(n)))
    url = f"http://127.0.0.1:{server.server_address[1]}"
    done = subprocess.run(stage_argv("stages.eval", "--url", url, "--data", data, "--out", out, "--max-tokens", 8,
                                     "--timeout", 5), env=stage_env(), capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "EVAL_RC=0" in done.stdout
    return out / "items.jsonl"


def test_the_eval_stage_joins_reasoning_content_so_a_split_answer_is_no_fake_zero(
        chat_server: _FakeChatServer, tmp_path: Path) -> None:
    chat_server.message = {"content": "", "reasoning_content": SERVER_THINK}
    items = run_eval_stage(chat_server, tmp_path)
    result = check_eval(items.read_text().splitlines())
    # the client-side join found 391 in reasoning_content: the fix working
    assert result.n == 4 and result.accuracy == 1.0 and result.pred_none == 0
    assert result.reasoning_only == 4
    assert codes(result) == {"empty_content": "error", "truncation": "error"}
    assert "fake_zero" not in codes(result)


def test_the_eval_stage_against_a_server_that_answers_nothing_is_a_fake_zero(
        chat_server: _FakeChatServer, tmp_path: Path) -> None:
    chat_server.message = {"content": "", "reasoning_content": ""}
    items = run_eval_stage(chat_server, tmp_path)
    with items.open() as lines:
        result = check_eval(lines)
    assert result.n == 4 and result.accuracy == 0 and result.pred_none == 4
    assert result.reasoning_only == 0 and result.empty_content == 4
    assert codes(result)["fake_zero"] == "error" and has_errors(result)
