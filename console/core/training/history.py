"""A stage's runs, read back from its logs. The box's launcher starts each run's log afresh and
keeps the logs of the runs before as NAME.1 .. NAME.5: so the logs are the history, and it
outlives the console. A run's chain opens its log with the run's header (`=== samai chain STAGE:
pid N started TIME [run NONCE]`) and closes it with `CHAIN_DONE rc=N [run NONCE]`, its cause of
death and disk lines between (remote/box/chainline.py).

The log is box text. The header counts only as a file's first line (written before the stage
runs), and the chain's other lines only with that header's nonce: a line that only looks like
one of them is the stage's text, which starts no run, ends none and says no cause. Nothing here
is ever markup."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from samai.console.core.config import CHAIN_DONE
from samai.remote.box.chainline import Header, read_header, said_by_chain
from samai.remote.boxapi import Box, BoxError
from samai.remote.model import Marker
from samai.remote.transport import TransportError

DONE = re.compile(r"CHAIN_DONE rc=(?P<rc>\d{1,3})$")  # a chain's line, its tag taken off
DEATH = re.compile(r"SAMAI_DEATH (?P<cause>[a-z_]{1,40}): (?P<detail>.{0,400})$")  # remote/box/death.py
LOG_GENERATIONS = 5  # the earlier runs' logs the box's launcher keeps (confine.LOG_GENERATIONS)
MAX_RUNS = 100  # the newest ones kept: a log of a stage fired every minute for days stays small here
SHOWN_CHARS = 120
MAX_MARKS = 200  # per run: its last marker and disk lines (a log that matches on every line stays small)


@dataclass(frozen=True)
class RunRecord:
    number: int  # 1: the oldest run read
    started: str  # the header's time (UTC), as the box wrote it
    pid: int | None
    rc: int | None  # None: no CHAIN_DONE of its chain (running now, or the chain itself was killed)
    lines: int
    last_marker: str = ""  # the run's last line that matched one of the stage's markers
    severity: str = "info"  # that marker's
    death: str = ""  # why it died, as its chain said (`cause: detail`)
    path: str = ""  # the log file it was read from
    marks: tuple[Mark, ...] = ()  # its marker and disk lines, in order (the last MAX_MARKS)
    marks_left_out: int = 0  # its earlier marker and disk lines not kept in marks (past MAX_MARKS): said
    ended_at: float | None = None  # its file's last write, for the last run of a file that ended (rc)
    first_line: int = 1  # its first line's number in its file (its header's)
    last_write: float | None = None  # its file's last write, for the last run of a file (running or not)


@dataclass(frozen=True)
class Mark:
    """A line of a run worth a place on the timeline: a marker's, or a SAMAI_DISK line."""

    line: int  # 1-based, in its file
    name: str  # the marker's name, or "disk"
    severity: str
    text: str


@dataclass
class _Run:
    """The run being read (mutable while its lines come in; a RunRecord once asked for)."""

    number: int
    started: str = ""
    pid: int | None = None
    nonce: str = ""  # its header's: what its chain's other lines carry ('' : none of them is trusted)
    rc: int | None = None
    lines: int = 0
    last_marker: str = ""
    severity: str = "info"
    death: str = ""
    path: str = ""
    marks: list[Mark] = field(default_factory=list)
    first_line: int = 1
    marks_left_out: int = 0

    def record(self) -> RunRecord:
        return RunRecord(self.number, self.started, self.pid, self.rc, self.lines, self.last_marker, self.severity,
                         self.death, self.path, tuple(self.marks), self.marks_left_out, first_line=self.first_line)


class RunHistory:
    """Feed a stage's log lines in order (`end_file` between files); `runs` are the runs seen,
    oldest first, the newest MAX_RUNS of them; `left_out` how many older ones they leave out."""

    def __init__(self, markers: Iterable[Marker] = ()) -> None:
        self._markers = [(m, _compiled(m.pattern)) for m in markers if m.name != CHAIN_DONE.name]
        self._runs: list[RunRecord] = []
        self._dropped = 0  # the oldest runs read, past MAX_RUNS: counted, never silently gone
        self._current: _Run | None = None
        self._number = 1
        self._path, self._line_number = "", 0

    def start_file(self, path: str) -> None:
        self._path, self._line_number = path, 0

    def end_file(self, mtime: float | None = None) -> None:
        """One log file read to its end (its last write at mtime): the next file's lines are another run's."""
        last = self._current
        self._keep()
        self._line_number = 0
        if last is not None and mtime is not None:
            self._runs[-1] = replace(self._runs[-1], last_write=mtime,
                                     ended_at=mtime if last.rc is not None else None)

    def feed(self, lines: Iterable[str]) -> None:
        for line in lines:
            self._line_number += 1
            header = read_header(line) if self._line_number == 1 else None
            if header is not None:
                self._start(header)
            else:
                self._line(line)

    def runs(self) -> list[RunRecord]:
        runs = self._runs + ([self._current.record()] if self._current else [])
        return runs[-MAX_RUNS:]

    def left_out(self) -> int:
        """How many runs older than those `runs` lists were read and not kept."""
        return self._dropped + max(0, len(self._runs) + (self._current is not None) - MAX_RUNS)

    def notes(self) -> list[str]:
        """What `runs` does not list, said (none when it lists every run read)."""
        older = self.left_out()
        return [f"{older:,} older runs not listed (the newest {MAX_RUNS} are)"] if older else []

    def _start(self, header: Header) -> None:
        self._keep()
        self._current = _Run(self._number, header.started, header.pid, header.nonce, path=self._path,
                             first_line=self._line_number)
        self._number += 1

    def _line(self, line: str) -> None:
        if self._current is None:  # lines before any header: a run all the same, its start unknown
            self._current = _Run(self._number, path=self._path, first_line=self._line_number)
            self._number += 1
        run = self._current
        run.lines += 1
        said = said_by_chain(line, run.nonce)
        if said is not None:
            self._chain_line(run, said)
            return
        hit = next((m for m, pattern in self._markers if pattern and pattern.search(line)), None)
        if hit:
            run.last_marker, run.severity = line[:SHOWN_CHARS], hit.severity
            self._mark(Mark(self._line_number, hit.name, hit.severity, line[:SHOWN_CHARS]))

    def _chain_line(self, run: _Run, said: str) -> None:
        """One of the run's chain's lines (its tag taken off): its end, its cause, a disk line."""
        done = DONE.match(said)
        if done:
            run.rc = int(done["rc"])
            return
        death = DEATH.match(said)
        if death:
            run.death = f"{death['cause']}: {death['detail']}"[:SHOWN_CHARS]
            return
        if said.startswith("SAMAI_DISK "):
            self._mark(Mark(self._line_number, "disk", "info", said[:SHOWN_CHARS]))

    def _mark(self, mark: Mark) -> None:
        if self._current is None:
            return
        marks = self._current.marks
        marks.append(mark)
        if len(marks) > MAX_MARKS:
            del marks[0]
            self._current.marks_left_out += 1

    def _keep(self) -> None:
        if self._current:
            self._runs.append(self._current.record())
            if len(self._runs) > MAX_RUNS:
                del self._runs[0]
                self._dropped += 1
        self._current = None


async def read_history(box: Box, log: str, markers: Iterable[Marker]) -> tuple[list[RunRecord], list[str]]:
    """The runs in a stage's log and its kept generations, oldest first (the newest MAX_RUNS);
    and what could not be read or is not listed (a generation that is not there is no problem: a
    stage run less often has fewer; older runs than those listed are counted there)."""
    from samai.console.core.checks import Unreadable, line_batches

    history, problems = RunHistory(markers), []
    for path in [f"{log}.{n}" for n in range(LOG_GENERATIONS, 0, -1)] + [log]:
        history.start_file(path)
        read: dict = {}
        try:
            async for batch in line_batches(box, path, read=read):
                history.feed(batch)
        except Unreadable as e:
            if path == log or "No such file" not in str(e):
                problems.append(str(e))
        except (BoxError, TransportError) as e:
            problems.append(f"{path}: {e}")
        history.end_file(read.get("mtime"))
    return history.runs(), problems + history.notes()


def _compiled(pattern: str) -> re.Pattern[str] | None:
    try:
        return re.compile(pattern)
    except re.error:  # the config refuses these; a marker that cannot match is no reason to fail
        return None
