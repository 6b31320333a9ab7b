"""The last 1,000 lines of a 1 GB and a 4 GB log (the first paint of a tail) against `tail -n 1000`:

    python bench/tail_speed.py [--runs 15] [--lines 1000]

Ours is what the console does when a log is opened in the log pane: one read through the probe
it keeps running (local target), looking back from the end for the last N lines, and decoding
them into lines. Both read the page cache; both must cost the same for a 1 GB and a 4 GB file.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from samai.remote.boxapi import Box  # noqa: E402
from samai.remote.follow import LogFollower  # noqa: E402
from samai.remote.local import LocalTransport  # noqa: E402

LINE = b"{'loss': '0.8897', 'grad_norm': '1.14', 'learning_rate': '0.00111', 'epoch': '47.5'} step %07d\n"


def write_log(path: Path, gigabytes: int) -> int:
    block = b"".join(LINE % i for i in range(10_000))
    with open(path, "wb") as f:
        while f.tell() < gigabytes * 1_000_000_000:
            f.write(block)
        return f.tell()


async def ours(box: Box, path: Path, lines: int) -> float:
    started = time.perf_counter()
    follower = LogFollower(str(path), last_lines=lines)
    update = follower.consume(await box.read_log(follower.cursor()))
    elapsed = time.perf_counter() - started
    assert len(update.lines) == lines, len(update.lines)
    return elapsed


def theirs(path: Path, lines: int) -> float:
    started = time.perf_counter()
    out = subprocess.run(["tail", "-n", str(lines), str(path)], stdout=subprocess.PIPE, check=True).stdout
    elapsed = time.perf_counter() - started
    assert out.count(b"\n") == lines
    return elapsed


async def main(runs: int, lines: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        paths = {gb: Path(tmp, f"{gb}g.log") for gb in (1, 4)}
        sizes = {gb: write_log(path, gb) for gb, path in paths.items()}
        box = Box(LocalTransport(), tmp, python=sys.executable)
        await box.snapshot(processes=False)  # the console's probe is already running when a log is opened
        times: dict[tuple[str, int], list[float]] = {}
        for _ in range(runs):
            for gb, path in paths.items():
                times.setdefault(("ours", gb), []).append(await ours(box, path, lines))
                times.setdefault(("tail", gb), []).append(theirs(path, lines))
        await box.close()
    med = {key: statistics.median(v) * 1000 for key, v in times.items()}
    print(f"last {lines} lines, {runs} runs each, interleaved, medians ({os.cpu_count()} CPUs)")
    print(f"{'file':>8}  {'console ms':>10}  {'tail -n ms':>10}  ratio")
    for gb in paths:
        print(f"{sizes[gb] / 1e9:6.1f}GB  {med['ours', gb]:10.2f}  {med['tail', gb]:10.2f}  "
              f"x{med['ours', gb] / med['tail', gb]:.2f}")
    print(f"console / tail at 4 GB: x{med['ours', 4] / med['tail', 4]:.2f} (target <= 3)")
    print(f"console 4 GB / 1 GB: x{med['ours', 4] / med['ours', 1]:.2f} (target: within 20 %, 0.8-1.2)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--lines", type=int, default=1000)
    args = parser.parse_args()
    asyncio.run(main(args.runs, args.lines))
