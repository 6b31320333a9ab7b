"""Text from the box made inert for a terminal: control and invisible characters become visible stand-ins.

Everything read from the box (names, command lines, log lines, stage output) may carry ESC,
OSC or CSI sequences that would retitle, recolour or rewrite the operator's terminal, and
format characters that hide or reorder what is shown: a right-to-left override (U+202E) makes
`evil` U+202E `gnp.py` read as `evilyp.png`, a zero-width space makes two names look the same.
Shown through `visible()`, each such character is a picture of itself instead: the U+2400 block
for C0 and DEL, U+FFFD for C1, the line and paragraph separators, the format characters (bidi
controls, zero-width characters, the soft hyphen, the byte-order mark) and lone surrogates
(bytes that were not UTF-8). Tabs are kept: they move the cursor only forward on the same line.
"""

from __future__ import annotations

import unicodedata

REPLACEMENT = "\ufffd"
# Unicode categories a terminal would act on or draw as nothing (Zs, the spaces, are drawn as space).
HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


class _Pictures(dict):
    """str.translate's table: every code point's stand-in, worked out the first time it is met."""

    def __missing__(self, code: int) -> str:
        char = chr(code)
        shown = REPLACEMENT if code != 0x09 and unicodedata.category(char) in HIDDEN_CATEGORIES else char
        self[code] = shown
        return shown


CONTROL_PICTURES = _Pictures({c: chr(0x2400 + c) for c in range(0x20) if c != 0x09})
CONTROL_PICTURES.update({0x7F: "\u2421"})


def visible(text: str) -> str:
    """`text` with every control and invisible character but tab shown as a visible stand-in."""
    if text.isprintable():
        return text
    return text.translate(CONTROL_PICTURES)
