"""Check an eval's answers for the ways a score lies: the eval stage's per-item JSONL
(OUT/items.jsonl), or a chat-completion server's own responses (evalread tells them apart).

The accuracy is recomputed from the items, never taken from summary.json, and set next to the
counts that expose a fake score: llama.cpp moves an unclosed <think> into `reasoning_content`
and leaves `content` empty, so a client that reads only `content` finds no answer and scores a
working model 0 % (playbook §6); too small a max_tokens cuts thinking short. The fake zero is
told by that signature (most items with no answer, their text in reasoning_content or nowhere),
not by how low the accuracy is.

An item that asked with an image says what it sent (`image`: sent_width, sent_height): an image
whose long side is over IMAGE_CAP costs more visual tokens than the playbook's budget (§10).

Problem codes are a contract (scripts and tests match on them): no_items, fake_zero,
truncation, empty_content, think_leak, malformed, image_over_cap. Severities: "error" or "warning".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from samai.console.core.evals.read import EXPECTED, EXPECTED_ANY, JSONL, EvalReader, EvalRecord, Malformed
from samai.console.core.problems import Problem, has_errors  # noqa: F401 (checkers' callers import has_errors here)
from samai.remote.model import Severity

FAKE_ZERO_SHARE = 0.5  # at least this share of items with no prediction and the split's shape: a fake score
TRUNCATION_ERROR_SHARE = 0.25
MALFORMED_LINES_SHOWN = 5
IMAGE_CAP = 1120  # px, the long side of an image sent to a vision model (playbook §10's visual-token budget)

FIX_SPLIT = ("start llama-server with --reasoning-format none, and join content + reasoning_content "
             "in the client (content + '\\n' + reasoning_content) before extracting the answer")


@dataclass(frozen=True)
class EvalResult:
    """An eval's items recounted: the figures, the first malformed line numbers, the problems.

    `format` is what was read (items, chat-completion; None when nothing could be) and `layout`
    how (jsonl, json: one object, json-array); in a JSON document, malformed_lines are the
    numbers of the array's elements. `split` counts the items with no prediction whose text went
    to reasoning_content or nowhere; `recoverable` those of them whose gold is in reasoning_content.
    """

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
    format: str | None = None
    layout: str = JSONL
    scored: int = 0
    split: int = 0
    recoverable: int = 0
    split_reasoning: int = 0  # of the split, those with text in reasoning_content (the rest have none anywhere)
    images: int = 0  # items that say what image they sent
    over_cap: int = 0  # of those, the ones whose long side is over IMAGE_CAP
    largest_over: tuple[int, int] | None = None  # (width, height) of the largest of them
    problems: tuple[Problem, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The CLI's JSON (its keys and their order are a contract)."""
        return {"n": self.n, "correct": self.correct, "accuracy": self.accuracy, "pred_none": self.pred_none,
                "truncated": self.truncated, "empty_content": self.empty_content,
                "reasoning_only": self.reasoning_only, "think_leaks": self.think_leaks,
                "malformed": self.malformed, "malformed_lines": list(self.malformed_lines),
                "format": self.format, "layout": self.layout, "scored": self.scored, "split": self.split,
                "recoverable": self.recoverable,
                "problems": [{"code": p.code, "severity": p.severity, "message": p.message, "count": p.count}
                             for p in self.problems],
                "images": self.images, "over_cap": self.over_cap,
                "largest_over": list(self.largest_over) if self.largest_over else None}


def check_eval(lines: Iterable[str], *, truncation_threshold: float = 0.05) -> EvalResult:
    """The recomputed summary of an eval file's lines (any format EvalReader reads), with the problems found.

    Streamed: memory holds the counts, never the items."""
    reader, tally = EvalReader(), _Tally()
    for record in reader.read(lines):
        tally.add(record)
    result = tally.result(reader)
    return replace(result, problems=_problems(result, truncation_threshold))


# --- counting ------------------------------------------------------------------------------


@dataclass(slots=True)
class _Tally:
    """The counts so far (mutable: one per check, fed record by record)."""

    n: int = 0
    scored: int = 0
    correct: int = 0
    pred_none: int = 0
    truncated: int = 0
    empty_content: int = 0
    reasoning_only: int = 0
    think_leaks: int = 0
    split: int = 0
    split_reasoning: int = 0
    recoverable: int = 0
    malformed: int = 0
    malformed_lines: list[int] = field(default_factory=list)
    images: int = 0
    over_cap: int = 0
    largest_over: tuple[int, int] | None = None

    def add(self, record: EvalRecord | Malformed) -> None:
        if isinstance(record, Malformed):
            self.malformed += 1
            if len(self.malformed_lines) < MALFORMED_LINES_SHOWN:
                self.malformed_lines.append(record.number)
            return
        self.n += 1
        if record.correct is not None:
            self.scored += 1
            self.correct += record.correct
        self.truncated += record.finish_reason == "length"
        self.empty_content += record.content_empty
        self.reasoning_only += record.content_empty and record.has_reasoning
        self.think_leaks += record.think_leak
        if record.image_sent is not None:
            self._image(record.image_sent)
        if record.no_pred:
            self.pred_none += 1
            if record.has_reasoning or record.content_empty:  # the §6 signature
                self.split += 1
                self.split_reasoning += record.has_reasoning
                self.recoverable += record.has_reasoning and record.gold_in_reasoning

    def _image(self, size: tuple[int, int]) -> None:
        self.images += 1
        if max(size) > IMAGE_CAP:
            self.over_cap += 1
            if self.largest_over is None or max(size) > max(self.largest_over):
                self.largest_over = size

    def result(self, reader: EvalReader) -> EvalResult:
        return EvalResult(n=self.n, correct=self.correct, accuracy=self.correct / self.scored if self.scored else None,
                          pred_none=self.pred_none, truncated=self.truncated, empty_content=self.empty_content,
                          reasoning_only=self.reasoning_only, think_leaks=self.think_leaks, malformed=self.malformed,
                          malformed_lines=tuple(self.malformed_lines), format=reader.kind, layout=reader.layout,
                          scored=self.scored, split=self.split, recoverable=self.recoverable,
                          split_reasoning=self.split_reasoning, images=self.images, over_cap=self.over_cap,
                          largest_over=self.largest_over)


# --- problems ------------------------------------------------------------------------------


def _problem(code: str, severity: Severity, message: str, count: int, lines: tuple[int, ...] = ()) -> Problem:
    return Problem(code, severity, message, lines=lines, count=count)


def _problems(result: EvalResult, truncation_threshold: float) -> tuple[Problem, ...]:
    found = [_no_items(result)]
    if result.n:
        found += [_fake_zero(result), _truncation(result, truncation_threshold),
                  _empty_content(result), _think_leak(result), _image_over_cap(result)]
    found.append(_malformed(result))
    return tuple(problem for problem in found if problem is not None)


def _percent(part: int, whole: int) -> str:
    return f"{part}/{whole} ({100 * part / whole:.0f} %)"


def _unit(result: EvalResult) -> str:
    return "line" if result.layout == JSONL else "element"


def _no_items(result: EvalResult) -> Problem | None:
    if result.n:
        return None
    if result.malformed:
        why = f"all {result.malformed} {_unit(result)}s are malformed; expected {EXPECTED_ANY}"
    else:
        why = "the file is empty" if result.layout == JSONL else "the JSON document holds no records"
    return _problem("no_items", "error", f"no eval items to check: {why}", 0)


def _fake_zero(result: EvalResult) -> Problem | None:
    """Most items have no answer and their text went to reasoning_content or nowhere: the §6 incident,
    whatever the accuracy the few other items make (a handful closing </think> in time score 6-10 %)."""
    split, n = result.split, result.n
    if split < FAKE_ZERO_SHARE * n:
        return None
    scored = (f"accuracy {100 * result.accuracy:.0f} % is likely fake" if result.accuracy is not None
              else "the score is likely fake (no gold to compute it)")
    message = (f"{scored}: {_percent(split, n)} items have no prediction, with content empty or the text only in "
               f"reasoning_content; {_recovery(result)}, then rerun the eval")
    return _problem("fake_zero", "error", message, split)


def _recovery(result: EvalResult) -> str:
    """What the fix would give back, and what each remaining part of the split needs."""
    said = []
    if result.split_reasoning:
        if result.scored:
            gained = (f"the fix recovers {result.recoverable} whose gold is in it, accuracy up to "
                      f"{100 * (result.correct + result.recoverable) / result.scored:.0f} %")
        else:
            gained = "the fix lets the client read them (no gold here to say how many it recovers)"
        said.append(f"{result.split_reasoning} have their text in reasoning_content (llama.cpp splits an unclosed "
                    f"<think> there) and {gained}: {FIX_SPLIT}")
        if result.split_reasoning > result.recoverable and result.scored:
            said.append(f"{result.split_reasoning - result.recoverable} of those hold no gold answer: thinking cut "
                        "short, raise max_tokens")
    silent = result.split - result.split_reasoning
    if silent:
        said.append(f"{silent} have no text at all (content and reasoning_content empty): the server answered "
                    "nothing; check its chat template (without one llama-cpp-python falls back to llama-2) "
                    "and max_tokens")
    return "; ".join(said)


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
    message = (f"{_percent(leaks, result.n)} items have thinking in content and no answer after it (an unclosed "
               "<think>, or nothing after </think>): an extractor that does not cut the thinking away reads it "
               "as the answer; give the thinking room (max_tokens) or fix the template")
    return _problem("think_leak", "warning", message, leaks)


def _image_over_cap(result: EvalResult) -> Problem | None:
    """Images sent larger than the cap: each costs visual tokens past the budget (and the context)."""
    if not result.over_cap or result.largest_over is None:
        return None
    width, height = result.largest_over
    message = (f"{_percent(result.over_cap, result.images)} images were sent with a long side over {IMAGE_CAP} px "
               f"(the largest {width}x{height}): more visual tokens than the playbook's budget; cap the long side "
               f"at {IMAGE_CAP} before sending (the eval stage's --image-cap)")
    return _problem("image_over_cap", "warning", message, result.over_cap)


def _malformed(result: EvalResult) -> Problem | None:
    if not result.malformed:
        return None
    unit, first = _unit(result), result.malformed_lines
    shown = ", ".join(str(number) for number in first)
    more = ", ..." if result.malformed > len(first) else ""
    expected = EXPECTED[result.format] + " like the first ones" if result.format else EXPECTED_ANY
    message = f"{result.malformed} {unit}s are not {expected}, skipped: {unit} {shown}{more}"
    return _problem("malformed", "warning", message, result.malformed, first)
