"""Marker hits in a chunk of log bytes: which configured markers occur on which lines.

Runs ON the box, imported by probe.py. Standard library only, Python >= 3.8.

Markers are rare and logs are large, so the scan looks for candidate lines as fast as the
bytes can be read, and runs the regexes only on those lines. When the console sent needles
(literals one of which every match contains), a few bytes that cover all needles and are rare
in this chunk are searched with bytes.find (memchr); otherwise, or when no rare enough bytes
exist, one combined pattern runs over the chunk.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Mapping, Pattern, Sequence

MAX_HIT_TEXT = 400
SAMPLE_BYTES = 16 * 1024  # from each of three places in the chunk, to judge how rare a byte is
MAX_CANDIDATE_RATE = 1.0 / 2048  # candidates per byte above which the combined regex is faster


def marker_hits(data: bytes, base: int, markers: Markers) -> list[dict[str, Any]]:
    """Hits of markers on the complete lines of data (which starts at offset base), one per
    marker and line, in line order. Each pattern is tested on its own line, as re.search on
    that line alone would, so that none can match across a line break. The chunk-wide search
    that finds candidate lines runs a leading ^ as "anywhere" (re.MULTILINE is several times
    slower): it may find too many lines, never too few; patterns with which it could find too
    few (an anchor or a negative lookaround that sees the neighbouring lines) test every line."""
    end = data.rfind(b"\n") + 1
    if not markers.patterns or end <= 0:
        return []
    combined = markers.combined or []  # None only when every_line
    cover = None if markers.every_line else rare_cover(data, end, markers.needles)
    if markers.every_line:
        starts = every_line(data, end)
    else:
        starts = lines_with_bytes(data, end, cover) if cover else lines_matching(data, end, combined)
    hits = []
    for start in starts:
        line = data[start:data.index(b"\n", start)]
        if cover and not any(p.search(line) for p in combined):
            continue
        for name, pattern in markers.patterns:
            if pattern.search(line):
                hits.append({"marker": name, "offset": base + start,
                             "line": line[:MAX_HIT_TEXT].decode("utf-8", "replace")})
    return hits


def every_line(data: bytes, end: int) -> list[int]:
    """The start of every line in data[:end]."""
    starts = [0]
    pos = data.find(b"\n", 0, end)
    while 0 <= pos < end - 1:
        starts.append(pos + 1)
        pos = data.find(b"\n", pos + 1, end)
    return starts


def lines_matching(data: bytes, end: int, patterns: Iterable[Pattern[bytes]]) -> list[int]:
    """Starts of the lines in data[:end] where any of patterns matches, in order (usually one
    combined pattern, which runs over the whole chunk in C). After a match the search goes on
    from the next line: a match that ran past its line's end must not hide the next line's."""
    starts = set()
    for pattern in patterns:
        pos = 0
        while pos < end:
            match = pattern.search(data, pos, end)
            if match is None or match.start() >= end:  # none, or an empty one after the last line
                break
            starts.add(data.rfind(b"\n", 0, match.start()) + 1)
            pos = data.index(b"\n", match.start()) + 1
    return sorted(starts)


def lines_with_bytes(data: bytes, end: int, cover: Iterable[int]) -> list[int]:
    """Starts of the lines in data[:end] that hold any byte of cover, in order."""
    starts = set()
    for byte in cover:
        pos = data.find(byte, 0, end)
        while pos >= 0:
            starts.add(data.rfind(b"\n", 0, pos) + 1)
            pos = data.find(byte, data.index(b"\n", pos) + 1, end)
    return sorted(starts)


def rare_cover(data: bytes, end: int, needles: Iterable[bytes] | None) -> list[int] | None:
    """A few bytes such that every needle holds one of them, chosen greedily by how rare they
    are in a sample of the chunk; None when there are no needles, or the bytes are so common
    that testing each candidate line would cost more than the combined regex."""
    if not needles:
        return None
    third = end // 3
    sample = data[:SAMPLE_BYTES] + data[third:third + SAMPLE_BYTES] + data[end - SAMPLE_BYTES:end]
    count: dict[int, int] = {}
    cover: list[int] = []
    uncovered = list(needles)
    while uncovered:
        holders: dict[int, int] = {}
        for needle in uncovered:
            for byte in set(needle):
                holders[byte] = holders.get(byte, 0) + 1
        for byte in holders:
            if byte not in count:
                count[byte] = sample.count(byte)
        best = min(holders, key=lambda b: (count[b] + 1.0) / holders[b])
        cover.append(best)
        uncovered = [n for n in uncovered if best not in n]
    if sum(count[b] for b in cover) > MAX_CANDIDATE_RATE * max(len(sample), 1):
        return None
    return cover


INLINE_FLAGS = ((re.IGNORECASE, b"i"), (re.MULTILINE, b"m"), (re.DOTALL, b"s"), (re.VERBOSE, b"x"))
LEADING_FLAGS = re.compile(br"^\(\?[aiLmsux]+\)")


def combine(patterns: Sequence[Pattern[bytes]]) -> list[Pattern[bytes]] | None:
    """One alternation of all patterns, each keeping its own flags: a (?i) at the start of one
    becomes (?i:...) around it, as global flags are only allowed at the very start. None when
    that does not compile, or would not mean what the patterns mean (a numbered backreference
    would point into another pattern's groups)."""
    if any(p.groups and NUMBERED_BACKREFERENCE.search(p.pattern) for p in patterns):
        return None
    pieces = []
    for p in patterns:
        letters = b"".join(letter for flag, letter in INLINE_FLAGS if p.flags & flag)
        source = LEADING_FLAGS.sub(b"", p.pattern, count=1) if letters else p.pattern
        pieces.append(b"(?" + letters + b":" + source + b")")
    try:
        return [compile_pattern(b"|".join(pieces))] if pieces else []
    except re.error:
        return None


def compile_pattern(source: bytes) -> Pattern[bytes]:
    """re.compile(source); re.error also for a repeat count or a nesting beyond re's limits."""
    try:
        return re.compile(source)
    except (OverflowError, RecursionError) as e:
        raise re.error("%s: %s" % (type(e).__name__, e)) from None


NUMBERED_BACKREFERENCE = re.compile(br"\\[1-9]|\(\?\([1-9]")
# What makes a search over many lines at once miss a match that the line alone holds: an anchor
# other than a leading ^ (in a chunk it means the chunk's start or end), or a negative lookaround
# that would see the next or the previous line. Found in the source text, erring on "may".
CONTEXT_SENSITIVE = re.compile(r"(?<!\[)\^|\$|\\[AZ]|\(\?<?!")


def sees_other_lines(source: str) -> bool:
    return bool(CONTEXT_SENSITIVE.search(source[1:] if source.startswith("^") else source))


COMPILED: dict[tuple[Any, ...], Markers] = {}  # the markers of each watched log, compiled once per probe process
MAX_COMPILED = 64


def compiled(specs: Sequence[Mapping[str, Any]]) -> Markers:
    """Markers(specs), compiled once: a --serve probe is asked for the same logs every second."""
    key = tuple((m.get("name"), m.get("pattern"), tuple(m.get("needles") or ())) for m in specs)
    markers = COMPILED.get(key)
    if markers is None:
        if len(COMPILED) >= MAX_COMPILED:
            COMPILED.clear()
        markers = COMPILED[key] = Markers(specs)
    return markers


class Markers(object):
    """Markers compiled for marker_hits: each pattern alone, all of them (a leading ^ left out)
    as one alternation, and the needles when every marker came with some. re.error when a
    pattern does not compile."""

    def __init__(self, specs: Sequence[Mapping[str, Any]]) -> None:
        self.patterns = []
        relaxed = []
        self.every_line = False
        for m in specs:
            source = m.get("pattern")
            if source is None:
                source = re.escape(m["name"])
            pattern = compile_pattern(source.encode("utf-8"))
            self.patterns.append((m["name"], pattern))
            self.every_line = self.every_line or sees_other_lines(source)
            try:  # leaving out a leading ^ only lets it match in more places
                relaxed.append(compile_pattern(source[1:].encode("utf-8")) if source.startswith("^") else pattern)
            except re.error:
                self.every_line = True
        self.combined = combine(relaxed) if not self.every_line else None
        if self.combined is None:
            self.every_line = True
        needles = [m.get("needles") or () for m in specs]
        self.needles = None
        if needles and all(needles) and all(n for group in needles for n in group):  # "" is in every line
            self.needles = sorted({n.encode("utf-8") for group in needles for n in group})
