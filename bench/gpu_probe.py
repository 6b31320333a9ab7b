"""The probe's CPU cost with the GPU section against the same probe without it, at 1 Hz and back to back:

    python bench/gpu_probe.py [--seconds 20] [--snapshots 100] [--recording dual_a5000]
    python bench/gpu_probe.py --real       (on a GPU box: the ctypes layer itself, what it read)

Each contender is one `probe --serve` (as the console keeps one per connection) answering the
console's poll request for the built-in tiny pipeline in a small workspace; they differ only in
the request's "gpus". The GPU section is read through the NVML replay layer from a recorded
reading (tests/data/nvml), which measures everything above the NVML boundary, and, where
libnvidia-ml.so.1 is present, through the real library as well. The probes' CPU time is
utime + stime of their own /proc/PID/stat; the polls alternate, so noise weighs on all alike.
The figure is CPU with the GPU section over CPU without it.

--real opens NVML through ctypes, reads every GPU as the probe does (timing each call), runs the
probe through the Box on this machine, and prints what both read; without the library it says so.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import ROOT, argument_parser, print_figure

from samai.console.core.config import load_builtin
from samai.console.core.state import ConsoleState
from samai.remote import model
from samai.remote.box import nvml
from samai.remote.box.gpus import GpuSession
from samai.remote.box.nvml_replay import REPLAY_ENV
from samai.remote.box.procfs import read_stat
from samai.remote.boxapi import Box
from samai.remote.local import LocalTransport

RECORDINGS = ROOT / "tests" / "data" / "nvml"
TARGET_RATIO = 1.5  # the GPU section may add at most half a poll's CPU (the probe's budget: probe_cost.py)


class ServeProbe:
    """One `probe --serve`, asked one request at a time."""

    def __init__(self, box: Box, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen([sys.executable, "-S", box.tools_dir, "probe", "--serve"], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def ask(self, request: bytes) -> dict:
        stdin, stdout = self.proc.stdin, self.proc.stdout
        assert stdin is not None and stdout is not None
        stdin.write(request + b"\n")
        stdin.flush()
        return json.loads(stdout.read(int(stdout.readline())))

    def cpu_ticks(self) -> int:
        stat = read_stat(self.proc.pid)
        return stat["utime"] + stat["stime"]

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait(10)


def library_present() -> str | None:
    """Why the real library cannot be used here, or None when it can."""
    session = GpuSession(nvml.Nvml())
    reply = session.read()
    session.close()
    return reply["gpu_error"] if not reply["gpus"] else None


async def poll_request(workspace: str) -> tuple[Box, dict]:
    """The console's poll request for the tiny pipeline, with its log cursors at the ends."""
    (Path(workspace) / "logs").mkdir()
    (Path(workspace) / "logs" / "train.log").write_text("{'loss': 1.0, 'epoch': 0.01}\n" * 2000)
    state = ConsoleState(dataclasses.replace(load_builtin("tiny"), workspace=workspace))
    box = Box(LocalTransport(), workspace, python=sys.executable)
    followers = state.followers()
    state.apply(await box.snapshot(**state.request(followers)), followers, time.time())
    return box, box.snapshot_request(**state.request(followers))


def measure(probes: dict[str, tuple[ServeProbe, bytes]], polls: int, interval: float) -> dict[str, int]:
    """CPU ticks each probe spent answering polls requests, interval seconds apart (0: back to back)."""
    for probe, request in probes.values():
        probe.ask(request)  # warm: NVML initialised, tools imported, caches filled
    before = {name: probe.cpu_ticks() for name, (probe, _) in probes.items()}
    next_at = time.monotonic()
    for _ in range(polls):
        for probe, request in probes.values():
            reply = probe.ask(request)
            if "error" in reply:
                raise SystemExit(f"the probe refused the request: {reply['error']}")
        next_at += interval
        time.sleep(max(0.0, next_at - time.monotonic()))
    return {name: probe.cpu_ticks() - before[name] for name, (probe, _) in probes.items()}


async def cost(seconds: int, snapshots: int, recording: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        box, request = await poll_request(tmp)
        base = {k: v for k, v in os.environ.items() if k != REPLAY_ENV}
        replayed = dict(base, **{REPLAY_ENV: str(RECORDINGS / f"{recording}.json")})
        without = json.dumps(dict(request, gpus=False)).encode()
        with_gpus = json.dumps(dict(request, gpus=True)).encode()
        probes = {"without GPUs": (ServeProbe(box, base), without),
                  f"GPUs replayed ({recording})": (ServeProbe(box, replayed), with_gpus)}
        missing = library_present()
        if missing is None:
            probes["GPUs through NVML"] = (ServeProbe(box, base), with_gpus)
        try:
            print(f"probe CPU, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}; request {len(with_gpus):,} B")
            for label, polls, interval in (("back to back", snapshots, 0.0), ("at 1 Hz", seconds, 1.0)):
                ticks = measure(probes, polls, interval)
                tck = os.sysconf("SC_CLK_TCK")
                shown = "   ".join(f"{name}: {1000 * t / tck / polls:.2f} ms/poll" for name, t in ticks.items())
                print(f"{label}, {polls} polls each: {shown}")
                for name, t in ticks.items():
                    if name != "without GPUs":
                        print_figure(f"{label}: {name} / without", t, ticks["without GPUs"], at_most=TARGET_RATIO)
            if missing is not None:
                print(f"no real NVML here ({missing}): only the replayed GPU section was measured")
        finally:
            for probe, _ in probes.values():
                probe.close()
            await box.close()


def timed_reading(source: nvml.Nvml) -> None:
    """Each NVML call the probe makes, on each GPU, with its time and what it returned."""
    started = time.perf_counter()
    source.init()
    print(f"nvmlInit: {1000 * (time.perf_counter() - started):.1f} ms; driver {source.driver_version()}")
    for index in range(source.device_count()):
        handle = source.handle(index)
        for call, args in (("name", ()), ("uuid", ()), ("bus_id", ()), ("utilization", ()), ("memory", ()),
                           ("temperature", ()), ("power_usage", ()), ("power_limit", ()),
                           ("clocks_event_reasons", ()), ("ecc_errors", (False,)), ("ecc_errors", (True,)),
                           ("processes", (False,)), ("processes", (True,))):
            started = time.perf_counter()
            try:
                value: object = getattr(source, call)(handle, *args)
            except nvml.NvmlError as e:
                value = f"NvmlError {e.code}: {e}"
            print(f"  gpu {index} {call}{args or ''}: {value!r} ({1000 * (time.perf_counter() - started):.2f} ms)")
    source.shutdown()


async def real() -> int:
    missing = library_present()
    if missing is not None:
        print(f"no GPU on this machine: {missing}")
        print("the ctypes layer was not exercised; run this script with --real on a box with an NVIDIA driver")
        return 0
    timed_reading(nvml.Nvml())
    session = GpuSession(nvml.Nvml())
    started = time.perf_counter()
    first = session.read()
    again = time.perf_counter()
    session.read()
    done = time.perf_counter()
    session.close()
    print(f"GpuSession.read: first {1000 * (again - started):.1f} ms (with init), then {1000 * (done - again):.1f} ms")
    print(json.dumps(first, indent=1))
    with tempfile.TemporaryDirectory() as tmp:
        box = Box(LocalTransport(), tmp, python=sys.executable)
        try:
            snap = await box.snapshot()
        finally:
            await box.close()
    reading: model.GpuReading = snap.gpus
    print(f"through the Box: driver {reading.driver}, error {reading.error}")
    for gpu in reading.gpus:
        print(f"  {gpu}")
    return 0 if reading.gpus and reading.error is None else 1


def main() -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--seconds", type=int, default=20, help="polls at 1 Hz (default 20)")
    parser.add_argument("--snapshots", type=int, default=100, help="polls back to back (default 100)")
    parser.add_argument("--recording", default="dual_a5000", help="the replayed reading (tests/data/nvml)")
    parser.add_argument("--real", action="store_true", help="exercise the ctypes layer on this machine's GPUs")
    args = parser.parse_args()
    if args.real:
        return asyncio.run(real())
    asyncio.run(cost(args.seconds, args.snapshots, args.recording))
    return 0


if __name__ == "__main__":
    sys.exit(main())
