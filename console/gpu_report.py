"""The box's GPUs as plain text for `snapshot` and `doctor` (the TUI has its GPU pane). Names,
errors and commands come from the box: every line is made visible before it is printed."""

from __future__ import annotations

from samai.console.core import units
from samai.console.core.redact import redact
from samai.remote.model import GpuReading, Snapshot
from samai.remote.safe_text import visible


def describe_gpus(reading: GpuReading, snap: Snapshot | None = None) -> str:
    """`gpus` then a line per GPU and one per process on it; or `gpus: none (why)`."""
    if not reading.gpus:
        return visible(f"gpus: none ({reading.error or 'no GPU section in the reply'})")
    lines = ["gpus" + (f" (driver {reading.driver})" if reading.driver else "")]
    for gpu in reading.gpus:
        if gpu.error:
            lines.append(f"  [{gpu.index}] {gpu.name or '?'}  unreadable: {gpu.error}")
            continue
        lines.append(f"  [{gpu.index}] {gpu.name or '?'}  util {_known(gpu.util_gpu)}%  memory "
                     f"{units.size(gpu.memory_used)} of {units.size(gpu.memory_total)}  {_known(gpu.temperature)} C  "
                     f"{_known(gpu.power_draw, '.0f')}/{_known(gpu.power_limit, '.0f')} W"
                     + (f"  slowed: {','.join(gpu.slowdowns)}" if gpu.slowdowns else "")
                     + (f"  ECC uncorrected {gpu.ecc_uncorrected}" if gpu.ecc_uncorrected else ""))
        for p in sorted(gpu.processes, key=lambda p: p.used_memory or 0, reverse=True):
            proc = snap.process(p.pid) if snap else None
            command = redact(proc.command)[:80] if proc else "(no such process on the box)"
            lines.append(f"      pid {p.pid:>7} {p.kind:<3} {units.size(p.used_memory):>9}  {command}")
    return "\n".join(visible(line) for line in lines)


def _known(value: float | None, spec: str = "") -> str:
    return "?" if value is None else format(value, spec)
