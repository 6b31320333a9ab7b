"""`check gguf` on the console against the same check on the box, on a real quantized model; and on a
multi-GB GGUF whose header is real and whose data is a hole (sparse), against gguf-py's GGUFReader:

    python bench/gguf_check_speed.py [--runs 5] [--gb 4] [--skip-deep] [--only-limits]

1. The Gemma 3 270M Q4_K_M GGUF (253 MB, a 262k-token vocabulary; tests/gguf_artifacts.py fetches
   and caches it). Two processes, interleaved, --runs times each, wall time and peak RSS (VmHWM,
   read by the process itself at its end):
   - box: the box's own check, as the box runs it (`python3 -S TOOLS gguf_check FILE --json`);
   - console: `samai-console check gguf FILE --json` on a local target (it reads the file as the
     box's tool does; a remote target's byte ranges through the probe are timed in part 2).
   The figures: console / box, for time and for peak RSS (target <= 2 each, issue 17). The same
   two commands on a vocab-only GGUF of a few hundred bytes give each process's floor (start-up
   and imports: the console's is its CLI's, the same for every command), and what the model's
   header adds to each floor is shown too: time (as a ratio) and peak RSS (in MB). Once, for comparison,
   `check gguf --deep` (gguf-py's GGUFReader as well), which is what the default path used to cost.
2. The sparse file: the check via the Box (bytes read) against GGUFReader's memory map.
3. What a header may declare (gguf_format.py's limits), the box's check as in 1, against its check
   of the real model's 262k-token vocabulary in the same run: a valid GGUF (gguf-py's writer) that
   declares 1,000,000 tensor infos (over MAX_TENSORS: over_limit, before the table is read), and
   one of exactly MAX_TENSORS (the most a check reads: the whole table, kept in columns).
This is a measurement, not a test: nothing here asserts on timings.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gguf import GGUFReader, GGUFWriter
from harness import Timings, argument_parser, median, print_figure

from samai.console.core.checks import check_gguf
from samai.remote.box.gguf_format import MAX_TENSORS
from samai.remote.boxapi import Box
from samai.remote.local import LocalTransport
from tests.box_tools import tool_argv, tools_folder
from tests.gguf_artifacts import gemma_q4_k_m
from tests.test_checks import sparse_gguf
from tests.test_gguf_header_caps import write_tiny_tensors

MANY_TENSORS = 1_000_000

# Each contender reports its own peak (VmHWM) as its last stderr line: ru_maxrss of a child may
# start at the RSS of the process it was forked from.
PEAK = """
def _peak():
    import json, resource, sys
    with open("/proc/self/status") as f:
        kb = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    print(json.dumps({"self_kb": kb, "children_kb": children}), file=sys.stderr)
"""
# The box tool exactly as `python3 -S TOOLS gguf_check ...` runs it (TOOLS/__main__.py).
BOX = PEAK + """
import os, runpy, sys
sys.argv = sys.argv[1:]
sys.stdout = open(os.devnull, "w")
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
except SystemExit:
    pass
_peak()
"""
CONSOLE = PEAK + """
import os, sys
from samai.console.cli import main
sys.stdout = open(os.devnull, "w")
main(sys.argv[1:])
_peak()
"""


def run_peak(argv: list[str]) -> dict:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    return json.loads(done.stderr.strip().splitlines()[-1])


def box_argv(path: Path) -> list[str]:
    return [sys.executable, "-S", "-c", BOX, str(tools_folder()), "gguf_check", str(path), "--json"]


def console_argv(cfg: Path, path: Path, *extra: str) -> list[str]:
    return [sys.executable, "-c", CONSOLE, "--config", str(cfg), "check", "gguf", str(path), "--json", *extra]


def tiny_gguf(path: Path) -> Path:
    """The least GGUF: a few KVs, no tensors (each process's floor: start-up and imports)."""
    w = GGUFWriter(str(path), "llama")
    w.add_name("floor")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    return path


class Contenders:
    """Wall seconds and peak RSS (kB) per named process, one entry per run."""

    def __init__(self) -> None:
        self.times = Timings()
        self.peaks: dict[str, list[dict]] = {}

    def run(self, name: str, argv: list[str]) -> None:
        started = time.perf_counter()
        peak = run_peak(argv)
        self.times.add(name, time.perf_counter() - started)
        self.peaks.setdefault(name, []).append(peak)

    def seconds(self, name: str) -> float:
        return self.times.median(name)

    def rss_mb(self, name: str, key: str = "self_kb") -> float:
        return median(p[key] for p in self.peaks[name]) / 1024


def model_section(runs: int, deep: bool) -> None:
    model = gemma_q4_k_m()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "bench.toml"
        cfg.write_text(f'[workspace]\npath = "{Path(tmp) / "ws"}"\n')
        floor = tiny_gguf(Path(tmp) / "floor.gguf")
        c = Contenders()
        for _ in range(runs):
            c.run("box", box_argv(model))
            c.run("console", console_argv(cfg, model))
            c.run("box floor", box_argv(floor))
            c.run("console floor", console_argv(cfg, floor))
        if deep:
            c.run("console --deep", console_argv(cfg, model, "--deep"))
    print(f"check gguf of {model.name} ({model.stat().st_size / 1e6:.0f} MB), {runs} runs each, interleaved, medians")
    for name in ("box", "console", "box floor", "console floor") + (("console --deep",) if deep else ()):
        print(f"{name:<15} {c.seconds(name):7.3f} s   peak RSS {c.rss_mb(name):7.1f} MB")
    added = {name: c.rss_mb(name) - c.rss_mb(f"{name} floor") for name in ("box", "console")}
    print(f"what the model's header adds to each floor: box {added['box']:+.1f} MB, console {added['console']:+.1f} MB"
          f" of peak RSS")
    print_figure("console / box, time", c.seconds("console"), c.seconds("box"), at_most=2)
    print_figure("console / box, peak RSS", c.rss_mb("console"), c.rss_mb("box"), at_most=2)
    print_figure("console / box, time above each floor (the check itself)", c.seconds("console")
                 - c.seconds("console floor"), c.seconds("box") - c.seconds("box floor"), at_most=2)
    if deep:
        print_figure("console --deep / console, time", c.seconds("console --deep"), c.seconds("console"))
        print_figure("console --deep / console, peak RSS", c.rss_mb("console --deep"), c.rss_mb("console"))


async def sparse_section(gb: float, runs: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = sparse_gguf(Path(tmp) / "big.gguf", int(gb * (1 << 30)))
        box = Box(LocalTransport(), tmp, python=sys.executable)
        await box.snapshot(processes=False)  # tools uploaded, probe started: as in a running console
        times, read = Timings(), 0
        for _ in range(runs):
            result = await times.time_async("check", lambda: check_gguf(box, str(path), expect_tensors=None,
                                                                         expect_last=None, local=False))
            read = result.bytes_read
            assert result.ok, result
            reader = times.time("GGUFReader", GGUFReader, str(path))
            assert len(reader.tensors) == result.tensor_count
        await box.close()
        size = path.stat().st_size
    ours_ms, theirs_ms = 1000 * times.median("check"), 1000 * times.median("GGUFReader")
    print(f"GGUF of {size / (1 << 30):.1f} GiB (sparse data), {runs} runs, medians")
    print(f"check gguf via the Box: {ours_ms:.1f} ms, {read:,} bytes read ({read / size:.2e} of the file)")
    print(f"GGUFReader (local mmap): {theirs_ms:.1f} ms")
    print_figure("check / GGUFReader", ours_ms, theirs_ms)


def verdict(path: Path) -> dict:
    """The box tool's JSON for path (the timed runs send it to /dev/null)."""
    done = subprocess.run(tool_argv("gguf_check", path, "--json"), capture_output=True, text=True, check=False)
    return json.loads(done.stdout)


def limits_section(runs: int) -> None:
    model = gemma_q4_k_m()
    with tempfile.TemporaryDirectory() as tmp:
        many = write_tiny_tensors(Path(tmp) / "many.gguf", MANY_TENSORS)
        at_limit = write_tiny_tensors(Path(tmp) / "at-limit.gguf", MAX_TENSORS)
        files = {"real vocab": model, "1M tensors": many, "at the limit": at_limit}
        c = Contenders()
        for _ in range(runs):
            for name, path in files.items():
                c.run(name, box_argv(path))
        verdicts = {name: verdict(path) for name, path in files.items()}
        sizes = {name: path.stat().st_size for name, path in files.items()}
    print(f"box check of headers at and over the limits, {runs} runs each, interleaved, medians")
    for name in files:
        found = ", ".join(p["code"] for p in verdicts[name]["problems"]) or "ok"
        print(f"{name:<13} {c.seconds(name):7.3f} s   peak RSS {c.rss_mb(name):7.1f} MB   {sizes[name] / 1e6:6.1f} MB"
              f" file, {verdicts[name]['tensor_count']:,} tensors declared: {found}")
    for name in ("1M tensors", "at the limit"):
        print_figure(f"{name} / real vocab, time", c.seconds(name), c.seconds("real vocab"))
        print_figure(f"{name} / real vocab, peak RSS", c.rss_mb(name), c.rss_mb("real vocab"))


if __name__ == "__main__":
    parser = argument_parser(__doc__, runs=5)
    parser.add_argument("--gb", type=float, default=4)
    parser.add_argument("--skip-deep", action="store_true", help="do not time --deep (about 20 s and 750 MB)")
    parser.add_argument("--only-limits", action="store_true", help="only part 3, the headers at the limits")
    args = parser.parse_args()
    if not args.only_limits:
        model_section(args.runs, not args.skip_deep)
        print()
        asyncio.run(sparse_section(args.gb, args.runs))
        print()
    limits_section(args.runs)
