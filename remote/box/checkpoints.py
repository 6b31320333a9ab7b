"""A training run's checkpoints, listed and judged: what a dead run could resume from.

Runs ON the box. Request on stdin: {"workspace", "folder", "weights"?} (folder: a train stage's
`checkpoints`, inside the workspace; weights false: sizes and completeness only, the adapter not
read for NaN, as the console's watch of a running run's checkpoints asks every half minute).
Reply: {"folder", "checkpoints": [...], "error"?}, newest step first, each

  {"name": "checkpoint-1200", "step": 1200, "mtime", "bytes", "files",
   "complete": bool, "missing": [...], "temporary": [...], "settling": bool,
   "finite": bool | None, "nonfinite": [tensor names], "weights": "adapter_model.safetensors" | None,
   "problems": [one line each]}

complete: the Trainer's own state is all there (trainer_state.json, the optimizer's and the
scheduler's state, the adapter's weights) and whole (trainer_state.json parses; a torch file in
zip form has its end record: a save cut short has none), and no temporary file is left.
settling: something in it was written in the last SETTLE_S seconds: while its run still runs, a
save may be under way (the console weighs that; a dead run writes nothing more). finite: every float in
the adapter's safetensors is a number (no NaN, no inf); None when there is no safetensors file to
read. The folder is opened inside the workspace without following symlinks (confine.py); its
names are anyone's, sent back as they are (the console shows them inert). Standard library only.
"""

from __future__ import annotations

import json
import os
import re
import stat
import struct
import sys
import time
from typing import Any

from .confine import Escape, open_folder, open_root, parts_inside, workspace_root
from .procfs import serve

CHECKPOINT = re.compile(r"^checkpoint-(?P<step>\d{1,12})$")
MAX_CHECKPOINTS = 200
MAX_FILES = 2000  # in one checkpoint folder
SETTLE_S = 5.0
HEADER_LIMIT = 64 << 20  # a safetensors header larger than this is not one we read
WEIGHTS_LIMIT = 8 << 30  # an adapter larger than this is not read for NaN (said as such)
CHUNK = 16 << 20
ZIP_TAIL = 65536 + 22  # a zip's end record sits in its last 22 bytes plus a comment of at most 64 KiB
# What a Trainer checkpoint holds (transformers' trainer.py: TRAINER_STATE_NAME, OPTIMIZER_NAME,
# SCHEDULER_NAME; peft's adapter files). DeepSpeed keeps the optimizer in global_stepN/ instead.
NEEDED = (("trainer_state.json",), ("optimizer.pt", "optimizer.bin", "global_step*"), ("scheduler.pt",),
          ("adapter_model.safetensors", "adapter_model.bin", "model.safetensors", "pytorch_model.bin"))
TEMPORARY = re.compile(r"(?:\.tmp|\.temp|\.partial|\.incomplete|\.lock)$|^tmp|^\.")
# Where NaN and inf live in each float type, little-endian: (item size, (byte index, mask) pairs
# that an exponent of all ones sets). A value is not finite when every listed byte has its mask set.
FLOATS = {"F64": (8, ((7, 0x7F), (6, 0xF0))), "F32": (4, ((3, 0x7F), (2, 0x80))),
          "BF16": (2, ((1, 0x7F), (0, 0x80))), "F16": (2, ((1, 0x7C),))}
SET = dict((mask, bytes(1 if b & mask == mask else 0 for b in range(256)))  # byte -> 1 where mask is set
           for _, lanes in FLOATS.values() for _, mask in lanes)


def matches(name: str, pattern: str) -> bool:
    return name.startswith(pattern[:-1]) if pattern.endswith("*") else name == pattern


def entries(fd: int) -> list[tuple[str, os.stat_result]]:
    """The folder's entries (not followed), at most MAX_FILES."""
    out = []
    for name in sorted(os.listdir(fd))[:MAX_FILES]:
        try:
            out.append((name, os.stat(name, dir_fd=fd, follow_symlinks=False)))
        except OSError:
            continue
    return out


def tree_bytes(fd: int, name: str, st: os.stat_result) -> int:
    """A file's size, or a folder's (global_stepN) regular files' sizes, one level down."""
    if not stat.S_ISDIR(st.st_mode):
        return st.st_size if stat.S_ISREG(st.st_mode) else 0
    try:
        sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
    except OSError:
        return 0
    try:
        return sum(s.st_size for _, s in entries(sub) if stat.S_ISREG(s.st_mode))
    finally:
        os.close(sub)


def nonfinite_tensors(fd: int, name: str) -> tuple[list[str], str | None]:
    """The tensors of a safetensors file holding a NaN or an inf, and a problem reading it."""
    try:
        f = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
    except OSError as e:
        return [], "%s cannot be opened: %s" % (name, e.strerror)
    try:
        size = os.fstat(f).st_size
        if size > WEIGHTS_LIMIT:
            return [], "%s is %d bytes: not read for NaN" % (name, size)
        head = os.read(f, 8)
        if len(head) < 8:
            return [], "%s is truncated (no header)" % name
        (n,) = struct.unpack("<Q", head)
        if n > HEADER_LIMIT or 8 + n > size:
            return [], "%s has a header of %d bytes, more than the file holds" % (name, n)
        header = json.loads(read_exactly(f, n).decode("utf-8"))
        if not isinstance(header, dict):
            return [], "%s has no tensor table" % name
        bad: list[str] = []
        for tensor, info in sorted(header.items()):
            if tensor == "__metadata__" or not isinstance(info, dict) or info.get("dtype") not in FLOATS:
                continue
            offsets = info.get("data_offsets")
            if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)
                    and 0 <= offsets[0] <= offsets[1] and 8 + n + offsets[1] <= size):
                return bad, "%s: tensor %s has data offsets outside the file" % (name, tensor[:80])
            os.lseek(f, 8 + n + offsets[0], os.SEEK_SET)
            if not finite(f, offsets[1] - offsets[0], info["dtype"]):
                bad.append(tensor[:200])
        return bad, None
    except (OSError, ValueError) as e:
        return [], "%s cannot be read: %s" % (name, e)
    finally:
        os.close(f)


def read_exactly(f: int, n: int) -> bytes:
    parts, left = [], n
    while left:
        got = os.read(f, min(left, CHUNK))
        if not got:
            raise ValueError("truncated")
        parts.append(got)
        left -= len(got)
    return b"".join(parts)


def finite(f: int, n: int, dtype: str) -> bool:
    """Whether the n bytes at f's offset, of this float type, are all finite. Each byte lane of
    the exponent is cut out with a stride (C speed) and the lanes are ANDed as big integers."""
    size, lanes = FLOATS[dtype]
    chunk = CHUNK - CHUNK % size
    while n > 0:
        data = read_exactly(f, min(n, chunk))
        n -= len(data)
        hit = -1
        for index, mask in lanes:
            bits = int.from_bytes(data[index::size].translate(SET[mask]), "big")
            hit = bits if hit == -1 else hit & bits
            if not hit:
                break
        if hit:
            return False
    return True


def parsed(data: bytes) -> Any:
    try:
        return json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError):
        return None


def cut_short(fd: int, names: list[str]) -> list[str]:
    """What in a checkpoint a save left unfinished: trainer_state.json that does not parse, a
    torch file in zip form (torch.save's, since 1.6) without its end-of-central-directory record."""
    found = []
    for name in names:
        if name != "trainer_state.json" and not name.endswith((".pt", ".pth", ".bin")):
            continue
        try:
            f = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
        except OSError:
            continue
        try:
            size = os.fstat(f).st_size
            if name == "trainer_state.json":
                if size > HEADER_LIMIT or not isinstance(parsed(read_exactly(f, size)), dict):
                    found.append("trainer_state.json does not parse as a JSON object")
            elif os.read(f, 4) == b"PK\x03\x04":
                os.lseek(f, max(0, size - ZIP_TAIL), os.SEEK_SET)
                if b"PK\x05\x06" not in read_exactly(f, min(size, ZIP_TAIL)):
                    found.append("%s is cut short (its zip has no end record)" % name)
        except (OSError, ValueError):
            found.append("%s cannot be read whole" % name)
        finally:
            os.close(f)
    return found


def judge(fd: int, name: str, now: float, read_weights: bool = True) -> dict[str, Any]:
    m = CHECKPOINT.match(name)
    assert m is not None
    files = entries(fd)
    names = [n for n, _ in files]
    missing = [" or ".join(alts) for alts in NEEDED if not any(matches(n, a) for n in names for a in alts)]
    temporary = [n for n in names if TEMPORARY.search(n)][:20]
    short = cut_short(fd, names)
    newest = max([s.st_mtime for _, s in files] or [0.0])
    settling = now - newest < SETTLE_S
    weights = next((n for n in names if n.endswith(".safetensors") and n.startswith(("adapter_model", "model"))),
                   None)
    nonfinite, problem = nonfinite_tensors(fd, weights) if weights and read_weights else ([], None)
    problems = ["missing " + x for x in missing] + ["a temporary file is left: " + t for t in temporary] + short
    if settling:
        problems.append("written %.0f s ago: a save may still be under way" % max(now - newest, 0))
    if problem:
        problems.append(problem)
    if nonfinite:
        problems.append("NaN or inf in %d tensor(s) of %s, first %s" % (len(nonfinite), weights, nonfinite[0]))
    return {"name": name, "step": int(m.group("step")), "mtime": newest, "files": len(files),
            "bytes": sum(tree_bytes(fd, n, s) for n, s in files),
            "complete": not missing and not temporary and not short, "missing": missing, "temporary": temporary,
            "settling": settling, "finite": None if weights is None or problem or not read_weights else not nonfinite,
            "nonfinite": nonfinite[:20], "weights": weights, "problems": problems}


def checkpoints(req: dict[str, Any]) -> dict[str, Any]:
    workspace, folder = workspace_root(req["workspace"]), req["folder"]
    read_weights = req.get("weights", True) is not False
    if not isinstance(folder, str) or not folder:
        raise ValueError("folder must be a path in the workspace")
    try:
        root = open_root(workspace)
        try:
            fd = open_folder(root, parts_inside(workspace, folder))
        finally:
            os.close(root)
    except FileNotFoundError:
        return {"folder": folder, "checkpoints": []}
    except (Escape, OSError) as e:
        return {"folder": folder, "checkpoints": [], "error": "%s: %s" % (folder, e)}
    now, found = time.time(), []
    try:
        names = [n for n, s in entries(fd) if CHECKPOINT.match(n) and stat.S_ISDIR(s.st_mode)]
        names.sort(key=lambda n: int(n.split("-", 1)[1]), reverse=True)
        for name in names[:MAX_CHECKPOINTS]:
            try:
                sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError:
                continue
            try:
                found.append(judge(sub, name, now, read_weights))
            finally:
                os.close(sub)
    finally:
        os.close(fd)
    return {"folder": folder, "checkpoints": found}


if __name__ == "__main__":
    sys.exit(serve("checkpoints", checkpoints))
