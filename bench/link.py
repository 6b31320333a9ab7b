"""The console over an emulated link (tests/linkem.py relaying to a real sshd), in round trips.

Run as root with openssh-server installed, from the repository root:

    python bench/link.py [--rtt 0.1] [--loss 0.01] [--runs 100] [--mb 52] [--outage 20]

Each figure is a ratio against a baseline timed in the same run, over the same link:
  first contact   the first snapshot of a fresh box, and of a box that has the tools, in round
                  trips on top of the SSH handshake's (asyncssh.connect alone), each timed over
                  the link and at rtt 0
  steady poll     the TUI's real poll (the samai-8b pipeline: nine stage logs and their markers)
                  once the probe holds it, and the same poll sent whole, against the smallest
                  poll (no logs), p50 and p95 at the given loss
  tail catch-up   a burst read from offset 0 to its end (the CLI's follower) in MB/s, against
                  `ssh cat FILE` through the same link; and with the reads of old (256 KiB each)
  outage          a blackhole longer than the keepalive gives up, and a reset: how long until a
                  poll fails, and until one succeeds after the link is back
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import asyncssh
from harness import Timings, argument_parser, print_figure

from samai.console.core import config
from samai.console.core.state import ConsoleState
from samai.remote.boxapi import Box
from samai.remote.follow import CATCH_UP_READ, LogFollower
from samai.remote.ssh import SshOptions, SshTarget, SshTransport
from samai.remote.transport import TransportError
from tests import sshd
from tests.linkem import Link

MB = 1e6


class WholeRequests:
    """A stream that says it may not remember: the Box sends every request whole (as before)."""

    persistent = False

    def __init__(self, inner) -> None:
        self.inner = inner

    async def request(self, line: bytes, *, timeout: float) -> bytes:
        return await self.inner.request(line, timeout=timeout)

    async def close(self) -> None:
        await self.inner.close()


class WholeBox(Box):
    async def _open_probe(self):
        return WholeRequests(await super()._open_probe())


def box_over(link: Link, workspace: str, cls: type[Box] = Box, timeout: float = 30.0) -> Box:
    return cls(SshTransport(SshTarget("127.0.0.1", "root", link.port), SshOptions()), workspace,
               python=sys.executable, timeout=timeout)


async def handshake(link: Link) -> float:
    started = time.monotonic()
    conn = await asyncssh.connect("127.0.0.1", port=link.port, username="root")
    took = time.monotonic() - started
    conn.close()
    await conn.wait_closed()
    return took


async def first_contact(link: Link, runs: int) -> None:
    """Round trips = (time over the link - time at rtt 0) / rtt: what the box and the CPUs
    spend (a first probe scans every process) is in both, and cancels out."""
    rtt, times = link.rtt, {0.0: Timings(), link.rtt: Timings()}
    for _ in range(runs):
        for delay, timed in times.items():
            link.set(rtt=delay)
            timed.add("handshake", await handshake(link))
            workspace = tempfile.mkdtemp(prefix="samai-bench-link-")
            for name in ("fresh box", "tools present"):
                box = box_over(link, workspace)
                await timed.time_async(name, box.snapshot)
                await box.close()
    link.set(rtt=rtt)

    def round_trips(name: str) -> float:
        return (times[rtt].median(name) - times[0.0].median(name)) / rtt

    print(f"first contact, {runs} runs each: handshake {round_trips('handshake'):.1f} round trips "
          f"({times[rtt].median('handshake') * 1000:.0f} ms at rtt {rtt * 1000:.0f} ms)")
    for name, target in (("fresh box", 5), ("tools present", 3)):
        print_figure(f"first snapshot, {name}: round trips on top of the handshake's",
                     round_trips(name) - round_trips("handshake"), 1.0, at_most=target)


async def steady_poll(link: Link, runs: int, loss: float) -> None:
    workspace = tempfile.mkdtemp(prefix="samai-bench-link-")
    cfg = config.load_builtin("samai-8b")
    cfg = replace(cfg, workspace=workspace, target=replace(cfg.target, python=sys.executable))
    for stage in cfg.stages:
        log = Path(workspace, stage.log)
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("".join(f"{stage.name} step {i}\n" for i in range(200)))
    state = ConsoleState(cfg)
    boxes = {"tui poll": box_over(link, workspace), "tui poll sent whole": box_over(link, workspace, WholeBox),
             "smallest poll": box_over(link, workspace)}
    for name, box in boxes.items():
        for _ in range(3):  # connected, and the logs read up to their ends
            followers = state.followers()
            snap = await box.snapshot(**state.request(followers))
            if name == "tui poll":
                state.apply(snap, followers, time.time())
    sizes = {"tui poll": boxes["tui poll"].last_request_bytes}
    link.set(loss=loss)
    times = Timings()
    for _ in range(runs):
        for name, box in boxes.items():
            kwargs = state.request(state.followers()) if name != "smallest poll" else {}
            await times.time_async(name, lambda box=box, kwargs=kwargs: box.snapshot(**kwargs))
            sizes[name] = box.last_request_bytes
    link.set(loss=0)
    print(f"steady poll at {loss:.1%} loss, {runs} polls each: request bytes "
          + ", ".join(f"{name} {n}" for name, n in sizes.items()))
    for name in boxes:
        p50, p95 = times.median(name) / link.rtt, times.percentile(name, 0.95) / link.rtt
        print(f"  {name:<20} p50 {p50:5.2f} rtt   p95 {p95:5.2f} rtt")
    print_figure("steady tui poll p95 / smallest poll p95", times.percentile("tui poll", 0.95),
                 times.percentile("smallest poll", 0.95), at_most=1.5)
    print_figure("whole tui poll p95 / smallest poll p95 (before)", times.percentile("tui poll sent whole", 0.95),
                 times.percentile("smallest poll", 0.95))
    for box in boxes.values():
        await box.close()


async def catch_up(link: Link, server: sshd.SshServer, size_mb: float, runs: int) -> None:
    workspace = tempfile.mkdtemp(prefix="samai-bench-link-")
    log = Path(workspace, "burst.log")
    with open(log, "w") as f:
        i = 0
        while f.tell() < size_mb * MB:
            f.write("".join(f"{{'step': {i + k}, 'loss': 0.5, 'note': '{'x' * 40}'}}\n" for k in range(1000)))
            i += 1000
    size = log.stat().st_size
    ssh_cat = ["ssh", "-F", str(server.client_home / ".ssh" / "config"), "-p", str(link.port), server.alias,
               "cat", str(log)]

    async def read_all(catch_up_bytes: int) -> None:
        box = box_over(link, workspace)
        await box.snapshot(processes=False)  # connected: the figure is the transfer
        follower = LogFollower(str(log), offset=0, catch_up_bytes=catch_up_bytes)
        started = time.monotonic()
        while follower.consume(await box.read_log(follower.cursor())).more:
            pass
        times.add(f"ours {catch_up_bytes}", time.monotonic() - started)
        await box.close()

    times = Timings()
    for _ in range(runs):
        started = time.monotonic()
        await asyncio.to_thread(subprocess.run, ssh_cat, check=True, stdout=subprocess.DEVNULL)
        times.add("ssh cat", time.monotonic() - started)  # its handshake included: a little in its favour
        await read_all(CATCH_UP_READ)
        await read_all(0)
    rates = {name: size / MB / times.median(name) for name in ("ssh cat", f"ours {CATCH_UP_READ}", "ours 0")}
    print(f"tail catch-up of {size / MB:.0f} MB, {runs} runs: ssh cat {rates['ssh cat']:.1f} MB/s, "
          f"ours {rates[f'ours {CATCH_UP_READ}']:.1f} MB/s, fixed 256 KiB reads {rates['ours 0']:.1f} MB/s")
    print_figure("catch-up MB/s, ours / ssh cat", rates[f"ours {CATCH_UP_READ}"], rates["ssh cat"], at_least=1.0)
    print_figure("catch-up MB/s, ours / fixed 256 KiB reads (before)", rates[f"ours {CATCH_UP_READ}"],
                 rates["ours 0"])


async def outage(link: Link, seconds: float, mode: str) -> None:
    """Poll once a second, as the TUI does; the link goes away for `seconds`."""
    workspace = tempfile.mkdtemp(prefix="samai-bench-link-")
    box = box_over(link, workspace, timeout=10.0)  # keepalive 5 s x 3, as configured by default
    await box.snapshot()
    began = time.monotonic()
    link.outage(seconds, mode=mode)  # type: ignore[arg-type]
    failed = back = None
    while back is None:
        try:
            await box.snapshot()
            if failed is not None or time.monotonic() - began > seconds:
                back = time.monotonic()
        except TransportError:
            failed = failed or time.monotonic()
        except Exception as e:  # a BoxError from a half-answered poll: a failure all the same
            failed = failed or time.monotonic()
            print(f"  ({type(e).__name__}: {e})")
        await asyncio.sleep(1.0)
    detect = (failed - began) if failed else float("nan")
    recover = back - (began + seconds)
    print(f"{mode} outage of {seconds:g} s (keepalive 5 s x 3; the TUI says STALE after 3 polls):")
    print(f"  first failed poll after {detect:.1f} s ({detect / link.rtt:.0f} rtt), "
          f"first good poll {recover:.1f} s ({recover / link.rtt:.0f} rtt) after it ended")
    await box.close()


async def main(args) -> None:
    server = sshd.SshServer(sshd.new_root()).start()
    os.environ["HOME"] = str(server.client_home)
    os.environ.pop("SSH_AUTH_SOCK", None)
    link = Link("127.0.0.1", server.port, rtt=args.rtt).start()
    kind, key = (server.root / "keys" / "host.pub").read_text().split()[:2]
    with open(server.client_home / ".ssh" / "known_hosts", "a") as f:
        f.write(f"[127.0.0.1]:{link.port} {kind} {key}\n")
    print(f"emulated link: rtt {args.rtt * 1000:.0f} ms ({os.cpu_count()} CPUs, Python {sys.version.split()[0]})")
    try:
        await first_contact(link, 5)
        await steady_poll(link, args.runs, args.loss)
        await catch_up(link, server, args.mb, 3)
        for mode in ("blackhole", "reset"):
            await outage(link, args.outage, mode)
    finally:
        link.stop()
        server.stop()


if __name__ == "__main__":
    parser = argument_parser(__doc__, runs=100)
    parser.add_argument("--rtt", type=float, default=0.1)
    parser.add_argument("--loss", type=float, default=0.01)
    parser.add_argument("--mb", type=float, default=52.0)
    parser.add_argument("--outage", type=float, default=20.0)
    asyncio.run(main(parser.parse_args()))
