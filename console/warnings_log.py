"""Warnings that the console's libraries print go to a file, never to stderr.

stderr is the command line's contract (one line of reason on an error) and, under the TUI, the
operator's screen: a dependency's new release that warns at import (a `cryptography` release made
asyncssh print six deprecation lines on every `ssh://` command) must not break either. Nothing is
lost: each warning is a line of STATE_DIR/warnings.log (README, "Command line")."""

from __future__ import annotations

import time
import warnings
from pathlib import Path

MAX_BYTES = 256 * 1024  # then the file is kept as warnings.log.1 and a new one begun


def route_to(path: Path) -> None:
    """Every warning shown from now on is appended to `path` instead of printed (the filters, and
    with them `-W error`, are left as they are: only where a shown warning goes changes)."""

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        text = warnings.formatwarning(message, category, filename, lineno, line).rstrip("\n")
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.exists() and path.stat().st_size > MAX_BYTES:
                path.replace(path.with_name(path.name + ".1"))
            with path.open("a", encoding="utf-8", errors="backslashreplace") as f:
                f.write(f"{stamp} {text}\n")
        except OSError:  # no place to keep it: dropped, as the console must go on either way
            pass

    warnings.showwarning = show
