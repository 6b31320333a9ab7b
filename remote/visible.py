"""Text from the box made inert for a terminal: control characters become visible stand-ins.

Everything read from the box (names, command lines, log lines, stage output) may carry ESC,
OSC or CSI sequences that would retitle, recolour or rewrite the operator's terminal. Shown
through `visible()`, each control character is a picture of itself instead (U+2400 block for
C0 and DEL, U+FFFD for C1 and the Unicode line separators). Tabs are kept: they move the
cursor only forward on the same line.
"""

from __future__ import annotations

CONTROL_PICTURES = {c: chr(0x2400 + c) for c in range(0x20) if c != 0x09}
CONTROL_PICTURES.update({0x7F: "\u2421", 0x2028: "\ufffd", 0x2029: "\ufffd"})
CONTROL_PICTURES.update({c: "\ufffd" for c in range(0x80, 0xA0)})


def visible(text: str) -> str:
    """`text` with every control character but tab shown as a visible stand-in."""
    if text.isprintable():
        return text
    return text.translate(CONTROL_PICTURES)
