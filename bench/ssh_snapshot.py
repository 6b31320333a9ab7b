"""Snapshot latency over SSH (loopback sshd) against the local target and the naive way.

The naive way is what an operator's shell loop does: one `ssh host CMD` process per probe
(df, ps, the listening sockets, the log's tail), each paying for its own connection. Run as
root with openssh-server installed, from the repository root:

    python bench/ssh_snapshot.py [--runs 30]

All three are measured in this one run, interleaved, so that the machine's noise hits them
alike; the figures that matter are the ratios.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from harness import argument_parser, interleaved_async, print_figure

from samai.remote.boxapi import Box
from samai.remote.follow import LogCursor
from samai.remote.local import LocalTransport
from samai.remote.ssh import SshTarget, SshTransport
from tests import sshd


def naive_snapshot(ssh: list[str], workspace: str, log: str) -> None:
    for command in (f"df -P {workspace}", "ps -eo pid,ppid,pgid,user,lstart,pcpu,rss,args",
                    "cat /proc/net/tcp /proc/net/tcp6", f"tail -c 65536 {log}"):
        subprocess.run([*ssh, command], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


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

        async def over_local() -> None:
            await local.snapshot(logs=cursors)

        async def over_ssh() -> None:
            await remote.snapshot(logs=cursors)

        async def naive() -> None:
            await asyncio.to_thread(naive_snapshot, server.ssh_argv(), workspace, str(log))

        times = await interleaved_async(runs, {"local": over_local, "ssh": over_ssh, "naive ssh": naive})
    finally:
        await remote.close()
        server.stop()
    print(f"snapshot latency, {runs} runs each, interleaved ({os.cpu_count()} CPUs, Python {sys.version.split()[0]})")
    print(f"{'target':<10} {'median ms':>10} {'p95 ms':>10}")
    for name in ("local", "ssh", "naive ssh"):
        print(f"{name:<10} {1000 * times.median(name):>10.1f} {1000 * times.percentile(name, 0.95):>10.1f}")
    print_figure("ssh / local", times.median("ssh"), times.median("local"),
                 note="one round trip on top of the same probe")
    print_figure("naive / ssh", times.median("naive ssh"), times.median("ssh"), note="how much faster ssh is",
                 at_least=10)


if __name__ == "__main__":
    asyncio.run(main(argument_parser(__doc__, runs=30).parse_args().runs))
