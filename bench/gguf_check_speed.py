"""`check gguf` on a multi-GB GGUF whose header is real and whose data is a hole (sparse), against
gguf-py's GGUFReader on the same file, in one run:

    python bench/gguf_check_speed.py [--gb 4] [--runs 5]

The check goes through the Box (byte ranges, as it would on a remote box) and reports what it
read; GGUFReader memory-maps the local file. The figures: time and bytes read of each.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

from gguf import GGUFReader
from harness import Timings, argument_parser, print_figure

from samai.console.core.checks import check_gguf
from samai.remote.boxapi import Box
from samai.remote.local import LocalTransport
from tests.test_checks import sparse_gguf


async def main(gb: float, runs: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = sparse_gguf(Path(tmp) / "big.gguf", int(gb * (1 << 30)))
        box = Box(LocalTransport(), tmp, python=sys.executable)
        await box.snapshot(processes=False)  # tools uploaded, probe started: as in a running console
        times, read = Timings(), 0
        for _ in range(runs):
            result = await times.time_async("check", lambda: check_gguf(box, str(path), expect_tensors=None,
                                                                         expect_last=None, local=False))
            read = result.bytes_read
            assert result.ok, result
            reader = times.time("GGUFReader", GGUFReader, str(path))
            assert len(reader.tensors) == result.tensor_count
        await box.close()
    size = path.stat().st_size if path.exists() else int(gb * (1 << 30))
    ours_ms, theirs_ms = 1000 * times.median("check"), 1000 * times.median("GGUFReader")
    print(f"GGUF of {size / (1 << 30):.1f} GiB (sparse data), {runs} runs, medians")
    print(f"check gguf via the Box: {ours_ms:.1f} ms, {read:,} bytes read ({read / size:.2e} of the file)")
    print(f"GGUFReader (local mmap): {theirs_ms:.1f} ms")
    print_figure("check / GGUFReader", ours_ms, theirs_ms)


if __name__ == "__main__":
    parser = argument_parser(__doc__, runs=5)
    parser.add_argument("--gb", type=float, default=4)
    args = parser.parse_args()
    asyncio.run(main(args.gb, args.runs))
