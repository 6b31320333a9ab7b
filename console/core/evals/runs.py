"""The eval runs the box holds: each run's summary.json, as the eval stage writes it
(runs/eval/NAME/summary.json), read from the reports a poll brings back.

A summary is a file on the box, so anyone may have written it: any text at all comes in. A
summary that is not one (not JSON, nested too deep, a count of 1e400) is that file's finding
and costs nothing else: the other runs, and the rest of the snapshot, are shown as usual.

A run's items (items.jsonl, a cu run's episodes.jsonl) are read whole, a read at a time
(item_batches): `check eval`, the TUI's check of a finished run and `eval diff` judge every line
or none. A file that cannot be read whole (not a regular file, replaced or cut while it was
read, more items than a diff keeps) is NotReadWhole, with why: never judged on a part."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import posixpath
import threading
from collections.abc import AsyncGenerator, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from samai.console.core.evals.check import EvalResult, check_eval
from samai.console.core.evals.cucheck import EpisodesResult, check_episodes, looks_like_episodes
from samai.console.core.evals.diff import MAX_ITEMS, RunItems, RunReader, TooManyItems
from samai.console.core.problems import Finding, Problem
from samai.remote.errors import BoxError
from samai.remote.follow import LogFollower, missing_notice
from samai.remote.model import Report
from samai.remote.safe_text import visible
from samai.remote.transport import TransportError

if TYPE_CHECKING:
    from samai.remote.boxapi import Box

FileCheck = EvalResult | EpisodesResult  # `check eval` of an eval run's items, or of a cu run's episodes


@dataclass(frozen=True)
class ItemsNotRead:
    """A finished run's items that could not be read whole, so were not checked: its one problem
    says so and why (a warning: the run's score stands unchecked, never checked on a part)."""

    why: str

    @property
    def problems(self) -> tuple[Problem, ...]:
        return (Problem("items_not_read", "warning", "its items could not be read whole, so they are not checked: "
                        + visible(self.why)[:300]),)


RunCheck = FileCheck | ItemsNotRead  # what the console holds of a finished run's check
ITEMS_READ = 4 << 20  # one read of a run's items: the bytes (and their lines) held at once
ITEM_LINE = 16 << 20  # the longest line kept whole (a longer one is no item: counted as such, and said)
MAX_COUNT = 10**12  # items in one eval run: far more than any eval set, far less than a float's integer range


@dataclass(frozen=True)
class EvalRun:
    """One eval run's summary."""

    name: str
    n: int
    accuracy: float | None
    empty_content: int
    truncated: int
    mtime: float = 0.0
    folder: str = ""  # on the box: where its items.jsonl (a cu run: its episodes.jsonl) is
    kind: str = "eval"  # or "cu": a computer-use run, whose accuracy is its success rate
    parse_failures: int = 0  # a cu run's episodes whose answer was no action of their task
    errors: int = 0  # a cu run's episodes that did not run to their check
    missed: int = 0  # of its parse failures: actions naming no element on the page (the rest: no action at all)

    @property
    def items(self) -> str:
        return posixpath.join(self.folder, "episodes.jsonl" if self.kind == "cu" else "items.jsonl")


class NotASummary(ValueError):
    """What makes a report no eval summary, said in a few words."""


def read_eval_runs(reports: tuple[Report, ...]) -> tuple[list[EvalRun], list[Finding]]:
    """The runs whose summaries can be read, and one finding for each that cannot."""
    runs, unreadable = [], []
    for report in reports:
        try:
            runs.append(eval_run(report))
        except NotASummary as e:
            unreadable.append(Finding("unreadable_summary", "warning",
                                      f"eval summary {visible(report.path)} cannot be read: {e}"))
    return runs, unreadable


def eval_run(report: Report) -> EvalRun:
    """NotASummary unless report's text is a summary with sound figures (and all of it: one the
    box found too big to read is said to be, with its size and the limit)."""
    if report.too_big:
        raise NotASummary(f"too big: {_bytes(report.size)}, over the {_bytes(report.limit)} a summary is read up to")
    try:
        raw = json.loads(report.text)
    except RecursionError:  # no ValueError: the decoder's stack ran out
        raise NotASummary("JSON nested too deep") from None
    except ValueError as e:  # a number of over 4300 digits too
        raise NotASummary(f"not JSON ({str(e)[:60]})") from None
    if not isinstance(raw, dict):
        raise NotASummary(f"a JSON {type(raw).__name__}, not an object")
    folder = posixpath.dirname(report.path)
    if "success_rate" in raw:  # cu_eval's summary (remote/box/stages/cu_eval.py)
        return EvalRun(posixpath.basename(folder), _count(raw, "n"), _fraction(raw, "success_rate"), 0, 0,
                       report.mtime, folder, "cu", _count(raw, "parse_failures", 0), _count(raw, "errors", 0),
                       _count(raw, "missed", 0))
    return EvalRun(posixpath.basename(folder), _count(raw, "n"), _fraction(raw, "accuracy"),
                   _count(raw, "empty_content", 0), _count(raw, "truncated", 0), report.mtime, folder)


def _count(raw: dict[str, Any], key: str, default: int | None = None) -> int:
    value = raw.get(key, default)
    if type(value) is float and math.isfinite(value) and value.is_integer():
        value = int(value)  # 12.0: a count written by a float-minded tool
    if type(value) is not int or not 0 <= value <= MAX_COUNT:
        raise NotASummary(f"{key} is {_shown(value)}, not a count")
    return value


def _fraction(raw: dict[str, Any], key: str) -> float | None:
    value = raw.get(key)
    if value is None:
        return None
    if type(value) not in (int, float) or not 0 <= value <= 1:  # NaN fails the range too
        raise NotASummary(f"{key} is {_shown(value)}, not a fraction from 0 to 1")
    return float(value)


def _bytes(n: int | None) -> str:
    return f"{n:,} bytes" if n is not None and 0 <= n < 10**18 else "? bytes"


def _shown(value: Any) -> str:
    """A value from the file, said briefly: a number of five thousand digits is not quoted whole."""
    if value is None:
        return "missing"
    if isinstance(value, (dict, list)):
        return f"a JSON {'object' if isinstance(value, dict) else 'array'}"
    text = json.dumps(value) if not isinstance(value, int) or abs(value) < 10**40 else "a number of over 40 digits"
    return text if len(text) <= 40 else text[:40] + "…"


def newest_run(runs: list[EvalRun]) -> EvalRun | None:
    """The run whose items are checked (the TUI's once per run, doctor's each time): the newest."""
    return max(runs, key=lambda run: run.mtime, default=None)


class NotReadWhole(BoxError):
    """A run's items that could not be read whole: judged on none of them. Its message says why."""


class ItemsMissing(NotReadWhole):
    """There is no such file on the box (at its first read)."""


async def item_batches(box: Box, path: str, max_bytes: int = ITEMS_READ) -> AsyncGenerator[list[str], None]:
    """Every line of a run's items file on the box, one read at a time, to its end: memory holds
    one read's lines. ItemsMissing where there is no such file; NotReadWhole where it cannot be
    read, or changes under the read other than by growing (replaced, truncated, deleted)."""
    follower = LogFollower(path, offset=0, max_bytes=max_bytes, max_line=ITEM_LINE)
    first = True
    while True:
        chunk = await box.read_log(follower.cursor())
        if chunk.missing and first:
            raise ItemsMissing(missing_notice(path))
        if chunk.error is not None:
            raise NotReadWhole(f"{visible(path)} cannot be read whole: {visible(chunk.error)}")
        if chunk.rotated or chunk.truncated or chunk.drain is not None or chunk.gone is not None:
            raise NotReadWhole(f"{visible(path)} was replaced or truncated while it was read: not judged on a part")
        first = False
        update = follower.consume(chunk)
        if update.more:
            yield update.lines
            continue
        last = follower.decoder.flush()
        yield update.lines + ([last] if last is not None else [])
        return


async def check_items(box: Box, run: EvalRun) -> RunCheck | None:
    """`check eval` on a run's whole items (a cu run's episodes); None where the box has no such
    file; ItemsNotRead, with why, where they could not be read whole (NotReadWhole, the box or the
    connection failing): the `eval` detector makes it a warning, so the operator sees it."""
    try:
        return await check_file(box, run.items, episodes=run.kind == "cu")
    except ItemsMissing:
        return None
    except (BoxError, TransportError) as e:
        return ItemsNotRead(str(e))


async def check_file(box: Box, path: str, episodes: bool | None = None) -> FileCheck:
    """`check eval` on a whole file of the box, streamed from the box to the check in its thread
    (episodes None: a cu run's episodes or an eval's items, told by its first lines). ItemsMissing,
    NotReadWhole and the box's errors are the caller's."""
    batches, stopped = item_batches(box, path), threading.Event()
    try:
        first = await anext(batches)
        loop = asyncio.get_running_loop()

        async def following() -> list[str] | None:
            return None if stopped.is_set() else await anext(batches, None)

        def lines() -> Iterator[str]:  # in the check's thread: each next read asked of the loop
            yield from first
            while (batch := asyncio.run_coroutine_threadsafe(following(), loop).result()) is not None:
                yield from batch

        cu = looks_like_episodes(first) if episodes is None else episodes
        return await asyncio.to_thread(check_episodes if cu else check_eval, lines())
    finally:
        stopped.set()  # a check cancelled half-way asks for no more reads
        await batches.aclose()


async def read_run_items(box: Box, name: str, path: str, max_items: int = MAX_ITEMS) -> RunItems | None:
    """A run's items for a diff (console/core/evals/diff.py), all of them; None where the box has
    no such file. NotReadWhole where they cannot all be read or kept."""
    reader = RunReader(name, max_items)
    feeding: asyncio.Future | None = None  # one read's lines parsed while the next is read
    try:
        async with contextlib.aclosing(item_batches(box, path)) as batches:
            async for batch in batches:
                if feeding is not None:
                    await feeding
                feeding = asyncio.ensure_future(asyncio.to_thread(reader.feed, batch))
                feeding.add_done_callback(lambda f: f.cancelled() or f.exception())  # raised where awaited, or not
        if feeding is not None:
            await feeding
    except ItemsMissing:
        return None
    except TooManyItems as e:
        raise NotReadWhole(f"{visible(path)} {e}") from None
    finally:
        if feeding is not None:  # the read failed: its parse is not waited for
            feeding.cancel()
    return reader.result()


def run_items_path(workspace: str, reports_glob: str, run: str) -> tuple[str, str]:
    """(name, items.jsonl path) of a run named as the eval pane names it (its folder's name under
    the eval reports' glob), or given as its folder or its items file (relative to the workspace)."""
    if "/" not in run and not run.endswith(".jsonl"):
        folder = posixpath.dirname(reports_glob).replace("*", run)
        return run, posixpath.join(workspace, folder, "items.jsonl")
    path = run if run.startswith("/") else posixpath.join(workspace, run)
    path = posixpath.normpath(path)
    if not path.endswith(".jsonl"):
        path = posixpath.join(path, "items.jsonl")
    return posixpath.basename(posixpath.dirname(path)), path
