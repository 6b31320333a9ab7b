"""A process's identity is its pid and its start time: the one rule for whether two start times
are one process's, shared by the box tools and the console (samai.remote.model). Stdlib only,
Python >= 3.8, nothing read at import."""

from __future__ import annotations

# Start times are epoch seconds rounded to the kernel's clock tick (1/100 s): two reads of one
# process agree within one tick, and the extra thousandth absorbs the rounding of the floats.
TICK_S = 0.011


def same_start(a: float | None, b: float | None) -> bool:
    """Whether two start times are one process's: within a tick of each other, the boundary
    included. A start time that is missing matches nothing."""
    return a is not None and b is not None and abs(float(a) - float(b)) <= TICK_S


def started_before(a: float, b: float) -> bool:
    """Whether a process started at a was born before one started at b: earlier, and not the
    same start. Its opposite, born at b or since, is what a chain's processes must be."""
    return float(a) < float(b) and not same_start(a, b)
