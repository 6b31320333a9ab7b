"""Replace a file atomically: a reader sees the old file or the new one, never half of one.

Runs ON the box (standard library only, Python >= 3.8); the one way the box tools and stage
scripts write a whole file. The data goes to a temporary name of its own in the same folder
(one per writer: two writers never share it), gets its mode, optionally reaches the disk
(fsync), and is renamed over the name; on any failure the temporary file is removed.

  replace_in(folder_fd, name, blocks, ...)   within an open folder: the name is never
      followed if it is a symlink (it is replaced), which confine.py relies on
  write_atomic(path, data, ...)              the same for a path (bytes, text or blocks)
  rename_new(folder_fd, name, new_name)       a rename that never replaces what is at new_name
"""

from __future__ import annotations

import binascii
import errno
import os
from typing import Iterable

CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
# linkat's answers where the filesystem has no hard links (vfat, some FUSE and network mounts)
NO_HARD_LINKS = (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EMLINK)


def temporary_name(name: str, tag: str) -> str:
    return ".%s.%s-%d-%s" % (name, tag, os.getpid(), binascii.hexlify(os.urandom(4)).decode())


def replace_in(folder_fd: int, name: str, blocks: Iterable[bytes | bytearray | memoryview], mode: int = 0o644,
               sync: bool = False, tag: str = "tmp") -> None:
    """Write the byte blocks (an iterable) to name inside the folder opened as folder_fd; the
    temporary file is .NAME.TAG-PID-RANDOM, so a caller can tell its own leftovers apart."""
    tmp = temporary_name(name, tag)
    fd = os.open(tmp, CREATE, 0o600, dir_fd=folder_fd)
    try:
        try:
            for block in blocks:
                view = memoryview(block)
                while view:
                    view = view[os.write(fd, view):]
            os.fchmod(fd, mode)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=folder_fd)
        except FileNotFoundError:
            pass
        raise


def write_atomic(path: str, data: str | bytes | bytearray | memoryview | Iterable[bytes], mode: int = 0o644,
                 sync: bool = False, tag: str = "tmp") -> None:
    """Replace path with data: bytes, str (UTF-8) or an iterable of byte blocks."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    blocks = (data,) if isinstance(data, (bytes, bytearray, memoryview)) else data
    folder = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        replace_in(folder, os.path.basename(path), blocks, mode, sync, tag)
        if sync:
            os.fsync(folder)  # the rename itself reaches the disk too
    finally:
        os.close(folder)


def rename_new(folder_fd: int, name: str, new_name: str) -> None:
    """Rename name to new_name inside the folder, never over anything at new_name (a file, a
    symlink, a hard link put there: FileExistsError, and it is left as it is). A hard link and
    then an unlink, which the kernel refuses atomically when new_name exists; where the
    filesystem has no hard links, a rename after a check (two steps there, not one)."""
    try:
        os.link(name, new_name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd, follow_symlinks=False)
    except OSError as e:
        if e.errno not in NO_HARD_LINKS:
            raise
        try:
            os.stat(new_name, dir_fd=folder_fd, follow_symlinks=False)
        except FileNotFoundError:
            os.rename(name, new_name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
            return
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), new_name) from None
    os.unlink(name, dir_fd=folder_fd)
