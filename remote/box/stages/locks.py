"""One writer per output: an flock on PATH.lock, holding its holder's pid, removed on release.

Runs ON the box (standard library only, Python >= 3.8). Two `curl -C -` on one file interleave
it into garbage (playbook §3): every writer of an output holds its lock first, and a second one
waits (up to a deadline) or gives up with Busy, naming the holder.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from typing import Iterator

LOCK_POLL_S = 0.2


class Busy(Exception):
    """Another process holds the lock on what we were asked to write."""

    def __init__(self, what: str, pid: str) -> None:
        Exception.__init__(self, what)
        self.what, self.pid = what, pid


def same_file(fd: int, path: str) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def try_lock(path: str) -> int | None:
    """An fd holding LOCK_EX on path, or None while another process holds it."""
    while True:
        # O_NOFOLLOW: a symlink planted at the lock's name would have us create and write elsewhere.
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        if same_file(fd, path):
            return fd
        os.close(fd)  # we locked a lock file its holder just removed: lock the current one


def holder_pid(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip() or "?"
    except OSError:
        return "?"


@contextlib.contextmanager
def exclusive(lock_path: str, wait_s: float | None, what: str) -> Iterator[None]:
    """Hold an flock on lock_path (the holder's pid inside) while the block runs.

    The lock file is removed on release, so finished fetches leave nothing behind; a waiter
    that locked the removed file sees its inode is gone and locks the new one instead."""
    deadline = time.monotonic() + (wait_s or 0)
    announced = False
    while True:
        fd = try_lock(lock_path)
        if fd is not None:
            break
        if time.monotonic() >= deadline:
            raise Busy(what, holder_pid(lock_path))
        if not announced:
            print("waiting up to %g s for another fetch of %s (pid %s)" % (wait_s or 0, what, holder_pid(lock_path)))
            announced = True
        time.sleep(LOCK_POLL_S)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, ("%d\n" % os.getpid()).encode())
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(lock_path)
        os.close(fd)
