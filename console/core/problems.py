"""The one finding type: what a detector sees on the box (`doctor`, the TUI's alerts) and what a
checker finds in a file (`check gguf|trainlog|eval`, the preflight's evidence), and the one
reading of a checker's findings (`has_errors`). Each checker's own result type (TrainLogResult,
EvalResult, GgufResult) adds its figures and a `to_json()` that is the CLI's JSON contract.

Two finding-like types stay apart, being other things: `preflight.Check` is one line of a
stage's go/no-go list (severity ok|warning|error, no code: an `ok` is no finding) and
`remote.model.GgufProblem` is the box checker's reply as it comes off the wire (remote/ imports
nothing of console/; checks.py turns each into a Finding)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from samai.console.core.redact import redact

if TYPE_CHECKING:
    from samai.console.core.fixes import FixAction
    from samai.remote.model import Severity


@dataclass(frozen=True)
class Finding:
    """One finding, and what `x` does about it (None: look, don't touch). Where it is, when the
    checker knows: the training step (a log anomaly), the 1-based line numbers (an eval's
    malformed lines, the first few), how many items it covers."""

    code: str
    severity: Severity
    message: str
    action: FixAction | None = None
    step: int | None = None
    lines: tuple[int, ...] = ()
    count: int | None = None
    checkpoint: str | None = None  # resume_available: the checkpoint folder a dead run resumes from

    def __post_init__(self) -> None:
        # Findings quote command lines, paths and file contents from the box: never a secret shown.
        object.__setattr__(self, "message", redact(self.message))

    @property
    def key(self) -> tuple[str, str]:
        """What makes it the same finding from poll to poll (an alert stands while it does)."""
        return self.code, self.message

    def to_json(self) -> dict[str, Any]:
        """As `doctor --json` and `snapshot --json` print a finding (its keys and their order are
        a contract; the checkers print theirs in their own result's to_json)."""
        found = {"code": self.code, "severity": self.severity, "message": self.message,
                 "action": str(self.action or "")}
        return found if self.checkpoint is None else dict(found, checkpoint=self.checkpoint)


Problem = Finding  # the checkers' name for it


class CheckResult(Protocol):
    """A checker's result: its problems, and its JSON for the CLI."""

    @property
    def problems(self) -> tuple[Finding, ...]: ...

    def to_json(self) -> dict[str, Any]: ...


def has_errors(result: CheckResult) -> bool:
    """Whether a check's result holds an error-level problem or says it is not ok (the CLI then
    exits 1). A GGUF check's `ok` is its own verdict: it can say no where its problems are warnings."""
    return any(p.severity == "error" for p in result.problems) or getattr(result, "ok", True) is False
