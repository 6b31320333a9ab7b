"""The disk line every stage's chain writes into its log at the run's start and end (§4.1).

Runs ON the box: `python3 -S -m samai_box.diskline start|end`, from the chain script (launch.py),
for the file system of $SAMAI_WORKSPACE, the run's nonce on its stdin. Standard library only,
Python >= 3.8. One line:

  SAMAI_DISK start used=41300000000 avail=18700000000 size=60000000000 (41.3 GB used, ...) path="/ws" [run N]

Exact bytes first (what the console reads), a human form, the path as a JSON string (so a
workspace name with spaces or control characters cannot break the line), the run's tag last
(chainline.py: what tells the chain's line from a copy the stage printed).
"""

from __future__ import annotations

import json
import os
import sys

from .chainline import read_nonce, signed
from .disk import disk_usage

PHASES = ("start", "end")


def human(n: float) -> str:
    """Decimal units, as the console's own sizes are written."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return ("%d %s" if unit == "B" else "%.1f %s") % (n, unit)
        n /= 1000.0
    return "%.1f TB" % n


PATH_CHARS = 160  # the line stays whole in a marker hit (the probe keeps 400 bytes of one), its tag included


def disk_line(phase: str, workspace: str) -> str:
    d = disk_usage("workspace", workspace)
    words = "%s used, %s free of %s" % (human(d["used"]), human(d["free"]), human(d["total"]))
    path = json.dumps(workspace)  # ASCII: whatever the path holds is escaped
    if len(path) > PATH_CHARS:
        path = path[: PATH_CHARS - 4] + '..."'
    return "SAMAI_DISK %s used=%d avail=%d size=%d (%s) path=%s" % (
        phase, d["used"], d["free"], d["total"], words, path)


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[1] not in PHASES:
        sys.stderr.write("usage: python3 -m samai_box.diskline start|end\n")
        return 2
    workspace = os.environ.get("SAMAI_WORKSPACE") or os.getcwd()
    try:
        line = disk_line(argv[1], workspace)
    except OSError as e:  # one line in the log, never a failed stage
        line = "SAMAI_DISK %s unreadable: %s" % (argv[1], " ".join(str(e).split()))
    sys.stdout.write(signed(line, read_nonce()) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
