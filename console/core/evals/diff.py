"""Two eval runs compared item by item: what went right to wrong and back, answers that became
empty or cut, answers found only in the reasoning, items in one run only, and whether the
accuracy change is more than noise.

Both runs are items.jsonl files from the box (the eval stage's format: id, gold, pred, correct,
finish_reason, content, reasoning_content), so untrusted: a line that is not an item is counted,
never raised on; an id seen twice counts once (its first line); every text is cut to a bound
(an id cut keeps a digest of the whole, so two long ids stay two). A run is read a batch of lines
at a time (RunReader), keeping per item only what the diff needs; a run of more than MAX_ITEMS
items is refused (TooManyItems), never judged on its first MAX_ITEMS.

The change is judged on the items both runs hold (paired): Newcombe's square-and-add interval
for a difference of paired proportions (Wilson score intervals of each run, with the
continuity-corrected correlation; Newcombe 1998, method 10) and the exact McNemar test on the
items that changed. "Noise" is an interval holding 0.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from samai.console.core.evals.read import matches

Z95 = 1.959963984540054  # the standard normal's 97.5 % quantile
TEXT_BOUND = 200  # characters of an id, a gold or an answer kept per item
MAX_ITEMS = 500_000  # per run: far more than any eval set (each kept in a few hundred bytes: ~0.2 KB at 120,000)


class TooManyItems(ValueError):
    """A run with more items than the diff keeps: refused whole, said in one line."""


class Outcome(NamedTuple):
    """One item of one run, as far as the diff needs it (a tuple: made for every item of a run)."""

    correct: bool
    answer: str
    gold: str
    empty: bool  # no answer at all
    truncated: bool  # stopped by its token limit
    in_reasoning: bool  # no answer in content, though the gold is in the reasoning


@dataclass(frozen=True)
class RunItems:
    """A run's items by id, in file order, and how many lines were not items."""

    name: str
    items: dict[str, Outcome]
    unreadable: int = 0
    duplicates: int = 0

    @property
    def accuracy(self) -> float | None:
        return sum(o.correct for o in self.items.values()) / len(self.items) if self.items else None


@dataclass(frozen=True)
class Changed:
    """An item both runs hold, with each run's answer."""

    id: str
    gold: str
    a: str
    b: str

    def to_json(self) -> dict:
        return {"id": self.id, "gold": self.gold, "a": self.a, "b": self.b}


@dataclass(frozen=True)
class EvalDiff:
    a: RunItems
    b: RunItems
    right_to_wrong: tuple[Changed, ...]
    wrong_to_right: tuple[Changed, ...]
    became_empty: tuple[Changed, ...]
    became_truncated: tuple[Changed, ...]
    only_in_reasoning: tuple[Changed, ...]  # B's answers found only in its reasoning (A's were not)
    only_in_a: tuple[str, ...]
    only_in_b: tuple[str, ...]
    paired: int
    delta: float | None  # accuracy_b - accuracy_a over the paired items
    interval: tuple[float, float] | None  # 95 % of the delta
    p_value: float | None  # exact McNemar on the paired items that changed

    @property
    def noise(self) -> bool | None:
        """Whether the change is within noise: its interval holds 0."""
        return None if self.interval is None else self.interval[0] <= 0 <= self.interval[1]

    def to_json(self) -> dict:
        ids = {name: [c.id for c in getattr(self, name)] for name in
               ("right_to_wrong", "wrong_to_right", "became_empty", "became_truncated", "only_in_reasoning")}
        return {
            "a": self.a.name, "b": self.b.name, **ids,
            "only_in_a": list(self.only_in_a), "only_in_b": list(self.only_in_b),
            "accuracy_a": self.a.accuracy, "accuracy_b": self.b.accuracy, "paired": self.paired,
            "delta": self.delta, "interval": list(self.interval) if self.interval else None,
            "p_value": self.p_value, "noise": self.noise,
            "items": {name: [c.to_json() for c in getattr(self, name)] for name in ids},
            "unreadable": {"a": self.a.unreadable, "b": self.b.unreadable},
            "duplicates": {"a": self.a.duplicates, "b": self.b.duplicates},
        }


@dataclass
class RunReader:
    """One run's items, fed a batch of lines at a time (mutable: one per read)."""

    name: str
    max_items: int = MAX_ITEMS
    items: dict[str, Outcome] = field(default_factory=dict)
    unreadable: int = 0
    duplicates: int = 0

    def feed(self, lines: Iterable[str]) -> None:
        """What is not an item is counted, not raised on; TooManyItems past max_items."""
        for line in lines:
            if not line.strip():
                continue
            read = _item(line)
            if read is None:
                self.unreadable += 1
            elif read[0] in self.items:
                self.duplicates += 1
            elif len(self.items) >= self.max_items:
                raise TooManyItems(f"holds more than {self.max_items:,} items, more than a diff keeps: not compared "
                                   "(a diff of a part would be judged as if it were the whole)")
            else:
                self.items[read[0]] = read[1]

    def result(self) -> RunItems:
        return RunItems(self.name, self.items, self.unreadable, self.duplicates)


def read_run(name: str, lines: Iterable[str], max_items: int = MAX_ITEMS) -> RunItems:
    """The items of one run's items.jsonl, all of them (TooManyItems past max_items)."""
    reader = RunReader(name, max_items)
    reader.feed(lines)
    return reader.result()


def _item(line: str) -> tuple[str, Outcome] | None:
    try:
        raw = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(raw, dict) or "id" not in raw or not _scalar(raw["id"]):
        return None
    pred, gold = _text(raw.get("pred")), _text(raw.get("gold"))
    correct = raw["correct"] if isinstance(raw.get("correct"), bool) else bool(pred) and matches(pred, gold)
    empty = not pred.strip()
    reasoning = _text(raw.get("reasoning_content") or raw.get("reasoning"))
    in_reasoning = empty and bool(gold.strip()) and gold.strip() in reasoning
    return _key(_text(raw["id"])), Outcome(correct, _bounded(pred), _bounded(gold), empty,
                                               raw.get("finish_reason") == "length", in_reasoning)


def _scalar(value: object) -> bool:
    return isinstance(value, (str, int)) and not isinstance(value, bool)


def _text(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float, bool)):
        return json.dumps(value)
    return ""  # an object or a list where text belongs: no answer


def _bounded(text: str) -> str:
    return text if len(text) <= TEXT_BOUND else text[:TEXT_BOUND] + "…"


def _key(text: str) -> str:
    """An id as kept: whole, or cut with a digest of the whole (two ids that share their first
    TEXT_BOUND characters stay two items)."""
    if len(text) <= TEXT_BOUND:
        return text
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()
    return f"{text[:TEXT_BOUND]}…#{digest}"


def diff(a: RunItems, b: RunItems) -> EvalDiff:
    both = [i for i in a.items if i in b.items]
    pairs = [(i, a.items[i], b.items[i]) for i in both]

    def changed(test) -> tuple[Changed, ...]:
        return tuple(Changed(i, x.gold, x.answer, y.answer) for i, x, y in pairs if test(x, y))

    right_to_wrong = changed(lambda x, y: x.correct and not y.correct)
    wrong_to_right = changed(lambda x, y: not x.correct and y.correct)
    table = _paired_table(pairs)
    return EvalDiff(
        a, b, right_to_wrong, wrong_to_right,
        changed(lambda x, y: not x.empty and y.empty), changed(lambda x, y: not x.truncated and y.truncated),
        changed(lambda x, y: not x.in_reasoning and y.in_reasoning),
        tuple(i for i in a.items if i not in b.items), tuple(i for i in b.items if i not in a.items),
        len(pairs), _delta(table), paired_interval(*table) if pairs else None,
        mcnemar_exact(table[1], table[2]) if pairs else None)


def _paired_table(pairs: list) -> tuple[int, int, int, int]:
    """(both right, right in A only, right in B only, both wrong)."""
    both = sum(1 for _, x, y in pairs if x.correct and y.correct)
    only_a = sum(1 for _, x, y in pairs if x.correct and not y.correct)
    only_b = sum(1 for _, x, y in pairs if not x.correct and y.correct)
    return both, only_a, only_b, len(pairs) - both - only_a - only_b


def _delta(table: tuple[int, int, int, int]) -> float | None:
    n = sum(table)
    return (table[2] - table[1]) / n if n else None


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a proportion."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def paired_interval(both: int, only_a: int, only_b: int, neither: int, z: float = Z95) -> tuple[float, float]:
    """95 % interval of accuracy B - accuracy A over paired items (Newcombe's square-and-add,
    with the continuity-corrected correlation he recommends)."""
    n = both + only_a + only_b + neither
    a_right, b_right = both + only_a, both + only_b
    p_a, p_b = a_right / n, b_right / n
    low_a, high_a = wilson(a_right, n, z)
    low_b, high_b = wilson(b_right, n, z)
    margins = a_right * (n - a_right) * b_right * (n - b_right)
    cross = both * neither - only_a * only_b
    if margins == 0 or 0 <= cross <= n / 2:
        phi = 0.0
    else:
        phi = (cross - n / 2 if cross > n / 2 else cross) / math.sqrt(margins)
    delta = p_b - p_a
    down = math.sqrt(max(0.0, (p_b - low_b) ** 2 + (high_a - p_a) ** 2 - 2 * phi * (p_b - low_b) * (high_a - p_a)))
    up = math.sqrt(max(0.0, (high_b - p_b) ** 2 + (p_a - low_a) ** 2 - 2 * phi * (high_b - p_b) * (p_a - low_a)))
    return max(-1.0, delta - down), min(1.0, delta + up)


def mcnemar_exact(only_a: int, only_b: int) -> float:
    """Two-sided exact McNemar p: the binomial test of the items that changed, at one half."""
    n = only_a + only_b
    if n == 0:
        return 1.0
    log_all = n * math.log(2)  # in logs: an eval of thousands of changed items overflows a float's 2**n
    tail = sum(math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) - log_all)
               for i in range(min(only_a, only_b) + 1))
    return min(1.0, 2 * tail)
