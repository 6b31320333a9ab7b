"""Why a stage's run ended badly, in one line with its evidence: what its chain said as it ended
(remote/box/death.py) and what only the console knows (the operator's stop, a reboot, a GPU's
Xid in the run's window, a chain killed before it could say anything).

The same line is shown in the stages bar, the alert, `snapshot`, `doctor` and the runs list."""

from __future__ import annotations

import time

from samai.remote.model import Death, Snapshot, StageRecord
from samai.remote.safe_text import visible

# What an Xid in the run's window explains: a run that died of a signal, an exit or an exception
# (not one whose own lines name a more specific cause, such as the disk being full).
XID_EXPLAINS = ("signal", "exit", "exception")
SHOWN_CHARS = 200


def cause_of_death(rec: StageRecord, snap: Snapshot) -> Death | None:
    """The cause of a run that did not end rc=0; None while it runs or when it ended well."""
    status = rec.status
    if status in ("running", "done"):
        return None
    if status == "stopped":
        when = time.strftime("%H:%M:%S", time.localtime(rec.stopped_at or 0))
        who = visible(rec.stopped_by)[:SHOWN_CHARS // 2] or "the operator"
        return Death("stopped", f"stopped by {who} from the console at {when}")
    if rec.rc is None:
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


def _xid_in_window(rec: StageRecord, snap: Snapshot) -> str | None:
    events = [e for e in snap.gpus.events if e.kind == "xid" and e.time >= rec.fired_at]
    if not events:
        return None
    e = events[-1]
    when = time.strftime("%H:%M:%S", time.localtime(e.time))
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
