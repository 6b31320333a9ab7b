"""Whether a file a resume loads is whole, judged by its content: a safetensors file's header and
data sizes, a torch file's zip end record; and the one way such a file is opened.

Runs ON the box (checkpoints.py). Standard library only, Python >= 3.8. Every file here is
anyone's: a save cut short by a full disk, a link swapped in, a FIFO. So a file is opened without
following a link and without waiting on a FIFO (O_NOFOLLOW | O_NONBLOCK), and read only when the
opened descriptor is a regular file; each check either passes or raises Unfit with one line."""

from __future__ import annotations

import json
import os
import stat
import struct
from typing import Any

HEADER_LIMIT = 64 << 20  # a safetensors header larger than this is not one we read
CHUNK = 16 << 20
ZIP_TAIL = 65536 + 22  # a zip's end record sits in its last 22 bytes plus a comment of at most 64 KiB
ZIP_END, ZIP64_LOCATOR, ZIP64_END, ZIP_DIRECTORY = b"PK\x05\x06", b"PK\x06\x07", b"PK\x06\x06", b"PK\x01\x02"
# Bits per element of each safetensors dtype (the safetensors crate's Dtype::bitsize).
DTYPE_BITS = {"BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "F4": 4, "F6_E2M3": 6,
              "F6_E3M2": 6, "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32,
              "C64": 64, "F64": 64, "I64": 64, "U64": 64}
U64 = 1 << 64


def said(text: str, limit: int = 120) -> str:
    """A name from the box in a problem line: as it is when printable, else quoted with its
    control and format characters escaped (a line stays one line)."""
    text = text[:limit]
    return text if text.isprintable() else json.dumps(text)


class Unfit(Exception):
    """What makes a file unfit to resume from, in one line (its message)."""


def what_kind(mode: int) -> str:
    """A file's type, said as a problem line says it."""
    for test, said in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISDIR, "a folder"), (stat.S_ISREG, "a regular file")):
        if test(mode):
            return said
    return "not a regular file"


def open_regular(folder: int, name: str) -> int:
    """name in the folder open as folder, opened for reading: never through a link, never waiting
    on a FIFO, and refused (Unfit) unless the descriptor itself is a regular file."""
    try:
        f = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder)
    except OSError as e:
        raise Unfit("%s cannot be opened: %s" % (name, e.strerror)) from None
    mode = os.fstat(f).st_mode
    if not stat.S_ISREG(mode):
        os.close(f)
        raise Unfit("%s is %s, not a regular file" % (name, what_kind(mode)))
    return f


def read_at(f: int, offset: int, n: int) -> bytes:
    """Exactly n bytes at offset (ValueError where the file holds fewer)."""
    os.lseek(f, offset, os.SEEK_SET)
    parts, left = [], n
    while left:
        got = os.read(f, min(left, CHUNK))
        if not got:
            raise ValueError("truncated")
        parts.append(got)
        left -= len(got)
    return b"".join(parts)


def safetensors_header(f: int, name: str, size: int) -> tuple[int, dict[str, Any]]:
    """(header length, tensor table) of a safetensors file that holds exactly what its header
    says, checked as the safetensors library checks it before it loads a tensor: a JSON object,
    each tensor's dtype known, its shape whole numbers, its data_offsets as long as its dtype and
    shape make it, the tensors back to back from 0, and the last one ending at the file's end."""
    if size < 8:
        raise Unfit("%s is truncated (%d bytes: no header)" % (name, size))
    (n,) = struct.unpack("<Q", read_at(f, 0, 8))
    if n > HEADER_LIMIT or 8 + n > size:
        raise Unfit("%s has a header of %d bytes, more than %s" % (
            name, n, "the file holds" if n <= HEADER_LIMIT else "this check reads"))
    text = read_at(f, 8, n)
    try:
        header = json.loads(text.decode("utf-8"), parse_constant=no_constant)
    except (ValueError, RecursionError):
        header = None
    if not isinstance(header, dict):
        raise Unfit("%s: its header is not a JSON object" % name)
    metadata = header.get("__metadata__")
    if not (metadata is None or isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())):
        raise Unfit("%s: its __metadata__ is not a table of texts" % name)
    spans = []
    for tensor, info in header.items():
        if tensor != "__metadata__":
            spans.append(tensor_span(name, tensor, info))
    end = 0
    for begin, stop, tensor in sorted(spans):
        if begin != end:
            raise Unfit("%s: tensor %s starts at byte %d of the data, not %d (overlapping or a gap)" % (
                name, said(tensor, 80), begin, end))
        end = stop
    if 8 + n + end != size:
        raise Unfit("%s is %d bytes, its header says %d: %s" % (
            name, size, 8 + n + end, "cut short" if size < 8 + n + end else "bytes past its last tensor"))
    return n, header


def no_constant(name: str) -> Any:
    raise ValueError("%s is no JSON" % name)  # NaN, Infinity: Python's json reads them, JSON has none


def tensor_span(name: str, tensor: str, info: Any) -> tuple[int, int, str]:
    """(begin, end, name) of one tensor's data, once its entry is consistent."""
    if not isinstance(info, dict):
        raise Unfit("%s: tensor %s has no entry of dtype, shape and offsets" % (name, said(tensor, 80)))
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        raise Unfit("%s: tensor %s has an unknown dtype" % (name, said(tensor, 80)))
    if not (isinstance(shape, list) and all(type(d) is int and 0 <= d < U64 for d in shape)):
        raise Unfit("%s: tensor %s has no shape of whole numbers" % (name, said(tensor, 80)))
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int and 0 <= o < U64 for o in offsets)
            and offsets[0] <= offsets[1]):
        raise Unfit("%s: tensor %s has no data offsets" % (name, said(tensor, 80)))
    elements = 1
    for d in shape:
        elements *= d
    bits = elements * DTYPE_BITS[dtype]
    if bits % 8 or offsets[1] - offsets[0] != bits // 8:
        raise Unfit("%s: tensor %s holds %d bytes, its dtype and shape make %s" % (
            name, said(tensor, 80), offsets[1] - offsets[0], "%d" % (bits // 8) if bits % 8 == 0 else "no whole bytes"))
    return offsets[0], offsets[1], tensor


def torch_file(f: int, name: str, size: int) -> None:
    """A torch file (torch.save's) whole: since torch 1.6 a zip archive, whole when its end record
    closes the file and points at its central directory (a save cut short has none); an older
    pickle is taken as it is (it has no end to check). Anything else is no torch file."""
    head = read_at(f, 0, min(size, 4))
    if head == b"PK\x03\x04":
        if not zip_whole(f, size):
            raise Unfit("%s is cut short (its zip has no end record)" % name)
    elif head[:1] != b"\x80":  # a pickle's PROTO opcode: torch's format before 1.6
        raise Unfit("%s is neither a zip nor a pickle: not a torch file" % name)


def zip_whole(f: int, size: int) -> bool:
    """Whether the zip's end record is its last bytes (its comment reaching the end exactly) and
    its central directory (its zip64 one for a large archive) lies just before it."""
    start = max(0, size - ZIP_TAIL)
    tail = read_at(f, start, size - start)
    at = tail.rfind(ZIP_END)
    while at >= 0:
        if len(tail) - at >= 22:
            entries, dir_size, dir_offset, comment = struct.unpack("<HII H", tail[at + 10:at + 22])
            if at + 22 + comment == len(tail):
                return directory_before(f, start + at, entries, dir_size, dir_offset)
        at = tail.rfind(ZIP_END, 0, at)
    return False


def directory_before(f: int, end: int, entries: int, dir_size: int, dir_offset: int) -> bool:
    """Whether the central directory the end record at `end` names ends where the end records begin."""
    if end >= 20 and read_at(f, end - 20, 4) == ZIP64_LOCATOR:
        (record,) = struct.unpack("<Q", read_at(f, end - 12, 8))
        if record + 56 > end - 20 or read_at(f, record, 4) != ZIP64_END:
            return False
        entries, dir_size, dir_offset = struct.unpack("<QQQ", read_at(f, record + 32, 24))
        end = record
    if dir_offset + dir_size != end:
        return False
    return entries == 0 or read_at(f, dir_offset, 4) == ZIP_DIRECTORY


def json_object(f: int, name: str, size: int, limit: int) -> dict[str, Any]:
    """A JSON file's object, read whole (a file over limit is not read: said)."""
    if size > limit:
        raise Unfit("%s is %d bytes, more than this check reads (%d)" % (name, size, limit))
    try:
        value = json.loads(read_at(f, 0, size).decode("utf-8"))
    except (ValueError, RecursionError):
        value = None
    if not isinstance(value, dict):
        raise Unfit("%s does not parse as a JSON object" % name)
    return value
