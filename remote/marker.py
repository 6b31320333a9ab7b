"""A log marker: a stage's named pattern, as its config declares it and the probe is asked for it.

Apart from remote/model.py (the types of every reply) so that reading a config, which the
first paint needs, does not load them all."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from samai.remote.marker_needles import required_needles

Severity = Literal["info", "warning", "error"]  # of a marker, a finding, a check, an alert


@dataclass(frozen=True)
class Marker:
    name: str
    pattern: str  # a regular expression matched against each log line's bytes
    severity: Severity = "info"

    def request(self) -> dict:
        needles = required_needles(self.pattern)
        return {"name": self.name, "pattern": self.pattern, "needles": list(needles) if needles else None}
