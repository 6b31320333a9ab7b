"""Tab completion of a path from one folder's listing (pure: the listing comes from the box)."""

from __future__ import annotations

import posixpath
from collections.abc import Sequence

MAX_SHOWN = 40  # candidates listed under the path; more are counted


def folder_of(text: str) -> str:
    """The folder whose listing completes text ("" for the workspace itself)."""
    return text[: text.rfind("/") + 1]


def complete(text: str, names: Sequence[str], *, whole: bool = True) -> tuple[str, tuple[str, ...]]:
    """text completed as far as the folder's entries agree (folders end with "/"), and the
    entries it could still become when that is more than one. Names are box text: only
    printable ones are offered. whole=False: names are the first of more that match, which may
    agree on less: text is left as it is and every match offered."""
    folder = folder_of(text)
    stem = text[len(folder):]
    hidden = stem.startswith(".")  # dot files only when asked for, as shells do
    # A name with control characters is never offered: it would go into the field as typed text.
    matches = sorted(n for n in names if n.startswith(stem) and (hidden or not n.startswith(".")) and n.isprintable())
    if not matches:
        return text, ()
    if not whole:
        return text, tuple(matches)
    common = posixpath.commonprefix(matches)
    return folder + common, tuple(matches) if len(matches) > 1 else ()
