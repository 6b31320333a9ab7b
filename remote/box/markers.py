"""Marker hits in a chunk of log bytes: which configured markers occur on which lines.

Runs ON the box, imported by probe.py. Standard library only, Python >= 3.8.
"""

import re

MAX_HIT_TEXT = 400


def marker_hits(data, base, markers):
    """Hits of markers on the complete lines of data (which starts at offset base), one per
    marker and line, in line order.

    One combined pattern runs over the whole chunk in C (markers are rare); only the few lines
    it stops at are then tested marker by marker, each on its own line, so that no pattern can
    match across a line break. A leading ^ is checked as "at the start of the line" instead of
    being left to re.MULTILINE, which is several times slower."""
    end = data.rfind(b"\n") + 1
    if not markers.patterns or end <= 0:
        return []
    hits = []
    next_line = 0
    for match in markers.any.finditer(data, 0, end):
        if match.start() < next_line:
            continue  # this line is done
        start = data.rfind(b"\n", 0, match.start()) + 1
        next_line = data.index(b"\n", match.start()) + 1
        line = data[start:next_line - 1]
        for name, pattern, anchored in markers.patterns:
            found = pattern.match(line) if anchored else pattern.search(line)
            if found:
                hits.append({"marker": name, "offset": base + start,
                             "line": line[:MAX_HIT_TEXT].decode("utf-8", "replace")})
    return hits


class Markers(object):
    """Markers compiled for marker_hits: each pattern alone, and all of them as one alternation."""

    def __init__(self, specs):
        self.patterns = []
        for m in specs:
            source = m.get("pattern", re.escape(m["name"]))
            anchored = source.startswith("^")
            self.patterns.append((m["name"], re.compile((source[1:] if anchored else source).encode("utf-8")),
                                  anchored))
        joined = b"|".join(b"(?:" + p.pattern + b")" for _, p, _ in self.patterns)
        self.any = re.compile(joined or b"(?!)")
