"""Why a stage's run ended badly, said by its chain as it ends, and nothing of it left running.

Runs ON the box: `python3 -S -m samai_box.death RC CHAIN_PID STAGE_PID`, from the chain script's
finish (launch.py), the run's nonce on its stdin, before it writes CHAIN_DONE. Standard library
only, Python >= 3.8. It

1. stops every process the chain started that still runs (a helper that outlived the stage
   would go on writing into its log after CHAIN_DONE), TERM then KILL, each by pid and start
   time, never the chain itself or this process;
2. for an rc other than 0, judges the cause from the evidence at the run's end and writes it as
   JSON to $SAMAI_DEATH_FILE: {"cause", "detail", "evidence": [...]}, and as one line into the
   log: `SAMAI_DEATH CAUSE: DETAIL [run NONCE]` (chainline.py).

The evidence at the run's end: its final error report (the last Python traceback, or a C++
`terminate called ... what():`, when the log ends with it: its exception and the lines it spans;
else the run's last few lines), the exit status, the workspace's file system, and the kernel's
record of an OOM kill that names one of the run's pids or its own memory cgroup. A phrase
earlier in the log (a sample that held "No space left on device", an error caught and logged)
decides nothing, and neither does an OOM kill of another process on the box.

The log lines are the stage's (anyone's) text: each is cut to a bounded length and the verdict
is built from what was matched, never by evaluating it; a line shaped like the chain's is
evidence of nothing (the chain's own, or a copy). The console adds what only it knows (a stop
by the operator, a reboot, a GPU's Xid, a peer rank's death): console/core/death.py.

The baseline the OOM verdict compares against is taken by launch.py before the chain starts
(SAMAI_DEATH_WATCH: {"oom_kill", "cgroup", "cgroup_version", "cgroup_oom_kill", "fired_at"}).
"""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import sys
import time
from typing import Any, Iterable, NamedTuple, Optional

from .chainline import looks_like_chain, read_nonce, said_by_chain, signed
from .procfs import boot_time, read_marker, read_regular_file, read_stat, start_epoch

TAIL_BYTES = 256 * 1024
TAIL_LINES = 400
LINE_CHARS = 300  # of any box line quoted as evidence
DETAIL_CHARS = 240
EVIDENCE_LINES = 4
KMSG_RECORDS = 20000  # at most read of the kernel's ring buffer
SURVIVOR_GRACE_S = 3.0
DISK_FULL_BYTES = 1 << 20  # a workspace with less free than this when the run died is full
FINAL_LINES = 3  # with no error report at its end, a run's last lines are its final words
AFTER_REPORT = 20  # lines after an error report that leave it the run's last (a launcher's summary, a logger's flush)
REPORT_LINES = 400  # the most lines one report spans (interleaved output of other ranks included)

DISK_FULL = re.compile(r"No space left on device|\[Errno 28\]|Errno 28\b|ENOSPC|Disk quota exceeded|"
                       r"\[Errno 122\]|EDQUOT")
CUDA_OOM = re.compile(r"CUDA out of memory|(?:torch\.(?:cuda\.)?)OutOfMemoryError|CUDA error: out of memory")
COLLECTIVE = re.compile(r"Watchdog caught collective operation timeout|ProcessGroupNCCL's watchdog got stuck|"
                        r"NCCL communicator was aborted|"
                        r"(?:gloo|nccl|NCCL|Gloo|ProcessGroup|c10d|collective).*(?:Connection reset by peer|"
                        r"Connection closed by peer|timed out|Timed out)|"
                        r"(?:Connection reset by peer|Connection closed by peer).*(?:gloo|nccl|ProcessGroup|c10d)")
TRACEBACK = "Traceback (most recent call last):"
TERMINATE = re.compile(r"^terminate called after throwing an instance of ")
WHAT = re.compile(r"^\s*what\(\):\s+(?P<text>.*)$")
CPP_FRAME = re.compile(r"^(?:frame #\d{1,4}:|Exception raised from )")
FRAME = re.compile(r'^\s*File "(?P<file>[^"]{1,400})", line (?P<line>\d{1,9}), in (?P<func>\S{1,200})')
EXCEPTION = re.compile(r"^(?P<name>[A-Za-z_][\w.]{0,120}(?:Error|Exception|Exit|Interrupt|Warning|Fault)|"
                       r"[A-Za-z_][\w.]{0,120}\.[A-Z]\w{0,80})(?::\s?(?P<text>.*))?$")
OOM_KILLED = re.compile(r"Killed process (?P<pid>\d{1,10}) \((?P<name>[^)]{0,64})\)")
# The kernel's record of one kill (Linux >= 4.19): the pid is the last but one field, after a
# task name that may hold anything.
OOM_RECORD = re.compile(r"oom-kill:(?P<head>.{0,2000}?),task=.{0,64},pid=(?P<pid>\d{1,10}),uid=\d{1,10}\s*$")
WRAPPERS = ("ChildFailedError",)  # a launcher's report of a child whose own traceback came before it
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
    """The stage's own lines: not blank, and not shaped like the chain's (the chain's own, or a
    copy the stage printed: either way no evidence of how the stage ended)."""
    return [line for line in lines if line.strip() and not looks_like_chain(line)]


class Report(NamedTuple):
    """One error report in the stage's lines: where it starts and ends (indices), its exception
    line and the frame it was raised in (Python), or C++'s what()."""

    start: int
    end: int
    exception: str
    frame: str

    @property
    def wrapper(self) -> bool:
        name = self.exception.split(":", 1)[0]
        return name.rsplit(".", 1)[-1] in WRAPPERS


def python_report(own: list[str], start: int) -> Report | None:
    """The traceback that starts at own[start]: up to its exception line (the first unindented
    line that is one; other unindented lines are another process's, interleaved), or None when
    it ends before one (cut, or another traceback begins)."""
    frame = ""
    for i in range(start + 1, min(len(own), start + REPORT_LINES)):
        line = own[i]
        if line.strip() == TRACEBACK:
            return None
        m = FRAME.match(line)
        if m:
            frame = "%s:%s in %s" % (m.group("file").rsplit("/", 1)[-1], m.group("line"), m.group("func"))
            continue
        if not line.startswith((" ", "\t")) and EXCEPTION.match(line.strip()):
            return Report(start, i, cut(line.strip(), 200), cut(frame, 120))
    return None


def cpp_report(own: list[str], start: int) -> Report | None:
    """C++'s std::terminate at own[start]: its what() (the exception's message) and the frames
    after it (torch's `Exception raised from ...`, `frame #N: ...`)."""
    what, end = "", start
    for i in range(start + 1, min(len(own), start + REPORT_LINES)):
        m = WHAT.match(own[i])
        if m and not what:
            what, end = m.group("text"), i
        elif what and CPP_FRAME.match(own[i].strip()):
            end = i
        elif what:
            break
    if not what:
        return None
    name = own[start][len("terminate called after throwing an instance of "):].strip().strip("'")
    return Report(start, end, cut("%s: %s" % (name, what), 200), "")


def reports(own: list[str]) -> list[Report]:
    """Every whole error report in the stage's lines, in order."""
    out = []
    for i, line in enumerate(own):
        found = python_report(own, i) if line.strip() == TRACEBACK else \
            cpp_report(own, i) if TERMINATE.match(line) else None
        if found is not None:
            out.append(found)
    return out


class FinalError(NamedTuple):
    """What the run's end says of how it ended: the lines a cause may be read from (its final
    error report's, or its last few lines), and that report."""

    lines: list[str]
    report: Optional[Report]


def final_error(own: list[str]) -> FinalError:
    """The run's final error: its last error report when the log ends with it (at most
    AFTER_REPORT lines after it; a launcher's report of a failed child stands for the child's
    report before it), else its last FINAL_LINES lines. What came before says nothing."""
    found = reports(own)
    last = found[-1] if found else None
    if last is None or len(own) - 1 - last.end > AFTER_REPORT:
        return FinalError(own[-FINAL_LINES:], None)
    if last.wrapper and len(found) > 1:
        child = found[-2]
        return FinalError(own[child.start: child.end + 1] + own[last.start: last.end + 1], child)
    return FinalError(own[last.start: last.end + 1], last)


def from_end(lines: list[str]) -> dict[str, Any] | None:
    """A cause the run's final error names by itself, most specific first."""
    end = final_error(meaningful(lines))
    for cause, pattern in (("disk_full", DISK_FULL), ("cuda_oom", CUDA_OOM), ("collective_timeout", COLLECTIVE)):
        hits = [line for line in end.lines if pattern.search(line)]
        if hits:
            return verdict(cause, cut(hits[-1], DETAIL_CHARS), [cut(h) for h in hits[-EVIDENCE_LINES:]])
    if end.report is not None:
        report = end.report
        first = TRACEBACK if end.lines[0].strip() == TRACEBACK else end.lines[0]
        return verdict("exception", report.exception + (" (at %s)" % report.frame if report.frame else ""),
                       [cut(first), cut(report.exception)])
    return None


def verdict(cause: str, detail: str, evidence: list[str]) -> dict[str, Any]:
    return {"cause": cause, "detail": cut(detail, DETAIL_CHARS), "evidence": [cut(e) for e in evidence][:8]}


def judge(rc: int | None, lines: list[str], oom: dict[str, Any] | None, disk_free: int | None,
          elsewhere: Iterable[str] = ()) -> dict[str, Any]:
    """The cause of a run that ended with rc (None: no exit status), most specific first. oom:
    the run's own OOM kill (oom_evidence), disk_free: the workspace's free bytes when it died,
    elsewhere: the OOM kills of other processes in its window (said beside a SIGKILL, never its cause)."""
    signum = signal_of(rc)
    if signum == signal.SIGKILL and oom is not None:
        return verdict("oom_killed", oom["detail"], oom["evidence"])
    said = from_end(lines)
    if said is not None and said["cause"] == "disk_full":
        return said
    if disk_free is not None and disk_free < DISK_FULL_BYTES:
        return verdict("disk_full", "the workspace's file system was full when it died (%d bytes free)" % disk_free,
                       [line for line in (said or {}).get("evidence", [])])
    if said is not None:
        return said
    if signum is not None:
        return verdict("signal", "killed by %s (rc=%d)" % (signal_name(signum), rc or 0),
                       list(elsewhere) if signum == signal.SIGKILL else [])
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


class OomKill(NamedTuple):
    """One OOM kill as the kernel logged it: the pid and name it killed, the memory cgroup it
    was in and the one whose limit was hit ('' where the kernel's lines do not say)."""

    pid: int
    name: str
    task_memcg: str
    oom_memcg: str
    lines: tuple


def oom_kills(kernel: list[str]) -> list[OomKill]:
    """The OOM kills in kernel log messages: each `Killed process PID (NAME)` with the
    `oom-kill:...,oom_memcg=...,task_memcg=...,task=NAME,pid=PID,uid=U` record before it."""
    records: dict[int, tuple[str, str, str]] = {}
    out = []
    for line in kernel:
        m = OOM_RECORD.search(line)
        if m:
            head = m.group("head")
            records[int(m.group("pid"))] = (field_of(head, "task_memcg"), field_of(head, "oom_memcg"), line)
            continue
        m = OOM_KILLED.search(line)
        if m:
            pid = int(m.group("pid"))
            task_memcg, oom_memcg, record = records.pop(pid, ("", "", ""))
            lines = tuple(cut(x) for x in (record, line) if x)
            out.append(OomKill(pid, cut(m.group("name"), 64), task_memcg, oom_memcg, lines))
    return out


def field_of(head: str, name: str) -> str:
    """NAME=VALUE among the comma-separated fields of an oom-kill record ('' if absent)."""
    for part in head.split(","):
        key, _, value = part.partition("=")
        if key == name:
            return value[:300]
    return ""


def cgroup_folder(version: Any, path: Any) -> str | None:
    """Where a memory cgroup is in /sys/fs/cgroup (None for the root, an unknown one, or a path
    that leaves it)."""
    if version not in (1, 2) or not isinstance(path, str) or path in ("", "/"):
        return None
    rel = path.lstrip("/")
    if ".." in rel.split("/"):
        return None
    return os.path.join("/sys/fs/cgroup", "memory" if version == 1 else "", rel)


def own_cgroup(watch: dict[str, Any], chain_id: str) -> bool:
    """Whether the run's memory cgroup (the one it was fired in) is its own: every process in it
    now is one its chain started (it carries the chain's marker). A cgroup the run shares with
    anything else (the box's, a container's, a session's) is not, and an OOM kill in it says
    nothing about this run."""
    folder = cgroup_folder(watch.get("cgroup_version"), watch.get("cgroup"))
    if folder is None or not chain_id:
        return False
    try:
        pids = [int(p) for p in read_regular_file(os.path.join(folder, "cgroup.procs"), 1 << 20).split()]
    except (OSError, ValueError):
        return False
    return bool(pids) and all(read_marker(pid) == chain_id for pid in pids)


def oom_evidence(watch: dict[str, Any], fired_at: float, pids: Iterable[int],
                 chain_id: str = "") -> tuple[dict[str, Any] | None, list[str]]:
    """The run's own OOM kill while it ran, or None; and what the OOM killer did elsewhere on
    the box meanwhile (said beside the verdict, never its cause). A kill is the run's when the
    kernel's record names one of its pids, or when the run's memory cgroup is its own and the
    kill was in it (the record's task_memcg or oom_memcg, or that cgroup's own oom_kill counter
    moved since the baseline). The box's /proc/vmstat counter says only that some process was
    killed somewhere."""
    mine, cgroup = set(pids), watch.get("cgroup")
    own = own_cgroup(watch, chain_id)
    kills = oom_kills(kernel_lines(fired_at))
    ours = [k for k in kills if k.pid in mine or (own and cgroup in (k.task_memcg, k.oom_memcg))]
    moved = ""
    if own:
        before = watch.get("cgroup_oom_kill")
        now = cgroup_memory(watch.get("cgroup_version") or 0, str(cgroup)).get("oom_kill")
        if isinstance(before, int) and isinstance(now, int) and now > before:
            moved = "its own memory cgroup's OOM kills went from %d to %d while it ran" % (before, now)
    others = [k for k in kills if k not in ours]
    elsewhere = []
    if others:
        named = ", ".join("pid %d (%s)" % (k.pid, k.name) for k in others[-3:])
        elsewhere.append(cut("the kernel's OOM killer killed %d other process(es) on the box while it ran, none of "
                             "them this run's: %s" % (len(others), named)))
    else:
        before, now = watch.get("oom_kill"), vmstat_oom_kill()
        if isinstance(before, int) and now is not None and now > before:
            elsewhere.append("the kernel's OOM killer ran %d time(s) on the box while it ran (/proc/vmstat "
                             "oom_kill %d -> %d), in no process known to be this run's" % (now - before, before, now))
    if not ours and not moved:
        return None, elsewhere
    evidence = [moved] if moved else []
    detail = "the kernel's OOM killer killed it"
    if ours:
        last = ours[-1]
        detail = "the kernel's OOM killer killed pid %d (%s)" % (last.pid, last.name)
        evidence.append("the kernel's record names pid %d, one of the run's" % last.pid if last.pid in mine
                        else "the kernel's record names the run's own memory cgroup")
        evidence += list(last.lines)
    said = cgroup_said(ours[-1].oom_memcg or ours[-1].task_memcg if ours else cgroup, watch.get("cgroup_version"))
    if said:
        detail += ", " + said
        evidence.append(said)
    return {"detail": detail, "evidence": evidence}, []


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


DISK_START = re.compile(r"^SAMAI_DISK start used=(\d{1,20}) ")


def disk_growth(log: str, workspace: str, nonce: str) -> int | None:
    """How much the workspace's file system gained while the run ran: its used bytes now against
    the chain's own SAMAI_DISK start line (this run's nonce) at the head of the run's log (None:
    not known)."""
    from .disk import disk_usage

    try:
        head = read_regular_file(log, 8192).decode("utf-8", "replace").splitlines()
        used = disk_usage("workspace", workspace)["used"]
    except (OSError, KeyError, TypeError, ValueError):
        return None
    starts = [m for m in (DISK_START.match(said_by_chain(line, nonce) or "") for line in head) if m]
    return used - int(starts[0].group(1)) if starts and isinstance(used, int) else None


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


def say(text: str, nonce: str) -> None:
    """One of the chain's lines into the log (this process's stdout), with the run's tag."""
    sys.stdout.write(signed(" ".join(text.split()), nonce) + "\n")
    sys.stdout.flush()


def death_watch(env: Any) -> dict[str, Any]:
    """launch.py's baseline (SAMAI_DEATH_WATCH), or {} where it is not one."""
    try:
        watch = json.loads(env.get("SAMAI_DEATH_WATCH") or "{}")
        if isinstance(watch, dict):
            watch["fired_at"] = float(watch.get("fired_at") or 0.0)
            return watch
    except (TypeError, ValueError, OverflowError):
        pass
    return {"fired_at": 0.0}


def main(argv: list[str]) -> int:
    if len(argv) not in (3, 4) or not argv[1].lstrip("-").isdigit() or not all(a.isdigit() for a in argv[2:]):
        sys.stderr.write("usage: python3 -m samai_box.death RC CHAIN_PID [STAGE_PID]\n")
        return 2
    rc, chain_pid = int(argv[1]), int(argv[2])
    stage_pid = int(argv[3]) if len(argv) == 4 else 0  # $!: the process the chain started the stage as
    nonce = read_nonce()
    env = os.environ
    chain_id = env.get("SAMAI_CHAIN", "")
    stopped = stop_survivors(chain_pid, chain_id)
    if stopped:
        say("SAMAI_SURVIVORS stopped %s: processes the stage started, still running at its end"
            % " ".join(str(p) for p in stopped), nonce)
    path = env.get("SAMAI_DEATH_FILE")
    if rc == 0 or not path:
        return 0
    watch = death_watch(env)
    pids = set([p for p in (chain_pid, stage_pid) if p > 0] + stopped)
    oom, elsewhere = oom_evidence(watch, watch["fired_at"], pids, chain_id)
    workspace = env.get("SAMAI_WORKSPACE", "/")
    said = judge(rc, log_lines(env.get("SAMAI_LOG", "")), oom, workspace_free(workspace), elsewhere)
    said = with_growth(said, disk_growth(env.get("SAMAI_LOG", ""), workspace, nonce))
    said["rc"] = rc
    said["time"] = time.time()
    # In the log too, where the runs list (H) reads each run's cause back: one line.
    say("SAMAI_DEATH %s: %s" % (said["cause"], said["detail"]), nonce)
    try:
        with open(path, "w") as f:
            f.write(json.dumps(said))
    except OSError as e:
        sys.stderr.write("samai death: %s\n" % e)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
