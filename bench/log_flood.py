"""The log pane under a flood, against an idle baseline, through the real read path.

    python bench/log_flood.py [--seconds 10] [--rate 50000] [--max-bytes 262144]

Each scenario runs in a fresh child process (so RSS figures do not mix), one after the other:

  idle   the log holds PREFILL lines and nobody writes to it;
  flood  the same, then a writer subprocess appends --rate lines/s for --seconds.

In both, a headless Textual app (App.run_test) shows a LogView and an async worker follows the
file exactly as the console does: Box(LocalTransport(), workspace).read_log(follower.cursor()),
follower.consume(chunk), view.append(update.lines); it loops at once while `update.more`, else
sleeps 0.2 s. Measuring starts once the prefill is on screen.

Key-to-screen latency: keys (k j w N f ...) are sent as Key events, as Pilot does, every
50-150 ms. The clock starts when the event is posted and stops when the screen has refreshed
after the binding's action ran: App.run_action is wrapped to note when the action is done,
then Screen.wait_for_refresh() waits for the next completed refresh (its callback runs once
the compositor has painted the dirty regions and the screen is idle again). Pilot.press is not
used for timing because it also waits for the process to go idle (CPU-based, up to 1 s per
wait), which under a flood never happens, so it would measure its own time-out.

Printed: key latency p50/p95 for both, lines shown per second (lines that reached the view),
lines written per second, peak RSS and RSS growth (peak minus RSS once the prefill is shown),
and flood/idle ratios. Targets from the issue: p95 <= 100 ms under the flood, RSS growth
<= 20 MB. This is a measurement, not a test: nothing here asserts on timings.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from itertools import cycle
from pathlib import Path

import psutil
from harness import argument_parser, figure
from harness import percentile as pct
from textual import events
from textual.app import App, ComposeResult

from samai.remote.boxapi import Box
from samai.remote.follow import DEFAULT_READ, LogFollower
from samai.remote.local import LocalTransport
from samai.remote.model import Marker
from samai.widgets.logview import LogView

PREFILL = 20_000
KEYS = ("up", "up", "down", "w", "N", "up", "w", "f")
MARKERS = (Marker("oom", r"CUDA out of memory", "error"), Marker("slow", r"WARN", "warning"),
           Marker("ckpt", r"saved checkpoint", "info"))
SIZE = (120, 40)

WRITER = r"""
import sys, time
path, rate, seconds, first = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
def line(n):
    if n % 4999 == 0:
        return f"ERROR step={n} CUDA out of memory. Tried to allocate 2.00 GiB\n"
    if n % 997 == 0:
        return f"WARN step={n} dataloader slow: 1.8 s waiting for batch\n"
    if n % 10007 == 0:
        return "tokens " + "x" * 8000 + "\n"
    return (f"2025-06-01T12:00:{n % 60:02d} step={n} loss={1 + (n % 977) / 1000:.4f} "
            f"lr=2.0e-05 grad_norm={(n % 89) / 10:.2f} tok/s={9000 + n % 500}\n")
n = first
if rate <= 0:
    with open(path, "a") as f:
        f.write("".join(line(i) for i in range(first)))
    sys.exit(0)
start = time.monotonic()
with open(path, "a", buffering=1 << 20) as f:
    while (elapsed := time.monotonic() - start) < seconds:
        due = first + int(elapsed * rate)
        f.write("".join(line(i) for i in range(n, due)))
        f.flush()
        n = due
        time.sleep(0.01)
print(n - first)
"""


class FloodApp(App):
    """One LogView fed by the real follower; notes when a key binding's action is done."""

    def __init__(self, box: Box, follower: LogFollower) -> None:
        super().__init__()
        self.box = box
        self.follower = follower
        self.action_done = asyncio.Event()
        self.reads = 0

    def compose(self) -> ComposeResult:
        yield LogView()

    def on_mount(self) -> None:
        view = self.query_one(LogView)
        view.reset(Path(self.follower.path).name, MARKERS)
        view.focus()
        self.run_worker(self.follow(view), exclusive=True, group="follow")

    async def follow(self, view: LogView) -> None:
        while True:
            update = self.follower.consume(await self.box.read_log(self.follower.cursor()))
            self.reads += 1
            if update.notice:
                view.notice(update.notice)
            if update.lines:
                view.append(update.lines)
            if not update.more:
                await asyncio.sleep(0.2)

    async def run_action(self, action, default_namespace=None) -> bool:  # type: ignore[override]
        handled = await super().run_action(action, default_namespace)
        self.action_done.set()
        return handled


async def press_timed(app: FloodApp, key: str) -> float:
    """Seconds from posting a key to the first refresh completed after its action ran."""
    app.action_done.clear()
    started = time.perf_counter()
    app.post_message(events.Key(key, key if len(key) == 1 else None))
    await asyncio.wait_for(app.action_done.wait(), timeout=10)
    await app.screen.wait_for_refresh()
    return time.perf_counter() - started


def shown_total(view: LogView) -> int:
    return view.first_line_number + len(view.lines)


async def scenario(name: str, seconds: float, rate: int, max_bytes: int) -> dict:
    me = psutil.Process()
    with tempfile.TemporaryDirectory() as tmp:
        workspace = Path(tmp) / "ws"
        workspace.mkdir()
        log = workspace / "train.log"
        prefill = await asyncio.create_subprocess_exec(sys.executable, "-c", WRITER, str(log), "0", "0", str(PREFILL))
        if await prefill.wait() != 0:
            raise RuntimeError("the prefill writer failed")
        box = Box(LocalTransport(), str(workspace), python=sys.executable)
        await box.ensure_tools()
        follower = LogFollower(str(log), markers=MARKERS, offset=0, max_bytes=max_bytes)
        app = FloodApp(box, follower)
        rss_start = me.memory_info().rss
        try:
            async with app.run_test(size=SIZE) as pilot:
                view = app.query_one(LogView)
                deadline = time.monotonic() + 30
                while shown_total(view) < PREFILL and time.monotonic() < deadline:
                    await pilot.pause(0.1)
                await pilot.pause(0.3)
                rss_warm = rss_peak = me.memory_info().rss
                shown_before = shown_total(view)

                async def sample() -> None:
                    nonlocal rss_peak
                    while True:
                        rss_peak = max(rss_peak, me.memory_info().rss)
                        await asyncio.sleep(0.05)

                sampler = asyncio.create_task(sample())
                writer = None
                if rate > 0:
                    writer = await asyncio.create_subprocess_exec(
                        sys.executable, "-c", WRITER, str(log), str(rate), str(seconds), str(PREFILL),
                        stdout=subprocess.PIPE)
                started = time.monotonic()
                latencies: list[float] = []
                by_key: dict[str, list[float]] = {}
                keys = cycle(KEYS)
                rnd = random.Random(3)
                while time.monotonic() - started < seconds:
                    await asyncio.sleep(rnd.uniform(0.05, 0.15))
                    key = next(keys)
                    latencies.append(await press_timed(app, key))
                    by_key.setdefault(key, []).append(latencies[-1])
                elapsed = time.monotonic() - started
                shown = shown_total(view) - shown_before
                written = int((await asyncio.wait_for(writer.communicate(), 30))[0] or 0) if writer else 0
                sampler.cancel()
                rss_end = me.memory_info().rss
                lag = log.stat().st_size - (follower.offset or 0)
                result = {
                    "scenario": name, "seconds": elapsed, "latencies": latencies, "by_key": by_key,
                    "shown_per_s": shown / elapsed, "written_per_s": written / elapsed,
                    "rss_start": rss_start, "rss_warm": rss_warm, "rss_peak": rss_peak,
                    "rss_end": rss_end, "lag_bytes": lag, "reads": app.reads,
                    "kept": len(view.lines),
                }
        finally:
            await box.close()
    return result


def report(idle: dict, flood: dict, args: argparse.Namespace) -> None:
    mb = 1024 * 1024

    def row(r: dict) -> str:
        lat = r["latencies"]
        return (f"{r['scenario']:<6} {pct(lat, .5) * 1000:8.1f} {pct(lat, .95) * 1000:8.1f} "
                f"{max(lat) * 1000:8.1f} {len(lat):5d} {r['shown_per_s']:11,.0f} {r['written_per_s']:11,.0f} "
                f"{r['rss_peak'] / mb:9.1f} {(r['rss_peak'] - r['rss_warm']) / mb:8.1f} "
                f"{r['lag_bytes'] / 1024:8,.0f}")

    print(f"log pane flood bench: {args.seconds:g} s per scenario, rate {args.rate:,} lines/s, "
          f"prefill {PREFILL:,} lines, read size {args.max_bytes:,} B, {os.cpu_count()} CPUs, "
          f"Python {sys.version.split()[0]}")
    print("scenario  p50 ms   p95 ms   max ms  keys   shown/s   written/s  peak MB  grow MB   lag KiB")
    print(row(idle))
    print(row(flood))

    li, lf = idle["latencies"], flood["latencies"]
    print(figure("flood/idle p50", pct(lf, .5), pct(li, .5)) + ", " + figure("p95", pct(lf, .95), pct(li, .95))
          + ", " + figure("peak RSS", flood["rss_peak"], idle["rss_peak"]))
    for r in (idle, flood):
        keys = ", ".join(f"{k} {pct(v, .5) * 1000:.0f}/{max(v) * 1000:.0f}" for k, v in sorted(r["by_key"].items()))
        print(f"  {r['scenario']} per key (p50/max ms): {keys}")
    p95 = pct(lf, .95) * 1000
    growth = (flood["rss_peak"] - flood["rss_warm"]) / mb
    print(f"targets: flood p95 {p95:.1f} ms <= 100 ms: {'met' if p95 <= 100 else 'MISSED'}; "
          f"flood RSS growth {growth:.1f} MB <= 20 MB: {'met' if growth <= 20 else 'MISSED'}")
    print(f"(RSS at app start: idle {idle['rss_start'] / mb:.1f} MB, flood {flood['rss_start'] / mb:.1f} MB; "
          f"growth = peak - RSS once the {PREFILL:,} prefill lines are shown; "
          f"reads: idle {idle['reads']}, flood {flood['reads']}; lines kept {flood['kept']:,})")


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each scenario")
    parser.add_argument("--rate", type=int, default=50_000, help="lines/s the writer appends")
    parser.add_argument("--max-bytes", type=int, default=DEFAULT_READ, help="bytes per log read")
    parser.add_argument("--child", choices=("idle", "flood"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        rate = args.rate if args.child == "flood" else 0
        result = asyncio.run(scenario(args.child, args.seconds, rate, args.max_bytes))
        print(json.dumps(result))
        return
    results = {}
    for name in ("idle", "flood"):
        out = subprocess.run([sys.executable, __file__, "--child", name, "--seconds", str(args.seconds),
                              "--rate", str(args.rate), "--max-bytes", str(args.max_bytes)],
                             check=False, capture_output=True, text=True, timeout=args.seconds * 4 + 120)
        if out.returncode != 0:
            sys.exit(f"{name} run failed:\n{out.stderr[-3000:]}")
        results[name] = json.loads(out.stdout.strip().splitlines()[-1])
    report(results["idle"], results["flood"], args)


if __name__ == "__main__":
    main()
