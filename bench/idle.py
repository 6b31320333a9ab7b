"""An idle console: CPU and memory of the TUI polling the local target once a second.

    python bench/idle.py [--seconds 60] [--interval 1.0] [--settle 5] [--box own|shared] [--config FILE]

The console runs as a user starts it: `python -m samai.console --config FILE` in a
pseudo-terminal (see startup.py: 150x45, HOME and the XDG folders in a temporary folder, so
its workspace is there too), FILE being the built-in tiny pipeline with the target's
poll_interval set to --interval. Its target is local: the box is this machine, and its
processes are what the processes pane lists (and updates each poll). --box own (the default)
runs this script and so the console in a PID namespace of their own (`unshare --pid --fork
--mount-proc`, as root), so the box holds only them: an idle box, whatever else this machine
is running. --box shared: this machine as it is, its processes and their churn included.
Nothing runs in the workspace. Once the first screen is painted and --settle seconds have passed (the first polls:
the box tools uploaded, the stage logs scanned), the console process and its descendants
(the probe it keeps running on the box, which here is this machine) are sampled every
second from /proc for --seconds: CPU time (utime + stime; for the descendants also what
they reaped, and what the console reaped of them) and the console's VmRSS. The terminal's
output is read all along, as a terminal would.

Printed: the console's CPU in % of one core, the probe's, the bytes written to the terminal
per second, RSS at the start, end and max, its growth and its slope, and the box: how many
processes with a command line it held, and how many started and ended while sampling. Targets from the
issue: console <= 2 % of one core, RSS flat (here: growth <= 1 MB over the run). This is a
measurement, not a test: nothing asserts on it.
"""

from __future__ import annotations

import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path

from harness import argument_parser
from startup import SIZE, Tui

from samai.remote.box.procfs import read_stat

IN_NAMESPACE = "SAMAI_BENCH_OWN_BOX"  # set when this script runs again inside its own PID namespace
TICK = os.sysconf("SC_CLK_TCK")
MB = 1024 * 1024
FLAT_MB = 1.0


def stat(pid: int) -> tuple[int, float, float] | None:
    """(ppid, own CPU seconds, CPU seconds of reaped children) of a live process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()  # after the command name, which may hold spaces
    utime, stime, cutime, cstime = (int(f) for f in fields[11:15])
    return int(fields[1]), (utime + stime) / TICK, (cutime + cstime) / TICK


def descendants(root: int) -> dict[int, float]:
    """CPU seconds (own + reaped) of every live descendant of root."""
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (s := stat(int(entry))) is not None:
            parents[int(entry)], cpu[int(entry)] = s[0], s[1] + s[2]
    found, todo = {}, [root]
    while todo:
        parent = todo.pop()
        for pid, ppid in parents.items():
            if ppid == parent and pid not in found:
                found[pid] = cpu[pid]
                todo.append(pid)
    return found


def box_processes() -> set[tuple[int, str]]:
    """(pid, start time) of each process with a command line that /proc shows: what the box lists."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if Path(f"/proc/{entry}/cmdline").read_bytes() and (st := read_stat(int(entry))):
                    found.add((int(entry), st["starttime"]))
            except OSError:
                continue
    return found


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def config_file(folder: str, interval: float, source: str | None = None) -> str:
    """The tiny pipeline (or the config file `source`) with its poll_interval set, in folder."""
    text = Path(source).read_text("utf-8") if source else \
        resources.files("samai.console").joinpath("pipelines", "tiny.toml").read_text("utf-8")
    text, found = re.subn(r"(?m)^poll_interval = .*$", f"poll_interval = {interval}", text)
    if found != 1:
        raise RuntimeError("the built-in tiny pipeline has no poll_interval line to set")
    path = os.path.join(folder, "samai.toml")
    Path(path).write_text(text, "utf-8")
    return path


def slope(samples: list[tuple[float, int]]) -> float:
    """Least-squares growth of RSS, in bytes per minute."""
    ts, vs = [t for t, _ in samples], [v for _, v in samples]
    mt, mv = statistics.fmean(ts), statistics.fmean(vs)
    var = sum((t - mt) ** 2 for t in ts)
    return 60 * sum((t - mt) * (v - mv) for t, v in samples) / var if var else 0.0


def main(seconds: float, interval: float, settle: float, box: str, source: str | None = None) -> None:
    with tempfile.TemporaryDirectory(prefix="samai-bench-idle-") as root:
        pycache = os.path.join(root, "pycache")
        tui = Tui([sys.executable, "-m", "samai.console", "--config", config_file(root, interval, source)], root,
                  pycache)
        try:
            painted = tui.wait_painted()
            tui.drain(settle)
            pid = tui.proc.pid
            start = stat(pid)
            kids_start = descendants(pid)
            seen = listed = box_processes()
            counts = [len(listed)]
            out_start, t0 = len(tui.output), time.monotonic()
            memory: list[tuple[float, int]] = [(0.0, rss(pid))]
            while (elapsed := time.monotonic() - t0) < seconds:
                tui.drain(min(1.0, seconds - elapsed))
                memory.append((time.monotonic() - t0, rss(pid)))
                now = box_processes()
                counts.append(len(now))
                seen |= now
            elapsed = time.monotonic() - t0
            end = stat(pid)
            kids_end = descendants(pid)
            written = len(tui.output) - out_start
            if end is None or tui.proc.poll() is not None:
                raise RuntimeError(f"the console exited (rc={tui.proc.poll()})")
        finally:
            tui.close()
    console = end[1] - start[1]
    probe = (end[2] - start[2]) + sum(cpu - kids_start.get(p, 0.0) for p, cpu in kids_end.items())
    values = [v for _, v in memory]
    growth = values[-1] - values[0]
    pct = 100 * console / elapsed
    where = "its own PID namespace" if box == "own" else "this machine as it is"
    print(f"idle console: poll every {interval:g} s, {elapsed:.0f} s sampled from {settle:g} s after the first paint "
          f"({os.cpu_count()} CPUs, Python {sys.version.split()[0]}, {SIZE[0]}x{SIZE[1]} pty)")
    print(f"box          local, {where}: {min(counts)}-{max(counts)} processes with a command line, "
          f"{len(seen - listed)} started and {len(seen - now)} ended while sampling")
    print(f"console CPU  {pct:5.2f} % of one core ({console:.2f} s; first paint after {painted:.2f} s)")
    print(f"probe CPU    {100 * probe / elapsed:5.2f} % of one core ({probe:.2f} s; {len(kids_end)} processes "
          f"under the console)")
    print(f"terminal     {written / elapsed / 1024:5.1f} KiB/s written")
    print(f"RSS          start {values[0] / MB:.1f} MB, end {values[-1] / MB:.1f} MB, max {max(values) / MB:.1f} MB, "
          f"growth {growth / MB:+.2f} MB, slope {slope(memory) / MB:+.2f} MB/min")
    print(f"target <= 2 % of one core: {'met' if pct <= 2 else 'MISSED'} ({pct:.2f} %)")
    print(f"RSS flat (growth <= {FLAT_MB:g} MB): {'met' if abs(growth) <= FLAT_MB * MB else 'MISSED'} "
          f"({growth / MB:+.2f} MB)")


def in_own_namespace() -> int:
    """Run this script again, with the same arguments, as the first process of a PID namespace."""
    if not shutil.which("unshare"):
        sys.exit("--box own needs unshare (util-linux), as root; or pass --box shared")
    done = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, __file__, *sys.argv[1:]],
                          env=dict(os.environ, **{IN_NAMESPACE: "1"}))
    if done.returncode != 0 and os.geteuid() != 0:
        print("(--box own needs root: pass --box shared to measure without it)", file=sys.stderr)
    return done.returncode


if __name__ == "__main__":
    parser = argument_parser(__doc__)
    parser.add_argument("--seconds", type=float, default=60.0, help="how long to sample")
    parser.add_argument("--interval", type=float, default=1.0, help="the target's poll_interval")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds between the first paint and sampling")
    parser.add_argument("--box", choices=("own", "shared"), default="own",
                        help="own: a PID namespace holding only the console (root); shared: this machine as it is")
    parser.add_argument("--config", metavar="FILE", help="a pipeline config (with its workspace) instead of the "
                        "built-in tiny pipeline, e.g. one whose stages have all run, a server up (use --box shared)")
    args = parser.parse_args()
    if args.box == "own" and not os.environ.get(IN_NAMESPACE):
        sys.exit(in_own_namespace())
    main(args.seconds, args.interval, args.settle, args.box, args.config)
