"""A live training curve: the console following a train log that logs 50 steps a second, at
minute 1 and at minute 10 of the run.

    python bench/live_curve.py [--rate 50] [--window 60] [--skip 27000] [--settle 10]

The console runs as a user starts it, in a pseudo-terminal (as idle.py: 150x45, HOME in a
temporary folder), on the built-in tiny pipeline with its workspace there. A writer appends
Trainer log lines ({'loss': …, 'grad_norm': …, 'learning_rate': …, 'epoch': …}) to the train
stage's log at --rate steps a second, from step 1. Three windows of --window seconds are
sampled (the console's CPU time from /proc, its VmRSS each second):

  idle     before the writer starts: the baseline of the same run;
  minute 1 the writer at --rate from step 1;
  minute N after --skip steps were appended at once (9 minutes' worth at 50 steps/s by
           default) and --settle seconds to read them: the same rate, a long curve behind it.

Printed: each window's CPU in % of one core and RSS, the ratio of minute N to minute 1, and
the RSS growth from the start of minute 1 to the end of minute N. Targets from the issue: at
50 steps/s, <= 10 % of a core and <= +10 MB, and minute 10 no costlier than minute 1 (here:
the ratio <= 1.2, these machines being noisy). A measurement, not a test.
"""

from __future__ import annotations

import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

from harness import argument_parser
from idle import MB, config_file, rss, stat
from startup import SIZE, Tui

from samai.console.core import config as configs


def trainer_line(step: int, rng: random.Random) -> str:
    loss = 2.0 / (1 + step / 500) + 0.05 * rng.random() + (5.0 if step % 7919 == 0 else 0.0)  # now and then a spike
    return (f"{{'loss': '{loss:.4g}', 'grad_norm': '{1 + rng.random():.4g}', "
            f"'learning_rate': '{5e-4 * (1 - step / 1e6):.4g}', 'epoch': '{step / 1000:.4g}'}}\n")


class Writer:
    """Appends one Trainer log line per step to the log, `rate` a second, in a thread."""

    def __init__(self, log: Path, rate: float) -> None:
        self.log, self.rate, self.step = log, rate, 0
        self.rng = random.Random(7)
        self.stopped = threading.Event()
        self.thread: threading.Thread | None = None

    def burst(self, steps: int) -> None:
        with self.log.open("a") as f:
            f.writelines(trainer_line(self.step + i + 1, self.rng) for i in range(steps))
        self.step += steps

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        began, written = time.monotonic(), 0
        while not self.stopped.is_set():
            due = int((time.monotonic() - began) * self.rate) - written
            if due > 0:
                self.burst(due)
                written += due
            time.sleep(0.02)

    def stop(self) -> None:
        self.stopped.set()
        if self.thread:
            self.thread.join()


def window(tui: Tui, pid: int, seconds: float) -> tuple[float, list[int]]:
    """(CPU % of one core, RSS each second) of the console over the next `seconds`."""
    start, t0, memory = stat(pid), time.monotonic(), [rss(pid)]
    while (elapsed := time.monotonic() - t0) < seconds:
        tui.drain(min(1.0, seconds - elapsed))
        memory.append(rss(pid))
    end = stat(pid)
    if start is None or end is None or tui.proc.poll() is not None:
        raise RuntimeError(f"the console exited (rc={tui.proc.poll()})")
    return 100 * (end[1] - start[1]) / (time.monotonic() - t0), memory


def main(rate: float, seconds: float, skip: int, settle: float) -> None:
    with tempfile.TemporaryDirectory(prefix="samai-bench-curve-") as root:
        workspace = Path(root, "ws")
        workspace.mkdir()
        path = config_file(root, 1.0)
        Path(path).write_text(Path(path).read_text() + f'\n[workspace]\npath = "{workspace}"\n')
        log = workspace / configs.load(path).stage_by_role("train").log
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("")
        writer = Writer(log, rate)
        tui = Tui([sys.executable, "-m", "samai.console", "--config", path], root, os.path.join(root, "pycache"))
        try:
            tui.wait_painted()
            tui.drain(5)
            pid = tui.proc.pid
            idle, idle_rss = window(tui, pid, seconds)
            writer.start()
            tui.drain(2)
            first, first_rss = window(tui, pid, seconds)
            writer.stop()
            writer.burst(skip)
            writer.start()
            tui.drain(settle)
            late, late_rss = window(tui, pid, seconds)
            steps = writer.step
        finally:
            writer.stop()
            tui.close()
    print(f"live curve: {rate:g} steps/s, windows of {seconds:g} s ({os.cpu_count()} CPUs, Python "
          f"{sys.version.split()[0]}, {SIZE[0]}x{SIZE[1]} pty); {steps} steps logged in all")
    print(f"idle           {idle:6.2f} % of one core, RSS {idle_rss[-1] / MB:.1f} MB")
    print(f"minute 1       {first:6.2f} % of one core, RSS {first_rss[0] / MB:.1f} -> {first_rss[-1] / MB:.1f} MB")
    print(f"after {skip} more steps {late:6.2f} % of one core, "
          f"RSS {late_rss[0] / MB:.1f} -> {late_rss[-1] / MB:.1f} MB")
    ratio = late / first if first else float("inf")
    growth = (late_rss[-1] - first_rss[0]) / MB
    print(f"minute N / minute 1: x{ratio:.2f} (target <= 1.2: {'met' if ratio <= 1.2 else 'MISSED'})")
    print(f"CPU at minute N <= 10 % of one core: {'met' if late <= 10 else 'MISSED'} ({late:.2f} %)")
    print(f"RSS growth over the run <= +10 MB: {'met' if growth <= 10 else 'MISSED'} ({growth:+.1f} MB)")


if __name__ == "__main__":
    parser = argument_parser(__doc__)
    parser.add_argument("--rate", type=float, default=50.0, help="steps logged a second")
    parser.add_argument("--window", type=float, default=60.0, help="seconds sampled per window")
    parser.add_argument("--skip", type=int, default=27_000, help="steps appended at once before the late window")
    parser.add_argument("--settle", type=float, default=10.0, help="seconds to read them before sampling")
    args = parser.parse_args()
    main(args.rate, args.window, args.skip, args.settle)
