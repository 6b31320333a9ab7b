"""One snapshot of the local target against the probe run by hand as one process:

    python bench/local_snapshot.py [--runs 30]

Both answer the request the console's poll sends for the built-in tiny pipeline (disk, artifact
sizes, processes and listeners, writers, binaries, a cursor on every stage log, eval reports) in
a workspace with a training log and an adapter. Ours goes through the Box to the probe the
console keeps running and is parsed into a typed Snapshot; by hand is
`python3 -S TOOLS probe < request.json` (the box tools' folder, as the console runs a tool), a fresh
process each time, its JSON left unparsed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import argument_parser, interleaved_async, print_figure

from samai.console.core.config import load_builtin
from samai.console.core.state import ConsoleState
from samai.remote.boxapi import Box
from samai.remote.local import LocalTransport


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
        by_hand = [sys.executable, "-S", box.tools_dir, "probe"]

        async def console() -> None:
            await box.snapshot(**what)

        def hand() -> None:
            subprocess.run(by_hand, input=request, stdout=subprocess.PIPE, check=True)

        times = await interleaved_async(runs, {"console": console, "by hand": hand})
        await box.close()
    o, t = times.median("console") * 1000, times.median("by hand") * 1000
    print(f"one local snapshot, {runs} runs each, interleaved, medians ({os.cpu_count()} CPUs, "
          f"Python {sys.version.split()[0]}; request {len(request):,} B)")
    print(f"console (kept probe, parsed): {o:.1f} ms   probe by hand: {t:.1f} ms")
    print_figure("console / by hand", o, t, at_most=1.5)


if __name__ == "__main__":
    asyncio.run(main(argument_parser(__doc__, runs=30).parse_args().runs))
