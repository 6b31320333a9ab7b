"""Run every benchmark of bench/ and write bench/RESULTS.md: what was measured, on what, and how
to measure it again. Each script measures its own baseline in the same run, so the ratios hold
on a noisy machine even when the absolute figures do not.

    python bench/run_all.py            (root and openssh-server for the SSH one: .ci/run installs it)
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHES = [  # the table first, in its order; then the other figures
    ("probe marker scan vs grep -c -E", ["marker_scan.py", "--mb", "1024", "--runs", "3"]),
    ("last 1,000 lines of a 1 GB and a 4 GB log vs tail -n 1000", ["tail_speed.py"]),
    ("one local snapshot vs the probe run by hand", ["local_snapshot.py"]),
    ("snapshot over SSH vs local vs one ssh per probe", ["ssh_snapshot.py", "--runs", "20"]),
    ("start-up to the first painted screen vs import textual", ["startup.py", "--runs", "10"]),
    ("idle console, 1 s poll, 60 s, on a box of its own", ["idle.py"]),
    ("idle console, 1 s poll, 60 s, on this machine as it is", ["idle.py", "--box", "shared"]),
    ("log pane under a 50,000 lines/s flood vs an idle log", ["log_flood.py"]),
    ("probe CPU at 1 Hz with the console's poll vs listing /proc", ["probe_cost.py", "--snapshots", "100",
                                                                    "--seconds", "20"]),
    ("probe CPU with the GPU section vs without, at 1 Hz and back to back", ["gpu_probe.py"]),
    ("the NVML ctypes layer on this machine's GPUs (what it read)", ["gpu_probe.py", "--real"]),
    ("snapshot through the exec gateway vs local", ["envelope_snapshot.py", "--runs", "15"]),
    ("check gguf: console vs box on a real model; a 4 GiB sparse GGUF vs GGUFReader", ["gguf_check_speed.py"]),
    ("gguf add-tensors from an HTTP donor: bytes fetched vs the donor's size", ["gguf_transplant.py"]),
    ("check trainlog on a 1 GB log vs grep", ["trainlog_speed.py"]),
    ("check eval of 100,000 items vs json.loads of every line", ["evalcheck_speed.py"]),
    ("the console over an emulated 100 ms link: first contact, steady poll, catch-up, outages", ["link.py"]),
    ("a fleet of 1, 4 and 16 boxes polled at 1 s: console CPU, memory, change to model", ["fleet.py"]),
    ("the probe's poll with two serving ports, one stopped, vs without", ["serving_probe.py", "--runs", "30"]),
    ("a live training curve at 50 steps/s: minute 1 vs after 27,000 more steps", ["live_curve.py"]),
    ("the fleet screen in a terminal, 16 and 64 boxes at 1 s, now vs before this round",
     ["fleet_tui.py", "--boxes", "1", "16", "64"]),
    ("a 256 KiB /metrics body: the console's read vs the whole body parsed", ["metrics_parse.py"]),
    ("a resumed run vs the same seed uninterrupted: the largest relative difference", ["resume_fidelity.py"]),
    ("death to the operator's phone: 10 kills, watch at 10 s, to the message and the resumed run",
     ["incident_latency.py"]),
]


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    mem = next((line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                if line.startswith("MemTotal")), "?")
    return (f"{platform.system()} {platform.release()}, {os.cpu_count()} CPUs ({cpu}), "
            f"{int(mem) // 1024} MiB RAM, Python {platform.python_version()}")


def main() -> int:
    sections = [f"# Benchmarks\n\nMeasured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {machine()}.\n\n"
                "Reproduce: `python bench/run_all.py` from the repository root (or one script alone).\n"]
    failed = 0
    for title, argv in BENCHES:
        print(f"== {title}", flush=True)
        done = subprocess.run([sys.executable, str(HERE / argv[0]), *argv[1:]], capture_output=True, text=True,
                              cwd=HERE.parent, timeout=900)
        output = (done.stdout.strip() or done.stderr.strip()[-2000:])
        failed += done.returncode != 0
        print(output, flush=True)
        sections.append(f"## {title}\n\n`python bench/{' '.join(argv)}`"
                        + (f" (exit {done.returncode})" if done.returncode else "") + f"\n\n```\n{output}\n```\n")
    (HERE / "RESULTS.md").write_text("\n".join(sections))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
