"""The probe's own CPU cost on the box at 1 Hz, with the console's poll request, against the floor of listing processes.

The probe runs as the console runs it (one `probe --serve` per connection, through Box on
LocalTransport) and is asked exactly what the console's poll asks for the built-in tiny pipeline
(ConsoleState builds the request and folds in each reply): every stage log watched for markers,
the train log, the log pane, every artifact and poison file sized, the eval reports, writers,
binaries, processes, listeners, stage states. The workspace holds a training log that grows while
the bench runs (a writer process appends to it and holds it open, recorded as the running train
stage), the other stage logs, a venv-like tree, checkpoints and an eval report.

The probe's CPU time is utime + stime of its own /proc/PID/stat (the child of this process that
runs the probe with --serve): per snapshot over snapshots asked back to back, then over wall time
while polling once a second, which is the figure the target is about (at 1 Hz the probe runs
with cold caches, and costs more per snapshot). The baseline, measured in the same run next to
each, is the floor of any process listing: one os.listdir("/proc") plus reading every
/proc/PID/stat once (what even the cheapest `ps` must do, and what the probe does among much
else); "x floor" is the probe's CPU per snapshot over it. One `ps -e -o pid,lstart,args` is shown
for scale. Both grow with the number of processes, so everything is measured twice: on the
machine as it is, and with 300 idle processes more (`sleep`, five of them Python listeners on TCP
ports). Sizing the artifacts grows with their files instead (a provisioned tiny venv holds some
38,000): its cost per 1000 files is printed, and the console walks a tree that no running stage
makes only every REFRESH_S or files * REFRESH_S_PER_FILE (console/core/disk/sizing.py), which the 1 Hz
figure includes.

    python bench/probe_cost.py [--snapshots 100] [--seconds 30] [--extra 300] [--venv-files 38000]
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import argument_parser, median, ratio

from samai.console.core.config import load_builtin
from samai.console.core.disk.sizing import REFRESH_S, REFRESH_S_PER_FILE
from samai.console.core.logcursor import LogCursor
from samai.console.core.state import ConsoleState
from samai.remote.box.procfs import boot_time, read_stat, start_epoch
from samai.remote.boxapi import Box
from samai.remote.local import LocalTransport

TARGET_PERCENT = 1.0
CLK_TCK = os.sysconf("SC_CLK_TCK")
WRITER = """import sys, time
with open(sys.argv[1], "a") as log:
    for step in range(1, 1200):  # ten minutes at most, should this bench be killed
        log.write("{'loss': %.4f, 'grad_norm': 1.0, 'epoch': %.2f}\\n" % (1 / step, step / 100))
        log.flush()
        time.sleep(0.5)
"""
LISTENER = "import socket,time\ns=socket.socket()\ns.bind(('127.0.0.1',0))\ns.listen()\ntime.sleep(600)"


def make_workspace(root: Path, venv_files: int) -> None:
    """What a tiny-pipeline workspace looks like mid-training."""
    logs = root / "logs"
    logs.mkdir(parents=True)
    (logs / "provision.log").write_text("Collecting torch\n" * 400 + "PROVISION_DONE\n")
    (logs / "fetch.log").write_text("fetched shard\n" * 50 + "FETCH_DONE\n")
    (logs / "train.log").write_text("".join(
        f"{{'loss': {1 / (i + 1):.4f}, 'grad_norm': 1.0, 'learning_rate': 0.0002, 'epoch': {i / 100:.2f}}}\n"
        for i in range(3000)))
    per_dir = 10
    for d in range(max(1, venv_files // per_dir)):  # a venv: many small files in many folders
        folder = root / "venv" / "lib" / "python3.11" / "site-packages" / f"pkg{d // 20}" / f"mod{d}"
        folder.mkdir(parents=True)
        for f in range(per_dir):
            (folder / f"f{f}.py").write_bytes(b"x" * 700)
    for name in ("models/base", "data"):
        (root / name).mkdir(parents=True)
    (root / "models" / "base" / "model.safetensors").write_bytes(b"w" * 200_000)
    (root / "models" / "base" / "config.json").write_text("{}")
    (root / "data" / "train.jsonl").write_text('{"text": "x"}\n' * 1000)
    for step in (50, 100):
        ckpt = root / "runs" / "train" / "checkpoints" / f"checkpoint-{step}"
        ckpt.mkdir(parents=True)
        (ckpt / "adapter_model.safetensors").write_bytes(b"a" * 50_000)
        (ckpt / "optimizer.pt").write_bytes(b"o" * 100_000)
    report = root / "runs" / "eval" / "20250101-000000" / "summary.json"
    report.parent.mkdir(parents=True)
    report.write_text(json.dumps({"n": 50, "accuracy": 0.9, "empty_content": 0, "truncated": 0}))


def cpu_ticks(pid: int) -> int:
    st = read_stat(pid)
    return st["utime"] + st["stime"]


def start_time(pid: int) -> float:
    """As the box's tools record it."""
    return start_epoch(read_stat(pid)["starttime"], boot_time())


def probe_pid() -> int:
    """The probe: the child of this process running the box tools' probe with --serve."""
    me = os.getpid()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            argv = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        st = read_stat(int(name))
        if st and st["ppid"] == me and b"probe" in argv and b"--serve" in argv:
            return int(name)
    raise RuntimeError("no probe --serve among this process's children")


def process_count() -> int:
    return sum(name.isdigit() for name in os.listdir("/proc"))


def listing_floor_ms(passes: int = 30) -> float:
    """CPU ms of one os.listdir('/proc') + reading every /proc/PID/stat once (os.open/os.read), here."""
    started = time.process_time()
    for _ in range(passes):
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    fd = os.open(f"/proc/{name}/stat", os.O_RDONLY)
                except OSError:
                    continue
                try:
                    os.read(fd, 4096)
                except OSError:
                    pass
                finally:
                    os.close(fd)
    return 1000 * (time.process_time() - started) / passes


def ps_ms(runs: int = 5) -> float:
    """CPU ms (user + system) of one `ps -e -o pid,lstart,args`, child's own rusage."""
    if not shutil.which("ps"):
        return float("nan")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    for _ in range(runs):
        subprocess.run(["ps", "-e", "-o", "pid,lstart,args"], stdout=subprocess.DEVNULL, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return 1000 * ((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)) / runs


class Console:
    """The console's poll: ConsoleState builds the request, Box asks the probe, the state folds it in."""

    def __init__(self, workspace: str) -> None:
        config = dataclasses.replace(load_builtin("tiny"), workspace=workspace)
        self.state = ConsoleState(config)
        self.cursor = LogCursor(config)
        self.cursor.show_stage_log(config.stages[0].name)  # the app opens on the first stage's log
        self.box = Box(LocalTransport(), workspace, python=sys.executable)
        self.files = 0  # in the artifacts, as the last snapshot counted them

    async def poll(self) -> float:
        followers = self.state.followers(self.cursor)
        started = time.perf_counter()
        snap = await self.box.snapshot(**self.state.request(followers))
        took = time.perf_counter() - started
        self.state.apply(snap, followers, time.time(), cursor=self.cursor)
        self.files = sum(a.files for a in self.state.snapshot.artifacts if a.exists)
        return took


async def measure(label: str, snapshots: int, seconds: float, workspace: str, batches: int = 5) -> dict:
    """Back to back in batches, each next to a floor measured just before it (so that a busy
    moment of the machine weighs on both alike); then once a second, as the console polls,
    with one pass of the floor after each poll (both then run with cold caches)."""
    console = Console(workspace)
    # All the artifacts alone, in the same probe: the part of the cost that grows with the files.
    sizing = {"workspace": workspace, "processes": False, "states": False,
              "artifacts": [{"name": name, "path": path} for name, path in console.state.sizer.wanted]}
    per_batch = max(1, snapshots // batches)
    ms, ratios, floors, sizing_ms, latencies, floors_1hz = [], [], [], [], [], []
    try:
        for _ in range(3):  # start the probe, read the logs' history: what the console does once
            await console.poll()
        pid = probe_pid()
        for _ in range(batches):
            floors.append(listing_floor_ms(10))
            t0 = cpu_ticks(pid)
            latencies += [await console.poll() for _ in range(per_batch)]
            ms.append(1000 * (cpu_ticks(pid) - t0) / CLK_TCK / per_batch)
            ratios.append(ratio(ms[-1], floors[-1]))
            t0 = cpu_ticks(pid)
            for _ in range(per_batch):
                await console.box.ask_probe(sizing)
            sizing_ms.append(1000 * (cpu_ticks(pid) - t0) / CLK_TCK / per_batch)
        # The window holds one walk of every tree, as the console spreads them: it sizes all at
        # the start, and the biggest tree next when the window is over.
        console.state.sizer.refresh_all()
        window = max(seconds, max(REFRESH_S, console.files * REFRESH_S_PER_FILE))
        t1, w1, polls = cpu_ticks(pid), time.monotonic(), 0
        next_at = w1
        while time.monotonic() - w1 < window:
            next_at += 1.0
            await console.poll()
            polls += 1
            floors_1hz.append(listing_floor_ms(1))
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        ticks_1hz = cpu_ticks(pid) - t1
        at_1hz = 100 * ticks_1hz / CLK_TCK / (time.monotonic() - w1)
        rss = next(int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                   if line.startswith("VmRSS:"))
    finally:
        await console.box.close()
    return {"label": label, "procs": process_count(), "ms": median(ms), "at_1hz": at_1hz,
            "sizing": median(sizing_ms), "latency": 1000 * median(latencies), "floor": median(floors),
            "ratio": median(ratios), "floor_1hz": median(floors_1hz),
            "ratio_1hz": ratio(1000 * ticks_1hz / CLK_TCK / max(polls, 1), median(floors_1hz)), "ps": ps_ms(),
            "files": console.files, "rss": rss / 1024, "window": window}


def spawn_idle(count: int, listeners: int) -> list[subprocess.Popen]:
    quiet = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    started = [subprocess.Popen([sys.executable, "-S", "-c", LISTENER], **quiet) for _ in range(listeners)]
    started += [subprocess.Popen(["sleep", "600"], **quiet) for _ in range(count - listeners)]
    return started


def stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        proc.kill()
    for proc in procs:
        proc.wait()


async def main(snapshots: int, seconds: float, extra: int, venv_files: int) -> None:
    root = Path(tempfile.mkdtemp(prefix="samai-bench-probe-"))
    workspace = root / "ws"
    make_workspace(workspace, venv_files)
    writer = subprocess.Popen([sys.executable, "-S", "-c", WRITER, str(workspace / "logs" / "train.log")])
    state = workspace / ".samai" / "state"
    state.mkdir(parents=True)
    (state / "train.json").write_text(json.dumps({"stage": "train", "pid": writer.pid, "pgid": writer.pid,
                                                  "sid": writer.pid, "start_time": start_time(writer.pid),
                                                  "log": str(workspace / "logs" / "train.log"), "cmd": "train",
                                                  "fired_at": time.time()}))
    idle: list[subprocess.Popen] = []
    time.sleep(2.5)  # a real venv is older than the probe's few seconds of doubt about a fresh directory
    try:
        rows = [await measure("as is", snapshots, seconds, str(workspace))]
        idle = spawn_idle(extra, listeners=5)
        time.sleep(0.5)  # let the listeners bind
        rows.append(await measure(f"+{extra} idle", snapshots, seconds, str(workspace)))
    finally:
        stop(idle + [writer])
        shutil.rmtree(root, ignore_errors=True)
    print(f"probe CPU, the console's poll of the tiny pipeline: {snapshots} snapshots back to back (medians of 5 "
          f"batches), then {rows[0]['window']:.0f} s at 1 Hz (every artifact tree walked once within); "
          f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}, "
          f"CLK_TCK {CLK_TCK}; workspace: {venv_files} files in the venv tree, a growing train log")
    print(f"{'processes':<11} {'count':>6} {'ms/snap':>8} {'x floor':>8} {'sizing ms':>10} {'% at 1 Hz':>10} "
          f"{'x floor':>8} {'floor ms':>9} {'floor 1Hz':>10} {'ps ms':>6} {'latency ms':>11} {'RSS MiB':>8}")
    for r in rows:
        print(f"{r['label']:<11} {r['procs']:>6} {r['ms']:>8.2f} {r['ratio']:>8.1f} {r['sizing']:>10.2f} "
              f"{r['at_1hz']:>10.2f} {r['ratio_1hz']:>8.1f} {r['floor']:>9.2f} {r['floor_1hz']:>10.2f} "
              f"{r['ps']:>6.1f} {r['latency']:>11.1f} {r['rss']:>8.1f}")
    print("ms/snap: probe CPU per snapshot asked back to back; sizing: of which the artifacts; % at 1 Hz: probe "
          f"CPU over wall time polling once a second (resolution {100 / CLK_TCK / max(seconds, 1):.2f} %), hence "
          "cold caches; floor: CPU of os.listdir('/proc') + reading every /proc/PID/stat once, here, back to back "
          "and once after each 1 Hz poll (x floor: the probe's CPU per snapshot over it); ps: one "
          "`ps -e -o pid,lstart,args`, for scale; RSS: the probe's, at the end")
    per_k = median(1000 * r["sizing"] / max(r["files"], 1) for r in rows)
    print(f"sizing all artifacts ({rows[0]['files']} files) costs {per_k:.2f} ms per 1000 files: {per_k / 10:.2f} % "
          f"of a core per 1000 files were they walked every second; a tree no running stage makes is walked every "
          f"max({REFRESH_S:g} s, files x {REFRESH_S_PER_FILE * 1000:g} ms)")
    print(f"target: <= {TARGET_PERCENT:g} % of one core at 1 Hz: " + ", ".join(
        f"{r['label']} {r['at_1hz']:.2f} % ({'met' if r['at_1hz'] <= TARGET_PERCENT else 'NOT met'})" for r in rows))


if __name__ == "__main__":
    parser = argument_parser(__doc__)
    parser.add_argument("--snapshots", type=int, default=100, help="asked back to back, per process count")
    parser.add_argument("--seconds", type=float, default=30, help="polled at 1 Hz, per process count")
    parser.add_argument("--extra", type=int, default=300, help="idle processes added for the second run")
    parser.add_argument("--venv-files", type=int, default=38_000, help="files in the venv artifact tree")
    args = parser.parse_args()
    asyncio.run(main(args.snapshots, args.seconds, args.extra, args.venv_files))
