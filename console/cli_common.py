"""What every command of the command line shares: its exit codes, the usage error, and the one
line of reason on stderr. Both the parser (cli.py) and the commands that talk to a box
(cli_box.py) import it; neither imports the other's names."""

from __future__ import annotations

import sys

from samai.remote.safe_text import visible

EXIT_OK, EXIT_PROBLEM, EXIT_USAGE = 0, 1, 2
EXIT_STDOUT_CLOSED = 128 + 13  # what a shell reports for a tool that SIGPIPE ended


class UsageError(Exception):
    """A mistake in what the user asked for: reported in one line, exit 2."""


def fail(message: str, code: int) -> int:
    """The one-line reason on stderr: box text in it (a path, a box error) shown inert, on one line."""
    print(f"samai-console: {visible(message)}", file=sys.stderr)
    return code
