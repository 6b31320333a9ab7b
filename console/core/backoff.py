"""How long to wait before asking a box again: one rule for the box screen, the fleet and `tail --follow`."""

from __future__ import annotations

MAX_BACKOFF_S = 8.0  # a box that comes back is seen within seconds, not minutes


class Backoff:
    """The pause before asking a box again: the interval while it answers, doubling up to
    MAX_BACKOFF_S while it does not."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.pause = interval

    def failed(self) -> float:
        """The pause after a failure (the next one doubles)."""
        pause, self.pause = self.pause, min(self.pause * 2, MAX_BACKOFF_S)
        return pause

    def answered(self) -> None:
        self.pause = self.interval
