"""Disk usage of the workspace's filesystems and the sizes of artifact trees.

Runs ON the box, imported by probe.py. Standard library only, Python >= 3.8.
"""

from __future__ import annotations

import os
import stat
import time
from typing import Any, Iterable, List, Mapping, Tuple

from .wire import ArtifactEntry, DiskEntry, DiskUserEntry, UsersReply


def mount_point(path: str) -> str:
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


def disk_usage(label: str, path: str) -> DiskEntry:
    mount = mount_point(path)
    st = os.statvfs(mount)
    total = st.f_blocks * st.f_frsize
    free = st.f_bavail * st.f_frsize
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    return {"label": label, "path": path, "mount": mount, "total": total, "used": used, "free": free}


def disks(workspace: str | None, errors: list[dict[str, str]]) -> list[DiskEntry]:
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


# A directory's listing: ((dev, ino, ctime_ns) it was taken under, file names, directory names).
Listing = Tuple[Tuple[int, int, int], List[str], List[str]]


class Listings(object):
    """Directory listings kept from one artifact walk to the next (in --serve, from one request
    to the next), so that an unchanged directory costs one lstat instead of a scandir. A listing
    is reused only while the directory's (device, inode, ctime) is the one it was taken under:
    adding, removing or renaming an entry sets the directory's ctime, and so does a utime()
    that puts an old mtime back, which no one can do to a ctime. A directory changed less than
    RACY_S before it was listed is listed again next time, since another change within the same
    timestamp tick would leave its ctime as it was. Files are never taken from here: each is
    lstat'ed on every walk, since a file grows without its directory changing."""

    RACY_S = 2.0

    def __init__(self) -> None:
        self.kept: dict[str, Listing] = {}  # path -> ((dev, ino, ctime_ns), file names, directory names)
        self.seen: dict[str, Listing] = {}  # what this walk used: only that is kept for the next one

    def entries(self, path: str) -> tuple[list[str], list[str]]:
        """(file names, directory names) of a directory; OSError when it cannot be read."""
        st = os.lstat(path)
        key = (st.st_dev, st.st_ino, st.st_ctime_ns)
        kept = self.kept.get(path)
        if kept is not None and kept[0] == key:
            self.seen[path] = kept
            return kept[1], kept[2]
        files: list[str] = []
        dirs: list[str] = []
        with os.scandir(path) as it:
            for entry in it:
                try:
                    (dirs if entry.is_dir(follow_symlinks=False) else files).append(entry.name)
                except OSError:
                    continue
        if time.time() - st.st_ctime_ns / 1e9 > self.RACY_S:
            self.seen[path] = (key, files, dirs)
        return files, dirs

    def done(self) -> None:
        self.kept, self.seen = self.seen, {}


def tree_size(path: str, deadline: float, listings: Listings | None = None) -> tuple[int, int, int, bool]:
    """(apparent bytes, allocated bytes, files, complete) of a file or a directory tree."""
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        return st.st_size, st.st_blocks * 512, 1, True
    listings = listings or Listings()
    size, alloc, files = 0, 0, 0
    stack = [path]
    lstat = os.lstat
    while stack:
        if time.monotonic() > deadline:
            return size, alloc, files, False
        folder = stack.pop()
        try:
            names, dirs = listings.entries(folder)
        except OSError:
            continue
        folder += "/"
        for name in names:
            try:
                st = lstat(folder + name)
            except OSError:
                continue
            size += st.st_size
            alloc += st.st_blocks * 512
            files += 1
        stack.extend(folder + name for name in dirs)
    return size, alloc, files, True


def artifacts(workspace: str | None, specs: Iterable[Mapping[str, Any]], budget_s: float,
              listings: Listings | None = None) -> list[ArtifactEntry]:
    deadline = time.monotonic() + budget_s
    listings = listings or Listings()
    out = []
    for spec in specs:
        path = resolve(workspace, spec["path"])
        entry: ArtifactEntry = {"name": spec.get("name", path), "path": path, "exists": False}
        try:
            size, alloc, files, complete = tree_size(path, deadline, listings)
            entry.update({"exists": True, "bytes": size, "allocated": alloc, "files": files, "complete": complete})
        except FileNotFoundError:
            pass
        except OSError as e:
            entry["error"] = str(e)
        out.append(entry)
    listings.done()
    return out


def resolve(workspace: str | None, path: str) -> str:
    path = os.path.expanduser(path)
    if workspace and not os.path.isabs(path):
        path = os.path.join(workspace, path)
    return path


def workspace_users(workspace: str, top: int, budget_s: float, listings: Listings | None = None) -> UsersReply:
    """The workspace's `top` largest users, biggest (allocated) first: each top-level folder's
    entries, and each top-level file. Two levels name what to delete (models/merged, venv/lib)
    without a full tree. Links are counted as links, never followed; a walk cut by the time
    budget says so ("complete": false). Also the folder's total and whether it is complete."""
    deadline = time.monotonic() + budget_s
    listings = listings or Listings()
    files, dirs = listings.entries(workspace)
    candidates = list(files)
    for name in dirs:
        try:
            inner_files, inner_dirs = listings.entries(os.path.join(workspace, name))
        except OSError:
            candidates.append(name)  # unreadable: sized (or failing) as one entry below
            continue
        candidates.extend(name + "/" + child for child in inner_files + inner_dirs)
    out: List[DiskUserEntry] = []
    for rel in candidates:
        try:
            size, alloc, count, complete = tree_size(os.path.join(workspace, rel), deadline, listings)
        except OSError:
            continue
        out.append({"path": rel, "bytes": size, "allocated": alloc, "files": count, "complete": complete})
    listings.done()
    out.sort(key=lambda u: u["allocated"], reverse=True)
    total = sum(u["allocated"] for u in out)
    return {"top": out[:top], "allocated": total, "entries": len(out),
            "complete": all(u["complete"] for u in out)}
