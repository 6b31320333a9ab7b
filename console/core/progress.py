"""How far a running stage is, read from its own log lines: pure parsing, no I/O.

Three shapes are understood, whatever stage prints them:
  - tqdm's bar (the Trainer's own): `12/80 [00:03<00:17, 4.1it/s]` -> steps, ETA, rate; a line
    written with carriage returns holds many updates: the last one counts;
  - fetch's byte lines: `base.bin: 1.2 GiB / 18.5 GiB (6%) 45.0 MiB/s` -> bytes, rate, ETA;
  - a build step, as provision announces each command it runs: `$ venv/bin/python -m pip ...`.

The probe returns only the lines that match PROGRESS_PATTERN (as a marker of every watched
stage log), so the poll moves no log bytes for this. Lines are the box's words: anything may
come in, nothing raises, and the text kept is plain (the widgets show it literally)."""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass

from samai.console.core import units
from samai.remote.marker import Marker

PROGRESS_MARKER_NAME = "samai.progress"  # not a marker the operator declares: never shown as one
# Each branch holds a literal the probe can find at memchr speed: "/s]" or "/it]" (tqdm), "%) "
# (a byte line), "$ " (a build step: parse_line wants it at the start of the line). No anchor and no
# "$" character in the source: the probe would test every line of the log for it.
PROGRESS_PATTERN = r"/s\]|/it\]|\d%\) |\x24 "
PROGRESS_MARKER = Marker(PROGRESS_MARKER_NAME, PROGRESS_PATTERN, "info")

MAX_LABEL = 60
MAX_LINE = 1000  # characters of a line read for its progress (the probe sends at most 400 bytes of a hit)
_NUM = r"\d{1,15}(?:\.\d{1,6})?"
_SIZE = rf"{_NUM} ?[KMGTP]?i?B"
TQDM = re.compile(r"(?P<done>\d{1,15})/(?P<total>\d{1,15}) \[(?P<elapsed>\d{1,9}(?::\d\d){0,2})"
                  r"<(?P<left>\d{1,9}(?::\d\d){0,2}|\?)"
                  rf"(?:, *(?:(?P<rate>{_NUM}|\?) ?[A-Za-z]{{0,8}}/s|(?P<inverse>{_NUM}) ?s/[A-Za-z]{{1,8}}))?")
BYTES = re.compile(rf"(?P<label>[^\r\n]{{0,200}}?): (?P<done>{_SIZE}) / (?P<total>{_SIZE}) \((?P<pct>\d{{1,3}})%\) "
                   rf"(?P<rate>{_SIZE})/s")
SIZE = re.compile(rf"({_NUM}) ?([KMGTP]?i?B)")
STEP = re.compile(r"\$ (?P<command>\S[^\r\n]*)")
UNITS = {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12, "PB": 1e15,
         "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40, "PIB": 2**50}


@dataclass(frozen=True)
class Progress:
    """One reading of a stage's progress. kind: "steps" (done/total items), "bytes", or "step"
    (a named build step, no fraction)."""

    kind: str
    done: float = 0.0
    total: float = 0.0
    rate: float | None = None  # per second
    eta: float | None = None  # seconds left
    label: str = ""  # what is being counted or built, e.g. "sha256 base.bin"

    @property
    def fraction(self) -> float | None:
        if self.kind == "step" or self.total <= 0:
            return None
        return min(max(self.done / self.total, 0.0), 1.0)

    @property
    def text(self) -> str:
        """A short line for the stages bar or a log title: `12/80 15% · 17s left`."""
        if self.kind == "step":
            return f"step: {self.label}"
        if self.kind == "bytes":
            done = f"{units.size(self.done)}/{units.size(self.total)}"
        else:
            done = f"{self.done:.0f}/{self.total:.0f}"
        parts = [done + (f" {self.fraction:.0%}" if self.fraction is not None else "")]
        if self.kind == "bytes" and self.rate is not None:
            parts.append(f"{units.size(self.rate)}/s")
        if self.eta is not None:
            parts.append(f"{units.duration(self.eta)} left")
        text = " · ".join(parts)
        return f"{self.label}: {text}" if self.label and self.kind == "bytes" else text


def parse_line(line: str) -> Progress | None:
    """The progress a log line tells, or None. The line may hold carriage-return updates."""
    if not isinstance(line, str):
        return None
    # A progress update is short, and the probe sends a hit's first MAX_HIT_TEXT bytes: a longer
    # line (from anything else that answers as the probe) is read no further, and costs no more.
    for part in reversed(line[:MAX_LINE].split("\r")):  # the newest update first
        found = _tqdm(part) or _bytes(part) or _step(part)
        if found is not None:
            return found
    return None


def latest(lines: list[str]) -> Progress | None:
    """The progress told by the last line of `lines` that tells one."""
    for line in reversed(lines):
        found = parse_line(line)
        if found is not None:
            return found
    return None


def _tqdm(text: str) -> Progress | None:
    match = next(reversed(list(TQDM.finditer(text))), None)  # the last bar of the text
    if match is None:
        return None
    done, total = int(match["done"]), int(match["total"])
    if total <= 0 or done > total:
        return None
    rate = None
    if match["rate"] not in (None, "?"):
        rate = float(match["rate"])
    elif match["inverse"] is not None and float(match["inverse"]) > 0:
        rate = 1 / float(match["inverse"])
    return Progress("steps", done, total, rate, _clock(match["left"]))


def _bytes(text: str) -> Progress | None:
    match = BYTES.search(text)
    if match is None:
        return None
    done, total, rate = _size(match["done"]), _size(match["total"]), _size(match["rate"])
    if done is None or total is None or total <= 0:
        return None
    eta = (total - done) / rate if rate and total >= done else None
    return Progress("bytes", done, total, rate, eta, _label(match["label"].strip()))


def _step(text: str) -> Progress | None:
    match = STEP.match(text)
    if match is None:
        return None
    words = match["command"].split()
    words[0] = posixpath.basename(words[0]) or words[0]
    if len(words) > 5:  # the program, its subcommand and what it works on; the options between left out
        words = [*words[:4], "…", posixpath.basename(words[-1]) or words[-1]]
    return Progress("step", label=_label(" ".join(words)))


def _clock(text: str | None) -> float | None:
    """Seconds of tqdm's `MM:SS` or `H:MM:SS`; None for `?`."""
    if not text or text == "?":
        return None
    seconds = 0.0
    for part in text.split(":"):
        seconds = seconds * 60 + int(part)
    return seconds


def _size(text: str) -> float | None:
    match = SIZE.fullmatch(text)
    return float(match[1]) * UNITS[match[2].upper()] if match else None


def _label(text: str) -> str:
    return text if len(text) <= MAX_LABEL else text[:MAX_LABEL - 1] + "…"
