"""A fleet of 1, 4 and 16 boxes polled every second by one console's fleet poller: its CPU, its
memory and the time from a change on a box to the fleet model seeing it.

    python bench/fleet.py [--boxes 1,16,64] [--seconds 30] [--settle 8] [--ssh]

Each box is a local target with a workspace of its own, running the built-in tiny pipeline's
config (its ten stages, their logs watched for markers) plus a `bench` and a `touched` stage, polled at 1 s by
the fleet model of the fleet screen (samai.console.core.fleet: one BoxWatch per box, its own Box
and probe, each in its own asyncio task, as the screen's workers run them). Each row's poll is
the fleet's slim one (ConsoleState's row_only). With --ssh every box is instead an SSH target on
a real OpenSSH server over loopback (root and openssh-server needed, as for the tests): one
connection per box carrying its probe; sshd's CPU is measured apart from the console's.

Each fleet size runs in a process of its own (so that its memory is its own). After the first
polls (--settle s: the box tools installed, every stage log scanned once), for --seconds:

- console CPU: the process's CPU time (the fleet poller's; the probes are other processes)
  over wall time, in % of one core;
- memory: RSS growth over the window, and RSS at its end less RSS before the fleet started;
- change → model: every 1.5 s a marker line is appended to one box's `touched` log (round robin),
  timed from the write to the row showing its alert; and the `bench` stage is fired on the
  first, the middle and the last box by the CLI (`--box NAME fire bench --yes`, a process of its
  own), timed from the run's fired_at (the box's clock, which is this one) to the row listing
  it as running;
- with --ssh, the sshd processes' CPU (the listener and its per-connection children) over the
  same window, apart.

Printed: the figures of each size, and each as a ratio against the single box measured in the
same run. A measurement, not a test: nothing asserts on it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path

import psutil
from harness import argument_parser, print_figure

from tests import sshd
from tests.helpers import stop_stages_under

MB = 1024 * 1024
CHANGE_EVERY_S = 1.5
BENCH_STAGES = """
[stages.bench]
key = "b"
command = "sleep 600"
log = "logs/bench.log"

[stages.touched]
key = "t"
command = "true"
log = "logs/touched.log"
markers = [{ name = "BENCH_CHANGE", pattern = "BENCH_CHANGE \\\\d+", severity = "warning" }]
"""  # bench: fired; touched: never fired, its log appended to (a fire rotates its stage's log)
TINY_TARGET = '[target]\nurl = "local"\npoll_interval = 1.0\n'


def rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def fleet_toml(folder: Path, count: int, url: str = "local") -> Path:
    """The tiny pipeline with `count` boxes at url in place of its [target], and the bench stage."""
    tiny = resources.files("samai.console").joinpath("pipelines/tiny.toml").read_text()
    assert TINY_TARGET in tiny, "the tiny pipeline's [target] changed: update this script"
    boxes = ""
    for i in range(count):
        workspace = folder / f"ws-{i}"
        (workspace / "logs").mkdir(parents=True)
        boxes += f'[boxes.box{i}]\nurl = "{url}"\nworkspace = "{workspace}"\npoll_interval = 1.0\n'
        if url != "local":
            boxes += f'python = "{sys.executable}"\n'
    path = folder / "fleet.toml"
    path.write_text(tiny.replace(TINY_TARGET, boxes) + BENCH_STAGES)
    return path


def sshd_cpu(server) -> float:
    """CPU seconds of the sshd listener and its per-connection processes so far."""
    procs = [psutil.Process(server.proc.pid), *psutil.Process(server.proc.pid).children(recursive=True)]
    total = 0.0
    for proc in procs:
        try:
            if proc.name().startswith("sshd"):
                times = proc.cpu_times()
                total += times.user + times.system
        except psutil.Error:  # a connection's process ended between the listing and the look
            pass
    return total


async def measure(count: int, seconds: float, settle: float, ssh: bool) -> dict:
    from samai.console.core import config
    from samai.console.core.connect import open_box
    from samai.console.core.fleet import Fleet

    folder = Path(tempfile.mkdtemp(prefix="samai-bench-fleet-"))
    server = None
    if ssh:
        server = sshd.SshServer(sshd.new_root()).start()
        os.environ["HOME"] = str(server.client_home)  # its client key and known_hosts (the fire CLI's too)
        os.environ.pop("SSH_AUTH_SOCK", None)
    path = fleet_toml(folder, count, server.url() if server else "local")
    fleet = Fleet(config.load(path), lambda c: open_box(c, readonly=True))
    rss_before = rss()
    tasks = [asyncio.create_task(w.run(WAITERS.report)) for w in fleet.watches]
    try:
        while not all(w.row.state == "connected" for w in fleet.watches):
            await asyncio.sleep(0.2)
        await asyncio.sleep(settle)
        cpu0, wall0, rss0 = time.process_time(), time.monotonic(), rss()
        sshd0 = sshd_cpu(server) if server else 0.0
        polls0 = sum(w.row.polls for w in fleet.watches)
        touches, fires = await changes(fleet, path, folder, seconds)
        cpu1, wall1, rss1 = time.process_time(), time.monotonic(), rss()
        sshd1 = sshd_cpu(server) if server else 0.0
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await fleet.close()
        stop_stages_under(folder)
        if server:
            server.stop()
    return {"boxes": count, "cpu": (cpu1 - cpu0) / (wall1 - wall0), "rss_growth": rss1 - rss0,
            "sshd_cpu": (sshd1 - sshd0) / (wall1 - wall0) if server else None,
            "rss_fleet": rss1 - rss_before, "touch": touches, "fire": fires,
            "polls": sum(w.row.polls for w in fleet.watches) - polls0, "seconds": wall1 - wall0}


async def changes(fleet, path: Path, folder: Path, seconds: float) -> tuple[list[float], list[float]]:
    """Touch a log every CHANGE_EVERY_S (round robin) and fire the bench stage on three boxes; the latencies."""
    names = [w.name for w in fleet.watches]
    fire_on = list(dict.fromkeys([names[0], names[len(names) // 2], names[-1]]))
    fired = [asyncio.create_task(fire_and_wait(fleet, path, name)) for name in fire_on]
    touches: list[float] = []
    start, i = time.monotonic(), 0
    while time.monotonic() - start < seconds:
        i += 1
        watch = fleet.watches[i % len(names)]
        token = f"BENCH_CHANGE {i}"
        log = Path(watch.config.workspace) / "logs" / "touched.log"
        at = time.time()
        with log.open("a") as f:
            f.write(token + "\n")
        row = await WAITERS.row_where(lambda r, n=watch.name, t=token: r.name == n and r.alert is not None
                                     and t in r.alert.text)
        touches.append(row.seen_at - at)
        await asyncio.sleep(max(0.0, CHANGE_EVERY_S - (time.time() - at)))
    return touches, [t for t in await asyncio.gather(*fired) if t is not None]


async def fire_and_wait(fleet, path: Path, name: str) -> float | None:
    """Fire the bench stage on box `name` by the CLI; from the run's fired_at to the first row running it."""
    seen = asyncio.create_task(WAITERS.row_where(lambda r: r.name == name and "bench" in r.running))
    done = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "samai.console", "--config", str(path),
                                                    "--box", name, "fire", "bench", "--yes"], capture_output=True)
    if done.returncode != 0:
        print(f"fire on {name} failed: {done.stderr.decode()[-300:]}", file=sys.stderr)
        seen.cancel()
        return None
    record = json.loads((Path(fleet.watch(name).config.workspace) / ".samai" / "state" / "bench.json").read_text())
    return (await seen).seen_at - float(record["fired_at"])


class Waiters:
    """Rows as the fleet reports them, handed to whoever waits for one like it: no polling of our own
    (it would be CPU of this process, counted as the console's)."""

    def __init__(self) -> None:
        self.waiting: list[tuple[object, asyncio.Future]] = []

    def report(self, row) -> None:
        for entry in list(self.waiting):
            predicate, future = entry
            if not future.done() and predicate(row):
                future.set_result(row)
                self.waiting.remove(entry)

    async def row_where(self, predicate, timeout: float = 60.0):
        """The first row reported from now on for which predicate holds."""
        future = asyncio.get_running_loop().create_future()
        self.waiting.append((predicate, future))
        return await asyncio.wait_for(future, timeout)


WAITERS = Waiters()


def child(count: int, seconds: float, settle: float, ssh: bool) -> None:
    print(json.dumps(asyncio.run(measure(count, seconds, settle, ssh))))


def main() -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--boxes", default="1,16,64", help="fleet sizes, the first the baseline (default 1,16,64)")
    parser.add_argument("--seconds", type=float, default=30.0, help="the measured window of each size")
    parser.add_argument("--settle", type=float, default=8.0, help="seconds of polling before the window")
    parser.add_argument("--ssh", action="store_true", help="the boxes SSH targets on a loopback sshd")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.seconds, args.settle, args.ssh)
        return 0
    results = []
    for count in (int(n) for n in args.boxes.split(",")):
        done = subprocess.run([sys.executable, __file__, "--child", str(count), "--seconds", str(args.seconds),
                               "--settle", str(args.settle), *(["--ssh"] if args.ssh else [])],
                              capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            print(f"{count} boxes failed:\n{done.stderr[-2000:]}")
            return 1
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    report(results, args.seconds, "SSH boxes on a loopback sshd" if args.ssh else "local boxes")
    return 0


def report(results: list[dict], seconds: float, boxes: str) -> None:
    print(f"fleet poller at 1 s, {seconds:g} s window per size, {boxes} ({os.cpu_count()} CPUs, "
          f"Python {sys.version.split()[0]})")
    print(f"{'boxes':>5} {'polls/s':>7} {'CPU %':>7} {'CPU %/box':>9} {'RSS Δ MB':>9} {'fleet MB':>9} "
          f"{'touch→seen ms (median, max)':>28} {'fire→seen ms (median)':>22} {'sshd CPU %':>10}")
    for r in results:
        touch, fire = r["touch"], r["fire"]
        print(f"{r['boxes']:>5} {r['polls'] / r['seconds']:>7.1f} {100 * r['cpu']:>7.2f} "
              f"{100 * r['cpu'] / r['boxes']:>9.3f} "
              f"{r['rss_growth'] / MB:>9.2f} {r['rss_fleet'] / MB:>9.1f} "
              f"{1000 * statistics.median(touch):>15.0f} {1000 * max(touch):>12.0f} "
              f"{1000 * statistics.median(fire) if fire else float('nan'):>22.0f} "
              f"{'' if r['sshd_cpu'] is None else format(100 * r['sshd_cpu'], '.3f'):>10}")
    base = results[0]
    for r in results[1:]:
        n = r["boxes"] / base["boxes"]
        print_figure(f"{r['boxes']} boxes / {base['boxes']}: console CPU", r["cpu"], base["cpu"],
                     note=f"{n:g}x the boxes")
        print_figure(f"{r['boxes']} boxes / {base['boxes']}: fleet memory", r["rss_fleet"], max(base["rss_fleet"], 1))
        print_figure(f"{r['boxes']} boxes / {base['boxes']}: touch → seen (median)", statistics.median(r["touch"]),
                     statistics.median(base["touch"]))
        if r["fire"] and base["fire"]:
            print_figure(f"{r['boxes']} boxes / {base['boxes']}: fire → seen (median)", statistics.median(r["fire"]),
                         statistics.median(base["fire"]))


if __name__ == "__main__":
    sys.exit(main())
