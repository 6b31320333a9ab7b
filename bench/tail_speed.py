"""The last 1,000 lines of a 1 GB and a 4 GB log (the first paint of a tail) against `tail -n 1000`:

    python bench/tail_speed.py [--runs 15] [--lines 1000]

Ours is what the console does when a log is opened in the log pane: one read through the probe
it keeps running (local target), looking back from the end for the last N lines, and decoding
them into lines. Both read the page cache; both must cost the same for a 1 GB and a 4 GB file.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from harness import Timings, argument_parser, print_figure, ratio

from samai.remote.boxapi import Box
from samai.remote.follow import LogFollower
from samai.remote.local import LocalTransport

LINE = b"{'loss': '0.8897', 'grad_norm': '1.14', 'learning_rate': '0.00111', 'epoch': '47.5'} step %07d\n"


def write_log(path: Path, gigabytes: int) -> int:
    block = b"".join(LINE % i for i in range(10_000))
    with open(path, "wb") as f:
        while f.tell() < gigabytes * 1_000_000_000:
            f.write(block)
        return f.tell()


async def ours(box: Box, path: Path, lines: int) -> int:
    """The lines the log pane would show."""
    follower = LogFollower(str(path), last_lines=lines)
    return len(follower.consume(await box.read_log(follower.cursor())).lines)


def theirs(path: Path, lines: int) -> int:
    out = subprocess.run(["tail", "-n", str(lines), str(path)], stdout=subprocess.PIPE, check=True).stdout
    return out.count(b"\n")


async def main(runs: int, lines: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        paths = {gb: Path(tmp, f"{gb}g.log") for gb in (1, 4)}
        sizes = {gb: write_log(path, gb) for gb, path in paths.items()}
        box = Box(LocalTransport(), tmp, python=sys.executable)
        await box.snapshot(processes=False)  # the console's probe is already running when a log is opened
        times = Timings()
        for _ in range(runs):
            for gb, path in paths.items():
                assert await times.time_async(f"ours {gb}", ours, box, path, lines) == lines
                assert times.time(f"tail {gb}", theirs, path, lines) == lines
        await box.close()
    med = {(who, gb): times.median(f"{who} {gb}") * 1000 for who in ("ours", "tail") for gb in paths}
    print(f"last {lines} lines, {runs} runs each, interleaved, medians ({os.cpu_count()} CPUs)")
    print(f"{'file':>8}  {'console ms':>10}  {'tail -n ms':>10}  ratio")
    for gb in paths:
        print(f"{sizes[gb] / 1e9:6.1f}GB  {med['ours', gb]:10.2f}  {med['tail', gb]:10.2f}  "
              f"x{ratio(med['ours', gb], med['tail', gb]):.2f}")
    print_figure("console / tail at 4 GB", med["ours", 4], med["tail", 4], at_most=3)
    print_figure("console 4 GB / 1 GB", med["ours", 4], med["ours", 1], note="target: within 20 %, 0.8-1.2")


if __name__ == "__main__":
    parser = argument_parser(__doc__, runs=15)
    parser.add_argument("--lines", type=int, default=1000)
    args = parser.parse_args()
    asyncio.run(main(args.runs, args.lines))
