"""Snapshot latency over the envelope target (the reference gateway on loopback) against the
local target, interleaved in one run:

    python bench/envelope_snapshot.py [--runs 20]

Through a gateway nothing stays open: every snapshot starts the probe anew inside a payload
that the gateway starts in a fresh interpreter, so the ratio is the price of that gateway.
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
from samai.remote.envelope import EnvelopeTransport  # noqa: E402
from samai.remote.local import LocalTransport  # noqa: E402

TOKEN = "bench-token-" + os.urandom(8).hex()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


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
        times: dict[str, list[float]] = {"local": [], "envelope": []}
        for _ in range(runs):
            for name, box in (("local", local), ("envelope", remote)):
                started = time.perf_counter()
                await box.snapshot()
                times[name].append(time.perf_counter() - started)
    finally:
        await local.close()
        await remote.close()
        gateway.terminate()
        gateway.wait(10)
    print(f"snapshot latency, {runs} runs each, interleaved ({os.cpu_count()} CPUs)")
    for name, values in times.items():
        median, p95 = 1000 * statistics.median(values), 1000 * percentile(values, 0.95)
        print(f"{name:<9} median {median:7.1f} ms   p95 {p95:7.1f} ms")
    ratio = statistics.median(times["envelope"]) / statistics.median(times["local"])
    print(f"envelope / local: x{ratio:.1f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    asyncio.run(main(parser.parse_args().runs))
