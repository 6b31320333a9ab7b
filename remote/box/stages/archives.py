"""Tarballs unpacked safely, and their layout fixed: refuse what would escape, flatten what nests.

Runs ON the box (standard library only, Python >= 3.8), for the fetch stage. An archive is
refused before anything is extracted if a member leaves the folder, is a special file, or would
be written through a link; after extraction every symlink is followed for real and must stay
inside. Release tarballs nest their tree (bin/bin/llama-server): the expected executable must
exist, else the nested tree is flattened into place (TAR_LAYOUT when neither works).
"""

from __future__ import annotations

import os
import posixpath
import shutil
import tarfile
import tempfile
from typing import Any, Container

from .transfer import FetchError, one_line


def unsafe(text: str) -> FetchError:
    return FetchError(text, "TAR_UNSAFE")


def normalized(name: str) -> str:
    return posixpath.normpath(name) if name else "."


def leaves_folder(path: str) -> bool:
    return path.startswith("/") or path == ".." or path.startswith("../")


def through_link(name: str, links: Container[str]) -> bool:
    """True when name sits below a symlink member: extracting it would write through the link."""
    parts = name.split("/")
    return any("/".join(parts[:i]) in links for i in range(1, len(parts)))


def check_members(members: list[tarfile.TarInfo]) -> None:
    """Refuse the archive before extracting anything: absolute paths, `..`, special files,
    links that point outside, and members that would be written through a link."""
    links = set(normalized(m.name) for m in members if m.issym())
    for m in members:
        name = normalized(m.name)
        if m.name.startswith("/") or leaves_folder(name):
            raise unsafe("%s: the path leaves the folder" % m.name)
        if not (m.isfile() or m.isdir() or m.issym() or m.islnk()):
            raise unsafe("%s: device, fifo and other special entries are not allowed" % m.name)
        if through_link(name, links):
            raise unsafe("%s: it would be written through a link" % m.name)
        if m.issym():
            target = normalized(posixpath.join(posixpath.dirname(name), m.linkname))
            if m.linkname.startswith("/") or leaves_folder(target):
                raise unsafe("%s -> %s: the link points outside the folder" % (m.name, m.linkname))
        if m.islnk():
            target = normalized(m.linkname)
            if leaves_folder(target) or target in links or through_link(target, links):
                raise unsafe("%s => %s: the hard link points outside the folder or at a link" % (m.name, m.linkname))


def check_links_inside(root: str) -> None:
    """After extraction: every symlink, followed for real (chains included), stays inside."""
    top = os.path.realpath(root)
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            if os.path.islink(path):
                real = os.path.realpath(path)
                if real != top and not real.startswith(top + os.sep):
                    raise unsafe("%s -> %s: the link points outside the folder"
                                 % (os.path.relpath(path, root), os.readlink(path)))


def extract_safely(archive: str, into: str) -> list[str]:
    """Extract archive into the empty folder `into`; returns the member names."""
    try:
        tar = tarfile.open(archive, "r:*")
    except (tarfile.TarError, OSError) as e:
        raise FetchError("%s is not a readable tar archive: %s" % (archive, one_line(e))) from None
    with tar:
        members = tar.getmembers()
        check_members(members)
        # a second guard where it exists
        options: dict[str, Any] = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        try:
            tar.extractall(into, members=members, numeric_owner=True, **options)
        except (tarfile.TarError, OSError) as e:
            raise unsafe("extracting %s failed: %s" % (archive, one_line(e))) from None
    check_links_inside(into)
    return [m.name for m in members]


def is_executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def find_nested(root: str, expect: str) -> str | None:
    """The shallowest folder D below root with D/expect in it, or None."""
    found = []
    for folder, _dirs, _files in os.walk(root):
        if folder != root and os.path.isfile(os.path.join(folder, expect)):
            found.append((folder.count(os.sep), folder))
    return min(found)[1] if found else None


def remove_empty_parents(folder: str, root: str) -> None:
    while folder != root and os.path.isdir(folder) and not os.listdir(folder):
        os.rmdir(folder)
        folder = os.path.dirname(folder)


def flatten(root: str, inner: str) -> None:
    """`mv inner/* root/`: the nested tree's contents move to the top of root."""
    holding = tempfile.mkdtemp(prefix=".flatten-", dir=root)
    os.rmdir(holding)
    os.rename(inner, holding)  # out of the way first: inner may hold an entry of its own name
    for name in sorted(os.listdir(holding)):
        target = os.path.join(root, name)
        if os.path.lexists(target):
            raise FetchError("cannot flatten %s: %s already exists at the top" % (os.path.relpath(inner, root), name),
                             "TAR_LAYOUT")
        os.rename(os.path.join(holding, name), target)
    os.rmdir(holding)
    remove_empty_parents(os.path.dirname(inner), root)


def ensure_layout(root: str, expect: str, names: list[str]) -> None:
    """Make root/expect an executable file, flattening a nested tree when that is what it takes."""
    target = os.path.join(root, expect)
    if not os.path.lexists(target):
        inner = find_nested(root, expect)
        if inner is None:
            raise FetchError("%s not found; the archive holds: %s" % (expect, ", ".join(names[:8]) or "nothing"),
                             "TAR_LAYOUT")
        flatten(root, inner)
        print("FETCH_FLATTENED from %s" % os.path.relpath(inner, root))
    if not is_executable(target):
        raise FetchError("%s is in the archive but is not an executable file" % expect, "TAR_LAYOUT")


def move_into(staging: str, dest: str) -> None:
    """The extracted entries replace same-named entries of dest."""
    for name in os.listdir(staging):
        target = os.path.join(dest, name)
        if os.path.isdir(target) and not os.path.islink(target):
            shutil.rmtree(target)
        elif os.path.lexists(target):
            os.unlink(target)
        os.rename(os.path.join(staging, name), target)


def remove_stale_staging(dest: str) -> None:
    """Extraction folders left by a fetch that was killed (we hold dest's lock: none is live)."""
    for name in os.listdir(dest):
        if name.startswith(".extract-"):
            shutil.rmtree(os.path.join(dest, name), ignore_errors=True)
