"""Bytes to lines, incrementally: split characters are completed by the next chunk, never
replaced; truly invalid bytes become U+FFFD; a giant line is capped, not buffered whole."""

from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_MAX_LINE = 64 * 1024


@dataclass
class LineDecoder:
    max_line: int = DEFAULT_MAX_LINE  # bytes kept of one line; the rest is counted and dropped
    _pending: bytearray = field(default_factory=bytearray)
    _dropped: int = 0

    @property
    def pending_bytes(self) -> int:
        """Bytes of the unfinished last line, dropped ones included (where that line began)."""
        return len(self._pending) + self._dropped

    def feed(self, data: bytes) -> list[str]:
        """Complete lines in data (and what came before it), without their line breaks.

        Lines are split on b"\\n" before decoding: in UTF-8 that byte never occurs inside a
        multibyte character, so a character split across two reads stays whole."""
        lines: list[str] = []
        start = 0
        if self._pending or self._dropped:  # the line begun in the last chunk first
            nl = data.find(b"\n")
            if nl < 0:
                self._keep(data)
                return lines
            self._keep(data[:nl])
            lines.append(self._finish())
            start = nl + 1
        end = data.rfind(b"\n") + 1
        if end > start:
            # All complete lines in one decode (the same text line by line would give, as b"\n"
            # is never part of a character), unless one of them could be over the cap.
            whole = data[start:end - 1].decode("utf-8", "replace").split("\n")
            if max(map(len, whole)) * 4 <= self.max_line:  # a character is at most 4 bytes
                lines += [line[:-1] if line.endswith("\r") else line for line in whole]
                start = end
        while True:
            nl = data.find(b"\n", start)
            if nl < 0:
                self._keep(data[start:])
                return lines
            self._keep(data[start:nl])
            lines.append(self._finish())
            start = nl + 1

    def flush(self) -> str | None:
        """The unfinished last line, if any (at end of stream)."""
        if not self._pending and not self._dropped:
            return None
        return self._finish()

    def reset(self) -> None:
        self._pending.clear()
        self._dropped = 0

    def _keep(self, part: bytes) -> None:
        room = self.max_line - len(self._pending)
        if room >= len(part):
            self._pending += part
        else:
            self._pending += part[: max(room, 0)]
            self._dropped += len(part) - max(room, 0)

    def _finish(self) -> str:
        raw, dropped = bytes(self._pending), self._dropped
        self.reset()
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        if not dropped:
            return raw.decode("utf-8", "replace")
        text = _cut_at_char_boundary(raw).decode("utf-8", "replace")
        return f"{text} … [line cut: {dropped:,} more bytes]"


def _cut_at_char_boundary(raw: bytes) -> bytes:
    """Drop a multibyte character that the cap cut in half, so the cut adds no U+FFFD."""
    end = len(raw)
    back = 0
    while back < 4 and end - back > 0 and (raw[end - back - 1] & 0xC0) == 0x80:
        back += 1
    if end - back > 0:
        lead = raw[end - back - 1]
        need = 2 if lead >> 5 == 0b110 else 3 if lead >> 4 == 0b1110 else 4 if lead >> 3 == 0b11110 else 1
        if need > back + 1:
            return raw[: end - back - 1]
    return raw
