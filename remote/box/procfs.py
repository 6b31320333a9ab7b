"""/proc readers and the request/reply loop shared by the box tools. Stdlib only, Python >= 3.8."""

from __future__ import annotations

import errno
import json
import os
import stat
import sys
from typing import Any, Callable, Iterable, Mapping, TypedDict

from .identity import same_start, started_before

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
BOOT_ID: list[str | None] = []  # boot_id(), once read
PF_KTHREAD = 0x00200000  # /proc/PID/stat flags: a kernel thread
CHAIN_VAR = b"SAMAI_CHAIN="  # in a stage's environment: <stage>:<random id>, also in its record (launch.py)


def read_text(path: str) -> str:
    with open(path, "rb") as f:
        return f.read().decode("utf-8", "replace")


def read_regular_file(path: str, limit: int = 1 << 20, from_end: bool = False) -> bytes:
    """At most limit bytes (the first, or the last) of a file that must be a regular one: a stage
    record, a pid or rc file, a log's tail. A FIFO, device or socket put in its place is refused with an OSError
    instead of blocking open() (the open is non-blocking) or being read forever."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
        return os.pread(fd, limit, max(0, st.st_size - limit) if from_end else 0)
    finally:
        os.close(fd)


def json_document(data: bytes) -> Any:
    """The JSON value in bytes anyone on the box could have written (a stage record, a stop note):
    ValueError when they are not JSON, and also when they nest deeper than the decoder goes (a
    RecursionError there would have ended the whole reply)."""
    try:
        return json.loads(data.decode("utf-8", "replace"))
    except RecursionError:
        raise ValueError("JSON nested too deep") from None


def read_proc(path: str, size: int = 4096, limit: int | None = None) -> bytes:
    """All of a one-record /proc file (PID/stat, cmdline, schedstat, fdinfo/FD), or its first
    limit bytes, with os.open and os.read: a Python file object costs several syscalls more.
    Such a file answers a read with all it holds up to size, so a short read is its end; a
    many-record one like /proc/net/tcp may not, and is read with read_text."""
    fd = os.open(path, os.O_RDONLY)
    try:
        data = os.read(fd, size)
        if len(data) < size:
            return data
        chunks, held = [data], len(data)
        while chunks[-1] and (limit is None or held < limit):
            chunks.append(os.read(fd, 65536))
            held += len(chunks[-1])
        return b"".join(chunks)[:limit]
    finally:
        os.close(fd)


def boot_time() -> int:
    for line in read_text("/proc/stat").splitlines():
        if line.startswith("btime "):
            return int(line.split()[1])
    raise RuntimeError("no btime in /proc/stat")


def boot_id() -> str | None:
    """This boot's random id (None where the kernel does not tell it); read once, since no
    process outlives its boot."""
    if not BOOT_ID:
        try:
            BOOT_ID.append(read_text("/proc/sys/kernel/random/boot_id").strip() or None)
        except OSError:
            BOOT_ID.append(None)
    return BOOT_ID[0]


def record_btime(rec: Mapping[str, Any], btime: float) -> float:
    """The boot time to read a recorded start time against. /proc/stat's btime moves when the
    clock is stepped (chrony's makestep, a VM resumed); a process's start in ticks since boot
    does not. So a start time recorded with the boot time it was computed from ("boot_time")
    is read against that one, while this is still the boot it was recorded on ("boot_id");
    anything else against btime (a record from another boot then matches no process)."""
    if rec.get("boot_time") is None or not rec.get("boot_id"):
        return btime
    if rec["boot_id"] != boot_id():
        return btime
    return rec["boot_time"]


def settled_btime(ticks: int, start_time: float, btime: float) -> float:
    """btime, or the second beside it when that one gives a process started `ticks` after boot
    the start time the caller holds. The kernel works btime out anew at each read (the wall
    clock less the time since boot, cut to a whole second), so two reads a moment apart can
    differ by exactly one; a start time that came without the boot time it was read against
    may have met the other second. Only whole-second steps: the tick still has to match."""
    for near in (btime, btime - 1, btime + 1):
        if same_start(start_epoch(ticks, near), start_time):
            return near
    return btime


def uptime() -> float:
    return float(read_text("/proc/uptime").split()[0])


class Stat(TypedDict):
    """The fields of /proc/PID/stat that the tools read (parse_stat)."""

    comm: str
    state: str
    ppid: int
    pgid: int
    sid: int
    utime: int
    stime: int
    starttime: int
    rss_pages: int
    flags: int
    threads: int


def parse_stat(raw: str) -> Stat:
    """Fields of /proc/PID/stat after the command name (which may hold spaces and ')')."""
    close = raw.rindex(")")
    comm = raw[raw.index("(") + 1 : close]
    rest = raw[close + 2 :].split(" ", 22)  # fields 3..24 are all that is read; leave the rest whole
    # rest[0] is field 3 (state); field N is rest[N - 3].
    return {
        "comm": comm,
        "state": rest[0],
        "ppid": int(rest[1]),
        "pgid": int(rest[2]),
        "sid": int(rest[3]),
        "utime": int(rest[11]),
        "stime": int(rest[12]),
        "starttime": int(rest[19]),
        "rss_pages": int(rest[21]),
        "flags": int(rest[6]),
        "threads": int(rest[17]),
    }


def start_epoch(starttime_ticks: int, btime: float) -> float:
    """A process's start time as epoch seconds, rounded to the kernel's tick."""
    return round(btime + starttime_ticks / float(CLK_TCK), 2)


def read_stat(pid: int) -> Stat | None:
    """parse_stat of a live pid, or None when it is gone."""
    try:
        return parse_stat(read_text("/proc/%d/stat" % pid))
    except (OSError, ValueError, IndexError):
        return None


def alive(pid: int, start_time: float | None, btime: float) -> bool:
    """True while pid is the very process that started at start_time and is not a zombie."""
    st = read_stat(pid)
    return st is not None and st["state"] != "Z" and same_start(start_epoch(st["starttime"], btime), start_time)


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) pids of a process group."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = read_stat(int(name))
            if st and st["pgid"] == pgid and st["state"] != "Z":
                out.append(int(name))
    return sorted(out)


def live_processes(btime: float) -> dict[int, dict[str, Any]]:
    """{pid: {"ppid", "pgid", "start_time" (epoch, read against btime), "state", "flags"}} of
    every process that is not a zombie: the shape of the probe's entries that chain_pids reads."""
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = read_stat(int(name))
            if st and st["state"] != "Z":
                out[int(name)] = {"ppid": st["ppid"], "pgid": st["pgid"], "state": st["state"], "flags": st["flags"],
                                  "start_time": start_epoch(st["starttime"], btime)}
    return out


class ChainMarkers(object):
    """The chain marker each process was started with: SAMAI_CHAIN from /proc/PID/environ,
    which launch.py puts in a stage's environment. Every process the chain starts inherits it,
    whatever session or group it moves to; one that clears its environment is still found as a
    descendant (chain_pids). Only a process of the same user (or any, as root) can be read.
    Kept by (pid, start time) for as long as that process lives: what a process was started
    with does not change, and an exec that drops the marker keeps it here, which errs towards
    following the process."""

    def __init__(self) -> None:
        self.known: dict[tuple[int, float], str | None] = {}

    def __call__(self, pid: int, start_time: float) -> str | None:
        key = (pid, start_time)
        if key not in self.known:
            self.known[key] = read_marker(pid)
        return self.known[key]

    def keep_only(self, table: Mapping[int, Mapping[str, Any]]) -> None:
        """Forget every process that is not in table (pid -> entry)."""
        self.known = dict((k, v) for k, v in self.known.items()
                          if k[0] in table and table[k[0]]["start_time"] == k[1])


def read_marker(pid: int) -> str | None:
    try:
        data = read_proc("/proc/%d/environ" % pid, 65536)
    except OSError:  # gone, or another user's
        return None
    at = data.find(b"\0" + CHAIN_VAR)
    if at < 0:
        if not data.startswith(CHAIN_VAR):
            return None
        at = -1
    start = at + 1 + len(CHAIN_VAR)
    end = data.find(b"\0", start)
    return data[start:end if end >= 0 else len(data)].decode("utf-8", "replace")


def chain_pids(table: Mapping[int, Mapping[str, Any]], rec: Mapping[str, Any], offset: float,
               marker_of: Callable[[int, float], str | None]) -> set[int]:
    """Every live process that a stage's chain started, as the stage's record (from launch.py)
    and table (live_processes, or the probe's entries by pid) tell them: its chain process if it
    is still the one recorded; the members of its process group; every process that carries its
    chain marker (marker_of(pid, start_time), see ChainMarkers); and every descendant of these
    by parent pid. Start times in table are read against a boot time `offset` seconds before
    the record's (record_btime). Nothing born before the chain can be one of its processes:
    that keeps out a group that took over a pgid long free, and a record from another boot."""
    start = rec.get("start_time")
    if start is None:
        return set()

    def born_since(pid: int) -> bool:
        return not started_before(table[pid]["start_time"] + offset, start)

    found: set[int] = set()
    pid = rec.get("pid")
    leader = table.get(pid) if isinstance(pid, int) else None  # a record's pid may be any JSON
    if leader and leader["state"] != "Z" and same_start(leader["start_time"] + offset, start):
        found.add(rec["pid"])
    if not leader or rec.get("pid") in found:  # a live pgid held by another process is not ours
        pgid = rec.get("pgid")
        found.update(p for p, e in table.items() if e["pgid"] == pgid and e["state"] != "Z" and born_since(p))
    marker = rec.get("chain_id")
    if marker:
        found.update(p for p, e in table.items() if p not in found and e["state"] != "Z" and born_since(p)
                     and marker_of(p, e["start_time"]) == marker)
    return found | descendants(found, table)


def descendants(pids: Iterable[int], table: Mapping[int, Mapping[str, Any]]) -> set[int]:
    """Every live process below pids by parent pid, in table (live_processes)."""
    children: dict[int, list[int]] = {}
    for pid, e in table.items():
        if e["state"] != "Z":
            children.setdefault(e["ppid"], []).append(pid)
    found: set[int] = set()
    todo = list(pids)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def is_kernel_thread(pid: int, st: Stat) -> bool:
    """A kernel thread (PF_KTHREAD), kthreadd (pid 2) or one of its children: never signalled."""
    if pid == 2 or st["flags"] & PF_KTHREAD:
        return True
    if st["ppid"] != 2:
        return False
    parent = read_stat(2)  # in a pid namespace, pid 2 may be an ordinary process
    return parent is not None and (parent["comm"] == "kthreadd" or bool(parent["flags"] & PF_KTHREAD))


def ancestors(pid: int) -> list[int]:
    """pid and every process above it up to init."""
    chain: list[int] = []
    while pid > 0 and pid not in chain:
        chain.append(pid)
        st = read_stat(pid)
        if not st:
            break
        pid = st["ppid"]
    return chain


def one_line(error: BaseException) -> str:
    """An exception as one line of text: its type and its message, newlines folded."""
    return " ".join(("%s: %s" % (type(error).__name__, error)).split())


def serve(name: str, handler: Callable[[Any], Any], on_os_error: Callable[[OSError], Any] | None = None) -> int:
    """One JSON request on stdin, one JSON reply on stdout. A request the tool cannot read is
    exit 2 with the reason on stderr; an OSError becomes on_os_error's reply when given. Any
    other failure is a one-line error reply, never a traceback: the console shows it as it is."""
    try:
        reply = handler(json.loads(sys.stdin.read()))
    except (ValueError, KeyError, TypeError) as e:
        sys.stderr.write("%s: bad request: %s\n" % (name, one_line(e)))
        return 2
    except OSError as e:
        reply = on_os_error(e) if on_os_error is not None else {"error": "%s: %s" % (name, one_line(e))}
    except Exception as e:  # a bug, or something /proc said that no reader expected
        reply = {"error": "%s: %s" % (name, one_line(e))}
    sys.stdout.write(json.dumps(reply) + "\n")
    return 0
