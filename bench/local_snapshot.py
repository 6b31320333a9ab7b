"""One snapshot of the local target against the probe run by hand as one process:

    python bench/local_snapshot.py [--runs 30]

Both answer the request the console's poll sends for the built-in tiny pipeline (disk, artifact
sizes, processes and listeners, writers, binaries, a cursor on every stage log, eval reports) in
a workspace with a training log and an adapter. Ours goes through the Box to the probe the
console keeps running and is parsed into a typed Snapshot; by hand is
`python3 -S probe.py < request.json`, a fresh process each time, its JSON left unparsed.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import posixpath
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from samai.console.core.config import load_builtin  # noqa: E402
from samai.console.core.state import ConsoleState  # noqa: E402
from samai.remote.boxapi import Box  # noqa: E402
from samai.remote.local import LocalTransport  # noqa: E402


def fill_workspace(root: Path) -> None:
    (root / "logs").mkdir()
    lines = (f"{{'loss': '{1 / (i + 1):.4f}', 'grad_norm': '1.0', 'epoch': '{i / 100:.2f}'}}\n" for i in range(5000))
    (root / "logs" / "train.log").write_text("".join(lines))
    adapter = root / "out" / "adapter"
    adapter.mkdir(parents=True)
    (adapter / "adapter_model.safetensors").write_bytes(os.urandom(1 << 20))


async def main(runs: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        fill_workspace(Path(tmp))
        state = ConsoleState(dataclasses.replace(load_builtin("tiny"), workspace=tmp))
        box = Box(LocalTransport(), tmp, python=sys.executable)
        followers = state.followers()
        state.apply(await box.snapshot(**state.request(followers)), followers, time.time())  # cursors at the ends
        what = state.request(followers)
        request = json.dumps(box.snapshot_request(**what)).encode()
        by_hand = [sys.executable, "-S", posixpath.join(box.tools_dir, "probe.py")]
        ours, theirs = [], []
        for _ in range(runs):
            started = time.perf_counter()
            await box.snapshot(**what)
            ours.append(time.perf_counter() - started)
            started = time.perf_counter()
            subprocess.run(by_hand, input=request, stdout=subprocess.PIPE, check=True)
            theirs.append(time.perf_counter() - started)
        await box.close()
    o, t = statistics.median(ours) * 1000, statistics.median(theirs) * 1000
    print(f"one local snapshot, {runs} runs each, interleaved, medians ({os.cpu_count()} CPUs, "
          f"Python {sys.version.split()[0]}; request {len(request):,} B)")
    print(f"console (kept probe, parsed): {o:.1f} ms   probe by hand: {t:.1f} ms")
    print(f"console / by hand: x{o / t:.2f} (target <= 1.5)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    asyncio.run(main(parser.parse_args().runs))
