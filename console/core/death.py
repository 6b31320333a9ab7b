"""Why a stage's run ended badly, in one line with its evidence: what its chain said as it ended
(remote/box/death.py) and what only the console knows (the operator's stop, a reboot, a GPU's
Xid in the run's window, a chain killed before it could say anything).

The same line is shown in the stages bar, the alert, `snapshot`, `doctor` and the runs list."""

from __future__ import annotations

from dataclasses import dataclass, replace

from samai.console.core import units
from samai.console.core.disk.budget import workspace_disk
from samai.remote.model import Death, Snapshot, StageRecord
from samai.remote.safe_text import visible

# What an Xid in the run's window explains: a run that died of a signal, an exit or an exception
# (not one whose own lines name a more specific cause, such as the disk being full).
XID_EXPLAINS = ("signal", "exit", "exception")
SHOWN_CHARS = 200
FULL_BYTES = 1 << 20  # a workspace with less free is full: a chain's rc file may not have fit


def cause_of_death(rec: StageRecord, snap: Snapshot) -> Death | None:
    """The cause of a run that did not end rc=0; None while it runs or when it ended well."""
    status = rec.status
    if status in ("running", "done"):
        return None
    if status == "stopped":
        when = units.local_time(rec.stopped_at or 0)
        who = visible(rec.stopped_by)[:SHOWN_CHARS // 2] or "the operator"
        return Death("stopped", f"stopped by {who} from the console at {when}")
    if rec.rc is None:
        disk = workspace_disk(snap)
        if disk is not None and disk.total and disk.free < FULL_BYTES:  # its chain could not write its rc
            return Death("disk_full", f"the workspace's file system is full ({units.size(disk.free)} free of "
                         f"{units.size(disk.total)}): its chain could not write its exit status")
        if rec.boot_id and snap.boot_id and rec.boot_id != snap.boot_id:
            return Death("reboot", "the box rebooted after it was fired (its boot id changed)",
                         (f"boot id then {rec.boot_id[:36]}, now {snap.boot_id[:36]}",))
        return Death("signal", "its chain was killed before it could write an exit status (SIGKILL from outside "
                     "the console, or the OOM killer took the chain itself)")
    said = rec.death or Death("exit", f"exit status {rec.rc}")
    xid = _xid_in_window(rec, snap)
    if xid is not None and said.cause in XID_EXPLAINS:
        return Death("gpu_xid", xid, (said.line[:SHOWN_CHARS], *said.evidence))
    return said


@dataclass(frozen=True)
class LastSeen:
    """A run as the last poll that saw it running saw it: what only the console kept."""

    time: float
    rss: int  # its processes' resident memory together
    gpu: tuple[tuple[int, str, int], ...]  # the GPUs' largest holders then: (pid, command, bytes)


GPU_HOLDERS_SHOWN = 3
RUNS_KEPT = 64


class RunWatch:
    """Each running run's last RSS and the GPUs' largest holders, poll by poll, kept after it ends:
    an OOM kill's cause says how large the run was when last seen, a CUDA OOM who held the GPUs."""

    def __init__(self) -> None:
        self.seen: dict[tuple[str, float], LastSeen] = {}

    def observe(self, snap: Snapshot) -> None:
        held = sorted(snap.gpus.holders().items(), key=lambda kv: -kv[1])[:GPU_HOLDERS_SHOWN]
        gpu = tuple((pid, (p.command if (p := snap.process(pid)) else "?")[:80], n) for pid, n in held)
        for rec in snap.states:
            if rec.status == "running":
                rss = sum(p.rss for p in snap.processes if p.pid in rec.group)
                self.seen[(rec.stage, rec.fired_at)] = LastSeen(snap.time, rss, gpu)
        while len(self.seen) > RUNS_KEPT:
            self.seen.pop(next(iter(self.seen)))

    def explained(self, rec: StageRecord, death: Death | None) -> Death | None:
        """The death with what the console saw of the run last: its RSS for an OOM kill, the
        GPUs' largest holders for a CUDA OOM (in its detail and its evidence)."""
        seen = self.seen.get((rec.stage, rec.fired_at))
        if death is None or seen is None:
            return death
        when = units.local_time(seen.time)
        if death.cause == "oom_killed" and seen.rss:
            said = f"last RSS seen {units.size(seen.rss)} at {when}"
        elif death.cause == "cuda_oom" and seen.gpu:
            said = "GPU memory at " + when + ": " + "; ".join(
                f"pid {pid} {visible(cmd)} {units.size(n)}" for pid, cmd, n in seen.gpu)
        else:
            return death
        return replace(death, detail=f"{death.detail} · {said}"[:SHOWN_CHARS * 2], evidence=(*death.evidence, said))


def _xid_in_window(rec: StageRecord, snap: Snapshot) -> str | None:
    events = [e for e in snap.gpus.events if e.kind == "xid" and e.time >= rec.fired_at]
    if not events:
        return None
    e = events[-1]
    when = units.local_time(e.time)
    return f"GPU {e.gpu} reported Xid {e.code} at {when}, while it ran"


def death_line(death: Death) -> str:
    """The one line shown for it: bounded, its box text's control characters as stand-ins."""
    return visible(death.line)[:SHOWN_CHARS]


def exit_words(death: Death | None) -> str:
    """A plain exit's last line of the stage (the rc says the rest), bounded and visible."""
    if death is None or death.cause != "exit" or not death.evidence:
        return ""
    return visible(death.evidence[-1])[:SHOWN_CHARS]


def death_json(death: Death | None) -> dict | None:
    return None if death is None else {"cause": death.cause, "detail": death.detail,
                                       "evidence": list(death.evidence)}
