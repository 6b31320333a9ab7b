"""Paths the console writes, rotates or deletes on the box, held inside the workspace at the
moment of use.

Runs ON the box, imported by launch.py, clean.py, install.py and the fetch and restore stages.
Standard library only, Python >= 3.8. A path is first judged by its text (relative to the
workspace, or absolute under it, with no `..` that leaves it). Then every folder on the way is
opened relative to the one before it (dir_fd) with O_NOFOLLOW, and the file itself is opened,
renamed or deleted relative to its folder's descriptor: a folder or file swapped for a symlink
between a check and a write makes the call fail instead of redirecting it outside the workspace.
Code that works with paths (the stages' download, its lock and its .part file) runs from inside
the file's folder, made the current folder by its descriptor (working_in), on bare names.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from typing import Iterable, Iterator

from .atomic import replace_in

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# The system itself, and folders that hold everyone's files: never a workspace to write in.
SYSTEM_TREES = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/run", "/sbin",
                "/sys", "/usr")
SHARED_FOLDERS = ("/", "/home", "/root", "/tmp", "/var", "/var/tmp", "/var/lib", "/var/log", "/var/cache",
                  "/var/opt", "/var/spool", "/var/mail", "/var/www", "/opt", "/srv", "/mnt", "/media", "/snap")


class Escape(Exception):
    """A path that would leave the workspace, or a workspace that is no place to write: refused,
    nothing touched."""


def within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def workspace_root(given: str) -> str:
    """The workspace as given (~ expanded, absolute), after checking that its real location is
    a folder of its own: not a system folder, a shared one or a home folder."""
    workspace = os.path.abspath(os.path.expanduser(given))
    for path in (workspace, os.path.realpath(workspace)):
        if path in SHARED_FOLDERS or any(within(path, tree) for tree in SYSTEM_TREES):
            raise Escape("workspace %s is a system or shared folder: refused" % given)
        if os.path.dirname(path) == "/home" or path == os.path.realpath(os.path.expanduser("~")):
            raise Escape("workspace %s is a home folder: refused" % given)
    return workspace


def parts_inside(workspace: str, path: str) -> list[str]:
    """The names leading from the workspace to path (relative to it, or absolute under it)."""
    if not path or path.startswith("~"):
        raise Escape("%r is not a path inside the workspace" % path)
    norm = os.path.normpath(path)
    if os.path.isabs(norm):
        for root in (os.path.normpath(workspace), os.path.realpath(workspace)):
            if within(norm, root) and norm != root:
                norm = norm[len(root.rstrip("/")) + 1:]
                break
        else:
            raise Escape("%s is outside the workspace %s" % (path, workspace))
    if norm in (".", "..") or norm.startswith("../"):
        raise Escape("%s is outside the workspace %s" % (path, workspace))
    return [p for p in norm.split("/") if p]


def open_root(workspace: str) -> int:
    """A descriptor of the workspace folder itself (its own symlinks are the operator's choice)."""
    return os.open(workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def open_folder(root_fd: int, names: Iterable[str], create: bool = False, mode: int = 0o755) -> int:
    """A descriptor of the folder root/names[0]/names[1]/..., each opened without following a
    symlink (made when create and missing)."""
    fd = os.dup(root_fd)
    try:
        for name in names:
            try:
                step = os.open(name, DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(name, mode, dir_fd=fd)
                except FileExistsError:
                    pass
                step = _open_step(name, fd)
            except OSError as e:
                raise _refusal(e, name) from e
            os.close(fd)
            fd = step
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_step(name: str, fd: int) -> int:
    try:
        return os.open(name, DIR_FLAGS, dir_fd=fd)
    except OSError as e:
        raise _refusal(e, name) from e


def _refusal(e: OSError, name: str) -> Exception:
    if e.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
        return Escape("%s is a symlink or not a folder: refused, it could lead out of the workspace" % name)
    return e


def open_parent(workspace: str, path: str, create: bool = False) -> tuple[int, str]:
    """(descriptor of path's folder, path's own name), path checked to be inside the workspace."""
    names = parts_inside(workspace, path)
    root = open_root(workspace)
    try:
        return open_folder(root, names[:-1], create), names[-1]
    finally:
        os.close(root)


@contextlib.contextmanager
def working_in(workspace: str, path: str, create: bool = False) -> Iterator[str]:
    """Run the block from inside path's folder, reached from the workspace as open_parent does
    (made when create), as the process's current folder: set by its descriptor (fchdir), so the
    bare names the block uses resolve in that very folder even if a folder on the way is then
    swapped for a symlink. Yields path's own name; the current folder is restored afterwards."""
    folder, name = open_parent(workspace, path, create)
    try:
        previous = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fchdir(folder)
            try:
                yield name
            finally:
                os.fchdir(previous)
        finally:
            os.close(previous)
    finally:
        os.close(folder)


def regular_or_absent(folder_fd: int | None, name: str) -> None:
    """Refuse name when it is there but is no regular file (a symlink, a FIFO, a device): what is
    read or kept under that name would be somewhere else. folder_fd None: the current folder."""
    try:
        st = os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode):
        raise Escape("%s is a symlink or not a regular file: refused, only a file of the workspace is written" % name)


def open_append(folder_fd: int | None, name: str, mode: int = 0o644) -> int:
    """A file (a log, a download's .part) opened for appending: a regular file, never through a
    symlink, never a FIFO or a device (which would block or write elsewhere). folder_fd None:
    the current folder, or name is absolute."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, mode, dir_fd=folder_fd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.EMLINK, errno.ENXIO):
            raise Escape("%s is a symlink or a FIFO: refused, only a regular file of the workspace is written"
                         % name) from e
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise Escape("%s is not a regular file: refused" % name)
    os.set_blocking(fd, True)
    return fd


def write_file(folder_fd: int, name: str, data: bytes, mode: int = 0o644) -> None:
    """Replace name in the folder atomically with data (a temporary file renamed over it: a
    symlink at name is replaced, never followed)."""
    replace_in(folder_fd, name, (data,), mode)


def unlink(folder_fd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=folder_fd)
    except FileNotFoundError:
        pass


LOG_GENERATIONS = 5  # earlier runs' logs kept beside a stage's log: NAME.1 (the last run) .. NAME.5


def rotate(folder_fd: int, name: str, keep: int = LOG_GENERATIONS) -> None:
    """Keep the earlier runs' logs as NAME.1 .. NAME.<keep> (newest first) so each run starts a
    fresh log and the last few stay readable as history. A log that is a symlink or not a
    regular file is refused: renaming it would keep the link, and writing to it would write
    wherever it points. (An older generation is only renamed, never written or followed.)"""
    try:
        st = os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode):
        raise Escape("%s is a symlink or not a regular file: refused, a log is written only to a file in the "
                     "workspace" % name)
    if st.st_size == 0:
        return
    for n in range(keep - 1, 0, -1):
        try:
            os.replace("%s.%d" % (name, n), "%s.%d" % (name, n + 1), src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
        except OSError:  # absent, or something that is no log in its place: that generation is not kept
            pass
    os.replace(name, name + ".1", src_dir_fd=folder_fd, dst_dir_fd=folder_fd)


def remove_tree(folder_fd: int, name: str) -> int:
    """Delete name in the folder (a folder with all it holds); the bytes of the files removed.
    Symlinks are removed as links, never followed."""
    st = os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=folder_fd)
        return st.st_size
    total = 0
    fd = os.open(name, DIR_FLAGS, dir_fd=folder_fd)
    try:
        for entry in list(os.scandir(fd)):
            total += remove_tree(fd, entry.name)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=folder_fd)
    return total
