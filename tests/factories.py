"""Builders for the typed data the Box hands the console (samai.remote.model), with sensible
defaults and keyword overrides: a test names only the fields it is about, and a field added
to a model class costs one default here, not an edit of every test that builds one.

`raw(obj)` turns a built object back into the probe's JSON shape, for a recorded box reply
(tests/replay_transport.py) that must hold it."""

from __future__ import annotations

import dataclasses
from typing import Any

from samai.remote import model

NOW = 1_000_000.0  # a box clock well after boot: start times and fired_at sit below it
BOOT = 900_000
GB = 10**9


def process(pid: int = 4242, *, argv: tuple[str, ...] | list[str] = ("python", "train.py"), **kw: Any
            ) -> model.Process:
    """A process alone in its own group and session, running as root since a minute before NOW."""
    argv = tuple(argv)
    fields: dict[str, Any] = dict(pid=pid, ppid=1, pgid=pid, sid=pid, user="root", start_time=NOW - 60,
                                  state="S", cpu_time=1.0, cpu_percent=0.0, rss=50_000_000,
                                  comm=(argv[0].rsplit("/", 1)[-1] if argv else "python")[:15], argv=argv)
    fields.update(kw)
    return model.Process(**fields)


def listener(port: int = 18080, pid: int | None = 4242, **kw: Any) -> model.Listener:
    fields: dict[str, Any] = dict(proto="tcp", host="127.0.0.1", port=port, inode=port * 10, pid=pid)
    fields.update(kw)
    return model.Listener(**fields)


def disk(*, free: int = 40 * GB, total: int = 100 * GB, **kw: Any) -> model.Disk:
    """The workspace's disk; used is what total and free leave unless given."""
    fields: dict[str, Any] = dict(label="workspace", path="/ws", mount="/", total=total, used=total - free, free=free)
    fields.update(kw)
    return model.Disk(**fields)


def artifact(name: str = "adapter", path: str | None = None, *, exists: bool = True, **kw: Any
             ) -> model.ArtifactSize:
    fields: dict[str, Any] = dict(name=name, path=path or name, exists=exists)
    if exists:
        fields.update(bytes=10**6, allocated=10**6, files=1)
    fields.update(kw)
    return model.ArtifactSize(**fields)


def stage_record(stage: str = "train", pid: int = 4242, *, alive: bool = False, **kw: Any) -> model.StageRecord:
    """A stage's recorded run: fired at NOW - 60 by a chain that is its own group."""
    fields: dict[str, Any] = dict(stage=stage, pid=pid, pgid=pid, start_time=NOW - 60, log=f"logs/{stage}.log",
                                  cmd=f"run {stage}", fired_at=NOW - 60, alive=alive,
                                  group=(pid,) if alive else ())
    fields.update(kw)
    return model.StageRecord(**fields)


def running(proc: model.Process, stage: str = "train", **kw: Any) -> model.StageRecord:
    """A running stage whose chain is proc's process group."""
    fields: dict[str, Any] = dict(pid=proc.pid, pgid=proc.pgid, start_time=proc.start_time, alive=True,
                                  group=(proc.pid,))
    fields.update(kw)
    return stage_record(stage, **fields)


def marker_hit(marker: str = "TRAIN_DONE", line: str | None = None, offset: int = 0) -> model.MarkerHit:
    return model.MarkerHit(marker=marker, offset=offset, line=line if line is not None else marker)


def log_chunk(path: str = "/ws/logs/train.log", data: bytes = b"", *, offset: int = 0, **kw: Any) -> model.LogChunk:
    """A read of one log: data from offset, the file ending where the read did."""
    end = offset + len(data)
    fields: dict[str, Any] = dict(path=path, data=data, offset=offset, next_offset=end, size=end, inode=1, dev=1,
                                  line_end=offset + data.rfind(b"\n") + 1 if b"\n" in data else None,
                                  tail=data[-16:])
    fields.update(kw)
    return model.LogChunk(**fields)


def report(path: str = "/ws/runs/eval/r/summary.json", text: str = "{}", *,
           glob: str = "runs/eval/*/summary.json", mtime: float = NOW - 30) -> model.Report:
    return model.Report(glob=glob, path=path, mtime=mtime, text=text)


def gpu_process(pid: int = 4242, used_memory: int | None = 1 * GB, kind: str = "C") -> model.GpuProcess:
    return model.GpuProcess(pid=pid, used_memory=used_memory, kind=kind)


def gpu(index: int = 0, **kw: Any) -> model.Gpu:
    """A healthy, idle 24 GB card; every reading overridable (None: NVML could not say)."""
    fields: dict[str, Any] = dict(index=index, name="NVIDIA GeForce RTX 4090", uuid=f"GPU-{index:08d}",
                                  bus_id=f"00000000:{index + 1:02x}:00.0", util_gpu=0, util_memory=0,
                                  memory_used=1 * GB, memory_total=24 * GB, temperature=40, power_draw=30.0,
                                  power_limit=450.0, throttle_reasons=(), ecc_corrected=None, ecc_uncorrected=None)
    fields.update(kw)
    return model.Gpu(**fields)


def gpu_reading(*gpus: model.Gpu, **kw: Any) -> model.GpuReading:
    return model.GpuReading(gpus=tuple(gpus), **kw)


def snapshot(*, processes: tuple[model.Process, ...] | list[model.Process] = (),
             states: tuple[model.StageRecord, ...] | list[model.StageRecord] = (),
             disks: tuple[model.Disk, ...] | list[model.Disk] | None = None, **kw: Any) -> model.Snapshot:
    """A snapshot at NOW of a box with one healthy workspace disk and nothing else unless given."""
    fields: dict[str, Any] = dict(time=NOW, host="box", boot_time=BOOT, rtt=0.01,
                                  disks=tuple(disks) if disks is not None else (disk(),), artifacts=(),
                                  processes=tuple(processes), listeners=(), logs=(), states=tuple(states))
    fields.update({k: tuple(v) if isinstance(v, list) else v for k, v in kw.items()})
    return model.Snapshot(**fields)


def raw(obj: Any) -> Any:
    """A model object as the probe's JSON holds it (tuples as lists, bytes left out)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: raw(getattr(obj, f.name)) for f in dataclasses.fields(obj)
                if not isinstance(getattr(obj, f.name), bytes)}
    if isinstance(obj, tuple | list):
        return [raw(item) for item in obj]
    return obj
