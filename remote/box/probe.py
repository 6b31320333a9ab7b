"""The box probe: one JSON request on stdin, one JSON reply on stdout (or, with --serve, one
request and one reply per line for as long as stdin stays open).

Runs ON the box. Standard library only, Python >= 3.8, reads /proc directly so that one
poll costs one process start and no shell-outs. Anything unreadable becomes an error
entry in the reply; the probe itself only fails on a request it cannot parse.

Request (every key optional):
  {"workspace": PATH, "artifacts": [{"name", "path"}], "artifact_budget_s": 1.0,
   "logs": [{"path", "offset", "inode", "check", "scan_from", "last_lines", "max_bytes",
             "data": true, "markers": [{"name", "pattern"}]}],
   "ranges": [{"path", "start", "end"}], "reports": [{"glob", "max"}],
   "processes": true, "states": true, "writers": false, "binaries": [PATH]}
Reply: {"time", "boot_time", "clk_tck", "host", "disks", "artifacts", "processes",
        "listeners", "logs", "ranges", "reports", "states", "writers", "binaries", "errors"}
"""

import base64
import glob
import json
import os
import pwd
import re
import socket
import sys
import time

from markers import Markers, marker_hits
from procfs import CLK_TCK, PAGE_SIZE, boot_time, parse_stat, read_text, start_epoch, uptime

DEFAULT_LOG_BYTES = 256 * 1024
MAX_LOG_BYTES = 8 * 1024 * 1024
MAX_RANGE_BYTES = 16 * 1024 * 1024
MAX_SCAN_CARRY = 64 * 1024  # longest unfinished line re-scanned for markers
TAIL_BLOCK = 64 * 1024
MAX_REPORTS = 50
MAX_REPORT_BYTES = 64 * 1024
CHECK_BYTES = 16  # the last bytes read, which the next read checks to catch a rewrite

class UserNames:
    def __init__(self):
        self.cache = {}

    def __call__(self, uid):
        if uid not in self.cache:
            try:
                self.cache[uid] = pwd.getpwuid(uid).pw_name
            except KeyError:
                self.cache[uid] = str(uid)
        return self.cache[uid]


def process_uid(pid):
    return os.stat("/proc/%d" % pid).st_uid


def read_process(pid, btime, now_up, user_name):
    with open("/proc/%d/stat" % pid, "rb") as f:
        st = parse_stat(f.read().decode("utf-8", "replace"))
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            argv = [a.decode("utf-8", "replace") for a in f.read().split(b"\0")]
        if argv and argv[-1] == "":
            argv.pop()
    except OSError:
        argv = []
    cpu_s = (st["utime"] + st["stime"]) / float(CLK_TCK)
    age = max(now_up - st["starttime"] / float(CLK_TCK), 1e-6)
    return {
        "pid": pid,
        "ppid": st["ppid"],
        "pgid": st["pgid"],
        "sid": st["sid"],
        "user": user_name(process_uid(pid)),
        "start_time": start_epoch(st["starttime"], btime),
        "state": st["state"],
        "cpu_time": round(cpu_s, 2),
        "cpu_percent": round(100.0 * cpu_s / age, 1),
        "rss": st["rss_pages"] * PAGE_SIZE,
        "comm": st["comm"],
        "argv": argv,
    }


def list_pids():
    return sorted(int(name) for name in os.listdir("/proc") if name.isdigit())


def processes(btime, errors):
    now_up = uptime()
    user_name = UserNames()
    out = []
    for pid in list_pids():
        try:
            out.append(read_process(pid, btime, now_up, user_name))
        except (OSError, ValueError, IndexError):
            continue  # it exited between listdir and read: not an error
    return out


# ---------------------------------------------------------------- sockets


def decode_address(hex_addr, family):
    host_hex, port_hex = hex_addr.split(":")
    raw = bytes.fromhex(host_hex)
    if family == socket.AF_INET:
        host = socket.inet_ntop(family, raw[::-1])
    else:  # /proc stores IPv6 as four host-order 32-bit words
        words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
        host = socket.inet_ntop(family, words)
    return host, int(port_hex, 16)


def listening_sockets(errors):
    """{inode: {"proto", "host", "port"}} for every TCP socket in LISTEN state."""
    found = {}
    for name, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        path = "/proc/net/" + name
        try:
            lines = read_text(path).splitlines()[1:]
        except OSError as e:
            if name == "tcp":
                errors.append({"what": path, "error": str(e)})
            continue
        for line in lines:
            f = line.split()
            if len(f) < 10 or f[3] != "0A":
                continue
            host, port = decode_address(f[1], family)
            found[int(f[9])] = {"proto": name, "host": host, "port": port}
    return found


def fd_links(pids):
    """(pid, fd, target) of every open descriptor this user may see."""
    for pid in pids:
        fd_dir = "/proc/%d/fd" % pid
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                yield pid, fd, os.readlink(fd_dir + "/" + fd)
            except OSError:
                continue


def socket_owners(inodes, pids):
    """Map socket inode -> pid by reading /proc/PID/fd links (only as far as needed)."""
    owners = {}
    wanted = set(inodes)
    if not wanted:
        return owners
    for pid, _fd, link in fd_links(pids):
        if link.startswith("socket:["):
            inode = int(link[8:-1])
            if inode in wanted:
                owners[inode] = pid
                wanted.discard(inode)
                if not wanted:
                    break
    return owners


def open_for_writing(pid, fd):
    """True when the descriptor was opened O_WRONLY or O_RDWR (from /proc/PID/fdinfo)."""
    try:
        with open("/proc/%d/fdinfo/%s" % (pid, fd)) as f:
            for line in f:
                if line.startswith("flags:"):
                    return int(line.split()[1], 8) & 3 != 0
    except (OSError, ValueError):
        pass
    return False


def writers(folder, pids):
    """Files under folder open for writing by more than one process: {path: [pid, ...]}.
    Two writers on one file is how a download got corrupted (playbook §3)."""
    folder = os.path.realpath(folder).rstrip("/") + "/"
    found = {}
    for pid, fd, link in fd_links(pids):
        if link.startswith(folder) and open_for_writing(pid, fd):
            found.setdefault(link, set()).add(pid)
    return dict((path, sorted(p)) for path, p in found.items() if len(p) > 1)


def binaries(workspace, paths):
    """Each declared binary: does it exist, and may it be executed (the tar-prefix trap)?"""
    out = []
    for path in paths:
        full = resolve(workspace, path)
        out.append({"path": path, "exists": os.path.exists(full), "executable": os.access(full, os.X_OK)})
    return out


def listeners(pids, errors):
    socks = listening_sockets(errors)
    owners = socket_owners(socks.keys(), pids)
    out = []
    for inode, s in sorted(socks.items(), key=lambda kv: (kv[1]["port"], kv[1]["proto"])):
        entry = dict(s)
        entry["inode"] = inode
        entry["pid"] = owners.get(inode)
        out.append(entry)
    return out


# ---------------------------------------------------------------- disk and artifacts


def mount_point(path):
    path = os.path.realpath(path)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    dev = os.stat(path).st_dev
    while path != "/":
        parent = os.path.dirname(path)
        if os.stat(parent).st_dev != dev:
            break
        path = parent
    return path


def disk_usage(label, path):
    mount = mount_point(path)
    st = os.statvfs(mount)
    total = st.f_blocks * st.f_frsize
    free = st.f_bavail * st.f_frsize
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    return {"label": label, "path": path, "mount": mount, "total": total, "used": used, "free": free}


def disks(workspace, errors):
    out = []
    seen = set()
    for label, path in (("workspace", workspace), ("root", "/")):
        if not path:
            continue
        try:
            d = disk_usage(label, path)
        except OSError as e:
            errors.append({"what": "disk " + path, "error": str(e)})
            continue
        if d["mount"] not in seen:
            seen.add(d["mount"])
            out.append(d)
    return out


def tree_size(path, deadline):
    """(apparent bytes, allocated bytes, files, complete) of a file or a directory tree."""
    st = os.lstat(path)
    if not os.path.isdir(path) or os.path.islink(path):
        return st.st_size, st.st_blocks * 512, 1, True
    size, alloc, files = 0, 0, 0
    stack = [path]
    while stack:
        if time.monotonic() > deadline:
            return size, alloc, files, False
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if entry.is_dir(follow_symlinks=False):
                stack.append(entry.path)
            else:
                size += st.st_size
                alloc += st.st_blocks * 512
                files += 1
    return size, alloc, files, True


def artifacts(workspace, specs, budget_s):
    deadline = time.monotonic() + budget_s
    out = []
    for spec in specs:
        path = resolve(workspace, spec["path"])
        entry = {"name": spec.get("name", path), "path": path, "exists": False}
        try:
            size, alloc, files, complete = tree_size(path, deadline)
            entry.update(exists=True, bytes=size, allocated=alloc, files=files, complete=complete)
        except FileNotFoundError:
            pass
        except OSError as e:
            entry["error"] = str(e)
        out.append(entry)
    return out


def resolve(workspace, path):
    path = os.path.expanduser(path)
    if workspace and not os.path.isabs(path):
        path = os.path.join(workspace, path)
    return path


# ---------------------------------------------------------------- logs


def pread(fd, offset, n):
    """n bytes at offset, fewer only at the end of the file: one read unless the kernel
    returns a short one (no file object, so no second copy through its buffer)."""
    data = os.pread(fd, n, offset)
    while len(data) < n:
        more = os.pread(fd, n - len(data), offset + len(data))
        if not more:
            break
        data += more
    return data


def start_of_last_lines(fd, size, n, limit):
    """Offset where the last n lines of an open file begin, looking back at most limit bytes."""
    pos = size
    newlines = 0
    floor = max(0, size - limit)
    # A trailing newline ends the last line; it does not start a new one.
    if size and pread(fd, size - 1, 1) == b"\n":
        newlines = -1
    while pos > floor:
        step = min(TAIL_BLOCK, pos - floor)
        pos -= step
        block = pread(fd, pos, step)
        idx = len(block)
        while True:
            idx = block.rfind(b"\n", 0, idx)
            if idx < 0:
                break
            newlines += 1
            if newlines >= n:
                return pos + idx + 1
    return floor


def rewritten(fd, offset, check):
    """True when the bytes just before offset are no longer the ones last read there: the
    file was truncated and has since grown past the old offset (tail -F misses this)."""
    if not check:
        return False
    expected = base64.b64decode(check)
    if offset < len(expected):
        return True
    return pread(fd, offset - len(expected), len(expected)) != expected


def read_log(req):
    path = req["path"]
    max_bytes = min(int(req.get("max_bytes") or DEFAULT_LOG_BYTES), MAX_LOG_BYTES)
    entry = {"path": path}
    fd = os.open(path, os.O_RDONLY)
    try:
        st = os.fstat(fd)
        size = st.st_size
        entry.update(inode=st.st_ino, dev=st.st_dev, size=size, mtime=st.st_mtime)
        offset = req.get("offset")
        rotated = req.get("inode") is not None and req["inode"] != st.st_ino
        truncated = not rotated and offset is not None and (size < offset or rewritten(fd, offset, req.get("check")))
        if rotated or truncated:
            offset = 0
        if offset is None:
            n = req.get("last_lines")
            offset = start_of_last_lines(fd, size, int(n), max_bytes) if n else size
        scan_from = req.get("scan_from")
        if scan_from is None or rotated or truncated or not (0 <= offset - scan_from <= MAX_SCAN_CARRY):
            scan_from = offset
        data = pread(fd, scan_from, offset - scan_from + max_bytes)
    finally:
        os.close(fd)
    new = memoryview(data)[offset - scan_from :]  # no copy of megabytes
    last_nl = data.rfind(b"\n")
    entry.update(
        offset=offset,
        next_offset=offset + len(new),
        line_end=scan_from + last_nl + 1 if last_nl >= 0 else None,
        more=offset + len(new) < size,
        rotated=rotated,
        truncated=truncated,
        data=base64.b64encode(new).decode("ascii") if req.get("data", True) else "",
        tail=base64.b64encode(data[-CHECK_BYTES:]).decode("ascii"),
        hits=marker_hits(data, scan_from, Markers(req.get("markers") or ())),
    )
    return entry


def logs(requests):
    out = []
    for req in requests:
        try:
            out.append(read_log(req))
        except (OSError, ValueError, re.error) as e:
            out.append({"path": req.get("path"), "error": str(e), "missing": isinstance(e, FileNotFoundError)})
    return out


def read_range(req):
    path, start, end = req["path"], int(req["start"]), int(req["end"])
    if start < 0 or end < start or end - start + 1 > MAX_RANGE_BYTES:
        raise ValueError("bad range %d-%d (at most %d bytes)" % (start, end, MAX_RANGE_BYTES))
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        f.seek(start)
        data = f.read(end - start + 1)
    return {"path": path, "start": start, "size": size, "data": base64.b64encode(data).decode("ascii")}


def ranges(requests):
    out = []
    for req in requests:
        try:
            out.append(read_range(req))
        except (OSError, ValueError, KeyError) as e:
            out.append({"path": req.get("path"), "error": str(e)})
    return out


# ---------------------------------------------------------------- reports


def reports(workspace, specs, errors):
    """Small files (eval summaries and the like) matching workspace globs, newest first."""
    out = []
    for spec in specs:
        paths = glob.glob(resolve(workspace, spec["glob"]))
        try:
            paths.sort(key=os.path.getmtime, reverse=True)
        except OSError:
            pass  # one vanished meanwhile; the order matters less than the reply
        for path in paths[: int(spec.get("max", MAX_REPORTS))]:
            try:
                with open(path, "rb") as f:
                    text = f.read(MAX_REPORT_BYTES).decode("utf-8", "replace")
                out.append({"glob": spec["glob"], "path": path, "mtime": os.path.getmtime(path), "text": text})
            except OSError as e:
                errors.append({"what": path, "error": str(e)})
    return out


# ---------------------------------------------------------------- stage states


def stage_states(workspace, by_pid, btime, errors):
    """Recorded stage launches under WORKSPACE/.samai/state, each with whether it still runs."""
    state_dir = os.path.join(workspace, ".samai", "state")
    try:
        names = sorted(n for n in os.listdir(state_dir) if n.endswith(".json"))
    except FileNotFoundError:
        return []
    except OSError as e:
        errors.append({"what": state_dir, "error": str(e)})
        return []
    out = []
    for name in names:
        path = os.path.join(state_dir, name)
        try:
            with open(path, "rb") as f:
                rec = json.loads(f.read().decode("utf-8"))
        except (OSError, ValueError) as e:
            errors.append({"what": path, "error": str(e)})
            continue
        proc = by_pid.get(rec.get("pid"))
        rec["alive"] = bool(proc) and proc["start_time"] == rec.get("start_time") and proc["state"] != "Z"
        rec["group"] = sorted(p["pid"] for p in by_pid.values() if p["pgid"] == rec.get("pgid") and p["state"] != "Z")
        rc_path = os.path.join(state_dir, name[: -len(".json")] + ".rc")
        try:
            with open(rc_path) as f:
                rec["rc"] = int(f.read().strip())
        except (OSError, ValueError):
            rec["rc"] = None
        out.append(rec)
    return out


# ---------------------------------------------------------------- main


def probe(req):
    errors = []
    btime = boot_time()
    workspace = req.get("workspace")
    if workspace:
        workspace = os.path.expanduser(workspace)
    reply = {
        "time": time.time(),
        "boot_time": btime,
        "clk_tck": CLK_TCK,
        "host": socket.gethostname(),
        "probe_pid": os.getpid(),
        "errors": errors,
    }
    reply["disks"] = disks(workspace, errors)
    reply["artifacts"] = artifacts(workspace, req.get("artifacts") or (), float(req.get("artifact_budget_s", 1.0)))
    procs = processes(btime, errors) if req.get("processes", True) else []
    reply["processes"] = procs
    reply["listeners"] = listeners([p["pid"] for p in procs], errors) if procs else []
    reply["writers"] = writers(workspace, [p["pid"] for p in procs]) if workspace and req.get("writers") else {}
    reply["binaries"] = binaries(workspace, req.get("binaries") or ())
    reply["logs"] = logs(req.get("logs") or ())
    reply["ranges"] = ranges(req.get("ranges") or ())
    reply["reports"] = reports(workspace, req.get("reports") or (), errors)
    by_pid = dict((p["pid"], p) for p in procs)
    reply["states"] = stage_states(workspace, by_pid, btime, errors) if workspace and req.get("states", True) else []
    return reply


def answer(text):
    """The reply line for one request line; a request it cannot read gets an error reply."""
    try:
        req = json.loads(text or "{}")
        if not isinstance(req, dict):
            raise ValueError("request must be a JSON object")
        reply = probe(req)
    except (ValueError, KeyError, TypeError, OSError, RuntimeError) as e:
        reply = {"error": "%s: %s" % (type(e).__name__, e)}
    return json.dumps(reply, separators=(",", ":")) + "\n"


def serve():
    """One request per line on stdin, each answered with a length line and the reply, until
    stdin closes: the console keeps one probe running per connection instead of starting one
    per poll. The length lets the reader take a reply of megabytes without scanning for a
    line end."""
    out = sys.stdout.buffer
    for line in sys.stdin.buffer:
        reply = answer(line.decode("utf-8", "replace")).encode("utf-8")
        out.write(b"%d\n" % len(reply))
        out.write(reply)
        out.flush()
    return 0


def main():
    if sys.argv[1:] == ["--serve"]:
        return serve()
    sys.stdout.write(answer(sys.stdin.buffer.read().decode("utf-8", "replace")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
