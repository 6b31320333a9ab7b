"""A checkpoint written whole: its completeness record, the folder it is written in first, and
how it is put in place and how an old one goes.

Runs ON the box, standard library only, Python >= 3.8: the train stage writes with it (in the
box venv), checkpoints.py reads the record back (the probe's python3).

A checkpoint is written into a temporary sibling, STAGING + "checkpoint-STEP" (`tmp-...`: the
Trainer's own glob for checkpoint-*, transformers' get_last_checkpoint and the box's listing all
pass over it), its files reach the disk (fsync), the record RECORD is written last and reaches the
disk, and only then is the folder renamed to checkpoint-STEP, in one rename. So a checkpoint-STEP
folder is whole or absent, whenever the run is killed. An old checkpoint is deleted the same way
round: renamed to a temporary name first, then removed, so no half-deleted checkpoint-STEP is
ever seen either.

The record, samai_complete.json:

  {"samai_complete": 1, "step": STEP, "files": {"NAME": BYTES, "FOLDER/NAME": BYTES, ...}}

every regular file of the checkpoint (and of its folders, one level down: DeepSpeed's
global_stepN/) with its size, the record itself left out. checkpoints.py holds a checkpoint to it:
each file named there, as large as it says, and nothing a resume loads that it does not name.
"""

from __future__ import annotations

import json
import os
import re
import stat
from typing import Callable, Dict, List, Optional, Tuple

RECORD = "samai_complete.json"
VERSION = 1
RECORD_LIMIT = 4 << 20  # a record larger than this is not read (said)
MAX_ENTRIES = 4000  # files a record may name (checkpoints.py judges 2,000 entries a folder)
STAGING = "tmp-"  # the prefix of a checkpoint being written, or being deleted: never a checkpoint-STEP
CHECKPOINT = re.compile(r"^checkpoint-(\d{1,12})$")
NAME = re.compile(r"^[^/\0]{1,255}$")
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
Midway = Optional[Callable[[], None]]  # called when half of the record is written (the stage's fault hook)


class Unsealed(ValueError):
    """A record that does not say what a record says, in one line."""


def listing(folder: str, sync: bool = False) -> Dict[str, int]:
    """{relative name: size} of the folder's regular files and of its folders' one level down,
    the record left out; each file fsynced when sync (its data on the disk before the record)."""
    found: Dict[str, int] = {}
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        st = os.lstat(path)
        if stat.S_ISDIR(st.st_mode):
            for inner in sorted(os.listdir(path)):
                ist = os.lstat(os.path.join(path, inner))
                if stat.S_ISREG(ist.st_mode):
                    found[name + "/" + inner] = _synced(os.path.join(path, inner), ist, sync)
            if sync:
                fsync_folder(path)
        elif stat.S_ISREG(st.st_mode) and name != RECORD:
            found[name] = _synced(path, st, sync)
    return found


def _synced(path: str, st: os.stat_result, sync: bool) -> int:
    if sync:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.fsync(fd)
            return os.fstat(fd).st_size
        finally:
            os.close(fd)
    return st.st_size


def fsync_folder(path: str) -> None:
    fd = os.open(path, DIR_FLAGS)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def record_bytes(step: int, files: Dict[str, int]) -> bytes:
    return (json.dumps({"samai_complete": VERSION, "step": step, "files": files}, indent=1, sort_keys=True)
            + "\n").encode()


def seal(folder: str, step: int, midway: Midway = None) -> Dict[str, int]:
    """Write the record into a checkpoint folder whose files are all written, after they reach
    the disk; the record, then the folder, reach it too. The files it names."""
    files = listing(folder, sync=True)
    data = record_bytes(step, files)
    fd = os.open(os.path.join(folder, RECORD), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o644)
    try:
        half = len(data) // 2
        _write_all(fd, data[:half])
        if midway is not None:
            midway()
        _write_all(fd, data[half:])
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_folder(folder)
    return files


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def read_record(data: bytes, step: int) -> Dict[str, int]:
    """The files a record names, with their sizes, once it is a record of this step (Unsealed if not)."""
    try:
        value = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError):
        value = None
    if not isinstance(value, dict) or value.get("samai_complete") != VERSION:
        raise Unsealed("%s is not a completeness record (version %d)" % (RECORD, VERSION))
    said_step = value.get("step")
    if type(said_step) is not int or said_step != step:
        raise Unsealed("%s is the record of step %s, not of the folder's step %d" % (
            RECORD, json.dumps(said_step)[:40], step))
    files = value.get("files")
    if not isinstance(files, dict) or len(files) > MAX_ENTRIES:
        raise Unsealed("%s names no files (or more than %d)" % (RECORD, MAX_ENTRIES))
    for name, size in files.items():
        parts = name.split("/")
        if (len(parts) > 2 or not all(NAME.match(p) and p not in (".", "..") for p in parts)
                or type(size) is not int or not 0 <= size < 1 << 62):
            raise Unsealed("%s holds an entry that is no file name and size: %s" % (RECORD, json.dumps(name)[:80]))
    return files


def staged_name(name: str) -> str:
    """Where checkpoint-STEP is written before it is whole (a sibling)."""
    return STAGING + name


def publish(staged: str, final: str) -> None:
    """Put a sealed checkpoint folder in place, in one rename (a checkpoint of the same step
    already there, from an earlier run that was resumed from before it, is moved aside first and
    removed after), and the rename reaches the disk."""
    parent = os.path.dirname(final)
    aside = os.path.join(parent, STAGING + "replaced-" + os.path.basename(final))
    replaced = False
    if os.path.lexists(final):
        remove_tree(aside)
        os.rename(final, aside)
        replaced = True
    os.rename(staged, final)
    fsync_folder(parent)
    if replaced:
        remove_tree(aside)


def rotate(parent: str, keep: int, protect: Tuple[str, ...] = (),
           said: Optional[Callable[[str, str], None]] = None) -> List[str]:
    """Delete the oldest checkpoint-STEP folders (by step) until `keep` are left (or as many as
    are protected), never one named in protect; each renamed to a temporary name first, then
    removed. said(name, what) is called after each rename ("moved aside") and each removal
    ("deleted"). The names deleted."""
    steps = sorted((int(m.group(1)), n) for n in os.listdir(parent) for m in [CHECKPOINT.match(n)] if m)
    names = [n for _, n in steps]
    keep = max(keep, len(set(protect) & set(names)))
    gone: List[str] = []
    for name in names:
        if len(names) - len(gone) <= keep:
            break
        if name in protect:
            continue
        aside = os.path.join(parent, STAGING + "deleted-" + name)
        remove_tree(aside)
        os.rename(os.path.join(parent, name), aside)
        if said:
            said(name, "moved aside")
        remove_tree(aside)
        if said:
            said(name, "deleted")
        gone.append(name)
    if gone:
        fsync_folder(parent)
    return gone


def leftovers(parent: str) -> List[str]:
    """The temporary folders a killed save or deletion left in the checkpoints' folder."""
    return sorted(n for n in os.listdir(parent) if n.startswith(STAGING) and os.path.isdir(os.path.join(parent, n))
                  and not os.path.islink(os.path.join(parent, n)))


def remove_tree(path: str) -> None:
    """Remove a folder and what it holds (links removed as links); nothing there is no error."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(path)
        return
    for name in os.listdir(path):
        remove_tree(os.path.join(path, name))
    os.rmdir(path)
