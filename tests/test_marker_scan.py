"""The probe's marker scan: needles worked out from the patterns, the byte prefilter that uses
them, and the combined-regex path it falls back to, which must all find exactly the same hits."""

from __future__ import annotations

import random
import re

import pytest

from samai.console.core.config import load_builtin
from samai.remote.box.markers import Markers, marker_hits, rare_cover
from samai.remote.marker_needles import required_needles
from samai.remote.model import Marker


@pytest.mark.parametrize(("pattern", "needles"), [
    (r"CHAIN_DONE rc=\d+", ("CHAIN_DONE rc=",)),
    (r"^Traceback ", ("Traceback ",)),
    (r"TRAIN_NAN|TRAIN_DONE", ("TRAIN_",)),
    (r"foo|bar", ("bar", "foo")),
    (r"loss[: ]+nan", ("loss",)),
    (r"x(?:ab)+y", ("ab",)),
    (r"(?:CUDA|cuda) out of memory", (" out of memory",)),
    (r"(?i:warn)ING", ("ING",)),
    (r"é", ("é",)),
])
def test_needles_of_patterns(pattern: str, needles: tuple[str, ...]) -> None:
    assert required_needles(pattern) == needles


@pytest.mark.parametrize("pattern", [r"(?i)error", r"a*", r"\d+", r"[A-Z]+_FAIL?" "|x*", "(", r"(?:ab)?"])
def test_no_needles_where_a_match_needs_no_fixed_text(pattern: str) -> None:
    assert required_needles(pattern) is None


PIECES = ["a", "b", "ab", "_X", "c?", "(?:a|bc)", "(?:ab)+", "[ab]", "\\d", "x*", "(?:q|a)?", ".", "(?i:b)", "b{2}"]


def test_every_match_holds_a_needle() -> None:
    """Random patterns over random text: wherever a pattern matches, one of its needles occurs
    inside the match (the prefilter may only ever let through too much)."""
    rng = random.Random(8)
    checked = 0
    for _ in range(3000):
        pattern = "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 4)))
        if rng.random() < 0.2:
            pattern += "|" + "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 3)))
        needles = required_needles(pattern)
        if needles is None:
            continue
        text = "".join(rng.choice("abcqxX_1B\n") for _ in range(200))
        for match in re.finditer(pattern, text):
            assert any(n in match.group() for n in needles), (pattern, needles, match.group())
            checked += 1
    assert checked > 1000


def specs(markers, with_needles: bool = True) -> list[dict]:
    out = [m.request() for m in markers]
    if not with_needles:
        for spec in out:
            spec["needles"] = None
    return out


PIPELINE = tuple({m.name: m for s in load_builtin("tiny").stages for m in s.markers}.values())
NOISE = [b"{'loss': '0.8897', 'grad_norm': '1.14', 'learning_rate': '0.00111', 'epoch': '47.5'}",
         b" 45%|####5     | 4500/10000 [12:01<14:41,  6.24it/s]",
         b"[2026-11-30 07:34:04,426] [INFO] [engine.py:2020:step] step=4500, skipped=0, lr=[0.0001]",
         b"\xff\xfe garbage \x00 bytes"]
MARKED = [b"TRAIN_NAN step 4 loss nan", b"Traceback (most recent call last):", b"  raise Traceback x",
          b"CHAIN_DONE rc=0", b"CHAIN_DONE rc=", b"FETCH_DONE and PUSH_FAIL on one line", b"EVAL_RC=3 \xff"]


def noisy_log(rng: random.Random, lines: int) -> bytes:
    rows = [rng.choice(MARKED) if rng.random() < 0.002 else NOISE[i % len(NOISE)] for i in range(lines)]
    return MARKED[0] + b"\n" + b"\n".join(rows) + b"\n" + MARKED[3] + b"\nCHAIN_DONE rc=1 (unfinished)"


def test_prefilter_finds_exactly_what_the_regex_finds() -> None:
    data = noisy_log(random.Random(1), 60_000)
    fast, slow = Markers(specs(PIPELINE)), Markers(specs(PIPELINE, with_needles=False))
    assert rare_cover(data, data.rfind(b"\n") + 1, fast.needles) is not None  # the prefilter is used
    hits = marker_hits(data, 1000, fast)
    assert hits == marker_hits(data, 1000, slow)
    names = [h["marker"] for h in hits]
    assert names[0] == "TRAIN_NAN" and hits[0]["offset"] == 1000
    assert names.count("Traceback") == sum(1 for h in hits if h["line"].startswith("Traceback"))
    assert {"FETCH_DONE", "PUSH_FAIL", "EVAL_RC", "CHAIN_DONE"} <= set(names)
    assert hits[-1]["marker"] == "CHAIN_DONE" and "unfinished" not in hits[-1]["line"]  # only complete lines


def test_common_needle_bytes_fall_back_to_the_regex() -> None:
    """A marker whose needle is made of everyday letters would make every line a candidate: the
    combined regex is used instead, with the same result."""
    markers = (*PIPELINE, Marker("step", r"step=\d+"))
    data = noisy_log(random.Random(2), 20_000)
    fast = Markers(specs(markers))
    assert rare_cover(data, data.rfind(b"\n") + 1, fast.needles) is None
    hits = marker_hits(data, 0, fast)
    assert hits == marker_hits(data, 0, Markers(specs(markers, with_needles=False)))
    assert sum(h["marker"] == "step" for h in hits) > 1000


def test_a_marker_without_needles_turns_the_prefilter_off() -> None:
    markers = (*PIPELINE, Marker("warn", r"(?i)warning"))
    compiled = Markers(specs(markers))
    assert compiled.needles is None
    data = b"x\nWarning: low disk\nTRAIN_DONE\n"
    assert [h["marker"] for h in marker_hits(data, 0, compiled)] == ["warn", "TRAIN_DONE"]
