"""A training run's checkpoints, listed and judged: what a dead run could resume from.

Runs ON the box. Request on stdin: {"workspace", "folder", "weights"?, "legacy"?} (folder: a train stage's
`checkpoints`, inside the workspace; weights false: sizes and completeness only, the adapter not
read for NaN, as the console's watch of a running run's checkpoints asks every half minute).
Reply: {"folder", "checkpoints": [...], "unjudged", "error"?}, newest step first (the newest
MAX_CHECKPOINTS; unjudged: how many older ones were left out), each

  {"name": "checkpoint-1200", "step": 1200, "mtime", "bytes", "files",
   "complete": bool, "missing": [...], "temporary": [...], "settling": bool,
   "finite": bool | None, "nonfinite": [tensor names], "weights": "adapter_model.safetensors" | None,
   "problems": [one line each]}

complete: the train stage sealed it whole (sealed.py: its completeness record, samai_complete.json,
written last, names every file it holds with its size, and each is there, that large; a file a
resume loads that it does not name is a problem; a folder without the record is not complete
unless the request says "legacy": true, where such a folder, an older train stage's or another
trainer's, is judged by its content alone), the Trainer's own state is all there (trainer_state.json,
the optimizer's and the scheduler's state, the weights, and adapter_config.json beside an adapter's
weights), no temporary file is left, and it is whole by its content, never by its names
(tensorfiles.py): every entry a
regular file or a folder (a symlink, a FIFO, a device is a problem: the resumed run would follow
or hang on it), every file a resume loads non-empty, every safetensors file exactly as long as its
header says, every torch file a zip with its end record (or an old pickle), trainer_state.json an object whose
global_step is the folder's step (the Trainer names the folder checkpoint-GLOBAL_STEP and writes
that state into it). Each problem is one line of "problems" and makes it not complete.
settling: something in it was written in the last SETTLE_S seconds: while its run still runs, a
save may be under way (the console weighs that; a dead run writes nothing more). finite: every float in
the adapter's safetensors is a number (no NaN, no inf); None when there is no safetensors file to
read. The folder is opened inside the workspace without following symlinks (confine.py); its
names are anyone's, sent back as they are (the console shows them inert). Standard library only.
(wire.py: CheckpointsRequest, CheckpointsReply, CheckpointEntry.)
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
import time

from .confine import Escape, open_folder, open_root, parts_inside, workspace_root
from .procfs import serve
from .sealed import RECORD, RECORD_LIMIT, Unsealed, read_record
from .tensorfiles import (
    CHUNK,
    Unfit,
    json_object,
    open_regular,
    read_at,
    safetensors_header,
    said,
    torch_file,
    what_kind,
)
from .wire import CheckpointEntry, CheckpointsReply, CheckpointsRequest

CHECKPOINT = re.compile(r"^checkpoint-(?P<step>\d{1,12})$")
MAX_CHECKPOINTS = 200
MAX_FILES = 2000  # entries in one checkpoint folder (and in each folder inside it): more is a problem, said
MAX_PROBLEMS = 20  # lines of problems per checkpoint; the rest counted in one more
SETTLE_S = 5.0
STATE_LIMIT = 64 << 20  # trainer_state.json and adapter_config.json are read whole up to this
WEIGHTS_LIMIT = 8 << 30  # an adapter larger than this is not read for NaN (said as such)
# What a Trainer checkpoint holds (transformers' trainer.py: TRAINER_STATE_NAME, OPTIMIZER_NAME,
# SCHEDULER_NAME; peft's adapter files). DeepSpeed keeps the optimizer in global_stepN/ instead.
NEEDED = (("trainer_state.json",), ("optimizer.pt", "optimizer.bin", "global_step*"), ("scheduler.pt",),
          ("adapter_model.safetensors", "adapter_model.bin", "model.safetensors", "pytorch_model.bin"))
ADAPTER_CONFIG = "adapter_config.json"  # peft reads it to load the adapter's weights
TORCH = (".pt", ".pth", ".bin")
LOADED = TORCH + (".safetensors", ".json")  # what a resume loads: an empty one is a save cut short
TEMPORARY = re.compile(r"(?:\.tmp|\.temp|\.partial|\.incomplete|\.lock)$|^tmp|^\.")
# Where NaN and inf live in each float type, little-endian: (item size, (byte index, mask) pairs
# that an exponent of all ones sets). A value is not finite when every listed byte has its mask set.
FLOATS = {"F64": (8, ((7, 0x7F), (6, 0xF0))), "F32": (4, ((3, 0x7F), (2, 0x80))),
          "BF16": (2, ((1, 0x7F), (0, 0x80))), "F16": (2, ((1, 0x7C),))}
SET = dict((mask, bytes(1 if b & mask == mask else 0 for b in range(256)))  # byte -> 1 where mask is set
           for _, lanes in FLOATS.values() for _, mask in lanes)


def matches(name: str, st: os.stat_result, pattern: str) -> bool:
    """Whether an entry is what a NEEDED name stands for (NAME*: DeepSpeed's folder of that prefix)."""
    return name.startswith(pattern[:-1]) and stat.S_ISDIR(st.st_mode) if pattern.endswith("*") else name == pattern


def entries(fd: int) -> tuple[list[tuple[str, os.stat_result]], int]:
    """The folder's entries (lstat: never followed), at most MAX_FILES, and how many more it holds."""
    names = sorted(os.listdir(fd))
    out = []
    for name in names[:MAX_FILES]:
        try:
            out.append((name, os.stat(name, dir_fd=fd, follow_symlinks=False)))
        except OSError:
            continue
    return out, max(0, len(names) - MAX_FILES)


def tree_bytes(fd: int, name: str, st: os.stat_result) -> int:
    """A file's size, or a folder's (global_stepN) regular files' sizes, one level down."""
    if not stat.S_ISDIR(st.st_mode):
        return st.st_size if stat.S_ISREG(st.st_mode) else 0
    try:
        sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
    except OSError:
        return 0
    try:
        return sum(s.st_size for _, s in entries(sub)[0] if stat.S_ISREG(s.st_mode))
    finally:
        os.close(sub)


def nonfinite_tensors(fd: int, name: str) -> tuple[list[str], str | None]:
    """The tensors of a safetensors file holding a NaN or an inf, and a problem reading it."""
    try:
        f = open_regular(fd, name)
    except Unfit as e:
        return [], str(e)
    try:
        size = os.fstat(f).st_size
        if size > WEIGHTS_LIMIT:
            return [], "%s is %d bytes: not read for NaN" % (said(name), size)
        n, header = safetensors_header(f, said(name), size)
        bad: list[str] = []
        for tensor, info in sorted(header.items()):
            if tensor == "__metadata__" or info["dtype"] not in FLOATS:
                continue
            begin, end = info["data_offsets"]
            os.lseek(f, 8 + n + begin, os.SEEK_SET)
            if not finite(f, end - begin, info["dtype"]):
                bad.append(tensor[:200])
        return bad, None
    except Unfit as e:
        return [], str(e)
    except (OSError, ValueError) as e:
        return [], "%s cannot be read: %s" % (said(name), e)
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


def unfit_files(fd: int, files: list[tuple[str, os.stat_result]], step: int,
                prefix: str = "") -> list[tuple[str, str]]:
    """(name, one line) for each entry a resume could not load as it is: not a regular file (a
    link, a FIFO, a device; a folder only at the top and not named as a file, as DeepSpeed's
    global_stepN, read one level down), empty, or not whole by its content."""
    found = []
    for name, st in files:
        shown = prefix + said(name)
        if stat.S_ISDIR(st.st_mode) and not prefix and not name.endswith(LOADED):
            found += [(name, line) for _, line in unfit_folder(fd, name, step)]
        elif not stat.S_ISREG(st.st_mode):
            found.append((name, "%s is %s, not a regular file" % (shown, what_kind(st.st_mode))))
        elif st.st_size == 0 and name.endswith(LOADED):
            found.append((name, "%s is empty" % shown))
        elif name.endswith(LOADED):
            try:
                whole(fd, name, shown, step if not prefix else None)
            except Unfit as e:
                found.append((name, str(e)))
            except (OSError, ValueError) as e:
                found.append((name, "%s cannot be read whole: %s" % (shown, e)))
    return found


def unfit_folder(fd: int, name: str, step: int) -> list[tuple[str, str]]:
    try:
        sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
    except OSError as e:
        return [(name, "%s/ cannot be opened: %s" % (said(name), e.strerror))]
    try:
        files, more = entries(sub)
        cut = [(name, "%s/ holds %d entries more than the %d judged" % (said(name), more, MAX_FILES))] if more else []
        return unfit_files(sub, files, step, said(name) + "/") + cut
    finally:
        os.close(sub)


def whole(fd: int, name: str, shown: str, step: int | None) -> None:
    """Unfit unless this file a resume loads is whole by its content (step: the folder's, for
    its trainer_state.json)."""
    f = open_regular(fd, name)
    try:
        size = os.fstat(f).st_size
        if name.endswith(TORCH):
            torch_file(f, shown, size)
        elif name.endswith(".safetensors"):
            safetensors_header(f, shown, size)
        elif name == "trainer_state.json" and step is not None:
            state = json_object(f, shown, size, STATE_LIMIT)
            global_step = state.get("global_step")
            if type(global_step) is not int or global_step != step:
                raise Unfit("%s says global_step %s, not the folder's step %d" % (
                    shown, "(none)" if global_step is None else json.dumps(global_step)[:40], step))
        elif name == ADAPTER_CONFIG:
            json_object(f, shown, size, STATE_LIMIT)
    finally:
        os.close(f)


def held_to_record(fd: int, files: list[tuple[str, os.stat_result]], step: int, legacy: bool) -> list[str]:
    """What does not hold to the checkpoint's completeness record, one line each: no record (unless
    legacy), a record that is none or of another step, a file it names not there or of another
    size, a file a resume loads that it does not name."""
    if not any(n == RECORD for n, _ in files):
        return [] if legacy else ["no %s: not known to be whole (its save was cut short, or an older train stage "
                                  "or another trainer wrote it)" % RECORD]
    try:
        f = open_regular(fd, RECORD)
    except Unfit as e:
        return [str(e)]
    try:
        size = os.fstat(f).st_size
        if size > RECORD_LIMIT:
            return ["%s is %d bytes, more than this check reads (%d)" % (RECORD, size, RECORD_LIMIT)]
        listed = read_record(read_at(f, 0, size), step)
    except Unsealed as e:
        return [str(e)]
    except (OSError, ValueError) as e:
        return ["%s cannot be read: %s" % (RECORD, e)]
    finally:
        os.close(f)
    there = regular_sizes(fd, files)
    problems = []
    for name, size in sorted(listed.items()):
        got = there.get(name)
        if got is None:
            problems.append("%s is not there as a regular file (%s names it)" % (said(name), RECORD))
        elif got != size:
            problems.append("%s is %d bytes, %s says %d" % (said(name), got, RECORD, size))
    problems += ["%s is not named in %s: written after the checkpoint was sealed" % (said(n), RECORD)
                 for n in sorted(there) if n not in listed and n.endswith(LOADED)]
    return problems


def regular_sizes(fd: int, files: list[tuple[str, os.stat_result]]) -> dict[str, int]:
    """{NAME or FOLDER/NAME: size} of the regular files of the folder and of its folders one level
    down (as sealed.listing names them), the record left out."""
    sizes = {}
    for name, st in files:
        if stat.S_ISREG(st.st_mode) and name != RECORD:
            sizes[name] = st.st_size
        elif stat.S_ISDIR(st.st_mode):
            try:
                sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError:
                continue
            try:
                sizes.update((name + "/" + n, s.st_size) for n, s in entries(sub)[0] if stat.S_ISREG(s.st_mode))
            finally:
                os.close(sub)
    return sizes


def judge(fd: int, name: str, now: float, read_weights: bool = True, legacy: bool = False) -> CheckpointEntry:
    m = CHECKPOINT.match(name)
    assert m is not None
    step = int(m.group("step"))
    files, more = entries(fd)
    names = [n for n, _ in files]
    missing = [" or ".join(alts) for alts in NEEDED if not any(matches(n, s, a) for n, s in files for a in alts)]
    weights = next((n for n in names if n.endswith(".safetensors") and n.startswith(("adapter_model", "model"))),
                   None)
    if any(n.startswith("adapter_model.") for n in names) and ADAPTER_CONFIG not in names:
        missing.append(ADAPTER_CONFIG)
    temporary = [n for n in names if TEMPORARY.search(n)][:20]
    unfit = unfit_files(fd, files, step)
    if more:
        unfit.append(("", "holds %d entries more than the %d judged" % (more, MAX_FILES)))
    newest = max([s.st_mtime for _, s in files] or [0.0])
    settling = now - newest < SETTLE_S
    scan = weights is not None and read_weights and all(n != weights for n, _ in unfit)
    nonfinite, problem = nonfinite_tensors(fd, weights) if scan and weights else ([], None)
    broken = (["missing " + x for x in missing] + ["a temporary file is left: " + said(t) for t in temporary]
              + [line for _, line in unfit] + held_to_record(fd, files, step, legacy))
    problems = broken[:MAX_PROBLEMS] + (["and %d more problems" % (len(broken) - MAX_PROBLEMS)]
                                        if len(broken) > MAX_PROBLEMS else [])
    if settling:
        problems.append("written %.0f s ago: a save may still be under way" % max(now - newest, 0))
    if problem:
        problems.append(problem)
    if nonfinite:
        problems.append("NaN or inf in %d tensor(s) of %s, first %s" % (len(nonfinite), said(weights or ""),
                                                                               said(nonfinite[0])))
    return {"name": name, "step": step, "mtime": newest, "files": len(files),
            "bytes": sum(tree_bytes(fd, n, s) for n, s in files),
            "complete": not broken, "missing": missing, "temporary": temporary,
            "settling": settling, "finite": None if not scan or problem else not nonfinite,
            "nonfinite": nonfinite[:20], "weights": weights, "problems": problems}


def not_a_folder(fd: int, name: str, error: OSError) -> CheckpointEntry:
    """A checkpoint-STEP entry that cannot be opened as a folder of its own (a link, a file): listed
    as not complete, with why, so that a resume passes over it saying so."""
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        why = "%s is %s, not a folder" % (name, what_kind(st.st_mode))
        mtime = st.st_mtime
    except OSError:
        why, mtime = "%s cannot be opened: %s" % (name, error.strerror), 0.0
    return {"name": name, "step": int(name.split("-", 1)[1]), "mtime": mtime, "files": 0, "bytes": 0,
            "complete": False, "settling": False, "finite": None, "problems": [why]}


def checkpoints(req: CheckpointsRequest) -> CheckpointsReply:
    workspace, folder = workspace_root(req["workspace"]), req["folder"]
    read_weights = req.get("weights", True) is not False
    legacy = req.get("legacy", False) is True
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
        names = [n for n in os.listdir(fd) if CHECKPOINT.match(n)]  # every one: the newest are judged
        names.sort(key=lambda n: int(n.split("-", 1)[1]), reverse=True)
        for name in names[:MAX_CHECKPOINTS]:
            try:
                sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                              dir_fd=fd)
            except OSError as e:
                found.append(not_a_folder(fd, name, e))
                continue
            try:
                found.append(judge(sub, name, now, read_weights, legacy))
            finally:
                os.close(sub)
    finally:
        os.close(fd)
    return {"folder": folder, "checkpoints": found, "unjudged": max(0, len(names) - MAX_CHECKPOINTS)}


if __name__ == "__main__":
    sys.exit(serve("checkpoints", checkpoints))
