"""Listening TCP sockets and their owners, and files open for writing by more than one process:
both from one walk of the processes' open descriptors.

Runs ON the box, imported by probe.py. Standard library only, Python >= 3.8.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Iterator

if TYPE_CHECKING:
    from .procs import Facts, Folder, Kept, Link

import os
import socket
import struct

from .procfs import read_proc, read_text


def decode_address(hex_addr: str, family: int) -> tuple[str, int]:
    host_hex, port_hex = hex_addr.split(":")
    raw = bytes.fromhex(host_hex)
    if family == socket.AF_INET:
        host = socket.inet_ntop(family, raw[::-1])
    else:  # /proc stores IPv6 as four host-order 32-bit words
        words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
        host = socket.inet_ntop(family, words)
    return host, int(port_hex, 16)


def listening_sockets(errors: list[dict[str, str]]) -> dict[int, dict[str, Any]]:
    """{inode: {"proto", "host", "port"}} for every TCP socket in LISTEN state: from the kernel's
    sock_diag over netlink, or from /proc/net/tcp{,6} where netlink is not to be had."""
    if SOCK_DIAG["usable"]:
        try:
            found = {}
            for proto, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
                for inode, host, port in diag_listening(family):
                    found[inode] = {"proto": proto, "host": host, "port": port}
            return found
        except (OSError, ValueError, struct.error):
            SOCK_DIAG["usable"] = False  # not again in this process: /proc/net from now on
    return proc_net_listening(errors)


def proc_net_listening(errors: list[dict[str, str]]) -> dict[int, dict[str, Any]]:
    """listening_sockets from /proc/net/tcp{,6}: each read walks every bucket of the kernel's
    established-connections hash (hundreds of thousands on a big box), whatever it holds."""
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


NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
TCP_LISTEN = 10
SOCK_DIAG = {"usable": hasattr(socket, "AF_NETLINK")}


def diag_listening(family: int) -> list[tuple[int, str, int]]:
    """(inode, host, port) of the listening TCP sockets of one address family, by an
    inet_diag dump that asks for the LISTEN state only: the kernel then walks its listening
    hash alone. Raises OSError when the kernel refuses (no inet_diag, a sandbox)."""
    request = struct.pack("=IHHII", 72, SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, 1, 0)
    request += struct.pack("=BBBxI", family, socket.IPPROTO_TCP, 0, 1 << TCP_LISTEN) + bytes(48)
    size = 4 if family == socket.AF_INET else 16
    out: list[tuple[int, str, int]] = []
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG)
    try:
        sock.settimeout(2.0)
        sock.sendto(request, (0, 0))
        while True:
            data = sock.recv(65536)
            if not data:
                raise OSError("sock_diag: empty reply")
            pos = 0
            while pos + 16 <= len(data):
                length, kind = struct.unpack_from("=IH", data, pos)
                if length < 16:
                    raise OSError("sock_diag: bad message length %d" % length)
                if kind == NLMSG_DONE:
                    return out
                if kind == NLMSG_ERROR:
                    code = struct.unpack_from("=i", data, pos + 16)[0]
                    raise OSError(-code, "sock_diag: %s" % os.strerror(-code))
                if kind == SOCK_DIAG_BY_FAMILY:
                    msg = pos + 16  # struct inet_diag_msg: family, state, timer, retrans, sockid, ...
                    msg_family, state = struct.unpack_from("=BB", data, msg)
                    if msg_family == family and state == TCP_LISTEN:
                        port = struct.unpack_from(">H", data, msg + 4)[0]
                        host = socket.inet_ntop(family, data[msg + 8 : msg + 8 + size])
                        inode = struct.unpack_from("=I", data, msg + 68)[0]
                        out.append((inode, host, port))
                pos += (length + 3) & ~3
    finally:
        sock.close()


def fd_links(pids: Iterable[int], facts: Facts | None = None, folder: Folder | None = None) -> Iterator[Link]:
    """(pid, fd, target) of every open descriptor this user may see.

    With facts, a process that has not run since its descriptors were listed is not listed
    again. Its sockets, pipes and the like keep their names; a file's path does not (another
    process may rename it), so a kept path is given only when it may lie in folder, a
    (path ending in "/", st_dev) pair: it is read again then. A file on another filesystem
    than folder's, listed outside folder, stays outside (a rename cannot cross filesystems)."""
    for pid in pids:
        fd_dir = "/proc/%d/fd/" % pid
        kept = facts.now.get(pid) if facts is not None else None
        if kept is not None and kept.fds is not None:
            for link in kept_links(pid, kept, folder, fd_dir):
                yield link
            continue
        links = []
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                links.append((pid, fd, os.readlink(fd_dir + fd)))
            except OSError:
                continue
        if kept is not None:
            kept.fds, kept.plan = [(fd, link) for _pid, fd, link in links], None
        for link in links:
            yield link


def kept_links(pid: int, kept: Kept, folder: Folder | None, fd_dir: str) -> list[Link]:
    """fd_links of a process that has not run since kept.fds were listed."""
    if kept.plan is None or kept.plan[0] != folder:
        fixed, paths = [], []
        for fd, link in kept.fds or ():  # listed before kept_links is called
            if not link.startswith("/"):
                fixed.append((pid, fd, link))
            elif folder is not None and (link.startswith(folder[0]) or file_dev(fd_dir + fd) in (folder[1], None)):
                paths.append(fd)
        kept.plan = (folder, fixed, paths)
    links = list(kept.plan[1])
    for fd in kept.plan[2]:
        try:
            links.append((pid, fd, os.readlink(fd_dir + fd)))
        except OSError:
            continue
    return links


def file_dev(fd_path: str) -> int | None:
    """st_dev of the file an open descriptor holds, None when it cannot be told."""
    try:
        return os.stat(fd_path).st_dev
    except OSError:
        return None


def socket_owners(inodes: Iterable[int], pids: Iterable[int], links: Iterable[Link] | None = None,
                  facts: Facts | None = None) -> dict[int, int]:
    """Map socket inode -> pid by reading /proc/PID/fd links (only as far as needed), or from
    links, the (pid, fd, target) of an fd walk already made; the lowest pid holding it wins."""
    owners: dict[int, int] = {}
    wanted = set(inodes)
    if not wanted:
        return owners
    for pid, _fd, link in fd_links(pids, facts) if links is None else links:
        if link.startswith("socket:["):
            inode = int(link[8:-1])
            if inode in wanted:
                owners[inode] = pid
                wanted.discard(inode)
                if not wanted:
                    break
    return owners


def open_for_writing(pid: int, fd: str) -> bool:
    """True when the descriptor was opened O_WRONLY or O_RDWR (from /proc/PID/fdinfo)."""
    try:
        for line in read_proc("/proc/%d/fdinfo/%s" % (pid, fd)).split(b"\n"):
            if line.startswith(b"flags:"):
                return int(line.split()[1], 8) & 3 != 0
    except (OSError, ValueError, IndexError):
        pass
    return False


def watched_folder(folder: str) -> Folder:
    """(path ending in "/", st_dev) of the folder whose files writers() looks at."""
    path = os.path.realpath(folder).rstrip("/") + "/"
    try:
        return path, os.stat(path).st_dev
    except OSError:
        return path, None


def writers(folder: str, links: Iterable[Link]) -> dict[str, list[int]]:
    """Files under folder open for writing by more than one process: {path: [pid, ...]}, from
    the (pid, fd, target) of an fd walk. Two writers on one file is how a download got
    corrupted (playbook §3)."""
    folder = os.path.realpath(folder).rstrip("/") + "/"
    found: dict[str, set[int]] = {}
    for pid, fd, link in links:
        if link.startswith(folder) and open_for_writing(pid, fd):
            found.setdefault(link, set()).add(pid)
    return dict((path, sorted(p)) for path, p in found.items() if len(p) > 1)


def listeners(pids: Iterable[int], errors: list[dict[str, str]], links: Iterable[Link] | None = None,
              facts: Facts | None = None) -> list[dict[str, Any]]:
    socks = listening_sockets(errors)
    owners = socket_owners(socks.keys(), pids, links, facts)
    out = []
    for inode, s in sorted(socks.items(), key=lambda kv: (kv[1]["port"], kv[1]["proto"])):
        entry = dict(s)
        entry["inode"] = inode
        entry["pid"] = owners.get(inode)
        out.append(entry)
    return out
