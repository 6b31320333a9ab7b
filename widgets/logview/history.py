"""The logs the pane has shown, for back and forward (`[` `]`) and the picker's recent files.

Pure data (no Textual): the app records each log it shows and asks where back or forward leads."""

from __future__ import annotations

from dataclasses import dataclass

MAX_VISITS = 50
MAX_RECENT_FILES = 10


@dataclass(frozen=True)
class ShownLog:
    """A log the pane showed: a stage's (by name) or a file opened by path (as typed)."""

    path: str
    stage: str | None = None


class LogHistory:
    """Visits in order, with a position in them, like a browser's."""

    def __init__(self, max_visits: int = MAX_VISITS, max_recent: int = MAX_RECENT_FILES) -> None:
        self._visits: list[ShownLog] = []
        self._at = -1
        self._recent: list[str] = []
        self._max_visits, self._max_recent = max_visits, max_recent

    @property
    def current(self) -> ShownLog | None:
        return self._visits[self._at] if self._visits else None

    @property
    def recent_files(self) -> tuple[str, ...]:
        """Files opened by path, the newest first, each once."""
        return tuple(self._recent)

    def visit(self, log: ShownLog) -> None:
        """The pane shows log now: what was ahead of the current one is forgotten."""
        if log.stage is None:
            self._recent = [log.path, *(p for p in self._recent if p != log.path)][: self._max_recent]
        if log == self.current:
            return
        del self._visits[self._at + 1:]
        self._visits.append(log)
        del self._visits[: max(0, len(self._visits) - self._max_visits)]
        self._at = len(self._visits) - 1

    def back(self) -> ShownLog | None:
        """The log shown before the current one (and go there), or None at the first."""
        if self._at <= 0:
            return None
        self._at -= 1
        return self._visits[self._at]

    def forward(self) -> ShownLog | None:
        """The log shown after the current one (and go there), or None at the last."""
        if self._at >= len(self._visits) - 1:
            return None
        self._at += 1
        return self._visits[self._at]
