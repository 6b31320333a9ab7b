"""What every checker's result shares: its findings as `Problem`s, and the one reading of them
(`has_errors`) that `check gguf|trainlog|eval` and the preflight's evidence use. Each checker's
own result type (TrainLogResult, EvalResult, GgufResult) adds its figures and a `to_json()`
that is the CLI's JSON contract."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from samai.remote.model import Severity


@dataclass(frozen=True)
class Problem:
    """One finding. Where it is, when the checker knows: the training step (a log anomaly), the
    1-based line numbers (an eval's malformed lines, the first few), how many items it covers."""

    code: str
    severity: Severity
    message: str
    step: int | None = None
    lines: tuple[int, ...] = ()
    count: int | None = None


class CheckResult(Protocol):
    """A checker's result: its problems, and its JSON for the CLI."""

    @property
    def problems(self) -> tuple[Problem, ...]: ...

    def to_json(self) -> dict[str, Any]: ...


def has_errors(result: CheckResult) -> bool:
    """Whether a check's result holds an error-level problem or says it is not ok (the CLI then
    exits 1). A GGUF check's `ok` is its own verdict: it can say no where its problems are warnings."""
    return any(p.severity == "error" for p in result.problems) or getattr(result, "ok", True) is False
