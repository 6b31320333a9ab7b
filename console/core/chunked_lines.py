"""Lines of a training log read in chunks, where one line may be megabytes of tqdm redraws.

LineDecoder keeps the head of a line over its cap and drops the rest: right for the log pane,
wrong for a training log, where tqdm writes its bar with `\\r` and no `\\n` for a whole run and
the Trainer's dict (a NaN loss, say) comes at the end of that line. PieceDecoder hands such a
line on in pieces cut just before a `\\r`, each a run of whole redraws, so memory holds one piece
and every segment is still read; a piece is counted as a line of its own."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from samai.remote.decode import LineDecoder
from samai.remote.follow import LogFollower

PIECE = 1024 * 1024  # the most of one unfinished line held before a piece of it is handed on


@dataclass
class PieceDecoder(LineDecoder):
    """A LineDecoder (as LogFollower uses it) that cuts an over-long line into pieces instead of
    dropping its tail. Lines within one chunk come whole: the chunk is held anyway."""

    max_line: int = PIECE
    part: bytearray = field(default_factory=bytearray)  # the unfinished line (or its last piece)

    @property
    def pending_bytes(self) -> int:
        return len(self.part)

    def feed(self, data: bytes) -> list[str]:
        lines: list[str] = []
        first = data.find(b"\n")
        if first < 0:
            self._add(data, lines)
            return lines
        self._add(data[:first], lines)
        lines.append(self._finish())
        end = data.rfind(b"\n")
        if end > first:  # whole lines: one decode (b"\n" is never inside a UTF-8 character)
            lines += _lines(data[first + 1:end].decode("utf-8", "replace"))
        self._add(data[end + 1:], lines)
        return lines

    def flush(self) -> str | None:
        return self._finish() if self.part else None

    def reset(self) -> None:
        self.part.clear()

    def _add(self, data: bytes, lines: list[str]) -> None:
        self.part += data
        while len(self.part) > self.max_line:
            cut = self.part.rfind(b"\r", 1)
            cut = cut if cut > 0 else self.max_line  # no redraw to cut at: a plain cut, garbage anyway
            lines.append(bytes(self.part[:cut]).decode("utf-8", "replace"))
            del self.part[:cut]

    def _finish(self) -> str:
        text = _line(bytes(self.part).decode("utf-8", "replace"))
        self.part.clear()
        return text


def _lines(text: str) -> list[str]:
    """text's lines, each without the \\r of a CRLF (looked for in each only when text has one)."""
    lines = text.split("\n")
    if "\r\n" in text or text.endswith("\r"):
        return [_line(line) for line in lines]
    return lines


def _line(text: str) -> str:
    return text[:-1] if text.endswith("\r") else text  # a CRLF line ends without its \r


def piece_follower(path: str, **kw: Any) -> LogFollower:
    """A LogFollower whose lines come through a PieceDecoder: how a training log is read, by
    `check trainlog`, the merge preflight and the training pane alike."""
    follower = LogFollower(path, **kw)
    follower.decoder = PieceDecoder()
    return follower
