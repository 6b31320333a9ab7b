"""The GPU incidents a snapshot shows (issue 21): memory held by a leftover of a killed run or
by a context whose process is gone, a training stage that stopped using its GPUs, an OOM in a
stage's log, uncorrectable ECC errors, recent Xid errors, thermal and power slowdowns, a GPU
that cannot be read.

`gpu_findings` reads one snapshot (what `doctor` prints); `GpuWatch` keeps the recent readings
for what only a sequence shows (the stall) and is what the console's state asks each poll."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from samai.console.core import units
from samai.console.core.config import Config, Stage
from samai.console.core.fixes import FixAction
from samai.console.core.problems import Finding
from samai.remote.model import Gpu, GpuReading, Severity, Snapshot

# Less than this is not a leftover worth an alert: a desktop's Xorg, a monitoring agent's context.
LEFTOVER_MIN_BYTES = 256 * 1024 * 1024
IDLE_PERCENT = 2  # "~0 %": NVML's utilization of a GPU that runs nothing reads 0, at most a few
STALL_S = 120.0  # a training stage with every GPU it holds idle this long is stalled
# A run that has not used its GPUs yet may still be loading weights or tokenizing: given longer.
STARTUP_STALL_S = 600.0
KEEP_S = STARTUP_STALL_S + 60.0  # how much of the recent readings the watch keeps
OOM_MARKER = "CUDA_OOM"  # the stage marker declared in console/pipelines/*.toml for the train stages
HOLDERS_SHOWN = 3
THERMAL = ("sw_thermal_slowdown", "hw_thermal_slowdown")
# sw_power_cap is left out: a GPU that draws its whole power budget is a GPU working flat out.
POWER = ("hw_slowdown", "hw_power_brake_slowdown")
XID_RECENT_S = 3600.0  # an Xid's alert stays this long after it happened, then resolves
RESET = "drain the box (stop what runs on the GPU) and have an admin reset the GPU or reboot"
# The well-known Xids, from NVIDIA's Xid catalogue (docs.nvidia.com/deploy/xid-errors): what each
# means and what to do. error: the GPU needs a reset; warning: the application's, or not urgent.
XIDS: dict[int, tuple[Severity, str, str]] = {
    13: ("warning", "graphics engine exception", "usually the application's fault: restart it; if it recurs "
         "with no change to the application, have the GPU's diagnostics run"),
    31: ("warning", "GPU memory page fault", "an illegal memory access, almost always the application or its "
         "framework: debug it and restart"),
    43: ("warning", "GPU stopped processing", "the application's work was stopped after a fault of its own; "
         "restart it (the GPU is usually fine)"),
    45: ("warning", "preemptive cleanup, due to previous errors", "work torn down because of another failure "
         "or a killed process: look for the Xid before it"),
    48: ("error", "double-bit ECC error", f"uncorrectable: what ran on it may be corrupt; {RESET}"),
    63: ("warning", "ECC page retirement or row remapping recorded", "it takes effect at the next GPU reset: "
         "restart the application that hit the error, and reset the GPU when convenient"),
    64: ("error", "ECC page retirement or row remapping failed", f"the failing memory is not fenced off; {RESET}"),
    74: ("error", "NVLink error", f"a fault on a GPU-to-GPU link, often hardware; {RESET} (if it recurs, "
         "have the links checked)"),
    79: ("error", "GPU has fallen off the bus", f"the GPU no longer answers; {RESET}"),
    92: ("warning", "high single-bit ECC error rate", "corrected, but the memory may be failing: watch for more "
         "and have it checked if they recur"),
    94: ("warning", "contained ECC error", "the application that hit it must be restarted; others may run on "
         "until a GPU reset at a convenient time"),
    95: ("error", "uncontained ECC error", f"memory corruption the GPU could not contain; {RESET}"),
    119: ("error", "GSP RPC timeout", f"the GPU's system processor stopped answering; {RESET}"),
    120: ("error", "GSP error", f"the GPU's system processor failed; {RESET}"),
    999: ("warning", "an Xid NVML could not name", "the kernel log (dmesg) has its number and text"),
}
UNKNOWN_XID: tuple[Severity, str, str] = (
    "warning", "one this console does not describe", "NVIDIA's Xid catalogue says what it means; the kernel log "
    "(dmesg) has its text")


@dataclass(frozen=True)
class UtilSample:
    """One poll's GPU utilization: each GPU's percent (None where NVML could not say)."""

    time: float
    percents: tuple[int | None, ...]

    @property
    def mean(self) -> float | None:
        known = [p for p in self.percents if p is not None]
        return sum(known) / len(known) if known else None


def stage_pids(snap: Snapshot) -> dict[int, str]:
    """pid -> the running stage it belongs to (the chain's group, or a process the chain started)."""
    owners: dict[int, str] = {}
    groups = {rec.pgid: rec.stage for rec in snap.states if rec.alive}
    for rec in snap.states:
        if rec.alive:
            owners.update(dict.fromkeys(rec.group, rec.stage))
    for proc in snap.processes:
        if proc.pgid in groups:
            owners.setdefault(proc.pid, groups[proc.pgid])
    return owners


def gpu_findings(snap: Snapshot, quoted: dict[int, int] | None = None) -> list[Finding]:
    """Everything one snapshot shows about its GPUs. quoted: the memory to quote for a holder
    (pid -> bytes) in place of what it holds now: an alert is one alert while its text stays
    the same, and a holder's memory moves from poll to poll."""
    reading = snap.gpus
    found = [*_unreadable(reading), *_ecc(reading), *_xids(snap), *_slowdowns(reading)]
    if snap.processes:  # a snapshot taken without the process table cannot tell leftovers
        held = {**reading.holders(), **(quoted or {})}
        found += [*_leftovers(snap, held), *_zombies(snap, held)]
    return found


def _label(gpu: Gpu) -> str:
    return f"GPU {gpu.index}" + (f" ({gpu.name[:40]})" if gpu.name else "")


def _unreadable(reading: GpuReading) -> Iterable[Finding]:
    for gpu in reading.gpus:
        if gpu.error:
            yield Finding("gpu_unreadable", "error", f"{_label(gpu)} cannot be read: {gpu.error[:120]} "
                          "(a GPU that fell off the bus needs a reset or a reboot by an admin)")


def _ecc(reading: GpuReading) -> Iterable[Finding]:
    for gpu in reading.gpus:
        if gpu.ecc_uncorrected:
            yield Finding("gpu_ecc", "error", f"{_label(gpu)} has {gpu.ecc_uncorrected} uncorrectable ECC "
                          "errors since the driver loaded: what ran on it may be corrupt; drain it and have "
                          "an admin reset it")


def _xids(snap: Snapshot) -> Iterable[Finding]:
    """An alert per GPU and Xid number seen in the last XID_RECENT_S, timed by its first time in
    that window: a storm of one Xid is one alert, and its text does not change each poll."""
    first: dict[tuple[int, int], float] = {}
    for event in snap.gpus.events:
        if event.kind == "xid" and snap.time - event.time <= XID_RECENT_S:
            key = (event.gpu, event.code)
            first[key] = min(first.get(key, event.time), event.time)
    gpus = {gpu.index: gpu for gpu in snap.gpus.gpus}
    for (index, code), at in sorted(first.items()):
        severity, meaning, todo = XIDS.get(code, UNKNOWN_XID)
        gpu = gpus.get(index)
        label = _label(gpu) if gpu else f"GPU {index}"
        yield Finding("gpu_xid", severity, f"{label} reported Xid {code} ({meaning}) at {_clock(at)}: {todo}")


def _clock(at: float) -> str:
    """The box's wall time, in UTC (the console's clock may not be the box's zone)."""
    try:
        return time.strftime("%H:%M:%S UTC", time.gmtime(at))
    except (OverflowError, ValueError, OSError):
        return f"{at:.0f} s since the epoch"


def _slowdowns(reading: GpuReading) -> Iterable[Finding]:
    for gpu in reading.gpus:
        reasons = gpu.slowdowns
        thermal = [r for r in reasons if r in THERMAL]
        power = [r for r in reasons if r in POWER]
        if thermal:  # no temperature in the text: it changes every poll (the GPU pane shows it)
            yield Finding("gpu_thermal", "warning", f"{_label(gpu)} is slowed down by heat "
                          f"({', '.join(thermal)}): check its cooling and airflow")
        if power:
            yield Finding("gpu_power", "warning", f"{_label(gpu)} is slowed down by its power supply "
                          f"({', '.join(power)}): a power brake or an overloaded PSU")


def _leftovers(snap: Snapshot, held_by: dict[int, int]) -> Iterable[Finding]:
    """GPU memory held by a live process that no running stage started: a killed run's leftover
    keeps it, and the next train OOMs."""
    owners = stage_pids(snap)
    for pid in snap.gpus.holders():
        proc, held = snap.process(pid), held_by[pid]
        if proc is None or pid in owners or held < LEFTOVER_MIN_BYTES:
            continue
        yield Finding("gpu_leftover", "warning", f"pid {pid} holds {units.size(held)} of GPU memory and is no "
                      f"running stage's ({proc.command[:80]}): the next train may run out of memory",
                      FixAction.kill(proc))


def _zombies(snap: Snapshot, held_by: dict[int, int]) -> Iterable[Finding]:
    """GPU memory held by a pid the box has no process for: a context whose process exited but
    was not reaped (a zombie), or a process in another PID namespace (another container)."""
    for pid in snap.gpus.holders():
        if snap.process(pid) is None:
            yield Finding("gpu_zombie", "warning", f"pid {pid} holds {units.size(held_by[pid])} of GPU memory but is "
                          "no process the box shows: a zombie context (it clears when its parent reaps it: stop the "
                          "parent), another container's process or one this user cannot see; else only a GPU reset "
                          "by an admin frees it")


def holders_text(reading: GpuReading, snap: Snapshot | None = None, shown: int = HOLDERS_SHOWN) -> str:
    """Each GPU's largest holders, for an OOM alert: `GPU 0: pid 41 python train.py 70.2 GB, ...`."""
    parts = []
    for gpu in reading.gpus:
        procs = sorted(gpu.processes, key=lambda p: p.used_memory or 0, reverse=True)[:shown]
        if not procs:
            continue
        named = []
        for p in procs:
            proc = snap.process(p.pid) if snap else None
            what = f" {proc.command[:40]}" if proc else ""
            size = units.size(p.used_memory) if p.used_memory is not None else "?"
            named.append(f"pid {p.pid}{what} {size}")
        parts.append(f"GPU {gpu.index}: " + ", ".join(named))
    return "; ".join(parts) if parts else "no process holds GPU memory now"


def oom_context(marker: str, snap: Snapshot | None) -> str:
    """What an OOM marker's alert adds: the largest holders of GPU memory as the log said it."""
    if marker != OOM_MARKER or snap is None or not snap.gpus.gpus:
        return ""
    return f" · largest GPU holders now: {holders_text(snap.gpus, snap)}"


def training_stages(cfg: Config) -> list[Stage]:
    """The stages that train: those of role train, and any stage that runs the box's train module."""
    return [s for s in cfg.stages if s.role.trains or "stages.train" in s.command]


class GpuWatch:
    """The recent readings, for the findings that need a sequence (a training stage whose GPUs
    have been idle for a while), and for the utilization line under the training curve."""

    def __init__(self, config: Config, stall_s: float = STALL_S, startup_stall_s: float = STARTUP_STALL_S) -> None:
        self.config = config
        self.stall_s, self.startup_stall_s = stall_s, startup_stall_s
        self.samples: deque[UtilSample] = deque()
        # Each training run (stage, fired_at): since when its GPUs have been idle, and whether it used them yet.
        self._idle_since: dict[tuple[str, float], float | None] = {}
        self._busy_once: set[tuple[str, float]] = set()
        self._first_held: dict[int, int] = {}  # each holder's memory when first seen: what its alert quotes

    def utilization(self) -> list[float | None]:
        """Each poll's mean utilization over the GPUs, oldest first."""
        return [s.mean for s in self.samples]

    def findings(self, snap: Snapshot) -> list[Finding]:
        self._keep(snap)
        holders = snap.gpus.holders()
        self._first_held = {pid: self._first_held.get(pid, held) for pid, held in holders.items()}
        return gpu_findings(snap, self._first_held) + self._stalls(snap)

    def _keep(self, snap: Snapshot) -> None:
        if not snap.gpus.gpus:
            return
        if self.samples and snap.time <= self.samples[-1].time:
            return  # the same reading again (a replay), or a clock stepped back: not a new moment
        self.samples.append(UtilSample(snap.time, tuple(g.util_gpu for g in snap.gpus.gpus)))
        while self.samples and snap.time - self.samples[0].time > KEEP_S:
            self.samples.popleft()

    def _stalls(self, snap: Snapshot) -> list[Finding]:
        owners = stage_pids(snap)
        found, watched = [], set()
        for stage in training_stages(self.config):
            rec = snap.state(stage.name)
            if rec is None or not rec.alive:
                continue
            run = (stage.name, rec.fired_at)
            watched.add(run)
            gpus = [g for g in snap.gpus.gpus if any(owners.get(p.pid) == stage.name for p in g.processes)]
            idle = bool(gpus) and all(g.util_gpu is not None and g.util_gpu <= IDLE_PERCENT for g in gpus)
            if gpus and not idle:
                self._busy_once.add(run)
            since = self._idle_since.get(run) if idle else None
            self._idle_since[run] = since if since is not None else (snap.time if idle else None)
            limit = self.stall_s if run in self._busy_once else self.startup_stall_s
            start = self._idle_since[run]
            if start is not None and snap.time - start >= limit:
                # No live duration in the text: the alert stays one alert while the stall lasts.
                found.append(Finding("gpu_stall", "error", f"stage {stage.name} is running but every GPU it holds "
                                     f"({', '.join(str(g.index) for g in gpus)}) has been at ~0 % utilization "
                                     f"for {limit:.0f} s or more: a dataloader stall, an NCCL hang or a "
                                     "deadlock? its log's last lines say where it waits"))
        self._idle_since = {k: v for k, v in self._idle_since.items() if k in watched}
        self._busy_once &= watched
        return found
