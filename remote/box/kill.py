"""Signal one process or one process group, after re-checking its identity. Never by name.

Runs ON the box. Request on stdin, either a process or a recorded stage:
  {"pid", "start_time", "boot_time", "boot_id", "signal": "TERM"|"KILL"|"INT"|"HUP", "grace": 5.0,
   "group": false, "protect": [PID, ...], "log": PATH|null}
  {"stage", "workspace", "signal", "grace", "protect"}   (the stage's group, from its record)
Reply: {"ok", "result": "exited"|"killed"|"refused"|"gone", "reason", "pgid",
        "signalled": [PID...], "survivors": [PID...]}

Identity is (pid, start time): the start time is read again right before the signal, so a
recycled pid is refused. A start time given with the boot time it was computed from (and this
boot's id) is read against that boot time, so that a clock stepped since moves nothing. Pid 1,
this tool, its ancestors (the session that runs it) and any pid the caller protects are never
signalled. With "group", the process group is
signalled; a group whose leader already exited is still found through members that started
after the leader did (a pgid cannot be recycled while any member lives). TERM, INT and HUP
are followed by KILL when the target outlives the grace period.
"""

import json
import os
import signal
import sys
import time

from procfs import ancestors, boot_time, group_members, read_stat, record_btime, same_start, serve, start_epoch

SIGNALS = {"TERM": signal.SIGTERM, "KILL": signal.SIGKILL, "INT": signal.SIGINT, "HUP": signal.SIGHUP}
POLL_S = 0.05
KILL_WAIT_S = 2.0


def refuse(reason, **extra):
    return dict(extra, ok=False, result="refused", reason=reason)


def gone(pid, start_time, btime):
    st = read_stat(pid)
    return not st or st["state"] == "Z" or not same_start(start_epoch(st["starttime"], btime), start_time)


def survivors(pid, start_time, pgid, btime):
    if pgid is not None:
        return group_members(pgid)
    return [] if gone(pid, start_time, btime) else [pid]


def wait_until_gone(pid, start_time, pgid, btime, seconds):
    deadline = time.monotonic() + seconds
    while True:
        left = survivors(pid, start_time, pgid, btime)
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(POLL_S)


def send(pid, pgid, signum):
    try:
        if pgid is not None:
            os.killpg(pgid, signum)
        else:
            os.kill(pid, signum)
    except ProcessLookupError:
        pass


def find_target(pid, start_time, group, btime):
    """(pgid or None, refusal or None) after re-reading the process's identity."""
    st = read_stat(pid)
    if st and st["state"] != "Z":
        started = start_epoch(st["starttime"], btime)
        if not same_start(started, start_time):
            why = "pid %d is now another process (started %.2f, expected %s)" % (pid, started, start_time)
            return None, refuse(why)
        return (st["pgid"] if group else None), None
    if group:
        # The leader is gone; its group may live on. Members born after it belong to it.
        members = [m for m in group_members(pid) if not _born_before(m, start_time, btime)]
        if members:
            return pid, None
    return None, {"ok": True, "result": "gone", "reason": "pid %d has already exited" % pid, "survivors": []}


def _born_before(pid, start_time, btime):
    st = read_stat(pid)
    return bool(st) and start_epoch(st["starttime"], btime) < float(start_time) - 0.011


def append_line(path, line):
    try:
        with open(path, "a") as f:
            f.write(line + "\n")
    except OSError:
        pass


def stage_request(req):
    """The kill request for a stage, from the record its launch left in the workspace."""
    path = os.path.join(os.path.abspath(os.path.expanduser(req["workspace"])), ".samai", "state",
                        req["stage"] + ".json")
    try:
        with open(path) as f:
            rec = json.load(f)
    except FileNotFoundError:
        return None
    return dict(req, pid=rec["pid"], start_time=rec["start_time"], boot_time=rec.get("boot_time"),
                boot_id=rec.get("boot_id"), group=True, log=rec.get("log"))


def kill(req):
    if "stage" in req:
        req = stage_request(req)
        if req is None:
            return {"ok": True, "result": "gone", "reason": "the stage has never been fired", "survivors": []}
    pid = req["pid"]
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 1:
        return refuse("refusing to signal pid %r" % (pid,))
    if req.get("start_time") is None:
        return refuse("a start time is required to identify pid %d" % pid)
    name = str(req.get("signal", "TERM")).upper()
    if name not in SIGNALS:
        return refuse("unknown signal %s (use one of %s)" % (name, ", ".join(sorted(SIGNALS))))
    btime = record_btime(req, boot_time())
    start_time = float(req["start_time"])
    pgid, refusal = find_target(pid, start_time, bool(req.get("group")), btime)
    if refusal:
        return refusal
    protected = set(ancestors(os.getpid())) | set(int(p) for p in req.get("protect") or ()) | {1}
    targets = group_members(pgid) if pgid is not None else [pid]
    hit = sorted(protected.intersection(targets))
    if hit:
        return refuse("pid %s is protected (init, the console or its session)" % ", ".join(map(str, hit)))

    send(pid, pgid, SIGNALS[name])
    grace = float(req.get("grace", 5.0))
    left = wait_until_gone(pid, start_time, pgid, btime, grace if name != "KILL" else KILL_WAIT_S)
    result = "exited"
    if left and name != "KILL":
        send(pid, pgid, signal.SIGKILL)
        left = wait_until_gone(pid, start_time, pgid, btime, KILL_WAIT_S)
        result = "killed"
    if name == "KILL":
        result = "killed"
    if req.get("log") and result == "killed":
        append_line(req["log"], "CHAIN_DONE rc=137 (killed by samai-console)")
    reply = {"ok": not left, "result": result, "pgid": pgid, "signalled": targets, "survivors": left}
    if left:
        reply["reason"] = "still alive after KILL: %s" % ", ".join(map(str, left))
    return reply


if __name__ == "__main__":
    sys.exit(serve("kill", kill))
