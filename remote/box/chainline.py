"""The lines a stage's chain writes into its log around the stage's own output, and how a
reader tells them from the stage's text. Standard library only, Python >= 3.8: the box writes
them (launch.py's chain, diskline.py, death.py, kill.py) and the console reads them.

  === samai chain train: pid 4242 started 2026-12-02T10:00:00Z [run 9f3c2a1b7d4e6f80]
  SAMAI_DISK start used=41300000000 avail=... path="/ws" [run 9f3c2a1b7d4e6f80]
  ... the stage's own lines ...
  SAMAI_SURVIVORS stopped 4250: processes the stage started, ... [run 9f3c2a1b7d4e6f80]
  SAMAI_DEATH exception: KeyError: 'x' (at train.py:3 in main) [run 9f3c2a1b7d4e6f80]
  SAMAI_DISK end used=... [run 9f3c2a1b7d4e6f80]
  CHAIN_DONE rc=1 [run 9f3c2a1b7d4e6f80]

Each run has a nonce the launcher makes and hands to the chain on its stdin: it is in no
process's environment, and the stage is started without it. The run header is the first line
of a log the launcher starts afresh (it moves the last run's log to NAME.1 first), written
before the stage runs: the stage cannot write ahead of it, and it names the run's nonce. Any
other line is the chain's only when it carries that nonce. A stage that prints a copy of a
chain line (a header, `CHAIN_DONE rc=0`, `SAMAI_DEATH ...`) with no nonce or another run's has
printed text, which starts no run, ends none and says no cause.
"""

from __future__ import annotations

import binascii
import os
import re
from typing import NamedTuple, Optional

NONCE_BYTES = 8
NONCE = re.compile(r"^[0-9a-f]{16}$")
HEADER_START = "=== samai chain "
# What the chain's other lines start with (each ends with its run's tag).
KINDS = ("SAMAI_DISK ", "SAMAI_SURVIVORS ", "SAMAI_DEATH ", "CHAIN_DONE ")
HEADER = re.compile(r"^=== samai chain (?P<stage>\S{1,64}): pid (?P<pid>\d{1,10}) started (?P<started>\S{1,40})"
                    r"(?: \[run (?P<nonce>[0-9a-f]{16})\])?$")


class Header(NamedTuple):
    """A run header as read: the stage, the chain's pid, its UTC start as written, its nonce
    ('' from a launcher older than the nonces: none of that run's other lines is trusted)."""

    stage: str
    pid: int
    started: str
    nonce: str


def new_nonce() -> str:
    return binascii.hexlify(os.urandom(NONCE_BYTES)).decode("ascii")


def is_nonce(value: object) -> bool:
    return isinstance(value, str) and NONCE.match(value) is not None


def tag(nonce: str) -> str:
    return " [run %s]" % nonce


def signed(text: str, nonce: str) -> str:
    """One of the chain's lines: its text (one line) and its run's tag (none without a nonce:
    then no reader takes it as the chain's)."""
    return text + tag(nonce) if is_nonce(nonce) else text


def looks_like_chain(line: str) -> bool:
    """A line shaped like one of the chain's, whoever wrote it (evidence of nothing)."""
    return line.startswith(HEADER_START) or line.startswith(KINDS)


def read_header(line: str) -> Optional[Header]:
    """The header this line is, by its shape only: where it stands (a file's first line) is the
    reader's to check."""
    found = HEADER.match(line.rstrip("\r"))
    if found is None:
        return None
    return Header(found.group("stage"), int(found.group("pid")), found.group("started"), found.group("nonce") or "")


def said_by_chain(line: str, nonce: str) -> Optional[str]:
    """The text of this line without its tag when it is one of the chain's lines of the run
    with this nonce; None for any other line (the stage's text, or another run's)."""
    if not is_nonce(nonce):
        return None
    line = line.rstrip("\r")
    end = tag(nonce)
    if not line.endswith(end) or not looks_like_chain(line):
        return None
    return line[: -len(end)]


def read_nonce(fd: int = 0) -> str:
    """The run's nonce on this descriptor (the chain hands it to its tools on their stdin);
    '' when it holds none."""
    try:
        if os.isatty(fd):
            return ""
        data = os.read(fd, 64)
    except OSError:
        return ""
    text = data.decode("ascii", "replace").strip()
    return text if is_nonce(text) else ""
