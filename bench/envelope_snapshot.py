"""Snapshot latency over the envelope target (the reference gateway on loopback) against the
local target, interleaved in one run:

    python bench/envelope_snapshot.py [--runs 20]

Through a gateway nothing stays open: every snapshot starts the probe anew inside a payload
that the gateway starts in a fresh interpreter, so the ratio is the price of that gateway.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile

from harness import argument_parser, interleaved_async, print_figure

from samai.remote.boxapi import Box
from samai.remote.envelope import EnvelopeTransport
from samai.remote.local import LocalTransport

TOKEN = "bench-token-" + os.urandom(8).hex()


async def main(runs: int) -> None:
    os.environ["SAMAI_ENVELOPE_TOKEN"] = TOKEN
    gateway = subprocess.Popen([sys.executable, "-m", "samai.console", "envelope-server", "--port", "0"],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    url = "envelope+" + gateway.stdout.readline().split()[-1]
    workspace = tempfile.mkdtemp(prefix="samai-bench-env-")
    local = Box(LocalTransport(), workspace, python=sys.executable)
    remote = Box(EnvelopeTransport(url), workspace, python=sys.executable)
    try:
        await local.snapshot()
        await remote.snapshot()  # tools uploaded once, as the console does
        times = await interleaved_async(runs, {"local": local.snapshot, "envelope": remote.snapshot})
    finally:
        await local.close()
        await remote.close()
        gateway.terminate()
        gateway.wait(10)
    print(f"snapshot latency, {runs} runs each, interleaved ({os.cpu_count()} CPUs)")
    for name in ("local", "envelope"):
        median, p95 = 1000 * times.median(name), 1000 * times.percentile(name, 0.95)
        print(f"{name:<9} median {median:7.1f} ms   p95 {p95:7.1f} ms")
    print_figure("envelope / local", times.median("envelope"), times.median("local"))


if __name__ == "__main__":
    asyncio.run(main(argument_parser(__doc__, runs=20).parse_args().runs))
