"""How fast `check trainlog` reads a big training log, against grep on the same file in the same run,
and how much memory the command takes for it.

    python bench/trainlog_speed.py [--mb 1000] [--every 50] [--runs 3] [--keep] [--rss-only]

Writes a synthetic log of about --mb MB into a temp dir: mostly tqdm progress noise (lines of
many \\r-separated bar redraws, now and then one of a few hundred KB, over the 64 KiB a log pane
line keeps) and info lines, with an HF Trainer dict (transformers 4 and 5 forms in turn, some
written over a live bar, some at the end of a long bar line) every --every lines and DeepSpeed
progress lines now and then. Then:
- runs `samai-console check trainlog --json` on it (local target, read through the Box in
  chunks, as on a remote box) in a child process, timed, with its peak RSS and its probe's, and
  the same command on the log's first tenth and first MB;
- times check_trainlog_path over it (the same parse, streamed from the file in-process), plain
  Python line iteration of the file (the floor any Python reader pays) and `grep -c "'loss'"`
  (the baseline), interleaved, --runs times each.
Prints lines/s and MB/s of the medians, and the ratios: check / grep, command / grep, and the
command's peak RSS on the whole log / on its first tenth (1.0: memory does not grow with the
log) and / on its first MB (what reading in 4 MiB chunks adds to the command's own footprint).
Every dict is counted (steps == grep's count) while the points kept stay a few thousand.
This is a measurement, not a test: nothing here asserts on timings."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

from harness import Timings, argument_parser, print_figure, scratch_folder

from samai.console.core.training.trainlog import check_trainlog_path

INFO = (
    "[2026-11-30 07:34:{s:02d},426] [INFO] [logging.py:96:log_dist] [Rank 0] time (ms) | fwd: 41.2 | bwd: 80.3",
    "[2026-11-30 07:34:{s:02d},512] [WARNING] [real_accelerator.py:213:get_accelerator] Setting accelerator",
    "[transformers] mtime may not be reliable on this filesystem, falling back to numerical ordering",
    "Saving model checkpoint to runs/train/checkpoint-{s}",
    "  Num examples = 52,002 | Num Epochs = 3 | Total optimization steps = 4,875",
)


def bar(done: int, total: int) -> str:
    pct = done * 100 // total
    fill = "\u2588" * (pct // 10)
    return f"\r{pct:3d}%|{fill:<10}| {done}/{total} [00:{done % 60:02d}<05:02,  2.91it/s]"


def trainer_dict(step: int, rng: random.Random) -> str:
    loss, norm, lr, epoch = 2.0 / (1 + step / 500) + rng.random() * 0.1, rng.uniform(0.5, 3), 1e-4, step / 1625
    if step % 2:
        return f"{{'loss': {loss:.4f}, 'grad_norm': {norm:.4f}, 'learning_rate': {lr}, 'epoch': {epoch:.2f}}}"
    return f"{{'loss': '{loss:.4g}', 'grad_norm': '{norm:.4g}', 'learning_rate': '{lr:.4g}', 'epoch': '{epoch:.4g}'}}"


def long_bar(step: int, rng: random.Random) -> str:
    """A bar line of a few hundred KB (tqdm without a newline for thousands of redraws)."""
    start = rng.randrange(4875)
    return "".join(bar((start + i) % 4875, 4875) for i in range(rng.randint(3000, 6000)))


def write_log(path: Path, size_mb: int, every: int, seed: int = 7) -> int:
    """The synthetic log; returns how many Trainer dicts it holds."""
    rng = random.Random(seed)
    target, written, step, n = size_mb * 1_000_000, 0, 0, 0
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        while written < target:
            block = []
            for _ in range(1000):
                n += 1
                if n % every == 0:
                    step += 1
                    line = trainer_dict(step, rng)
                    if step % 500 == 0:
                        line = long_bar(step, rng) + "\r" + line  # the dict at the end of a long line
                    elif step % 3 == 0:
                        line = bar(step % 4875, 4875) + "\r" + " " * 60 + "\r" + line
                    block.append(line)
                elif n % (every * 10) == 1:
                    block.append(f"[2026-11-30 07:35:01,000] [INFO] [logging.py:96:log_dist] [Rank 0] "
                                 f"step={step}, skipped=0, lr=[0.0001], mom=[(0.9, 0.999)]")
                elif rng.random() < 0.7:
                    start = rng.randrange(4800)
                    block.append("".join(bar(start + i, 4875) for i in range(rng.randint(1, 12))))
                else:
                    block.append(rng.choice(INFO).format(s=n % 60))
            text = "\n".join(block) + "\n"
            f.write(text)
            written += len(text.encode())
    return step


def head_of(log: Path, folder: Path, size: int = 1_000_000) -> Path:
    """The log's first lines, about size bytes: what the command costs on a small log."""
    small = folder / "head.log"
    with open(log, "rb") as f, open(small, "wb") as out:
        for line in f:
            out.write(line)
            if out.tell() >= size:
                break
    return small


def python_lines(path: Path) -> int:
    with open(path, encoding="utf-8", errors="replace", newline="\n") as f:
        return sum(1 for _ in f)


def grep_count(path: Path) -> int:
    out = subprocess.run(["grep", "-c", "'loss'", str(path)], capture_output=True, text=True, check=False)
    return int(out.stdout.strip() or 0)


# The CLI in-process, so that its own peak is measured (VmHWM: ru_maxrss would start at the RSS of
# the process it was forked from); the probe is its child.
PEAK_RSS = """
import json, os, resource, sys
from samai.console.cli import main
sys.stdout = open(os.devnull, "w")
code = main(sys.argv[1:])
with open("/proc/self/status") as f:
    self_kb = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
print(json.dumps({"rc": code, "self_kb": self_kb,
                  "children_kb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}), file=sys.stderr)
"""


def cli_peak_rss(folder: Path, log: Path) -> dict:
    """Peak RSS (kB) of `samai-console check trainlog LOG --json` and of its probe, its exit code
    and its steps."""
    cfg = folder / "bench.toml"
    cfg.write_text(f'[workspace]\npath = "{folder / "ws"}"\n')
    done = subprocess.run([sys.executable, "-c", PEAK_RSS, "--config", str(cfg), "check", "trainlog", str(log),
                           "--json"], capture_output=True, text=True, check=False)
    return json.loads(done.stderr.strip().splitlines()[-1])


def main() -> None:
    p = argument_parser(__doc__, runs=3)
    p.add_argument("--mb", type=int, default=1000, help="size of the synthetic log in MB (default 1000)")
    p.add_argument("--every", type=int, default=50, help="a Trainer dict every this many lines")
    p.add_argument("--keep", action="store_true", help="keep the log (its path is printed)")
    p.add_argument("--rss-only", action="store_true", help="only the command's peak memory, no timings")
    args = p.parse_args()

    with scratch_folder("trainlog-bench-", args.keep) as folder:
        log = folder / "train.log"
        times = Timings()
        dicts = times.time("write", write_log, log, args.mb, args.every)
        size = log.stat().st_size
        print(f"log: {size / 1e6:.1f} MB, {dicts} Trainer dicts (written in {times.median('write'):.1f} s)")
        grep_count(log)  # the page cache is warm for everyone, grep included
        small = cli_peak_rss(folder, head_of(log, folder))
        tenth = cli_peak_rss(folder, head_of(log, folder, size // 10))
        peak = times.time("command", cli_peak_rss, folder, log)
        print(f"samai-console check trainlog --json: rc {peak['rc']}, {times.median('command'):.1f} s, "
              f"peak RSS {peak['self_kb'] / 1024:.0f} MiB (its probe: at most {peak['children_kb'] / 1024:.0f} MiB); "
              f"on the log's first tenth: {tenth['self_kb'] / 1024:.0f} MiB, on its first MB: "
              f"{small['self_kb'] / 1024:.0f} MiB")
        print_figure("command peak RSS, whole log / its first tenth", peak["self_kb"], tenth["self_kb"])
        print_figure("command peak RSS, whole log / its first MB", peak["self_kb"], small["self_kb"])
        if args.rss_only:
            return
        for _ in range(args.runs):
            greps = times.time("grep", grep_count, log)
            lines = times.time("lines", python_lines, log)
            result = times.time("check", check_trainlog_path, log)
            assert result.steps == dicts == greps, (result.steps, dicts, greps)
        grep_s, iter_s, check_s = times.median("grep"), times.median("lines"), times.median("check")

        def rate(seconds: float) -> str:
            return f"{lines / seconds / 1e6:6.2f} M lines/s  {size / seconds / 1e6:7.1f} MB/s  ({seconds:.2f} s)"

        print(f"lines: {lines:,}  steps: {result.steps:,}  points kept: {len(result.points):,}  "
              f"anomalies: {len(result.problems)}  unparsed: {result.unparsed:,}")
        print(f"check_trainlog         {rate(check_s)}")
        print(f"python line iteration  {rate(iter_s)}")
        print(f"grep -c \"'loss'\"       {rate(grep_s)}")
        print(f"the command            {rate(times.median('command'))}")
        print_figure("check / grep", check_s, grep_s)
        print_figure("check / line iteration", check_s, iter_s)
        print_figure("command / grep", times.median("command"), grep_s)


if __name__ == "__main__":
    main()
