"""What every benchmark here shares: timing runs, medians and percentiles, a ratio against a baseline
measured in the same run, the command line, and one way to print the figure.

A script imports it first (`import harness` or `from harness import ...`: bench/ is on sys.path
when a script of it runs); importing it also puts the repository root on sys.path, so that the
scripts can use helpers from tests/.

Every figure that matters is a ratio of medians: ours against a baseline timed in the same run,
interleaved with it, so that the machine's noise weighs on both alike.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import math
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # `tests` (sshd, sparse GGUF files) for the scripts that need them


def median(values: Iterable[float]) -> float:
    values = list(values)
    return statistics.median(values) if values else math.nan


def percentile(values: Iterable[float], q: float) -> float:
    """The value at quantile q (0..1) of values, nearest rank; nan for none."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def ratio(ours: float, baseline: float) -> float:
    """ours / baseline; nan when the baseline is 0 (nothing to compare with)."""
    return ours / baseline if baseline else math.nan


class Timings:
    """Seconds per named contender, one entry per run; the figures are medians."""

    def __init__(self) -> None:
        self.seconds: dict[str, list[float]] = {}

    def add(self, name: str, seconds: float) -> None:
        self.seconds.setdefault(name, []).append(seconds)

    def time(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Run fn(*args) once, timed under name; what it returns."""
        started = time.perf_counter()
        value = fn(*args)
        self.add(name, time.perf_counter() - started)
        return value

    async def time_async(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Await fn(*args) once, timed under name; what it returns."""
        started = time.perf_counter()
        value = await fn(*args)
        self.add(name, time.perf_counter() - started)
        return value

    def median(self, name: str) -> float:
        return median(self.seconds.get(name, ()))

    def percentile(self, name: str, q: float) -> float:
        return percentile(self.seconds.get(name, ()), q)

    def ratio(self, name: str, baseline: str) -> float:
        """Median of name over median of baseline."""
        return ratio(self.median(name), self.median(baseline))


def interleaved(runs: int, contenders: dict[str, Callable[[], Any]]) -> Timings:
    """Each contender once per round, in order, for runs rounds."""
    timings = Timings()
    for _ in range(runs):
        for name, fn in contenders.items():
            timings.time(name, fn)
    return timings


async def interleaved_async(runs: int, contenders: dict[str, Callable[[], Any]]) -> Timings:
    """As interleaved, for contenders that may be coroutine functions (awaited) or plain ones."""
    timings = Timings()
    for _ in range(runs):
        for name, fn in contenders.items():
            if inspect.iscoroutinefunction(fn):
                await timings.time_async(name, fn)
            else:
                timings.time(name, fn)
    return timings


def argument_parser(doc: str | None, *, runs: int | None = None) -> argparse.ArgumentParser:
    """The script's parser: described by its docstring's first paragraph; --runs N when runs is given."""
    description = (doc or "").strip().split("\n\n")[0]
    parser = argparse.ArgumentParser(description=" ".join(description.split()))
    if runs is not None:
        parser.add_argument("--runs", type=int, default=runs, help=f"timed runs of each contender (default {runs})")
    return parser


def figure(label: str, ours: float, baseline: float, *, at_most: float | None = None,
           at_least: float | None = None, note: str = "") -> str:
    """`label: x1.23 (note) (target <= 3: met)`: the one line a ratio is printed as."""
    value = ratio(ours, baseline)
    line = f"{label}: x{value:.2f}" + (f" ({note})" if note else "")
    if at_most is not None:
        line += f" (target <= {at_most:g}: {'met' if value <= at_most else 'MISSED'})"
    if at_least is not None:
        line += f" (target >= {at_least:g}: {'met' if value >= at_least else 'MISSED'})"
    return line


def print_figure(label: str, ours: float, baseline: float, **target: Any) -> float:
    """Print the figure (see figure); the ratio."""
    print(figure(label, ours, baseline, **target), flush=True)
    return ratio(ours, baseline)


@contextlib.contextmanager
def scratch_folder(prefix: str, keep: bool = False) -> Iterator[Path]:
    """A temporary folder for a benchmark's files, removed afterwards unless keep (then named)."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield folder
    finally:
        if keep:
            print(f"kept {folder}")
        else:
            shutil.rmtree(folder, ignore_errors=True)
