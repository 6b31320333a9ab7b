"""The GGUF v3 layout a surgery writes, the write itself (as OUT.part), and the mandatory
assertions on what was written (the playbook's §5).

Runs ON the box (standard library only, Python >= 3.8), imported by gguf_surgery.py.

OUT.part is created new (O_EXCL, O_NOFOLLOW): a file or link already at that name, whether an
earlier run's leftover or one placed there while the sources were read, would be written
through, so it is refused and left as it is. What is written is read back through the same
descriptor, and it becomes OUT by a rename that never replaces anything at OUT (atomic.py).
On failure OUT.part is removed only while it is still the file this run created.

Layout: magic, version, tensor_count (u64 @8), kv_count (u64 @16), the KVs, the tensor infos
(u64 name length, name, u32 n_dims, u64 dims, u32 type, u64 offset); header_end is after the
last tensor info; the data area starts at align(header_end, alignment) and each tensor's offset
is relative to it, aligned; the file ends at the last tensor's data padded to the alignment.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, List, Mapping, Sequence

if TYPE_CHECKING:
    from .gguf_format import Tensor
    from .gguf_source import Source

import hashlib
import json
import os
import struct

from .atomic import rename_new
from .gguf_check import inspect
from .gguf_format import (
    ARRAY,
    BOOL,
    FLOAT32,
    FLOAT64,
    MAGIC,
    SCALAR_FORMATS,
    STRING,
    VALUE_TYPE_NAMES,
    align,
)
from .wire import Assertion

U32 = struct.Struct("<I")
U64 = struct.Struct("<Q")
PART = ".part"
# Type names a request may use for a new key: ours (u32, str, arr[str]) and gguf-py's (uint32, string).
TYPE_IDS = dict((name, t) for t, name in VALUE_TYPE_NAMES.items())
TYPE_IDS.update({"uint8": 0, "int8": 1, "uint16": 2, "int16": 3, "uint32": 4, "int32": 5, "float32": 6,
                 "string": 8, "uint64": 10, "int64": 11, "float64": 12})
TRUE_TEXT = ("true", "1", "yes", "on")
FALSE_TEXT = ("false", "0", "no", "off")
Run = List[Any]  # [source, start, end, [OutTensor, ...]]: one range of a source to read (reads_of)


class WriteError(Exception):
    """The output cannot be built or failed an assertion: the message has the numbers."""


# ---------------------------------------------------------------------------------------------
# Encoding


def encode_string(text: str | bytes) -> bytes:
    data = text.encode("utf-8") if isinstance(text, str) else text
    return U64.pack(len(data)) + data


def type_of(name: str) -> tuple[int, int | None]:
    """(value type, element type or None) for a type name: u32, str, arr[str], uint32, ..."""
    name = name.strip().lower()
    if name.startswith("arr[") and name.endswith("]"):
        element = TYPE_IDS.get(name[4:-1])
        if element is None or element == ARRAY:
            raise WriteError("unknown array element type %r (one of %s)" % (name[4:-1], scalar_type_names()))
        return ARRAY, element
    if name not in TYPE_IDS or TYPE_IDS[name] == ARRAY:
        raise WriteError("unknown KV type %r (one of %s, or arr[T])" % (name, scalar_type_names()))
    return TYPE_IDS[name], None


def scalar_type_names() -> str:
    return ", ".join(n for t, n in sorted(VALUE_TYPE_NAMES.items()) if t != ARRAY)


def parse_scalar(value_type: int, text: Any) -> Any:
    """A value of that type from its text (JSON values are taken as they are)."""
    if value_type == STRING:
        if not isinstance(text, str):
            raise WriteError("a str value must be text, not %s" % type(text).__name__)
        return text
    if value_type == BOOL:
        if isinstance(text, bool):
            return text
        lowered = str(text).strip().lower()
        if lowered not in TRUE_TEXT + FALSE_TEXT:
            raise WriteError("%r is not a bool (true/false)" % (text,))
        return lowered in TRUE_TEXT
    if value_type in (FLOAT32, FLOAT64):
        try:
            return float(text)
        except (TypeError, ValueError):
            raise WriteError("%r is not a number" % (text,)) from None
    if isinstance(text, bool) or isinstance(text, float):
        raise WriteError("%r is not an integer" % (text,))
    for base in (10, 0):  # decimal (leading zeros too), else 0x.., 0o.., 0b..
        try:
            return int(str(text).strip(), base)
        except ValueError:
            pass
    raise WriteError("%r is not an integer" % (text,))


def encode_scalar(value_type: int, value: Any) -> bytes:
    if value_type == STRING:
        return encode_string(value)
    try:
        return struct.pack(SCALAR_FORMATS[value_type], value)
    except (struct.error, OverflowError):
        raise WriteError("%r does not fit a %s" % (value, VALUE_TYPE_NAMES[value_type])) from None


def encode_value(value_type: int, element_type: int | None, text: Any) -> bytes:
    """A KV value's bytes (after its u32 type). An array is given as a JSON list."""
    if value_type != ARRAY:
        return encode_scalar(value_type, parse_scalar(value_type, text))
    try:
        items = json.loads(text) if isinstance(text, str) else text
    except (ValueError, RecursionError):
        raise WriteError("an array value is a JSON list, not %r" % (text[:60],)) from None
    if not isinstance(items, list):
        raise WriteError("an array value is a JSON list, not %r" % (str(text)[:60],))
    if element_type is None:  # type_of gives an array's element type with it
        raise WriteError("an array value needs its element type (arr[T])")
    body = b"".join(encode_scalar(element_type, parse_scalar(element_type, item)) for item in items)
    return U32.pack(element_type) + U64.pack(len(items)) + body


def encode_kv(key: str, value_type: int, value_bytes: bytes) -> bytes:
    return encode_string(key) + U32.pack(value_type) + value_bytes


class OutTensor:
    """A tensor of the output: its info, where its bytes come from, and their sha256 as read."""

    __slots__ = ("name", "dims", "type_id", "nbytes", "offset", "source", "source_start", "digest")
    offset: int | None  # None until Layout gives it one (a kept tensor keeps its input's)

    def __init__(self, name: str, dims: list[int], type_id: int, nbytes: int, source: Source,
                 source_start: int) -> None:
        self.name = name
        self.dims = dims
        self.type_id = type_id
        self.nbytes = nbytes
        self.offset = None  # relative to the output's data area, set by Layout
        self.source = source
        self.source_start = source_start  # absolute, in the source
        self.digest = hashlib.sha256()

    def info(self) -> bytes:
        return (encode_string(self.name) + U32.pack(len(self.dims)) + b"".join(U64.pack(d) for d in self.dims)
                + U32.pack(self.type_id) + U64.pack(self.offset))


class Layout:
    """The output file: header bytes, data_start, size. Tensors keep an offset they were given
    (their input's), and the others follow the last, each at an aligned offset."""

    def __init__(self, version: int, kvs: list[bytes], tensors: list[OutTensor], alignment: int) -> None:
        self.alignment = alignment
        end = 0
        for t in tensors:
            if t.offset is None:
                t.offset = align(end, alignment)
            end = max(end, t.offset + t.nbytes)
        infos = b"".join(t.info() for t in tensors)
        self.header = MAGIC + U32.pack(version) + U64.pack(len(tensors)) + U64.pack(len(kvs)) + b"".join(kvs) + infos
        self.header_end = len(self.header)
        self.data_start = align(self.header_end, alignment)
        self.tensors = tensors
        self.data_end = self.data_start + end  # the least a loader needs
        self.size = self.data_start + align(end, alignment) if tensors else self.header_end


# ---------------------------------------------------------------------------------------------
# Writing OUT.part


def write_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def reads_of(tensors: Iterable[OutTensor], alignment: int) -> list[Run]:
    """The byte ranges to read, per source: tensors next to each other in their source (only
    padding between) are one range, so a donor costs one request per run of tensors."""
    runs: list[Run] = []
    for t in sorted(tensors, key=lambda t: (id(t.source), t.source_start)):
        last = runs[-1] if runs else None
        if last and last[0] is t.source and 0 <= t.source_start - last[2] < alignment:
            last[2] = max(last[2], t.source_start + t.nbytes)
            last[3].append(t)
        else:
            runs.append([t.source, t.source_start, t.source_start + t.nbytes, [t]])
    return runs


def copy_run(fd: int, data_start: int, run: Run) -> None:
    """Stream one range of a source into the output, each tensor's bytes to its place, hashed."""
    source, start, end, members = run
    pos = start
    first = 0
    for chunk in source.chunks(start, end - start):
        view = memoryview(chunk)
        chunk_start, pos = pos, pos + len(chunk)
        while first < len(members) and members[first].source_start + members[first].nbytes <= chunk_start:
            first += 1
        for t in members[first:]:
            if t.source_start >= pos:
                break
            lo, hi = max(chunk_start, t.source_start), min(pos, t.source_start + t.nbytes)
            if lo < hi:
                piece = view[lo - chunk_start:hi - chunk_start]
                write_all(fd, piece, data_start + t.offset + lo - t.source_start)
                t.digest.update(piece)


def create_part(folder_fd: int, name: str) -> int:
    """A descriptor (read and write) of OUT.part, a file this call created."""
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(name + PART, flags, 0o644, dir_fd=folder_fd)
    except FileExistsError:
        raise WriteError("%s%s appeared while the sources were read (a file or a link put there): refused, left as"
                         " it is, nothing written" % (name, PART)) from None


def write_part(fd: int, layout: Layout) -> None:
    """OUT.part: the header, every tensor's bytes from its source, zero padding, synced."""
    write_all(fd, layout.header, 0)
    for run in tensor_reads(layout):
        copy_run(fd, layout.data_start, run)
    os.ftruncate(fd, layout.size)  # the padding: zeros
    os.fsync(fd)


def tensor_reads(layout: Layout) -> list[Run]:
    return reads_of([t for t in layout.tensors if t.nbytes], layout.alignment)


def is_same_file(folder_fd: int, name: str, fd: int) -> bool:
    try:
        st = os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    ours = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (ours.st_dev, ours.st_ino)


def publish(folder_fd: int, name: str, fd: int) -> None:
    """OUT.part (still the file written through fd) renamed to OUT, which must not exist."""
    if not is_same_file(folder_fd, name + PART, fd):
        raise WriteError("%s%s was replaced while it was written: refused, OUT not written" % (name, PART))
    try:
        rename_new(folder_fd, name + PART, name)
    except FileExistsError:
        raise WriteError("OUT %s appeared while it was written (a file or a link put there): refused, left as it"
                         " is" % name) from None


def discard_part(folder_fd: int, name: str, fd: int) -> None:
    """Remove OUT.part if it is still the file this run created, never one put in its place."""
    if is_same_file(folder_fd, name + PART, fd):
        try:
            os.unlink(name + PART, dir_fd=folder_fd)
        except OSError:
            pass


# ---------------------------------------------------------------------------------------------
# The mandatory assertions


def assertion(name: str, ok: object, detail: str) -> Assertion:
    return {"name": name, "ok": bool(ok), "detail": detail}


def verify(fd: int, layout: Layout, expect_tensors: int, expect_last: str | None) -> List[Assertion]:
    """Read OUT.part back (fd): tensor count, last name, size, every tensor's sha256, the checker."""
    size = os.fstat(fd).st_size
    result, tensors, _spans = inspect(lambda o, n: os.pread(fd, n, o), size, expect_tensors, expect_last)
    found = dict((t.name, t) for t in tensors)
    out = [count_assertion(result, expect_tensors), last_assertion(result, expect_last),
           size_assertion(size, result, layout), hash_assertion(fd, result, found, layout.tensors)]
    problems = "; ".join("%s: %s" % (p["code"], p["message"]) for p in result["problems"])
    out.append(assertion("check", result["ok"], "check gguf: %s" % (problems or "no problem")))
    return out


def count_assertion(result: Mapping[str, Any], expected: int) -> Assertion:
    got = result["tensor_count"]
    return assertion("tensor_count", got == expected, "tensor_count %s, expected %d" % (got, expected))


def last_assertion(result: Mapping[str, Any], expected: str | None) -> Assertion:
    got = result["last_tensor"]
    return assertion("last_tensor", got == expected, "last tensor %r, expected %r" % (got, expected))


def size_assertion(size: int, result: Mapping[str, Any], layout: Layout) -> Assertion:
    start, end = result["data_start"], layout.size - layout.data_start
    ok = size == layout.size and start == layout.data_start
    return assertion("size", ok, "size(OUT) %d, expected data_start %s + padded end of the last tensor's data %d"
                                 " = %d" % (size, start, end, layout.size))


def hash_assertion(fd: int, result: Mapping[str, Any], found: Mapping[str, Tensor],
                   tensors: Sequence[OutTensor]) -> Assertion:
    for t in tensors:
        read = found.get(t.name)
        if read is None or result["data_start"] is None:
            return assertion("sha256", False, "tensor %r is not in the output's header" % t.name)
        got = hashlib.sha256()
        start = result["data_start"] + read.offset
        for at in range(start, start + t.nbytes, 1 << 20):
            got.update(os.pread(fd, min(1 << 20, start + t.nbytes - at), at))
        if got.hexdigest() != t.digest.hexdigest():
            return assertion("sha256", False, "tensor %r: sha256 of its %d bytes at %d is %s, its source's %s"
                             % (t.name, t.nbytes, start, got.hexdigest(), t.digest.hexdigest()))
    return assertion("sha256", True, "%d tensors, each equal (sha256) to its source's bytes" % len(tensors))
