"""The probe's marker scan of a large log against `grep -c -E` with the same patterns, one run:

    python bench/marker_scan.py [--mb 1024] [--runs 3]

The log is mostly Trainer and tqdm noise with a marker every ~50,000 lines; the probe scans it
in markers-only reads (no bytes returned), as the console's stage watches do.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from harness import Timings, argument_parser, print_figure

from samai.console.core.config import load_builtin
from samai.remote.boxapi import Box
from samai.remote.follow import MARKER_SCAN_READ, LogFollower
from samai.remote.local import LocalTransport

NOISE = [b"{'loss': '0.8897', 'grad_norm': '1.14', 'learning_rate': '0.00111', 'epoch': '47.5'}\n",
         b" 45%|####5     | 4500/10000 [12:01<14:41,  6.24it/s]\n",
         b"[2026-11-30 07:34:04,426] [INFO] [engine.py:2020:step] step=4500, skipped=0, lr=[0.0001]\n"]


def write_log(path: Path, megabytes: int) -> int:
    block = b"".join(NOISE[i % 3] for i in range(50_000)) + b"TRAIN_NAN step 4 loss nan\n"
    with open(path, "wb") as f:
        while f.tell() < megabytes * 1_000_000:
            f.write(block)
        return f.tell()


async def probe_scan(box: Box, path: Path, markers) -> int:
    """The marker hits in the whole file."""
    follower = LogFollower(str(path), markers=markers, offset=0, want_data=False, max_bytes=MARKER_SCAN_READ)
    hits = 0
    while True:
        update = follower.consume(await box.read_log(follower.cursor()))
        hits += len(update.hits)
        if not update.more:
            return hits


def grep_scan(path: Path, markers) -> int:
    """The lines grep finds with the same patterns."""
    pattern = "|".join(m.pattern for m in markers)
    out = subprocess.run(["grep", "-c", "-E", pattern, str(path)], capture_output=True, text=True)
    return int(out.stdout.strip() or 0)


async def main(megabytes: int, runs: int) -> None:
    markers = tuple({m.name: m for s in load_builtin("tiny").stages for m in s.markers}.values())
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "flood.log")
        size = write_log(path, megabytes)
        box = Box(LocalTransport(), tmp, python=sys.executable)
        await box.snapshot(processes=False)
        times = Timings()
        for _ in range(runs):
            subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL)  # both read from the page cache
            hits = await times.time_async("probe", probe_scan, box, path, markers)
            lines = times.time("grep", grep_scan, path, markers)
            assert hits == lines, (hits, lines)
        await box.close()
    o, t = times.median("probe"), times.median("grep")
    print(f"marker scan of {size / 1e6:.0f} MB, {len(markers)} patterns, {hits} hits, {runs} runs, medians "
          f"({os.cpu_count()} CPUs)")
    print(f"probe: {o:.2f} s ({size / o / 1e6:.0f} MB/s)   grep -c -E: {t:.2f} s ({size / t / 1e6:.0f} MB/s)")
    print_figure("probe / grep", o, t, at_most=2)


if __name__ == "__main__":
    parser = argument_parser(__doc__, runs=3)
    parser.add_argument("--mb", type=int, default=1024)
    args = parser.parse_args()
    asyncio.run(main(args.mb, args.runs))
