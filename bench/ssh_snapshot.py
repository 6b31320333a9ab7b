"""Snapshot latency over SSH (loopback sshd) against the local target and the naive way.

The naive way is what an operator's shell loop does: one `ssh host CMD` process per probe
(df, ps, the listening sockets, the log's tail), each paying for its own connection. Run as
root with openssh-server installed, from the repository root:

    python bench/ssh_snapshot.py [--runs 30]

All three are measured in this one run, interleaved, so that the machine's noise hits them
alike; the figures that matter are the ratios.
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
from samai.remote.follow import LogCursor  # noqa: E402
from samai.remote.local import LocalTransport  # noqa: E402
from samai.remote.ssh import SshTarget, SshTransport  # noqa: E402
from tests import sshd  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def naive_snapshot(ssh: list[str], workspace: str, log: str) -> None:
    for command in (f"df -P {workspace}", "ps -eo pid,ppid,pgid,user,lstart,pcpu,rss,args",
                    "cat /proc/net/tcp /proc/net/tcp6", f"tail -c 65536 {log}"):
        subprocess.run([*ssh, command], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def timed(coro_factory) -> float:
    started = time.perf_counter()
    await coro_factory()
    return time.perf_counter() - started


async def main(runs: int) -> None:
    server = sshd.SshServer(sshd.new_root()).start()
    os.environ["HOME"] = str(server.client_home)
    workspace = tempfile.mkdtemp(prefix="samai-bench-ws-")
    log = Path(workspace, "train.log")
    log.write_text("".join(f"{{'loss': {1 / (i + 1):.4f}, 'grad_norm': 1.0}}\n" for i in range(2000)))
    cursors = [LogCursor(str(log), last_lines=100)]
    local = Box(LocalTransport(), workspace, python=sys.executable)
    remote = Box(SshTransport(SshTarget("127.0.0.1", "root", server.port)), workspace, python=sys.executable)
    try:
        await local.snapshot(logs=cursors)
        await remote.snapshot(logs=cursors)  # connect and upload the tools once, as the console does
        naive_snapshot(server.ssh_argv(), workspace, str(log))
        times: dict[str, list[float]] = {"local": [], "ssh": [], "naive ssh": []}
        for _ in range(runs):
            times["local"].append(await timed(lambda: local.snapshot(logs=cursors)))
            times["ssh"].append(await timed(lambda: remote.snapshot(logs=cursors)))
            times["naive ssh"].append(await timed(lambda: asyncio.to_thread(
                naive_snapshot, server.ssh_argv(), workspace, str(log))))
    finally:
        await remote.close()
        server.stop()
    print(f"snapshot latency, {runs} runs each, interleaved ({os.cpu_count()} CPUs, Python {sys.version.split()[0]})")
    print(f"{'target':<10} {'median ms':>10} {'p95 ms':>10}")
    for name, values in times.items():
        print(f"{name:<10} {1000 * statistics.median(values):>10.1f} {1000 * percentile(values, 0.95):>10.1f}")
    ssh_med, local_med = statistics.median(times["ssh"]), statistics.median(times["local"])
    naive_med = statistics.median(times["naive ssh"])
    print(f"ssh / local: x{ssh_med / local_med:.2f} (one round trip on top of the same probe)")
    print(f"naive / ssh: x{naive_med / ssh_med:.1f} faster (target: >= 10x)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    asyncio.run(main(parser.parse_args().runs))
