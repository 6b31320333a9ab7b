"""Marker lines: which lines of a log stand out, and how much (no Textual here).

Stage logs bring their configured markers; every log, a file opened with `o` included, is
also scanned for the usual signs of trouble (ALARMS), so `n`/`N` land on them anywhere."""

from __future__ import annotations

import re
from collections.abc import Sequence

from samai.remote.marker import Marker
from samai.remote.marker_needles import required_needles

RANKS = {"info": 1, "warning": 2, "error": 3}
RANK_CLASSES = ("", "logview--info", "logview--warning", "logview--error")

# What any log says when something went wrong: matched in every file the pane shows.
ALARMS: tuple[Marker, ...] = (
    Marker("error", r"\b(?:ERROR|CRITICAL|FATAL)\b|\bTraceback \(most recent call last\)", "error"),
    Marker("oom", r"CUDA out of memory|\bOutOfMemoryError\b|\bOOM\b|\bout of memory\b", "error"),
    Marker("killed", r"\bKilled\b|\bSegmentation fault\b|\bcore dumped\b", "error"),
    Marker("nan", r"\b(?:NaN|nan)\b", "warning"),
)

# Patterns that refer to their own groups by number cannot be joined into one alternation.
_GROUP_REFERENCE = re.compile(r"\\[1-9]|\(\?P=|\(\?\(")


def with_alarms(markers: Sequence[Marker]) -> tuple[Marker, ...]:
    """A log's own markers, then the alarms (a line matching both keeps the higher rank)."""
    return (*markers, *ALARMS)


class Markers:
    """Markers, compiled: a line's most severe match, as a rank (0: none)."""

    def __init__(self, markers: Sequence[Marker]) -> None:
        compiled: list[tuple[int, re.Pattern[str]]] = []
        for marker in markers:
            try:
                compiled.append((RANKS.get(marker.severity, 1), re.compile(marker.pattern)))
            except re.error:
                continue  # the config layer reports bad patterns; the pane just can't colour them
        compiled.sort(key=lambda item: -item[0])
        self._by_rank = compiled
        # Fixed strings one of which every match holds: most lines are turned away by a few
        # substring searches, which cost far less than the patterns (\b at every position).
        needles = [required_needles(rx.pattern) for _, rx in compiled]
        self._needles: tuple[str, ...] | None = None
        if compiled and all(needles):
            self._needles = tuple(dict.fromkeys(n for group in needles for n in group or ()))
        # One alternation rejects the (many) unmarked lines in a single search.
        self._any: re.Pattern[str] | None = None
        if len(compiled) > 1 and not any(_GROUP_REFERENCE.search(rx.pattern) for _, rx in compiled):
            try:
                self._any = re.compile("|".join(f"(?:{rx.pattern})" for _, rx in compiled))
            except re.error:
                self._any = None  # e.g. a global inline flag inside one pattern: test one by one

    def __bool__(self) -> bool:
        return bool(self._by_rank)

    def rank(self, line: str) -> int:
        if self._needles is not None and not any(n in line for n in self._needles):
            return 0
        if self._any is not None and self._any.search(line) is None:
            return 0
        for rank, rx in self._by_rank:
            if rx.search(line) is not None:
                return rank
        return 0
