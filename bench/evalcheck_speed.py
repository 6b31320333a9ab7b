"""How fast `check eval` reads 100,000 items, against json.loads of every line and `wc -l` on the same
file in the same run, and how much memory the command takes for it.

    python bench/evalcheck_speed.py [--items 100000] [--runs 3] [--keep]

Writes two files of --items records into a temp dir: the eval stage's items.jsonl (answers, the
reasoning split, truncations, think leaks, as the stage writes them) and the same answers as a
chat-completion server's responses with gold beside them, one per line. For each, times
check_eval over the file's lines (the CLI's parse), a loop that only json.loads every line (the
floor of any reader of JSONL in Python) and `wc -l` (the baseline), interleaved, --runs times
each, and prints the ratios. Then runs `samai-console check eval FILE --json` (local target,
read through the Box in chunks, as on a remote box) in a child process and prints its peak RSS,
against a child that only reads the file's lines into a list and json.loads each.
This is a measurement, not a test: nothing here asserts on timings."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

from harness import Timings, argument_parser, print_figure, scratch_folder

from samai.console.core.evals.check import check_eval

THINK = "<think>Let me compute 17*23. 17*20 = 340, 17*3 = 51, so 340 + 51 = 391. Check: 391/17 = 23."


def answer(i: int, rng: random.Random) -> dict:
    """One answer in one of the shapes a real eval has: right, wrong, split, cut, leaked."""
    shape = rng.random()
    if shape < 0.6:
        return {"pred": "391", "content": "The answer is 391.", "reasoning_content": "", "finish_reason": "stop"}
    if shape < 0.75:
        return {"pred": "390", "content": "The answer is 390.", "reasoning_content": "", "finish_reason": "stop"}
    if shape < 0.9:
        return {"pred": None, "content": "", "reasoning_content": THINK, "finish_reason": "length"}
    if shape < 0.95:
        return {"pred": "391", "content": THINK + "</think> 391", "reasoning_content": "", "finish_reason": "stop"}
    return {"pred": None, "content": "", "reasoning_content": "", "finish_reason": "stop"}


def write_files(folder: Path, n: int, seed: int = 7) -> tuple[Path, Path]:
    rng = random.Random(seed)
    items, responses = folder / "items.jsonl", folder / "responses.jsonl"
    with open(items, "w") as fi, open(responses, "w") as fr:
        for i in range(n):
            a = answer(i, rng)
            fi.write(json.dumps({"id": i, "prompt": f"{i}: 17*23=", "gold": "391", "pred": a["pred"],
                                 "correct": a["pred"] == "391", "finish_reason": a["finish_reason"],
                                 "content": a["content"], "reasoning_content": a["reasoning_content"]}) + "\n")
            message = {"role": "assistant", "content": a["content"], "reasoning_content": a["reasoning_content"]}
            fr.write(json.dumps({"id": f"chatcmpl-{i:08x}", "object": "chat.completion", "created": 1796104454,
                                 "model": "bench.gguf", "choices": [{"index": 0, "message": message, "logprobs": None,
                                                                     "finish_reason": a["finish_reason"]}],
                                 "usage": {"prompt_tokens": 12, "completion_tokens": 40, "total_tokens": 52},
                                 "gold": "391", "messages": [{"role": "user", "content": "17*23="}]}) + "\n")
    return items, responses


def check_file(path: Path):
    with open(path, encoding="utf-8", errors="replace") as lines:
        return check_eval(lines)


def loads_every_line(path: Path) -> int:
    count = 0
    with open(path, encoding="utf-8", errors="replace") as lines:
        for line in lines:
            json.loads(line)
            count += 1
    return count


def wc_lines(path: Path) -> int:
    return int(subprocess.run(["wc", "-l", str(path)], capture_output=True, text=True, check=True).stdout.split()[0])


# The CLI in-process, so that its own peak is measured (VmHWM: ru_maxrss would start at the RSS of
# the process it was forked from); the probe is its child.
PEAK_RSS = """
import json, os, sys
from samai.console.cli import main
sys.stdout = open(os.devnull, "w")
code = main(sys.argv[1:])
with open("/proc/self/status") as f:
    self_kb = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
print(json.dumps({"rc": code, "self_kb": self_kb}), file=sys.stderr)
"""
# The baseline child: the same interpreter and samai's import of the check, then every line read and parsed.
BASELINE_RSS = """
import json, sys
import samai.console.cli
with open(sys.argv[1], encoding="utf-8", errors="replace") as f:
    lines = f.readlines()
for line in lines:
    json.loads(line)
with open("/proc/self/status") as f:
    self_kb = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
print(json.dumps({"self_kb": self_kb}), file=sys.stderr)
"""


def peak_rss_kb(folder: Path, path: Path) -> tuple[int, int]:
    """Peak RSS (kB) of `samai-console check eval PATH --json`, and of the baseline child."""
    cfg = folder / "bench.toml"
    cfg.write_text(f'[workspace]\npath = "{folder / "ws"}"\n')
    ours = subprocess.run([sys.executable, "-c", PEAK_RSS, "--config", str(cfg), "check", "eval", str(path),
                           "--json"], capture_output=True, text=True, check=False)
    base = subprocess.run([sys.executable, "-c", BASELINE_RSS, str(path)], capture_output=True, text=True, check=False)
    return (json.loads(ours.stderr.strip().splitlines()[-1])["self_kb"],
            json.loads(base.stderr.strip().splitlines()[-1])["self_kb"])


def bench(name: str, path: Path, folder: Path, runs: int, n: int) -> None:
    size = path.stat().st_size
    times = Timings()
    wc_lines(path)  # the page cache is warm for everyone, wc included
    for _ in range(runs):
        assert times.time("wc", wc_lines, path) == n
        assert times.time("loads", loads_every_line, path) == n
        result = times.time("check", check_file, path)
        assert result.n == n and result.malformed == 0, result
    check_s = times.median("check")
    print(f"{name}: {n:,} records, {size / 1e6:.1f} MB, format {result.format}/{result.layout}, "
          f"accuracy {100 * (result.accuracy or 0):.1f} %, problems {', '.join(p.code for p in result.problems)}")
    print(f"  check_eval {check_s:.2f} s ({n / check_s / 1e3:.0f} k records/s), json.loads of every line "
          f"{times.median('loads'):.2f} s, wc -l {times.median('wc') * 1e3:.0f} ms")
    print_figure(f"  {name}: check eval / json.loads every line", check_s, times.median("loads"))
    print_figure(f"  {name}: check eval / wc -l", check_s, times.median("wc"))
    ours_kb, base_kb = peak_rss_kb(folder, path)
    print(f"  samai-console check eval --json: peak RSS {ours_kb / 1024:.0f} MiB; a child that reads the lines and "
          f"json.loads each: {base_kb / 1024:.0f} MiB")
    print_figure(f"  {name}: check eval peak RSS / read-and-parse peak RSS", ours_kb, base_kb)


def main() -> None:
    p = argument_parser(__doc__, runs=3)
    p.add_argument("--items", type=int, default=100_000, help="records per file")
    p.add_argument("--keep", action="store_true", help="keep the files (their folder is printed)")
    args = p.parse_args()
    with scratch_folder("evalcheck-bench-", args.keep) as folder:
        items, responses = write_files(folder, args.items)
        bench("items.jsonl", items, folder, args.runs, args.items)
        bench("chat-completion JSONL", responses, folder, args.runs, args.items)


if __name__ == "__main__":
    main()
