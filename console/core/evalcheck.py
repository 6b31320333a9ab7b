"""Check an eval stage's per-item JSONL (OUT/items.jsonl) for the ways a score lies.

The accuracy is recomputed from the items, never taken from summary.json, and set next to the
counts that expose a fake score: llama.cpp moves an unclosed <think> into `reasoning_content`
and leaves `content` empty, so a client that reads only `content` finds no answer and scores a
working model 0 % (playbook §6); too small a max_tokens cuts thinking short.

Problem codes are a contract (scripts and tests match on them): no_items, fake_zero,
truncation, empty_content, think_leak, malformed. Severities: "error" or "warning".
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from samai.console.core.problems import Problem, has_errors  # noqa: F401 (checkers' callers import has_errors here)
from samai.remote.model import Severity

FAKE_ZERO_ACCURACY = 0.05  # at or under this, a zero may be the reasoning split, not the model
FAKE_ZERO_SHARE = 0.5  # ... when at least this share of items has no prediction and the split's shape
TRUNCATION_ERROR_SHARE = 0.25
MALFORMED_LINES_SHOWN = 5
THINK_TAGS = ("<think>", "</think>")

FIX_SPLIT = ("start llama-server with --reasoning-format none, and join content + reasoning_content "
             "in the client (content + '\\n' + reasoning_content) before extracting the answer")


@dataclass(frozen=True)
class EvalResult:
    """An eval's items recounted: the figures, the first malformed line numbers, the problems."""

    n: int
    correct: int
    accuracy: float | None
    pred_none: int
    truncated: int
    empty_content: int
    reasoning_only: int
    think_leaks: int
    malformed: int = 0
    malformed_lines: tuple[int, ...] = ()
    problems: tuple[Problem, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The CLI's JSON (its keys and their order are a contract)."""
        return {"n": self.n, "correct": self.correct, "accuracy": self.accuracy, "pred_none": self.pred_none,
                "truncated": self.truncated, "empty_content": self.empty_content,
                "reasoning_only": self.reasoning_only, "think_leaks": self.think_leaks,
                "malformed": self.malformed, "malformed_lines": list(self.malformed_lines),
                "problems": [{"code": p.code, "severity": p.severity, "message": p.message, "count": p.count}
                             for p in self.problems]}


def check_eval(lines: Iterable[str], *, truncation_threshold: float = 0.05) -> EvalResult:
    """The recomputed summary of an eval's items.jsonl lines, with the problems found."""
    items, malformed_lines = _parse(lines)
    result = replace(_summarize(items), malformed=len(malformed_lines),
                     malformed_lines=tuple(malformed_lines[:MALFORMED_LINES_SHOWN]))
    return replace(result, problems=_problems(result, items, malformed_lines, truncation_threshold))


# --- reading -------------------------------------------------------------------------------


def _parse(lines: Iterable[str]) -> tuple[list[dict], list[int]]:
    """The well-formed items, and the (1-based) numbers of the lines that are not."""
    items, malformed = [], []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue  # a blank line holds no item; it is not a broken one
        item = _item(line)
        if item is None:
            malformed.append(number)
        else:
            items.append(item)
    return items, malformed


def _item(line: str) -> dict | None:
    """The line's JSON object when it can be scored, else None."""
    try:
        item = json.loads(line)
    except (ValueError, RecursionError):  # RecursionError: nesting deeper than the decoder's stack
        return None
    if not isinstance(item, dict) or "id" not in item or "pred" not in item:
        return None
    if not isinstance(item.get("correct"), bool) and "gold" not in item:
        return None  # nothing to score it against
    return item


def _text(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    try:
        return str(value)
    except RecursionError:  # a list nested almost as deep as the decoder allows: no answer text
        return ""


def _is_correct(item: dict) -> bool:
    """`correct` when the stage wrote it; otherwise pred and gold compared as stripped strings."""
    if isinstance(item.get("correct"), bool):
        return item["correct"]
    return not _has_no_pred(item) and _text(item["pred"]).strip() == _text(item.get("gold")).strip()


def _has_no_pred(item: dict) -> bool:
    return not _text(item.get("pred")).strip()


def _content_is_empty(item: dict) -> bool:
    return not _text(item.get("content")).strip()


def _has_reasoning(item: dict) -> bool:
    return bool(_text(item.get("reasoning_content")).strip())


def _leaks_think(item: dict) -> bool:
    content = _text(item.get("content"))
    return any(tag in content for tag in THINK_TAGS)


def _shows_split(item: dict) -> bool:
    """No answer found, and the text went to reasoning_content or nowhere: the §6 signature."""
    return _has_no_pred(item) and (_has_reasoning(item) or _content_is_empty(item))


# --- summary -------------------------------------------------------------------------------


def _summarize(items: list[dict]) -> EvalResult:
    n = len(items)
    correct = sum(1 for item in items if _is_correct(item))
    return EvalResult(
        n=n,
        correct=correct,
        accuracy=correct / n if n else None,
        pred_none=sum(1 for item in items if _has_no_pred(item)),
        truncated=sum(1 for item in items if item.get("finish_reason") == "length"),
        empty_content=sum(1 for item in items if _content_is_empty(item)),
        reasoning_only=sum(1 for item in items if _content_is_empty(item) and _has_reasoning(item)),
        think_leaks=sum(1 for item in items if _leaks_think(item)),
    )


# --- problems ------------------------------------------------------------------------------


def _problem(code: str, severity: Severity, message: str, count: int, lines: tuple[int, ...] = ()) -> Problem:
    return Problem(code, severity, message, lines=lines, count=count)


def _problems(result: EvalResult, items: list[dict], malformed_lines: list[int],
              truncation_threshold: float) -> tuple[Problem, ...]:
    found = [_no_items(result, malformed_lines)]
    if result.n:
        found += [_fake_zero(result, items), _truncation(result, truncation_threshold),
                  _empty_content(result), _think_leak(result)]
    found.append(_malformed(malformed_lines))
    return tuple(problem for problem in found if problem is not None)


def _percent(part: int, whole: int) -> str:
    return f"{part}/{whole} ({100 * part / whole:.0f} %)"


def _no_items(result: EvalResult, malformed_lines: list[int]) -> Problem | None:
    if result.n:
        return None
    why = f"all {len(malformed_lines)} lines are malformed" if malformed_lines else "the file is empty"
    return _problem("no_items", "error", f"no eval items to check: {why}", 0)


def _fake_zero(result: EvalResult, items: list[dict]) -> Problem | None:
    split = sum(1 for item in items if _shows_split(item))
    if result.accuracy is None or result.accuracy > FAKE_ZERO_ACCURACY or split < FAKE_ZERO_SHARE * result.n:
        return None
    message = (f"accuracy {100 * result.accuracy:.0f} % is likely fake: {_percent(split, result.n)} items "
               "have no prediction, with content empty or the text only in reasoning_content (llama.cpp splits "
               f"an unclosed <think> into reasoning_content); {FIX_SPLIT}, then rerun the eval")
    return _problem("fake_zero", "error", message, split)


def _truncation(result: EvalResult, threshold: float) -> Problem | None:
    truncated, n = result.truncated, result.n
    if truncated <= threshold * n:
        return None
    severity: Severity = "error" if truncated > TRUNCATION_ERROR_SHARE * n else "warning"
    message = (f"{_percent(truncated, n)} items stopped at max_tokens (finish_reason \"length\"), over the "
               f"{100 * threshold:.0f} % allowed: thinking was cut short; raise max_tokens (double the current "
               "one, or 2048)")
    return _problem("truncation", severity, message, truncated)


def _empty_content(result: EvalResult) -> Problem | None:
    empty, n = result.empty_content, result.n
    if not empty:
        return None
    severity: Severity = "error" if empty > n / 2 else "warning"
    message = f"{_percent(empty, n)} items have empty content"
    if result.reasoning_only:
        message += (f"; {result.reasoning_only} of them have their text only in reasoning_content (the server "
                    f"split <think>): {FIX_SPLIT}")
    return _problem("empty_content", severity, message, empty)


def _think_leak(result: EvalResult) -> Problem | None:
    leaks = result.think_leaks
    if not leaks:
        return None
    message = (f"{_percent(leaks, result.n)} items have <think> or </think> inside content: the server is not "
               "splitting reasoning, or the model leaks it; the answer extractor may read the thinking")
    return _problem("think_leak", "warning", message, leaks)


def _malformed(malformed_lines: list[int]) -> Problem | None:
    if not malformed_lines:
        return None
    first = tuple(malformed_lines[:MALFORMED_LINES_SHOWN])
    shown = ", ".join(str(number) for number in first)
    more = ", ..." if len(malformed_lines) > MALFORMED_LINES_SHOWN else ""
    message = (f"{len(malformed_lines)} lines are not JSON objects with id, pred and gold (or correct), "
               f"skipped: line {shown}{more}")
    return _problem("malformed", "warning", message, len(malformed_lines), first)
