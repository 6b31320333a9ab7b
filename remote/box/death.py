"""Why a stage's run ended badly, said by its chain as it ends, and nothing of it left running.

Runs ON the box: `python3 -S -m samai_box.death RC CHAIN_PID`, from the chain script's finish
(launch.py), before it writes CHAIN_DONE. Standard library only, Python >= 3.8. It

1. stops every process the chain started that still runs (a helper that outlived the stage
   would go on writing into its log after CHAIN_DONE), TERM then KILL, each by pid and start
   time, never the chain itself or this process;
2. for an rc other than 0, judges the cause from what the box shows (the kernel's OOM counters
   and log, the workspace's file system, the stage's last log lines) and writes it as JSON to
   $SAMAI_DEATH_FILE: {"cause", "detail", "evidence": [...]}, and as one line into the log:
   `SAMAI_DEATH CAUSE: DETAIL`.

The log lines are the stage's (anyone's) text: each is cut to a bounded length and the verdict
is built from what was matched, never by evaluating it. The console adds what only it knows (a
stop by the operator, a reboot, a GPU's Xid, a peer rank's death): console/core/death.py.

The baseline the OOM verdict compares against is taken by launch.py before the chain starts
(SAMAI_DEATH_WATCH: {"oom_kill", "cgroup", "cgroup_oom_kill"}).
"""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import sys
import time
from typing import Any

from .procfs import boot_time, read_regular_file, read_stat, start_epoch

TAIL_BYTES = 256 * 1024
TAIL_LINES = 400
LINE_CHARS = 300  # of any box line quoted as evidence
DETAIL_CHARS = 240
EVIDENCE_LINES = 4
KMSG_RECORDS = 20000  # at most read of the kernel's ring buffer
SURVIVOR_GRACE_S = 3.0
DISK_FULL_BYTES = 1 << 20  # a workspace with less free than this when the run died is full

DISK_FULL = re.compile(r"No space left on device|\[Errno 28\]|Errno 28\b|ENOSPC|Disk quota exceeded|"
                       r"\[Errno 122\]|EDQUOT")
CUDA_OOM = re.compile(r"CUDA out of memory|(?:torch\.(?:cuda\.)?)OutOfMemoryError|CUDA error: out of memory")
COLLECTIVE = re.compile(r"Watchdog caught collective operation timeout|ProcessGroupNCCL's watchdog got stuck|"
                        r"(?:gloo|nccl|NCCL|Gloo|ProcessGroup|c10d|collective).*(?:Connection reset by peer|"
                        r"Connection closed by peer|timed out|Timed out)|"
                        r"(?:Connection reset by peer|Connection closed by peer).*(?:gloo|nccl|ProcessGroup|c10d)")
TRACEBACK = "Traceback (most recent call last):"
FRAME = re.compile(r'^\s*File "(?P<file>[^"]{1,400})", line (?P<line>\d{1,9}), in (?P<func>\S{1,200})')
EXCEPTION = re.compile(r"^(?P<name>[A-Za-z_][\w.]{0,120}(?:Error|Exception|Exit|Interrupt|Warning|Fault)|"
                       r"[A-Za-z_][\w.]{0,120}\.[A-Z]\w{0,80})(?::\s?(?P<text>.*))?$")
OOM_KILLED = re.compile(r"Killed process (?P<pid>\d{1,10}) \((?P<name>[^)]{0,64})\)")
OOM_MEMCG = re.compile(r"oom_memcg=(?P<memcg>[^,\s]{1,300})")
CHAIN_LINES = re.compile(r"^(?:CHAIN_DONE rc=|SAMAI_DISK |SAMAI_DEATH |SAMAI_SURVIVORS |=== samai chain )")
SIGNAL_NAMES = dict((int(s), s.name) for s in signal.Signals)


def cut(text: str, n: int = LINE_CHARS) -> str:
    """One line of box text, bounded, its control characters as spaces (the console escapes again)."""
    text = "".join(" " if ord(c) < 32 or ord(c) == 127 else c for c in text.strip())
    return text if len(text) <= n else text[: n - 1] + "…"


def signal_of(rc: int | None) -> int | None:
    """The signal a shell's exit status says killed the stage (128 + N), or a negative rc's."""
    if rc is None:
        return None
    if rc < 0:
        return -rc
    return rc - 128 if 128 < rc < 128 + 65 else None


def signal_name(signum: int) -> str:
    return SIGNAL_NAMES.get(signum, "signal %d" % signum)


# ---------------------------------------------------------------- what the log says


def meaningful(lines: list[str]) -> list[str]:
    """The stage's own lines: not the chain's bookkeeping, not blank."""
    return [line for line in lines if line.strip() and not CHAIN_LINES.match(line)]


def last_exception(lines: list[str]) -> tuple[str, str, list[str]] | None:
    """The last traceback's exception line and the frame it came from, (exception, frame,
    evidence), or None when the lines hold no traceback that ends in one."""
    start = max((i for i, line in enumerate(lines) if line.strip() == TRACEBACK), default=None)
    if start is None:
        return None
    frame, exception = "", ""
    for line in lines[start + 1:]:
        m = FRAME.match(line)
        if m:
            frame = "%s:%s in %s" % (m.group("file").rsplit("/", 1)[-1], m.group("line"), m.group("func"))
            continue
        if not line.startswith((" ", "\t")) and EXCEPTION.match(line.strip()):
            exception = line.strip()
    if not exception:
        return None
    return cut(exception, 200), cut(frame, 120), [cut(TRACEBACK), cut(exception)]


def from_lines(lines: list[str]) -> dict[str, Any] | None:
    """A cause the log's last lines name by themselves, most specific first."""
    own = meaningful(lines)
    for cause, pattern in (("disk_full", DISK_FULL), ("cuda_oom", CUDA_OOM), ("collective_timeout", COLLECTIVE)):
        hits = [line for line in own if pattern.search(line)]
        if hits:
            return verdict(cause, cut(hits[-1], DETAIL_CHARS), [cut(h) for h in hits[-EVIDENCE_LINES:]])
    exc = last_exception(own)
    if exc is not None:
        exception, frame, evidence = exc
        return verdict("exception", exception + (" (at %s)" % frame if frame else ""), evidence)
    return None


def verdict(cause: str, detail: str, evidence: list[str]) -> dict[str, Any]:
    return {"cause": cause, "detail": cut(detail, DETAIL_CHARS), "evidence": [cut(e) for e in evidence][:8]}


def judge(rc: int | None, lines: list[str], oom: dict[str, Any] | None, disk_free: int | None) -> dict[str, Any]:
    """The cause of a run that ended with rc (None: no exit status), most specific first. oom:
    what the kernel's OOM killer did while it ran (oom_evidence), disk_free: the workspace's
    free bytes when it died."""
    signum = signal_of(rc)
    if signum == signal.SIGKILL and oom is not None:
        return verdict("oom_killed", oom["detail"], oom["evidence"])
    said = from_lines(lines)
    if said is not None and said["cause"] == "disk_full":
        return said
    if disk_free is not None and disk_free < DISK_FULL_BYTES:
        return verdict("disk_full", "the workspace's file system was full when it died (%d bytes free)" % disk_free,
                       [line for line in (said or {}).get("evidence", [])])
    if said is not None:
        return said
    if signum is not None:
        return verdict("signal", "killed by %s (rc=%d)" % (signal_name(signum), rc or 0), [])
    own = meaningful(lines)
    last = cut(own[-1], DETAIL_CHARS) if own else "no line of its own in its log"
    return verdict("exit", "exit status %s: %s" % ("unknown" if rc is None else rc, last), [last] if own else [])


# ---------------------------------------------------------------- what the kernel says


def vmstat_oom_kill() -> int | None:
    """The kernel's count of OOM kills since boot (/proc/vmstat oom_kill, Linux >= 4.13)."""
    try:
        for line in read_regular_file("/proc/vmstat", 1 << 16).decode("ascii", "replace").splitlines():
            name, _, value = line.partition(" ")
            if name == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        pass
    return None


def memory_cgroup(pid: str = "self") -> tuple[int, str] | None:
    """(version, path) of a process's memory cgroup: v1's `memory` controller, else v2's."""
    try:
        text = read_regular_file("/proc/%s/cgroup" % pid, 1 << 16).decode("utf-8", "replace")
    except OSError:
        return None
    unified = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if "memory" in parts[1].split(","):
            return 1, parts[2]
        if parts[0] == "0" and parts[1] == "":
            unified = parts[2]
    return (2, unified) if unified is not None else None


def cgroup_memory(version: int, path: str) -> dict[str, Any]:
    """A memory cgroup's OOM kills and limit, as far as they can be read (no root needed)."""
    rel = path.lstrip("/")
    if ".." in rel.split("/"):
        return {}
    base = os.path.join("/sys/fs/cgroup", "memory" if version == 1 else "", rel)
    out: dict[str, Any] = {"path": path, "version": version}
    try:
        if version == 1:
            fields = read_regular_file(os.path.join(base, "memory.oom_control"), 4096).decode("ascii", "replace")
            limit = read_regular_file(os.path.join(base, "memory.limit_in_bytes"), 64).strip()
        else:
            fields = read_regular_file(os.path.join(base, "memory.events"), 4096).decode("ascii", "replace")
            limit = read_regular_file(os.path.join(base, "memory.max"), 64).strip()
        counts = dict(line.split(" ", 1) for line in fields.splitlines() if " " in line)
        out["oom_kill"] = int(counts.get("oom_kill", "0"))
        out["limit"] = None if limit in (b"max", b"") or int(limit) >= 1 << 62 else int(limit)
    except (OSError, ValueError):
        pass
    return out


def baseline() -> dict[str, Any]:
    """What launch.py records before the chain starts: the counters an OOM kill moves."""
    found = memory_cgroup()
    watch: dict[str, Any] = {"oom_kill": vmstat_oom_kill()}
    if found is not None:
        mem = cgroup_memory(*found)
        watch.update(cgroup=found[1], cgroup_version=found[0], cgroup_oom_kill=mem.get("oom_kill"))
    return watch


def kernel_lines(since: float) -> list[str]:
    """The kernel log's messages since `since` (epoch), from /dev/kmsg (readable by root, or
    where dmesg_restrict is 0); empty where it cannot be read."""
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return []
    btime, out = boot_time(), []
    try:
        for _ in range(KMSG_RECORDS):
            try:
                record = os.read(fd, 8192).decode("utf-8", "replace")
            except OSError as e:
                if e.errno == errno.EPIPE:  # overwritten while read: go on with the next
                    continue
                break  # EAGAIN: the end of the buffer
            head, _, message = record.partition(";")
            fields = head.split(",")
            if len(fields) >= 3 and fields[2].isdigit() and btime + int(fields[2]) / 1e6 >= since - 1:
                out.append(message.split("\n", 1)[0])
    finally:
        os.close(fd)
    return out


def oom_evidence(watch: dict[str, Any], fired_at: float) -> dict[str, Any] | None:
    """What the OOM killer did while the run ran, or None when no counter moved and the kernel
    log names no kill since it was fired."""
    evidence, moved = [], False
    before, now = watch.get("oom_kill"), vmstat_oom_kill()
    if isinstance(before, int) and now is not None and now > before:
        moved = True
        evidence.append("the kernel's OOM killer ran %d time(s) while it ran (/proc/vmstat oom_kill %d -> %d)"
                        % (now - before, before, now))
    kernel = kernel_lines(fired_at)
    killed = [m for m in (OOM_KILLED.search(line) for line in kernel) if m]
    if not moved and not killed:
        return None
    detail = "the kernel's OOM killer killed it"
    if killed:
        last = killed[-1]
        detail = "the kernel's OOM killer killed pid %s (%s)" % (last.group("pid"), cut(last.group("name"), 64))
        evidence += [cut(m.string) for m in killed[-2:]]
    memcgs = [m.group("memcg") for m in (OOM_MEMCG.search(line) for line in kernel) if m]
    cgroup = cgroup_said(memcgs[-1] if memcgs else watch.get("cgroup"), watch.get("cgroup_version"))
    if cgroup:
        detail += ", " + cgroup
        evidence.append(cgroup)
    return {"detail": detail, "evidence": evidence}


def cgroup_said(path: Any, version: Any) -> str:
    """Which memory cgroup, with its limit and OOM kills: '' for the root or an unknown one."""
    if not isinstance(path, str) or path in ("", "/"):
        return ""
    if version not in (1, 2):
        found = memory_cgroup()
        version = found[0] if found else 1
    mem = cgroup_memory(version, path)
    said = "in memory cgroup %s" % cut(path, 120)
    if mem.get("limit"):
        said += " (limit %.1f MiB, %s OOM kill(s))" % (mem["limit"] / 2.0 ** 20, mem.get("oom_kill", "?"))
    return said


# ---------------------------------------------------------------- the chain's end


def log_lines(path: str) -> list[str]:
    try:
        data = read_regular_file(path, TAIL_BYTES, from_end=True)
    except OSError:
        return []
    return [line.decode("utf-8", "replace") for line in data.splitlines()[-TAIL_LINES:]]


def workspace_free(workspace: str) -> int | None:
    try:
        st = os.statvfs(workspace)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


DISK_START = re.compile(rb"^SAMAI_DISK start used=(\d{1,20}) ", re.M)


def disk_growth(log: str, workspace: str) -> int | None:
    """How much the workspace's file system gained while the run ran: its used bytes now against
    the chain's SAMAI_DISK start line at the head of the run's log (None: not known)."""
    from .disk import disk_usage

    try:
        found = DISK_START.search(read_regular_file(log, 8192))
        used = disk_usage("workspace", workspace)["used"]
    except (OSError, KeyError, TypeError, ValueError):
        return None
    return used - int(found.group(1)) if found and isinstance(used, int) else None


def with_growth(said: dict[str, Any], growth: int | None) -> dict[str, Any]:
    """A disk_full verdict with what filled it: the workspace's file system's growth while the
    run ran (its own writes, and any other writer's on that file system)."""
    if said["cause"] != "disk_full" or growth is None or growth <= 0:
        return said  # (a file system mounted inside the workspace filled, not the workspace's)
    from .diskline import human

    grew = "the workspace's file system grew by %s while it ran (SAMAI_DISK start to its end)" % human(growth)
    return dict(said, detail=cut("%s · %s" % (said["detail"], grew), DETAIL_CHARS), evidence=said["evidence"] + [grew])


def stop_survivors(chain_pid: int, chain_id: str) -> list[int]:
    """Every process the chain started that still runs, but the chain and this process: TERM,
    then KILL after a grace. The pids it stopped."""
    from .kill import Chain  # the stop's own way of finding a chain's processes

    st = read_stat(chain_pid)
    if st is None:
        return []
    btime = boot_time()
    rec = {"pid": chain_pid, "pgid": chain_pid, "start_time": start_epoch(st["starttime"], btime),
           "chain_id": chain_id}
    chain = Chain(rec, btime)
    mine = {chain_pid, os.getpid()}

    def survivors() -> list[int]:
        return [p for p in chain.look() if p not in mine]

    first = survivors()
    for signum in (signal.SIGTERM, signal.SIGKILL):
        left = survivors()
        if not left:
            break
        for pid in left:
            if chain.ident.alive(pid):  # the same process that was found, not a reuse of its pid
                try:
                    os.kill(pid, signum)
                except OSError:
                    pass
        deadline = time.monotonic() + SURVIVOR_GRACE_S
        while survivors() and time.monotonic() < deadline:
            time.sleep(0.05)
    return first


def main(argv: list[str]) -> int:
    if len(argv) != 3 or not argv[1].lstrip("-").isdigit() or not argv[2].isdigit():
        sys.stderr.write("usage: python3 -m samai_box.death RC CHAIN_PID\n")
        return 2
    rc, chain_pid = int(argv[1]), int(argv[2])
    env = os.environ
    stopped = stop_survivors(chain_pid, env.get("SAMAI_CHAIN", ""))
    if stopped:
        sys.stdout.write("SAMAI_SURVIVORS stopped %s: processes the stage started, still running at its end\n"
                         % " ".join(str(p) for p in stopped))
        sys.stdout.flush()
    path = env.get("SAMAI_DEATH_FILE")
    if rc == 0 or not path:
        return 0
    try:
        watch = json.loads(env.get("SAMAI_DEATH_WATCH") or "{}")
    except ValueError:
        watch = {}
    fired_at = float(watch.get("fired_at") or 0.0) if isinstance(watch, dict) else 0.0
    oom = oom_evidence(watch, fired_at) if isinstance(watch, dict) else None
    workspace = env.get("SAMAI_WORKSPACE", "/")
    said = judge(rc, log_lines(env.get("SAMAI_LOG", "")), oom, workspace_free(workspace))
    said = with_growth(said, disk_growth(env.get("SAMAI_LOG", ""), workspace))
    said["rc"] = rc
    said["time"] = time.time()
    # In the log too, where the runs list (H) reads each run's cause back: one line, no newline.
    sys.stdout.write("SAMAI_DEATH %s: %s\n" % (said["cause"], said["detail"]))
    sys.stdout.flush()
    try:
        with open(path, "w") as f:
            f.write(json.dumps(said))
    except OSError as e:
        sys.stderr.write("samai death: %s\n" % e)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
