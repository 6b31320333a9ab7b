"""Human-readable sizes and durations, shared by the CLI's reports and the widgets.

The numbers often come from the box: an infinite or NaN one is shown as unknown, never raised on."""

from __future__ import annotations

import math


def size(n: float | None) -> str:
    if n is None or not math.isfinite(n):
        return "?"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "?"
    s = int(max(seconds, 0))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def age(seconds: float | None) -> str:
    """An age as kubectl and k9s show it: seconds only in the first minute, then minutes. A table
    of ages then changes once a minute rather than every second, for the eye and for the CPU."""
    if seconds is not None and 60 <= seconds < 3600:  # (NaN fails this)
        return f"{int(seconds) // 60}m"
    return duration(seconds)
