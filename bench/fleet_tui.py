"""The fleet screen as a user runs it: `samai-console --config fleet.toml` with 1, 16 and 64 local
boxes, in a pseudo-terminal, its CPU over a minute. The product's figure for the fleet.

    python bench/fleet_tui.py [--boxes 1 16 64] [--seconds 60] [--settle 15] [--adaptive] [--before REV]

Each box is this machine (`url = "local"`) with a workspace of its own, every box's
`poll_interval = 1.0` set explicitly (the issue's case: an explicit interval is honoured); with
--adaptive none is set and the fleet picks it from its size. The console starts as a user starts
it (150x45 pty, HOME a temporary folder); after the fleet screen is painted and --settle seconds,
its own CPU (from /proc: the TUI process) and that of the box probes it started are sampled for
--seconds. Printed per fleet size: the console's CPU in % of one core and per box, and the ratio
of the largest fleet's cost per box to the smallest's (the baseline, same run): below 1 is
sublinear. --before REV runs the same fleets on the console of that commit too (a git worktree of
it, imported in its place), each size before then now: the ratio now / before per size.
Targets (issue 49): 64 boxes <= 25 %, 16 boxes <= 10 %. A measurement, not a test.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from harness import argument_parser
from idle import descendants, stat
from startup import Tui

TARGETS = {16: 10.0, 64: 25.0}


def config(root: Path, boxes: int, adaptive: bool) -> Path:
    tables = []
    for i in range(boxes):
        ws = root / f"ws-{i}"
        ws.mkdir()
        tables.append(f'[boxes.b{i:02d}]\nurl = "local"\nworkspace = "{ws}"\n'
                      + ("" if adaptive else "poll_interval = 1.0\n"))
    path = root / "fleet.toml"
    path.write_text('pipeline = "fleet"\n' + "".join(tables) + '[stages.slow]\nkey = "z"\ncommand = "sleep 30"\n')
    return path


@contextlib.contextmanager
def console_of(rev: str) -> Iterator[str]:
    """A PYTHONPATH under which `samai` is the console of commit rev (a worktree of it, laid out as
    the installed package: samai/console, samai/remote, ...)."""
    root = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory(prefix="samai-bench-before-") as tmp:
        tree = Path(tmp, "tree")
        subprocess.run(["git", "-C", str(root), "worktree", "add", "--detach", "-q", str(tree), rev], check=True)
        try:
            package = Path(tmp, "path", "samai")
            package.mkdir(parents=True)
            for part in ("console", "remote", "widgets", "themes"):
                (package / part).symlink_to(tree / part)
            yield str(package.parent)
        finally:
            subprocess.run(["git", "-C", str(root), "worktree", "remove", "--force", str(tree)], check=False)


def measure(boxes: int, seconds: float, settle: float, adaptive: bool, path: str = "") -> tuple[float, float]:
    """(the console's CPU, its probes' CPU), in % of one core; path: a PYTHONPATH (console_of)."""
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = path
    try:
        return _measure(boxes, seconds, settle, adaptive)
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


def _measure(boxes: int, seconds: float, settle: float, adaptive: bool) -> tuple[float, float]:
    with tempfile.TemporaryDirectory(prefix="samai-bench-fleet-") as tmp:
        root = Path(tmp)
        tui = Tui([sys.executable, "-m", "samai.console", "--config", str(config(root, boxes, adaptive))], tmp,
                  str(root / "pycache"))
        try:
            painted = f"fleet · {boxes} boxes".encode() if boxes > 1 else b"Quit"
            deadline = time.monotonic() + 60
            while painted not in tui.output:
                if time.monotonic() > deadline or not tui.read(0.5):
                    raise RuntimeError(f"no fleet screen: {bytes(tui.output[-800:]).decode('utf-8', 'replace')}")
            tui.drain(settle)
            pid = tui.proc.pid
            start, kids_start, t0 = stat(pid), descendants(pid), time.monotonic()
            tui.drain(seconds)
            elapsed = time.monotonic() - t0
            end, kids_end = stat(pid), descendants(pid)
            if start is None or end is None or tui.proc.poll() is not None:
                raise RuntimeError(f"the console exited (rc={tui.proc.poll()})")
        finally:
            tui.close()
    probes = (end[2] - start[2]) + sum(cpu - kids_start.get(p, 0.0) for p, cpu in kids_end.items())
    return 100 * (end[1] - start[1]) / elapsed, 100 * probes / elapsed


def main(sizes: list[int], seconds: float, settle: float, adaptive: bool, before: str | None) -> None:
    print(f"the fleet screen, {'adaptive intervals' if adaptive else 'every box at poll_interval = 1.0'}: "
          f"{seconds:g} s sampled {settle:g} s after the first paint ({os.cpu_count()} CPUs, "
          f"Python {sys.version.split()[0]}, 150x45 pty)")
    with console_of(before) if before else contextlib.nullcontext("") as path:
        figures = {}
        for n in sizes:
            if before:
                then, _ = measure(n, seconds, settle, adaptive, path)
                print(f"{n:>3} boxes  console {then:6.2f} % of one core at {before}", flush=True)
            figures[n] = _one(n, seconds, settle, adaptive)
            if before:
                print(f"{n:>3} boxes  now / {before}: x{figures[n] / then:.2f}", flush=True)
    small, large = min(figures), max(figures)
    if large != small:
        per_box = (figures[large] / large) / (figures[small] / small)
        print(f"cost per box, {large} boxes / {small}: x{per_box:.2f} "
              f"({'sublinear' if per_box < 1 else 'not sublinear'})")


def _one(n: int, seconds: float, settle: float, adaptive: bool) -> float:
    """The console of this checkout on n boxes, printed; its CPU."""
    console, probes = measure(n, seconds, settle, adaptive)
    target = TARGETS.get(n)
    met = target is not None and console <= target
    said = "" if target is None or adaptive else f"   target <= {target:g} %: {'met' if met else 'MISSED'}"
    print(f"{n:>3} boxes  console {console:6.2f} % of one core ({console / n:5.2f} % a box), "
          f"probes {probes:6.2f} %{said}", flush=True)
    return console


if __name__ == "__main__":
    parser = argument_parser(__doc__)
    parser.add_argument("--boxes", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--settle", type=float, default=15)
    parser.add_argument("--adaptive", action="store_true")
    parser.add_argument("--before", metavar="REV", help="measure the console of this commit too, as the baseline")
    args = parser.parse_args()
    main(args.boxes, args.seconds, args.settle, args.adaptive, args.before)
