"""The one reading of a check's result that every checker shares: `check gguf` (problems and
ok), `check eval` (problems), `check trainlog` (anomalies). Each finding carries a severity."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def has_errors(result: Mapping[str, Any]) -> bool:
    """Whether a check's result holds an error-level finding or says it is not ok (the CLI then
    exits 1). A finding without a severity counts as an error: unknown is not fine."""
    findings = [*result.get("problems", ()), *result.get("anomalies", ())]
    return any(f.get("severity", "error") == "error" for f in findings) or result.get("ok") is False
