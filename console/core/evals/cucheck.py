"""Check a computer-use eval's episodes (cu_eval's OUT/episodes.jsonl) for the ways its success
rate lies: most failures being answers that are no action at all (the model does not speak the
action format: the computer-use form of the fake 0 %), screenshots sent over the visual-token
cap, and episodes the browser or the page kept from running. Most failures being actions that
name no element on the page (a misspelt name: "gren") is no lie: the model speaks the format and
misses, and the low score is a real one; said so, with the advice that fits it.

An answer that is no action of its task is of one of two kinds (webtasks.py): "missed", in the
action format naming no element on the page, or "no_action". An episode says which (its
answer_kind); one recorded before episodes did is told by its answer's shape.

The figures are recounted from the episodes, never taken from summary.json. The file is written
on the box by a stage that read untrusted pages and answers: any line may be anything.

Problem codes are a contract: no_episodes, parse_failures, missed_actions, screenshot_over_cap,
cu_errors, malformed."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from samai.console.core.evals.check import IMAGE_CAP, MALFORMED_LINES_SHOWN
from samai.console.core.problems import Problem
from samai.remote.box.stages.webtasks import ANSWER_KINDS, MISSED, NO_ACTION, answer_kind, answer_text
from samai.remote.safe_text import visible

PARSE_FAILURE_SHARE = 0.5  # of the failed episodes that ran: more than this answered no action of their task
MAX_LINE = 1 << 20
EXAMPLES = 3  # answers quoted in a finding, each cut to EXAMPLE_CHARS
EXAMPLE_CHARS = 40


@dataclass(frozen=True)
class EpisodesResult:
    n: int = 0
    successes: int = 0
    parse_failures: int = 0  # ran, and the answer was no action of its task: missed + no_action
    errors: int = 0  # did not run to its check: the page, the browser, the server
    over_cap: int = 0
    largest_over: tuple[int, int] | None = None
    malformed: int = 0
    malformed_lines: tuple[int, ...] = ()
    first_error: str | None = None
    problems: tuple[Problem, ...] = field(default=())
    missed: int = 0  # of the parse failures: in the action format, naming no element on the page
    examples: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())  # a few answers of each kind: missed, no action

    @property
    def no_action(self) -> int:
        """Of the parse failures: no action at all."""
        return self.parse_failures - self.missed

    @property
    def success_rate(self) -> float | None:
        return self.successes / self.n if self.n else None

    def to_json(self) -> dict[str, Any]:
        """The CLI's JSON (its keys are a contract)."""
        return {"format": "episodes", "n": self.n, "successes": self.successes, "success_rate": self.success_rate,
                "parse_failures": self.parse_failures, "missed": self.missed, "no_action": self.no_action,
                "errors": self.errors, "over_cap": self.over_cap,
                "largest_over": list(self.largest_over) if self.largest_over else None,
                "malformed": self.malformed, "malformed_lines": list(self.malformed_lines),
                "problems": [{"code": p.code, "severity": p.severity, "message": p.message, "count": p.count}
                             for p in self.problems]}


def looks_like_episodes(lines: list[str]) -> bool:
    """Whether a file's first JSON line is a cu episode (a task, its assertions, a reward)."""
    for line in lines[:20]:
        if line.strip():
            try:
                first = json.loads(line[:MAX_LINE])
            except (ValueError, RecursionError):
                return False
            return isinstance(first, dict) and {"task", "assertions", "reward"} <= first.keys()
    return False


def check_episodes(lines: Iterable[str]) -> EpisodesResult:
    counts: dict[str, int] = dict(n=0, successes=0, parse_failures=0, errors=0, over_cap=0, malformed=0, missed=0)
    examples: dict[str, list[str]] = {MISSED: [], NO_ACTION: []}
    bad_lines: list[int] = []
    largest: tuple[int, int] | None = None
    first_error: str | None = None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        episode = _episode(line)
        if episode is None:
            counts["malformed"] += 1
            if len(bad_lines) < MALFORMED_LINES_SHOWN:
                bad_lines.append(number)
            continue
        counts["n"] += 1
        error, sent = episode.get("error"), _size(episode.get("sent"))
        if episode.get("reward") == 1 and error is None:
            counts["successes"] += 1
        elif error is not None:
            counts["errors"] += 1
            first_error = first_error or visible(str(error))[:200]
        elif episode.get("action") is None:
            counts["parse_failures"] += 1
            kind = _kind(episode)
            counts["missed"] += kind == MISSED
            if len(examples[kind]) < EXAMPLES:
                examples[kind].append(_shown_answer(episode.get("answer")))
        if sent is not None and max(sent) > IMAGE_CAP:
            counts["over_cap"] += 1
            largest = max(largest or sent, sent, key=lambda s: s[0] * s[1])
    result = EpisodesResult(counts["n"], counts["successes"], counts["parse_failures"], counts["errors"],
                            counts["over_cap"], largest, counts["malformed"], tuple(bad_lines), first_error,
                            missed=counts["missed"], examples=(tuple(examples[MISSED]), tuple(examples[NO_ACTION])))
    return replace(result, problems=_problems(result))


def _kind(episode: dict[str, Any]) -> str:
    """MISSED or NO_ACTION, for an episode whose answer was no action of its task: as the episode
    says, or (one recorded before episodes said it) as its answer's shape tells."""
    said = episode.get("answer_kind")
    return said if said in ANSWER_KINDS and said != "action" else answer_kind(episode.get("answer"))


def _shown_answer(answer: object) -> str:
    """An answer quoted in a finding: its text after any thinking, on one line, inert and short."""
    text = " ".join(answer_text(answer).split()) if isinstance(answer, str) else ""
    text = visible(text[:EXAMPLE_CHARS * 4])
    return json.dumps(text if len(text) <= EXAMPLE_CHARS else text[:EXAMPLE_CHARS - 1] + "…", ensure_ascii=False)


def _episode(line: str) -> dict[str, Any] | None:
    if len(line) > MAX_LINE:
        return None
    try:
        raw = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(raw, dict) or not isinstance(raw.get("assertions", []), list):
        return None
    return raw


def _size(value: Any) -> tuple[int, int] | None:
    if isinstance(value, list) and len(value) == 2 and all(type(v) is int and 0 < v < 1 << 31 for v in value):
        return value[0], value[1]
    return None


def _problems(r: EpisodesResult) -> tuple[Problem, ...]:
    found = []
    ran_and_failed = r.n - r.successes - r.errors
    if r.n == 0:
        found.append(Problem("no_episodes", "error", "no episode could be read: nothing was evaluated", count=0))
    if ran_and_failed and r.parse_failures > PARSE_FAILURE_SHARE * ran_and_failed:
        found.append(_parse_failures(r, ran_and_failed))
    if r.over_cap:
        w, h = r.largest_over or (0, 0)
        found.append(Problem("screenshot_over_cap", "warning",
                             f"{r.over_cap} screenshots were sent with a long side over {IMAGE_CAP} px "
                             f"(the largest {w}x{h}): more visual tokens than the budget (--image-cap)",
                             count=r.over_cap))
    if r.errors:
        found.append(Problem("cu_errors", "error" if r.errors * 2 > r.n else "warning",
                             f"{r.errors} of {r.n} episodes did not run to their check (the page, the browser or "
                             f"the server), the first: {r.first_error}", count=r.errors))
    if r.malformed:
        shown = ", ".join(map(str, r.malformed_lines))
        found.append(Problem("malformed", "warning", f"{r.malformed} lines are not episodes (lines {shown})",
                             count=r.malformed,
                             lines=r.malformed_lines))
    return tuple(found)


def _parse_failures(r: EpisodesResult, failed: int) -> Problem:
    """Most failed episodes answered no action of their task: worded by which kind most were.
    Actions that name no element on the page: the model acts and misses (a real low score).
    Answers that are no action at all: the model does not speak the format (a fake score)."""
    missed, none = r.examples
    if r.missed > r.no_action:
        also = f"; {r.no_action} more answered no action at all" if r.no_action else ""
        return Problem("missed_actions", "warning",
                       f"{r.missed} of {failed} failed episodes answered in the action format but named no element "
                       f"on the page (such as {', '.join(missed)}){also}: the model acts and misses, so the success "
                       "rate is a real low score, not a fake one; teach it the page's names (more training, an rft "
                       "round), not the format", count=r.missed)
    also = f"; {r.missed} more were actions naming no element on the page" if r.missed else ""
    return Problem("parse_failures", "error",
                   f"{r.no_action} of {failed} failed episodes answered no action at all (such as "
                   f"{', '.join(none) or 'nothing'}){also}: the model does not speak the action format (a fake "
                   "score, as a 0 % from answers nobody read); fix the prompt or the format before reading the "
                   "success rate", count=r.no_action)
