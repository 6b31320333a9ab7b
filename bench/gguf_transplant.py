"""GGUF surgery's transplant: the bytes fetched from an HTTP donor against the donor's size.

    python bench/gguf_transplant.py [--runs 3] [--keep]

The donor is the Gemma 3 270M Q4_K_M GGUF (253 MB, a 262k-token vocabulary in its header;
tests/gguf_artifacts.py fetches and caches it), served on loopback by tests/httpfiles.py, which
honours Range. The base is a small model written by gguf-py's GGUFWriter. The box tool
(gguf_surgery add_tensors, through the Box on this machine) adds one whole layer of the donor
(blk.5.*, the tensors next to each other in its data area) and output_norm.weight, --runs times.
The figures:
- bytes fetched / donor size (the playbook's §4: "big files can be pulled by Range, not whole");
- bytes fetched / (the donor's header + the tensors' bytes): what the range reading costs on top
  of what it must read (the header in growing ranges, the padding between merged tensors);
- the requests made, and the seconds, against downloading the whole donor from the same server.
This is a measurement, not a test: nothing here asserts on it.
"""

from __future__ import annotations

import asyncio
import sys
import time
import urllib.request
from pathlib import Path

from gguf import GGUFReader
from harness import argument_parser, median, print_figure, scratch_folder

from samai.remote.boxapi import Box
from samai.remote.local import LocalTransport
from tests.gguf_artifacts import gemma_q4_k_m
from tests.httpfiles import FileServer
from tests.test_gguf_surgery import write_tiny

LAYER = "blk.5."


def whole_download(url: str) -> float:
    started = time.perf_counter()
    with urllib.request.urlopen(url) as response:
        while response.read(1 << 20):
            pass
    return time.perf_counter() - started


async def transplant(workspace: Path, url: str, names: list[str], run: int):
    box = Box(LocalTransport(), str(workspace), python=sys.executable, timeout=120)
    try:
        started = time.perf_counter()
        result = await box.gguf_write({"op": "add_tensors", "path": "base.gguf", "donor": url, "tensors": names,
                                       "out": f"grafted-{run}.gguf"}, timeout=600)
        return result, time.perf_counter() - started
    finally:
        await box.close()


def main() -> int:
    parser = argument_parser(__doc__, runs=3)
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder")
    args = parser.parse_args()
    donor = gemma_q4_k_m()
    reader = GGUFReader(str(donor))
    names = [t.name for t in reader.tensors if t.name.startswith(LAYER)] + ["output_norm.weight"]
    tensor_bytes = sum(int(t.n_bytes) for t in reader.tensors if t.name in names)
    header = int(reader.data_offset)
    size = donor.stat().st_size
    with scratch_folder("gguf-transplant-", args.keep) as folder, FileServer(donor.parent) as server:
        workspace = folder / "ws"
        workspace.mkdir()
        write_tiny(workspace / "base.gguf")
        url = server.url(donor.name)
        fetched, seconds, requests = [], [], []
        for run in range(args.runs):
            before = len(server.gets(donor.name))
            result, took = asyncio.run(transplant(workspace, url, names, run))
            if not result.ok:
                print(f"transplant failed: {result.error}")
                return 1
            fetched.append(result.fetched)
            seconds.append(took)
            requests.append(len(server.gets(donor.name)) - before)
        whole = [whole_download(url) for _ in range(args.runs)]
    print(f"donor {donor.name}: {size} bytes, header {header} bytes; {len(names)} tensors ({LAYER}* and "
          f"output_norm.weight) of {tensor_bytes} bytes")
    print(f"per transplant: {int(median(fetched))} bytes fetched in {int(median(requests))} requests, "
          f"{median(seconds):.2f} s (whole download {median(whole):.2f} s)")
    print_figure("bytes fetched / donor size", median(fetched), size, at_most=0.1)
    print_figure("bytes fetched / (donor header + tensor bytes)", median(fetched), header + tensor_bytes,
                 at_most=1.1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
