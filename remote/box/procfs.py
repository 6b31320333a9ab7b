"""/proc readers and the request/reply loop shared by the box tools. Stdlib only, Python >= 3.8."""

import json
import os
import sys

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
BOOT_ID = []  # boot_id(), once read


def read_text(path):
    with open(path, "rb") as f:
        return f.read().decode("utf-8", "replace")


def read_proc(path, size=4096):
    """All of a one-record /proc file (PID/stat, cmdline, schedstat, fdinfo/FD) with os.open and
    os.read: a Python file object costs several syscalls more. Such a file answers a read with
    all it holds up to size, so a short read is its end; a many-record one like /proc/net/tcp
    may not, and is read with read_text."""
    fd = os.open(path, os.O_RDONLY)
    try:
        data = os.read(fd, size)
        if len(data) < size:
            return data
        chunks = [data]
        while chunks[-1]:
            chunks.append(os.read(fd, 65536))
        return b"".join(chunks)
    finally:
        os.close(fd)


def boot_time():
    for line in read_text("/proc/stat").splitlines():
        if line.startswith("btime "):
            return int(line.split()[1])
    raise RuntimeError("no btime in /proc/stat")


def boot_id():
    """This boot's random id (None where the kernel does not tell it); read once, since no
    process outlives its boot."""
    if not BOOT_ID:
        try:
            BOOT_ID.append(read_text("/proc/sys/kernel/random/boot_id").strip() or None)
        except OSError:
            BOOT_ID.append(None)
    return BOOT_ID[0]


def record_btime(rec, btime):
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


def uptime():
    return float(read_text("/proc/uptime").split()[0])


def parse_stat(raw):
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


def start_epoch(starttime_ticks, btime):
    """A process's start time as epoch seconds, rounded to the kernel's tick."""
    return round(btime + starttime_ticks / float(CLK_TCK), 2)


def read_stat(pid):
    """parse_stat of a live pid, or None when it is gone."""
    try:
        return parse_stat(read_text("/proc/%d/stat" % pid))
    except (OSError, ValueError, IndexError):
        return None


def same_start(a, b):
    """Start times from one box agree to the tick; anything else is another process."""
    return a is not None and b is not None and abs(float(a) - float(b)) < 0.011


def alive(pid, start_time, btime):
    """True while pid is the very process that started at start_time and is not a zombie."""
    st = read_stat(pid)
    return bool(st) and st["state"] != "Z" and same_start(start_epoch(st["starttime"], btime), start_time)


def group_members(pgid):
    """Live (non-zombie) pids of a process group."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = read_stat(int(name))
            if st and st["pgid"] == pgid and st["state"] != "Z":
                out.append(int(name))
    return sorted(out)


def ancestors(pid):
    """pid and every process above it up to init."""
    chain = []
    while pid > 0 and pid not in chain:
        chain.append(pid)
        st = read_stat(pid)
        if not st:
            break
        pid = st["ppid"]
    return chain


def serve(name, handler, on_os_error=None):
    """One JSON request on stdin, one JSON reply on stdout. A request the tool cannot read is
    exit 2 with the reason on stderr; an OSError becomes on_os_error's reply when given."""
    try:
        reply = handler(json.loads(sys.stdin.read()))
    except (ValueError, KeyError, TypeError) as e:
        sys.stderr.write("%s: bad request: %r\n" % (name, e))
        return 2
    except OSError as e:
        if on_os_error is None:
            raise
        reply = on_os_error(e)
    sys.stdout.write(json.dumps(reply) + "\n")
    return 0
