"""Literal needles of a marker pattern: strings one of which every match must contain.

The probe looks for these with memchr-speed byte searches before it runs any regex, so a 1 GB
log is scanned at the speed of reading it. The needles are worked out here, on the console
(pinned Python), rather than on the box (any Python >= 3.8), because they come from the regex
parser's internals.
"""

from __future__ import annotations

import re
from functools import lru_cache
from re import _constants as c  # type: ignore[attr-defined]  # private on purpose (see above): no stubs
from re import _parser  # type: ignore[attr-defined]  # private on purpose (see above): no stubs

Needles = tuple[str, ...]


@lru_cache(maxsize=1024)
def required_needles(pattern: str) -> Needles | None:
    """Strings one of which occurs in every match of pattern; None when there is no such set
    (a pattern that can match without any fixed text, case-insensitive matching, bad syntax)."""
    try:
        parsed = _parser.parse(pattern)
    except (re.error, OverflowError, RecursionError):  # also a repeat count or a nesting beyond re's limits
        return None
    if parsed.state.flags & re.IGNORECASE:
        return None
    return _needles(list(parsed))


def _needles(items: list) -> Needles | None:
    """The best needle set of one sequence: each maximal run of literals is a set of one; a
    group, a branch or a repeat of at least one contributes its own. Runs are cut at anything
    else, which can only make the needles shorter, never wrong."""
    best: Needles | None = None
    run: list[str] = []
    for op, arg in [*items, (None, None)]:
        if op is c.LITERAL:
            run.append(chr(arg))
            continue
        if run:
            best = _better(best, ("".join(run),))
            run = []
        best = _better(best, _of_item(op, arg))
    return best


def _of_item(op, arg) -> Needles | None:
    if op is c.SUBPATTERN:
        _group, add_flags, _del_flags, items = arg
        return None if add_flags & re.IGNORECASE else _needles(list(items))
    if op is c.ATOMIC_GROUP:
        return _needles(list(arg))
    if op in (c.MAX_REPEAT, c.MIN_REPEAT, c.POSSESSIVE_REPEAT):
        low, _high, items = arg
        return _needles(list(items)) if low >= 1 else None
    if op is c.BRANCH:
        union: set[str] = set()
        for items in arg[1]:
            branch = _needles(list(items))
            if branch is None:  # one branch without needles: the whole branch has none
                return None
            union.update(branch)
        return tuple(sorted(union))
    return None


def _better(a: Needles | None, b: Needles | None) -> Needles | None:
    """The set whose shortest needle is longest (rarer), then the one with fewer needles."""
    if a is None or b is None:
        return a or b
    return max(a, b, key=lambda n: (min(map(len, n)), -len(n)))
