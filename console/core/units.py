"""Human-readable sizes and durations, shared by the CLI's reports and the widgets.

The numbers often come from the box: an infinite or NaN one is shown as unknown, never raised on."""

from __future__ import annotations

import math
import time


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


def local_time(t: float | None, fmt: str = "%H:%M:%S") -> str:
    """A moment (seconds since the epoch) as local time; "?" for one no clock reads (a box's
    reply may hold an infinite, NaN or far-off time, which time.localtime raises on)."""
    if t is None or not math.isfinite(t):
        return "?"
    try:
        return time.strftime(fmt, time.localtime(t))
    except (OverflowError, OSError, ValueError):
        return "?"
