"""Training-log points from HF Trainer log lines, incrementally.

Both forms the Trainer prints are read: transformers 4's bare numbers
(`{'loss': 1.0778, 'grad_norm': nan, ...}`) and transformers 5's quoted values
(`{'loss': '0.8897', 'grad_norm': '1.14', ...}`), with `nan`/`inf` and `tensor(1.23)`.
Lines without a step get the next step in order."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

_DICT = re.compile(r"\{[^{}]*'loss'[^{}]*\}")
_PAIR = re.compile(r"'(\w+)'\s*:\s*(?:tensor\()?'?([-+\w.]+)'?\)?")
FIELDS = ("loss", "grad_norm", "learning_rate", "epoch")


@dataclass(frozen=True)
class TrainPoint:
    step: int
    loss: float | None
    grad_norm: float | None = None
    learning_rate: float | None = None
    epoch: float | None = None

    @property
    def bad(self) -> bool:
        """NaN/inf anywhere, or loss 0 while grad_norm is not finite (the Trainer hiding a NaN)."""
        values = [v for v in (self.loss, self.grad_norm) if v is not None]
        hidden = self.loss == 0 and self.grad_norm is not None and not math.isfinite(self.grad_norm)
        return hidden or any(not math.isfinite(v) for v in values)


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


class TrainLogParser:
    def __init__(self) -> None:
        self.points: list[TrainPoint] = []

    def feed(self, lines: Iterable[str]) -> list[TrainPoint]:
        """The new points in lines (also kept in self.points)."""
        new = []
        for line in lines:
            for found in _DICT.finditer(line.rsplit("\r", 1)[-1]):
                values = {k: _number(v) for k, v in _PAIR.findall(found.group())}
                if "train_runtime" in values or "eval_loss" in values:
                    continue  # the run's summary and eval lines are not training steps
                last = self.points[-1].step if self.points else 0
                step = values.get("step")
                point = TrainPoint(int(step) if step is not None and math.isfinite(step) else last + 1,
                                   *(values.get(f) for f in FIELDS))
                self.points.append(point)
                new.append(point)
        return new
