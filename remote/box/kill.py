"""Signal one process, one process group, or every process of a stage. Never by name.

Runs ON the box. Request on stdin, either a process or a recorded stage:
  {"pid", "start_time", "boot_time", "boot_id", "signal": "TERM"|"KILL"|"INT"|"HUP", "grace": 5.0,
   "group": false|true, "protect": [PID, ...]}
  {"stage", "workspace", "signal", "grace", "protect", "by"}   (every process of the stage, from its record)
Reply: {"ok", "result": "exited"|"killed"|"failed"|"refused"|"gone", "reason", "pgid",
        "signalled": [PID...], "survivors": [PID...], "remaining": [PID...]}
(wire.py: KillRequest, KillReply.)

"group" is required: false signals this process only, true its whole process group. A stage
is followed to every process its chain started (chain_pids: its group, the processes that
carry its chain marker, whatever session they moved to, and their descendants), each group
among them signalled as a group. "survivors": what it was asked to end and is still alive,
by pid; while there is one, "ok" is false and "result" is "failed" (or "refused" when the
signal itself was not permitted). "remaining": what it was not asked to end and still runs,
the target's children and group, so that the console can say who is left.

Identity is (pid, start time): the start time is read again right before each signal (through
a pidfd where the kernel has them, so that nothing can take the pid in between), so a recycled
pid is refused. A start time given with the boot time it was computed from (and this boot's
id) is read against that boot time, so that a clock stepped since moves nothing. Pid 1, kernel
threads, this tool, its ancestors (the session that runs it) and any pid the caller protects
are never signalled. A group whose leader already exited is still found through members that
started after the leader did (a pgid cannot be recycled while any member lives). TERM, INT and
HUP are followed by KILL when the target outlives the grace period. Every failure is one line.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import signal
import sys
import time
from typing import Any, Callable, Iterable, Optional, Tuple

from .chainline import is_nonce, signed
from .confine import Escape, open_append, open_folder, open_parent, open_root, unlink, write_file
from .identity import same_start, started_before
from .procfs import (
    ChainMarkers,
    ancestors,
    boot_time,
    chain_pids,
    descendants,
    group_members,
    is_kernel_thread,
    json_document,
    live_processes,
    read_regular_file,
    read_stat,
    record_btime,
    serve,
    settled_btime,
    start_epoch,
)
from .wire import KillReply, KillRequest

SIGNALS = {"TERM": signal.SIGTERM, "KILL": signal.SIGKILL, "INT": signal.SIGINT, "HUP": signal.SIGHUP}
POLL_S = 0.05
CHAIN_POLL_S = 0.2  # a look at a stage's processes reads every /proc/PID/stat
STAGE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")  # as launch.py names its records
KILL_WAIT_S = 2.0


def refuse(reason: str, pgid: Optional[int] = None) -> KillReply:
    reply: KillReply = {"ok": False, "result": "refused", "reason": reason}
    if pgid is not None:
        reply["pgid"] = pgid
    return reply


def gone_reply(reason: str) -> KillReply:
    return {"ok": True, "result": "gone", "reason": reason, "signalled": [], "survivors": [], "remaining": []}


def owner(pid: int) -> str:
    try:
        uid = os.stat("/proc/%d" % pid).st_uid
    except OSError:
        return "?"
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def denied(pid: int) -> str:
    return "pid %d belongs to user %s: permission denied" % (pid, owner(pid))


def still_alive(pid: int) -> str:
    """Why pid outlived a SIGKILL, as far as can be told: another user's, or not (uninterruptible
    sleep in the kernel, a pid namespace's init)."""
    try:
        uid = os.stat("/proc/%d" % pid).st_uid
    except OSError:
        return "%d" % pid
    if os.geteuid() != 0 and uid != os.geteuid():
        return denied(pid)
    return "%d (user %s)" % (pid, owner(pid))


# ------------------------------------------------------------ identity and signals


class Identity(object):
    """Processes by (pid, start time), all read against one boot time."""

    def __init__(self, btime: float) -> None:
        self.btime = btime
        self.started: dict[int, float] = {}  # pid -> start time (epoch), as first seen

    def add(self, pid: int, start_time: float | None = None) -> None:
        if pid not in self.started:
            if start_time is None:
                st = read_stat(pid)
                if not st:
                    return
                start_time = start_epoch(st["starttime"], self.btime)
            self.started[pid] = start_time

    def alive(self, pid: int) -> bool:
        st = read_stat(pid)
        return st is not None and st["state"] != "Z" and same_start(start_epoch(st["starttime"], self.btime),
                                                                    self.started.get(pid))

    def living(self, pids: Iterable[int] | None = None) -> list[int]:
        return sorted(p for p in (self.started if pids is None else pids) if self.alive(p))


def signal_process(ident: Identity, pid: int, signum: int) -> bool:
    """Signal pid if it is still the process ident knows: True if signalled, False if gone.
    Raises PermissionError. Through a pidfd where there is one: once opened it names that very
    process, so the identity read after it cannot be overtaken by a recycled pid."""
    fd = None
    if hasattr(os, "pidfd_open") and hasattr(signal, "pidfd_send_signal"):
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return False
        except OSError:  # an older kernel: the plain kill below, after the same check
            fd = None
    try:
        if not ident.alive(pid):
            return False
        if fd is not None:
            signal.pidfd_send_signal(fd, signum)
        else:
            os.kill(pid, signum)
        return True
    except ProcessLookupError:
        return False
    finally:
        if fd is not None:
            os.close(fd)


def signal_group(ident: Identity, pgid: int, members: Iterable[int], signum: int) -> bool:
    """killpg(pgid) if one of members (known to ident) still lives in it: while one does, the
    pgid cannot have been given to another group. True if signalled."""
    for pid in members:
        st = read_stat(pid)
        if st and st["pgid"] == pgid and ident.alive(pid):
            try:
                os.killpg(pgid, signum)
                return True
            except ProcessLookupError:
                return False
    return False


def wait_until(done: Callable[[], object], seconds: float, poll: float = POLL_S) -> None:
    deadline = time.monotonic() + seconds
    while not done() and time.monotonic() < deadline:
        time.sleep(poll)


# ------------------------------------------------------------ checks before any signal


def check_request(req: KillRequest) -> Tuple[str, float, Optional[KillReply]]:
    """(signal name, grace, None), or a refusal last."""
    name = str(req.get("signal", "TERM")).upper()
    if name not in SIGNALS:
        return name, 0.0, refuse("unknown signal %s (use one of %s)" % (name, ", ".join(sorted(SIGNALS))))
    return name, float(req.get("grace", 5.0)), None


def forbidden(pids: Iterable[int], req: KillRequest) -> KillReply | None:
    """A refusal if any of pids may never be signalled, else None."""
    protected = set(ancestors(os.getpid())) | set(int(p) for p in req.get("protect") or ()) | {1}
    hit = sorted(protected.intersection(pids))
    if hit:
        return refuse("pid %s is protected (init, the console or its session)" % ", ".join(map(str, hit)))
    for pid in sorted(pids):
        st = read_stat(pid)
        if st and is_kernel_thread(pid, st):
            return refuse("pid %d is a kernel thread (%s): never signalled" % (pid, st["comm"]))
    return None


# ------------------------------------------------------------ one process or its group


def kill(req: KillRequest) -> KillReply:
    if "stage" in req:
        return stop_stage(req)
    pid = req["pid"]
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 1:
        return refuse("refusing to signal pid %r" % (pid,))
    if pid == 2:
        return refuse("pid 2 is kthreadd, the kernel's thread parent: never signalled")
    if not isinstance(req.get("group"), bool):
        return refuse('say "group": false (this process only) or true (its whole process group)')
    if req.get("start_time") is None:
        return refuse("a start time is required to identify pid %d" % pid)
    name, grace, refusal = check_request(req)
    if refusal:
        return refusal
    btime = record_btime(req, boot_time())
    start_time = float(req["start_time"])
    st = read_stat(pid)
    if st and st["state"] != "Z":
        if req.get("boot_time") is None:
            btime = settled_btime(st["starttime"], start_time, btime)
        started = start_epoch(st["starttime"], btime)
        if not same_start(started, start_time):
            return refuse("pid %d is now another process (started %.2f, expected %s)" % (pid, started, start_time))
        if is_kernel_thread(pid, st):
            return refuse("pid %d is a kernel thread (%s): never signalled" % (pid, st["comm"]))
        pgid = st["pgid"]
    elif req["group"] and any(not born_before(m, start_time, btime) for m in group_members(pid)):
        pgid = pid  # the leader is gone; members born after it still hold its group
    else:
        return gone_reply("pid %d has already exited" % pid)
    if req["group"]:
        return kill_group(req, pid, pgid, start_time, btime, name, grace)
    return kill_process(req, pid, pgid, start_time, btime, name, grace)


def born_before(pid: int, start_time: float, btime: float) -> bool:
    st = read_stat(pid)
    return st is not None and started_before(start_epoch(st["starttime"], btime), start_time)


def kill_process(req: KillRequest, pid: int, pgid: int, start_time: float, btime: float, name: str,
                 grace: float) -> KillReply:
    refusal = forbidden([pid], req)
    if refusal:
        return refusal
    ident = Identity(btime)
    ident.add(pid, start_time)
    others = Identity(btime)  # its children and, when it leads one, its group: not asked to end

    def note_others() -> None:
        table = live_processes(btime)
        related = descendants([pid], table) | (set(p for p, e in table.items() if e["pgid"] == pid) if pgid == pid
                                                else set())
        for p in related - {pid}:
            others.add(p, table[p]["start_time"])

    note_others()
    try:
        if not signal_process(ident, pid, SIGNALS[name]):
            return gone_reply("pid %d has already exited" % pid)
    except PermissionError:
        return refuse(denied(pid))
    result = "killed" if name == "KILL" else "exited"
    wait_until(lambda: not ident.alive(pid), KILL_WAIT_S if name == "KILL" else grace)
    if ident.alive(pid) and name != "KILL":
        note_others()  # children it started during the grace period are reparented once it dies
        try:
            signal_process(ident, pid, signal.SIGKILL)
        except PermissionError:
            pass  # signalled once already, so permitted; an exec of a setuid program since
        result = "killed"
        wait_until(lambda: not ident.alive(pid), KILL_WAIT_S)
    return outcome(result, ident, others, None, [pid])


def kill_group(req: KillRequest, pid: int, pgid: int, start_time: float, btime: float, name: str,
               grace: float) -> KillReply:
    if pgid <= 1:
        return refuse("pid %d has no process group of its own to signal (pgid %d)" % (pid, pgid))
    members = group_members(pgid)
    refusal = forbidden(members, req)
    if refusal:
        return refusal
    ident = Identity(btime)
    ident.add(pid, start_time)
    for m in members:
        ident.add(m)
    others = Identity(btime)  # processes it started outside the group: not asked to end

    def note_group() -> None:
        table = live_processes(btime)
        for p, e in table.items():
            if e["pgid"] == pgid:
                ident.add(p, e["start_time"])
        for p in descendants(list(ident.started), table):
            if table[p]["pgid"] != pgid:
                others.add(p, table[p]["start_time"])

    def group_alive() -> list[int]:
        return [p for p in group_members(pgid) if ident.alive(p) or p not in ident.started]

    note_group()
    try:
        if not signal_group(ident, pgid, list(ident.started), SIGNALS[name]):
            return gone_reply("process group %d has already exited" % pgid)
    except PermissionError:
        return refuse(denied(pid if ident.alive(pid) else members[0]), pgid=pgid)
    result = "killed" if name == "KILL" else "exited"
    wait_until(lambda: not group_alive(), KILL_WAIT_S if name == "KILL" else grace)
    if group_alive() and name != "KILL":
        note_group()
        try:
            signal_group(ident, pgid, list(ident.started), signal.SIGKILL)
        except PermissionError:
            pass  # the survivors are reported below, by pid
        result = "killed"
        wait_until(lambda: not group_alive(), KILL_WAIT_S)
    note_group()
    return outcome(result, ident, others, pgid, list(ident.started))


def outcome(result: str, ident: Identity, others: Identity, pgid: int | None,
            signalled: Iterable[int]) -> KillReply:
    """The reply: what it was asked to end and still lives fails it, whatever was sent."""
    left = ident.living()
    reply: KillReply = {"ok": not left, "result": result, "pgid": pgid, "signalled": sorted(signalled),
                        "survivors": left, "remaining": [p for p in others.living() if p not in ident.started]}
    if left:
        reply["result"] = "failed"
        reply["reason"] = "still alive after SIGKILL: %s" % ", ".join(still_alive(p) for p in left)
    return reply


# ------------------------------------------------------------ every process of a stage


def workspace(req: KillRequest) -> str:
    return os.path.abspath(os.path.expanduser(req["workspace"]))


def stage_record(req: KillRequest) -> dict[str, Any] | None:
    if not isinstance(req["stage"], str) or not STAGE_NAME.match(req["stage"]):
        raise ValueError("bad stage name %r" % (req["stage"],))
    path = os.path.join(workspace(req), ".samai", "state", req["stage"] + ".json")
    try:
        rec = json_document(read_regular_file(path))
    except FileNotFoundError:
        return None
    if not isinstance(rec, dict):
        raise ValueError("%s is not a stage record" % path)
    return rec


class Chain(object):
    """The processes of one stage's chain, found again on every look (chain_pids) and kept:
    a process once found stays followed by its (pid, start time) even after its parent died
    and took the trail with it."""

    def __init__(self, rec: dict[str, Any], btime: float) -> None:
        self.rec = rec
        self.now = boot_time()
        self.btime = btime  # the record's: what its start time is read against
        self.ident = Identity(btime)
        self.markers = ChainMarkers()
        self.groups: set[int] = set()  # pgids led by a process of the chain

    def look(self) -> list[int]:
        table = live_processes(self.now)
        offset = self.btime - self.now
        for pid in chain_pids(table, self.rec, offset, self.markers):
            e = table[pid]
            self.ident.add(pid, round(e["start_time"] + offset, 2))
            if e["pgid"] == pid or e["pgid"] == self.rec.get("pgid"):
                self.groups.add(e["pgid"])
        return self.ident.living()

    def send(self, signum: int) -> tuple[list[int], list[int]]:
        """Signal every group the chain leads, then each of its processes outside them (a
        second TERM could run a shell's trap twice). (signalled, denied) pids."""
        alive = self.look()
        covered: set[int] = set()
        for pgid in sorted(self.groups):
            try:
                if signal_group(self.ident, pgid, alive, signum):
                    covered.add(pgid)
            except PermissionError:
                pass  # each member is tried on its own below
        signalled: list[int] = []
        denied_pids: list[int] = []
        for pid in alive:
            st = read_stat(pid)
            try:
                if (st and st["pgid"] in covered) or signal_process(self.ident, pid, signum):
                    signalled.append(pid)
            except PermissionError:
                denied_pids.append(pid)
        return signalled, denied_pids


def stop_stage(req: KillRequest) -> KillReply:
    rec = stage_record(req)
    if rec is None:
        return gone_reply("the stage has never been fired")
    name, grace, refusal = check_request(req)
    if refusal:
        return refusal
    chain = Chain(rec, record_btime(rec, boot_time()))
    alive = chain.look()
    if not alive:
        return gone_reply("no process of the stage is running") if not recycled(rec, chain.btime) else \
            refuse("pid %d is now another process (the record's start time is %s)" % (rec["pid"], rec["start_time"]))
    refusal = forbidden(alive, req)
    if refusal:
        return refusal
    # Said before the signal: the chain's trap writes its rc at once, and a console polling in
    # between must not read a deliberate stop as a failure.
    note_stopped(workspace(req), req["stage"], rec, name, req.get("by"))
    signalled, denied_pids = chain.send(SIGNALS[name])
    if not signalled:
        forget_stopped(workspace(req), req["stage"])
    if denied_pids and not signalled:
        return refuse(denied(denied_pids[0]), pgid=rec.get("pgid"))
    result = "killed" if name == "KILL" else "exited"
    wait_until(lambda: not chain.look(), KILL_WAIT_S if name == "KILL" else grace, CHAIN_POLL_S)
    chain_killed = name == "KILL" and rec.get("pid") in alive
    still = chain.look() if name != "KILL" else []
    if still:
        chain_killed = rec.get("pid") in still  # it did not get to write its own CHAIN_DONE
        more, _ = chain.send(signal.SIGKILL)
        signalled += more
        result = "killed"
        wait_until(lambda: not chain.look(), KILL_WAIT_S, CHAIN_POLL_S)
    left = chain.look()
    if isinstance(rec.get("log"), str) and chain_killed and rec["pid"] not in left:
        append_line(workspace(req), rec["log"], chain_done_killed(rec))
    return outcome(result, chain.ident, Identity(chain.btime), rec.get("pgid"), set(signalled))


def chain_done_killed(rec: dict[str, Any]) -> str:
    """The last line of a chain killed before it could write its own: with its run's tag
    (chainline.py) when the record names it, so that readers take it as the chain's."""
    text = "CHAIN_DONE rc=137 (killed by samai-console)"
    nonce = rec.get("nonce")
    return signed(text, str(nonce)) if is_nonce(nonce) else text


def state_folder(workspace: str) -> int:
    root = open_root(workspace)
    try:
        return open_folder(root, [".samai", "state"])
    finally:
        os.close(root)


def note_stopped(workspace: str, stage: str, rec: dict[str, Any], signal_name: str, by: Any = None) -> None:
    """STAGE.stopped: this run (by its fired_at) was stopped by the operator, by whom (the
    console's user@host and what it did: stop, restart) and when. A new fire records another
    fired_at, so the note never speaks for a later run."""
    note = {"fired_at": rec.get("fired_at"), "time": time.time(), "signal": signal_name,
            "by": by[:120] if isinstance(by, str) else ""}
    try:
        folder = state_folder(workspace)
        try:
            write_file(folder, stage + ".stopped", json.dumps(note).encode("utf-8"))
        finally:
            os.close(folder)
    except (OSError, Escape):
        pass  # the stop stands; the stage only reads as failed rather than stopped


def forget_stopped(workspace: str, stage: str) -> None:
    try:
        folder = state_folder(workspace)
        try:
            unlink(folder, stage + ".stopped")
        finally:
            os.close(folder)
    except (OSError, Escape):
        pass


def recycled(rec: dict[str, Any], btime: float) -> bool:
    """True when the record's pid is alive as another process than the one it recorded."""
    st = read_stat(rec.get("pid") or 0)
    return st is not None and st["state"] != "Z" and not same_start(start_epoch(st["starttime"], btime),
                                                                    rec.get("start_time"))


def append_line(workspace: str, path: str, line: str) -> None:
    """A line at the end of a stage's log, only where that log lies inside the workspace (a
    record is a file anyone who can write the workspace could have changed)."""
    try:
        folder, name = open_parent(workspace, path)
        try:
            fd = open_append(folder, name)
        finally:
            os.close(folder)
        with os.fdopen(fd, "a") as f:
            f.write(line + "\n")
    except (OSError, Escape):
        pass  # the stop stands; only its note in the log is missing


if __name__ == "__main__":
    sys.exit(serve("kill", kill))
