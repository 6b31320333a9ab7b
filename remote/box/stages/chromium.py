"""Which headless Chromium the computer-use stages drive, and what to say when the box has none.

Playwright's own browser download cannot run on these machines, so a system Chromium is
launched with executable_path. Standard library only, and light: the console imports the names
too (doctor says a missing browser before cu_eval or rft is fired).

Runs ON the box (imported by browser.py and provision.py), and in the console.
"""

from __future__ import annotations

import os
import shutil

BROWSERS = ("chromium-headless-shell", "chromium", "google-chrome", "google-chrome-stable", "chrome")
INSTALL_HINT = ("apt-get install chromium-headless-shell (Debian, Ubuntu), or name one with --browser PATH; "
                "Playwright's own download does not run here")


class BrowserMissing(RuntimeError):
    pass


def find_browser(explicit: str | None = None) -> str:
    """The browser to drive: the one named, else the first of BROWSERS on PATH."""
    if explicit:
        path = explicit if os.sep in explicit else shutil.which(explicit)
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
        raise BrowserMissing("no browser at %s: %s" % (explicit, INSTALL_HINT))
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    raise BrowserMissing("no headless Chromium on this box (looked for %s): %s" % (", ".join(BROWSERS), INSTALL_HINT))
