"""`check gguf` on a multi-GB GGUF whose header is real and whose data is a hole (sparse), against
gguf-py's GGUFReader on the same file, in one run:

    python bench/gguf_check_speed.py [--gb 4] [--runs 5]

The check goes through the Box (byte ranges, as it would on a remote box) and reports what it
read; GGUFReader memory-maps the local file. The figures: time and bytes read of each.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gguf import GGUFReader  # noqa: E402

from samai.console.core.checks import check_gguf  # noqa: E402
from samai.remote.boxapi import Box  # noqa: E402
from samai.remote.local import LocalTransport  # noqa: E402
from tests.test_checks import sparse_gguf  # noqa: E402


async def main(gb: float, runs: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = sparse_gguf(Path(tmp) / "big.gguf", int(gb * (1 << 30)))
        box = Box(LocalTransport(), tmp, python=sys.executable)
        await box.snapshot(processes=False)  # tools uploaded, probe started: as in a running console
        ours, theirs, read = [], [], 0
        for _ in range(runs):
            started = time.perf_counter()
            result = await check_gguf(box, str(path), expect_tensors=None, expect_last=None, local=False)
            ours.append(time.perf_counter() - started)
            read = result["bytes_read"]
            assert result["ok"], result
            started = time.perf_counter()
            reader = GGUFReader(str(path))
            theirs.append(time.perf_counter() - started)
            assert len(reader.tensors) == result["tensor_count"]
        await box.close()
    size = path.stat().st_size if path.exists() else int(gb * (1 << 30))
    ours_ms, theirs_ms = 1000 * statistics.median(ours), 1000 * statistics.median(theirs)
    print(f"GGUF of {size / (1 << 30):.1f} GiB (sparse data), {runs} runs, medians")
    print(f"check gguf via the Box: {ours_ms:.1f} ms, {read:,} bytes read ({read / size:.2e} of the file)")
    print(f"GGUFReader (local mmap): {theirs_ms:.1f} ms")
    print(f"ratio check/GGUFReader: x{ours_ms / theirs_ms:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=4)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(main(args.gb, args.runs))
