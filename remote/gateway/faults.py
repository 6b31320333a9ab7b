"""Fault injection: what the next /execute requests suffer (a queue of steps, then a standing fault)."""

from __future__ import annotations

import math
import threading
from collections import deque
from dataclasses import dataclass

DEFAULT_TRICKLE_DELAY_S = 0.2
DEFAULT_RETRY_AFTER_S = 1

FAULT_MODES = ("500", "503", "hang", "trickle", "close_mid_body", "silent_spawn")
FAULTS_THAT_SKIP_THE_RUN = ("500", "503", "hang", "silent_spawn")


@dataclass(frozen=True)
class Fault:
    mode: str
    delay_s: float = DEFAULT_TRICKLE_DELAY_S
    retry_after_s: int = DEFAULT_RETRY_AFTER_S


@dataclass
class FaultStep:
    fault: Fault | None  # None: let requests through
    remaining: int


class FaultError(ValueError):
    """A fault request that makes no sense (unknown mode, bad count)."""


def _non_negative_number(spec: dict, name: str, default, kind):
    value = spec.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise FaultError(f"{name} must be a non-negative number")
    if kind is int and value != int(value):
        raise FaultError(f"{name} must be a whole number")
    return kind(value)


def fault_from_spec(spec: dict) -> tuple[Fault, int, int]:
    """Parse a control request's JSON into (fault, count, after)."""
    if not isinstance(spec, dict):
        raise FaultError("expected a JSON object")
    unknown = set(spec) - {"mode", "count", "after", "delay_s", "retry_after_s"}
    if unknown:
        raise FaultError(f"unknown field(s): {', '.join(sorted(unknown))}")
    mode = spec.get("mode")
    if mode not in FAULT_MODES:
        raise FaultError(f"mode must be one of {', '.join(FAULT_MODES)}")
    count = _non_negative_number(spec, "count", 1, int)
    if count < 1:
        raise FaultError("count must be at least 1")
    after = _non_negative_number(spec, "after", 0, int)
    delay_s = _non_negative_number(spec, "delay_s", DEFAULT_TRICKLE_DELAY_S, float)
    retry_after_s = _non_negative_number(spec, "retry_after_s", DEFAULT_RETRY_AFTER_S, int)
    return Fault(mode, delay_s, retry_after_s), count, after


class FaultPlan:
    """What the next /execute requests suffer: the queued steps in order, then the standing fault."""

    def __init__(self, standing: Fault | None = None) -> None:
        self.standing = standing
        self._steps: deque[FaultStep] = deque()
        self._lock = threading.Lock()

    def arm(self, mode: str, count: int = 1, after: int = 0, *, delay_s: float = DEFAULT_TRICKLE_DELAY_S,
            retry_after_s: int = DEFAULT_RETRY_AFTER_S) -> None:
        fault, count, after = fault_from_spec(
            {"mode": mode, "count": count, "after": after, "delay_s": delay_s, "retry_after_s": retry_after_s})
        with self._lock:
            if after:
                self._steps.append(FaultStep(None, after))
            self._steps.append(FaultStep(fault, count))

    def clear(self) -> None:
        with self._lock:
            self._steps.clear()

    def take(self) -> Fault | None:
        """The fault for the request being handled now (consumes one request of the current step)."""
        with self._lock:
            if not self._steps:
                return self.standing
            step = self._steps[0]
            step.remaining -= 1
            if step.remaining == 0:
                self._steps.popleft()
            return step.fault

    def describe(self) -> dict:
        with self._lock:
            queued = [{"mode": step.fault.mode if step.fault else "none", "remaining": step.remaining,
                       **({"delay_s": step.fault.delay_s, "retry_after_s": step.fault.retry_after_s}
                          if step.fault else {})}
                      for step in self._steps]
        return {"queued": queued, "standing": self.standing.mode if self.standing else None}

