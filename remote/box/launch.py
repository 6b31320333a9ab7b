"""Fire a stage: write its chain script, start it detached, verify it, record it.

Runs ON the box. Request on stdin:
  {"stage", "workspace", "command", "log", "verify_s": 3.0, "env": {NAME: VALUE}}
Reply: {"ok", "state": "running"|"done"|"failed"|"refused", "reason", "pid", "pgid",
        "start_time", "boot_time", "boot_id", "rc", "log", "chain", "log_tail"}
(wire.py: LaunchRequest, LaunchReply; the stage's record is a LaunchRecord.)

The chain runs in a new session (so a stop can signal its whole process group), with
stdin a pipe that holds only the run's nonce and then /dev/null (an open stdin keeps SSH
sessions hanging), and its own log. Its
pid is written from inside the chain and must equal the pid we started: `setsid` the
command forks when its caller leads a group, and then the pid the caller sees is wrong.
At its start and its end the chain writes a SAMAI_DISK line (diskline.py) into the log: the
workspace's file system then, so the console can tell what the stage added (§4.1). At its end,
before CHAIN_DONE, death.py stops what the stage left running and, for an rc other than 0,
writes why it died (STAGE.death) beside its rc.

Every line the chain writes carries the run's nonce (chainline.py): the chain reads it from its
stdin (a pipe the launcher fills and closes) and hands it to its tools on theirs, so that no
environment holds it, and starts the stage without it; the record keeps it, for kill.py's line
and for the console.
"""

from __future__ import annotations

import binascii
import json
import os
import re
import subprocess
import sys
import time
from typing import Any, Mapping

from .chainline import new_nonce
from .confine import (
    Escape,
    open_append,
    open_folder,
    open_parent,
    open_root,
    parts_inside,
    rotate,
    unlink,
    workspace_root,
    write_file,
)
from .death import baseline as death_baseline
from .procfs import (
    alive,
    boot_id,
    boot_time,
    json_document,
    read_regular_file,
    read_stat,
    record_btime,
    serve,
    start_epoch,
)
from .wire import LaunchRecord, LaunchReply, LaunchRequest

STAGE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
TAIL_LINES = 20

CHAIN = """#!/bin/sh
# samai-console chain for stage %(stage)s: written by the console, rewritten on every fire.
read -r samai_nonce
exec </dev/null
echo $$ > "$SAMAI_PID_FILE"
say() {
    printf '%%s [run %%s]\\n' "$*" "$samai_nonce"
}
tool() {
    name=$1
    shift
    printf '%%s\\n' "$samai_nonce" | "$SAMAI_BOX_PYTHON" -S -m "samai_box.$name" "$@" 2>/dev/null
}
disk_line() {
    tool diskline "$1" || say "SAMAI_DISK $1 unavailable"
}
finish() {
    tool death "$1" $$ "${samai_stage_pid:-0}"
    disk_line end
    say "CHAIN_DONE rc=$1"
    echo "$1" > "$SAMAI_RC_FILE"
    exit "$1"
}
trap 'finish 129' HUP
trap 'finish 130' INT
trap 'finish 143' TERM
say "=== samai chain $SAMAI_STAGE: pid $$ started $(date -u +%%Y-%%m-%%dT%%H:%%M:%%SZ)"
cd "$SAMAI_WORKSPACE" || finish 2
disk_line start
(
unset samai_nonce
%(command)s
) &
samai_stage_pid=$!
wait $samai_stage_pid
finish $?
"""


def state_paths(workspace: str, stage: str) -> dict[str, str]:
    base = os.path.join(workspace, ".samai")
    state = os.path.join(base, "state")
    return {
        "state": os.path.join(state, stage + ".json"),
        "pid": os.path.join(state, stage + ".pid"),
        "rc": os.path.join(state, stage + ".rc"),
        "death": os.path.join(state, stage + ".death"),
        "chain": os.path.join(base, "chains", stage + ".sh"),
    }


class Places(object):
    """The folders launch writes in, opened inside the workspace without following symlinks
    (see confine.py): its state records, its chain scripts and the stage's log folder."""

    def __init__(self, given_workspace: str, stage: str, log: str) -> None:
        self.workspace = workspace_root(given_workspace)
        self.log = os.path.join(self.workspace, *parts_inside(self.workspace, log))
        self.log_folder, self.log_name = open_parent(self.workspace, log, create=True)
        root = open_root(self.workspace)
        try:
            self.state = open_folder(root, [".samai", "state"], create=True)
            self.chains = open_folder(root, [".samai", "chains"], create=True)
        finally:
            os.close(root)
        self.stage = stage

    def prepare(self, chain_text: str) -> int:
        """Clear the last run's pid and rc, write the chain script, rotate the log; the log's
        descriptor to append to."""
        for stale in (".rc", ".pid", ".death"):
            unlink(self.state, self.stage + stale)
        write_file(self.chains, self.stage + ".sh", chain_text.encode("utf-8"), 0o755)
        rotate(self.log_folder, self.log_name)
        return open_append(self.log_folder, self.log_name)

    def record(self, text: str) -> None:
        write_file(self.state, self.stage + ".json", text.encode("utf-8"))

    def chain_files(self) -> dict[str, str]:
        """The pid and rc files as the chain writes them: through the state folder's descriptor,
        which the chain inherits, so a state folder swapped for a symlink later cannot redirect
        them (Linux: /proc/self/fd/N is the folder that was opened, wherever it is now)."""
        folder = "/proc/self/fd/%d/" % self.state
        return {"SAMAI_PID_FILE": folder + self.stage + ".pid", "SAMAI_RC_FILE": folder + self.stage + ".rc",
                "SAMAI_DEATH_FILE": folder + self.stage + ".death"}


def tools_env(env: Mapping[str, str]) -> dict[str, str]:
    """SAMAI_TOOLS, the folder that holds this package, and that folder first on PYTHONPATH:
    a stage command runs a stage as `python3 -m samai_box.stages.NAME` with any python."""
    tools = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = [tools] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != tools]
    return {"SAMAI_TOOLS": tools, "PYTHONPATH": os.pathsep.join(path)}


def read_json(path: str) -> Any:
    try:
        return json_document(read_regular_file(path))
    except (OSError, ValueError):
        return None


def log_tail(path: str, n: int = TAIL_LINES, limit: int = 64 * 1024) -> list[str]:
    try:
        data = read_regular_file(path, limit, from_end=True)
    except OSError:
        return []
    return [line.decode("utf-8", "replace") for line in data.splitlines()[-n:]]


def nonce_pipe(nonce: str) -> int:
    """The chain's stdin: a pipe that holds the run's nonce and then its end (the chain reads the
    line and goes on with /dev/null): its read end, for the caller to close once the chain has it."""
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, (nonce + "\n").encode("ascii"))  # far below a pipe's buffer: never blocks
    finally:
        os.close(write_end)
    return read_end


def wait_for_pidfile(path: str, proc: subprocess.Popen[bytes], deadline: float) -> int | None:
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            text = read_regular_file(path, 64).strip()
            if text:
                return int(text)
        except (OSError, ValueError):
            pass
        time.sleep(0.02)
    return None


def launch(req: LaunchRequest) -> LaunchReply:
    stage, command = req["stage"], req["command"]
    workspace = os.path.abspath(os.path.expanduser(req["workspace"]))  # the chain runs from /
    if not STAGE_NAME.match(stage):
        return {"ok": False, "state": "refused", "reason": "bad stage name %r" % stage}
    try:
        places = Places(req["workspace"], stage, req["log"])
    except (Escape, OSError) as e:
        return {"ok": False, "state": "refused", "reason": "stage %s: %s" % (stage, e)}
    workspace, log = places.workspace, places.log
    btime = boot_time()
    paths = state_paths(workspace, stage)
    previous = read_json(paths["state"])
    if previous and alive(previous.get("pid", 0), previous.get("start_time"), record_btime(previous, btime)):
        return {"ok": False, "state": "refused", "pid": previous["pid"],
                "reason": "stage %s is already running as pid %d" % (stage, previous["pid"])}
    try:
        log_fd = places.prepare(CHAIN % {"stage": stage, "command": command})
    except (Escape, OSError) as e:
        return {"ok": False, "state": "refused", "reason": "stage %s: %s" % (stage, e)}

    env = dict(os.environ)
    env.update(dict((str(k), str(v)) for k, v in (req.get("env") or {}).items()))
    chain_id = "%s:%s" % (stage, binascii.hexlify(os.urandom(8)).decode())  # every process it starts: kill.py
    env.update(SAMAI_STAGE=stage, SAMAI_WORKSPACE=workspace, SAMAI_LOG=log, SAMAI_CHAIN=chain_id,
               SAMAI_PID_FILE=paths["pid"], SAMAI_RC_FILE=paths["rc"], SAMAI_BOX_PYTHON=sys.executable,
               **tools_env(env))  # SAMAI_BOX_PYTHON: what writes the chain's disk lines (diskline.py)
    # What an OOM kill moves, before the chain starts: death.py compares against it at the end.
    env["SAMAI_DEATH_WATCH"] = json.dumps(dict(death_baseline(), fired_at=time.time()))
    nonce = new_nonce()
    stdin = nonce_pipe(nonce)
    try:
        with os.fdopen(log_fd, "ab") as out:
            env.update(places.chain_files())
            proc = subprocess.Popen(["/bin/sh", paths["chain"]], stdin=stdin, stdout=out, stderr=subprocess.STDOUT,
                                    cwd="/", env=env, start_new_session=True, close_fds=True, pass_fds=(places.state,))
    finally:
        os.close(stdin)
    st = read_stat(proc.pid)  # readable even if it already exited: unreaped until we poll
    fired_at = time.time()
    verify_s = float(req.get("verify_s", 3.0))
    deadline = time.monotonic() + verify_s
    reported = wait_for_pidfile(paths["pid"], proc, deadline)
    record: LaunchRecord = {
        "stage": stage, "pid": proc.pid, "pgid": proc.pid, "sid": proc.pid,
        "start_time": start_epoch(st["starttime"], btime) if st else None,
        "boot_time": btime, "boot_id": boot_id(),  # what start_time is read against: record_btime
        "log": log, "cmd": command, "chain": paths["chain"], "fired_at": fired_at,
        "chain_id": chain_id,  # the SAMAI_CHAIN its processes carry
        "nonce": nonce}  # what the chain's lines in the log carry (chainline.py)
    places.record(json.dumps(record, indent=1))
    if reported is not None and reported != proc.pid:
        return LaunchReply(**record, ok=False, state="failed",
                           reason="chain reported pid %d, started pid %d" % (reported, proc.pid))

    while time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    rc = proc.poll()
    if rc is None:
        if not alive(proc.pid, record["start_time"], btime):
            return LaunchReply(**record, ok=False, state="failed", reason="chain vanished", log_tail=log_tail(log))
        return LaunchReply(**record, ok=True, state="running", rc=None)
    state = "done" if rc == 0 else "failed"
    reason = "" if rc == 0 else "chain exited with rc=%d within %.1f s" % (rc, verify_s)
    return LaunchReply(**record, ok=rc == 0, state=state, rc=rc, reason=reason, log_tail=log_tail(log))


if __name__ == "__main__":
    sys.exit(serve("launch", launch, lambda e: {"ok": False, "state": "failed", "reason": str(e)}))
