"""Processes from /proc: one reply entry each, and what a --serve probe may keep of them.

Runs ON the box, imported by probe.py. Standard library only, Python >= 3.8.
"""

from __future__ import annotations

import os
import pwd
import resource
from typing import Any, Callable, List, Optional, Tuple

from .procfs import CLK_TCK, PAGE_SIZE, parse_stat, read_proc, start_epoch

PF_KTHREAD = 0x00200000  # /proc/PID/stat flags: a kernel thread
HZ = float(CLK_TCK)
RESERVED_FDS = 256  # of the probe's descriptor limit, left for everything but OpenFiles
# Of a command line (up to 2 MiB or more on Linux), what is sent: a thousand processes of a
# long one each stay far inside the largest reply the console takes (transport.MAX_FRAME_BYTES).
MAX_CMDLINE = 16 * 1024
# (pid, fd, what the descriptor's link names) from an fd walk (sockets.fd_links)
Link = Tuple[int, str, str]
# (path ending in "/", its st_dev or None): the folder whose files sockets.writers looks at
Folder = Tuple[str, Optional[int]]


class UserNames:
    """uid -> user name, read once per uid for as long as the user database is unchanged."""

    PASSWD = "/etc/passwd"

    def __init__(self) -> None:
        self.cache: dict[int, str] = {}
        self.kernel_uid: int | None = None  # the owner of a kernel thread's /proc/PID, the same for all
        self.signature = self.passwd_signature()

    @classmethod
    def passwd_signature(cls) -> tuple[int, int, int] | None:
        try:
            st = os.stat(cls.PASSWD)
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def still_valid(self) -> bool:
        return self.passwd_signature() == self.signature

    def __call__(self, uid: int) -> str:
        if uid not in self.cache:
            try:
                self.cache[uid] = pwd.getpwuid(uid).pw_name
            except KeyError:
                self.cache[uid] = str(uid)
        return self.cache[uid]


class Facts(object):
    """What a process cannot change without running, kept between --serve requests: its command
    line, its owner and its open descriptors. Only a process's own threads exec, rewrite argv,
    change uid, open and close files; so while a single-threaded process has not run since its
    facts were read, they still hold. "Has not run" is read from /proc/PID/schedstat: its run
    time in nanoseconds, taken before the facts, has grown by the time it leaves a CPU (and one
    on a CPU as its stat is read is in state R, which is never trusted). Its stat is read anew
    every time (a sleeping process's parent can die, its pages can be reclaimed); when that has
    not moved by a byte either, its whole entry holds: the very entry object is given again, so
    that a reply can tell it unchanged by identity. User names are kept with it for as long as
    /etc/passwd is unchanged (a user renamed in a directory service other than that file shows
    when the process next runs). The paths of its open files are not facts of its own: see fd_links.
    Out of reach of this: a debugger writing into its memory, and a process that shares its
    memory or its descriptor table without being one of its threads (clone without
    CLONE_THREAD, which no program does by accident), which could change them while it sleeps."""

    def __init__(self) -> None:
        self.kept: dict[int, Kept] = {}  # pid -> Kept, from the last request
        self.now: dict[int, Kept] = {}  # pid -> Kept, confirmed or read anew in this request: the next one's kept
        self.user_name = UserNames()
        self.files = OpenFiles()

    def begin(self) -> None:
        self.kept, self.now = self.now, {}
        if not self.user_name.still_valid():  # the kept entries hold names that may be stale
            self.kept, self.user_name = {}, UserNames()


class Kept(object):
    """One process's facts and its last reply entry, as Facts keeps them."""

    __slots__ = ("stat", "btime", "sched", "uid", "argv", "entry", "start_s", "fds", "plan")
    stat: bytes
    btime: float
    sched: bytes
    uid: int | None
    argv: list[str] | None
    entry: dict[str, Any]
    start_s: float
    fds: list[tuple[str, str]] | None
    plan: tuple[Folder | None, List[Link], List[str]] | None

    def __init__(self, sched: bytes, uid: int | None, argv: list[str] | None) -> None:
        self.sched, self.uid, self.argv = sched, uid, argv
        self.fds = None  # [(fd, link), ...] once fd_links has listed them
        self.plan = None  # (folder, the (pid, fd, link) to give as they are, the fds to read again)


class OpenFiles(object):
    """/proc/PID/stat and schedstat kept open between --serve requests. A read at offset 0 of an
    open one is as fresh as a new open's, and costs one syscall instead of three; and the
    descriptor stays bound to its process, not its pid: once that process is gone it reads
    ESRCH, never the file of another process given the same pid. At most `limit` are kept, so
    that the probe never runs out of descriptors; beyond that, files are opened per read."""

    def __init__(self, limit: int | None = None) -> None:
        if limit is None:
            limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0] - RESERVED_FDS
        self.limit = max(0, limit)
        self.fds: dict[tuple[int, str], int] = {}  # (pid, "stat" | "schedstat") -> fd
        self.pids: set[int] = set()  # as keep_only was last told: every pid with a file open is one of them

    def read(self, pid: int, name: str) -> bytes:
        key = (pid, name)
        fd = self.fds.get(key)
        if fd is not None:
            try:
                return self.pread(fd, key)
            except OSError:  # its process is gone; the pid may be another's now
                os.close(self.fds.pop(key))
        if len(self.fds) >= self.limit:
            return read_proc("/proc/%d/%s" % key)
        fd = os.open("/proc/%d/%s" % key, os.O_RDONLY)
        try:
            data = self.pread(fd, key)
        except OSError:
            os.close(fd)
            raise
        self.fds[key] = fd
        return data

    @staticmethod
    def pread(fd: int, key: tuple[int, str]) -> bytes:
        data = os.pread(fd, 4096, 0)
        return data if len(data) < 4096 else read_proc("/proc/%d/%s" % key)

    def keep_only(self, pids: set[int]) -> None:
        """Close the files of every process but these (a set)."""
        for pid in self.pids - pids:
            for name in ("stat", "schedstat"):
                fd = self.fds.pop((pid, name), None)
                if fd is not None:
                    os.close(fd)
        self.pids = pids


def fresh_read(pid: int, name: str) -> bytes:
    return read_proc("/proc/%d/%s" % (pid, name))


def schedstat(pid: int, read: Callable[[int, str], bytes], sched: bytes | None = None) -> bytes | None:
    """/proc/PID/schedstat (or sched, read from it already), or None where it tells nothing:
    missing, or zeros from a kernel built without scheduler statistics."""
    if sched is None:
        try:
            sched = read(pid, "schedstat")
        except OSError:
            return None
    fields = sched.split()
    if len(fields) < 3 or fields[0] == b"0" or fields[2] == b"0":
        return None
    return sched


def read_process(pid: int, btime: float, user_name: UserNames,
                 facts: Facts | None = None) -> tuple[dict[str, Any], bool]:
    """The reply entry of one process, and whether it is a kernel thread (which has no command
    line and no open files: neither is read)."""
    base = "/proc/%d" % pid
    read: Callable[[int, str], bytes] = facts.files.read if facts is not None else fresh_read
    raw = read(pid, "stat")
    kept = facts.kept.get(pid) if facts is not None else None
    sched = None
    if kept is not None and kept.stat == raw and kept.btime == btime:
        try:
            sched = read(pid, "schedstat")
        except OSError:
            sched = None
        if sched == kept.sched and facts is not None:  # which was found telling when it was kept (kept: from facts)
            facts.now[pid] = kept
            return kept.entry, False
    st = parse_stat(raw.decode("utf-8", "replace"))
    kthread = bool(st["flags"] & PF_KTHREAD)
    cacheable = facts is not None and not kthread and st["threads"] == 1 and st["state"] not in ("R", "Z", "X")
    if cacheable:
        sched = schedstat(pid, read, sched)  # before the facts: a run after this read shows next time
    if not cacheable or sched is None:
        kept = None
    elif kept is None or kept.sched != sched or kept.start_s != st["starttime"] / HZ:
        kept = Kept(sched, None, None)
    if kthread:  # every kernel thread's /proc/PID belongs to root (as this namespace sees it)
        argv = []
        if user_name.kernel_uid is None:
            user_name.kernel_uid = os.stat(base).st_uid
        uid = user_name.kernel_uid
    elif kept is not None and kept.argv is not None and kept.uid is not None:  # kept together
        argv, uid = kept.argv, kept.uid
    else:
        try:
            argv = read_proc(base + "/cmdline", limit=MAX_CMDLINE).decode("utf-8", "replace").split("\0")
        except OSError:
            argv = []
        if argv and argv[-1] == "":
            argv.pop()
        uid = os.stat(base).st_uid
    cpu_s = (st["utime"] + st["stime"]) / HZ
    start_s = st["starttime"] / HZ
    entry = {
        "pid": pid,
        "ppid": st["ppid"],
        "pgid": st["pgid"],
        "sid": st["sid"],
        "user": user_name(uid),
        "start_time": start_epoch(st["starttime"], btime),
        "state": st["state"],
        "cpu_time": round(cpu_s, 2),
        "rss": st["rss_pages"] * PAGE_SIZE,
        "comm": st["comm"],
        "argv": argv,
    }
    if kept is not None and facts is not None:  # kept: only with facts
        kept.stat, kept.btime, kept.uid, kept.argv, kept.entry = raw, btime, uid, argv, entry
        kept.start_s = start_s
        facts.now[pid] = kept
    return entry, kthread


def list_pids() -> list[int]:
    return sorted(int(name) for name in os.listdir("/proc") if name.isdigit())


def processes(btime: float, errors: list[dict[str, str]],
              facts: Facts | None = None) -> tuple[list[dict[str, Any]], list[int]]:
    """(reply entries of every process, pids of those that are not kernel threads)."""
    if facts is not None:
        facts.begin()
    user_name = facts.user_name if facts is not None else UserNames()
    out = []
    user_pids = []
    pids = list_pids()
    if facts is not None:
        facts.files.keep_only(set(pids))
    for pid in pids:
        try:
            entry, kthread = read_process(pid, btime, user_name, facts)
        except (OSError, ValueError, IndexError):
            continue  # it exited between listdir and read: not an error
        out.append(entry)
        if not kthread:
            user_pids.append(pid)
    return out, user_pids
