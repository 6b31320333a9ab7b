"""Check a GGUF file's header and layout without loading it: the post-surgery and post-download check.

Runs ON the box (standard library only, Python >= 3.8) and in the console, which passes a
`read_at` that does remote range reads. It reads the header (all KVs and ALL tensor infos: the
header ends after the last tensor info, not after the last KV) and never the tensor data.

Library:
  check(read_at, file_size, expect_tensors=None, expect_last=None) -> dict
      read_at(offset, length) -> bytes returns up to `length` bytes from `offset`.
  check_file(path, expect_tensors=None, expect_last=None) -> dict   (OSError if unreadable)

CLI:
  python3 gguf_check.py FILE [--expect-tensors N] [--last-tensor NAME] [--json]
  exit 0: no error-level problem, 1: problems, 2: the file could not be read.

Result: {"ok", "version", "tensor_count", "kv_count", "alignment", "header_end", "data_start",
         "data_end", "expected_size", "file_size", "tensors", "first_tensor", "last_tensor",
         "kv", "arrays", "problems": [{"code", "severity", "message", "offset"}]}
  data_end: data_start + max(offset + nbytes), the least a loader needs; expected_size: the same
  padded to the alignment, which is what GGUF writers produce. A size in between is fine.

Problem codes (a contract: `samai-console check gguf` and its users match on them): lfs_pointer,
  bad_magic, bad_version, bad_kv_type, absurd_count (a count or length beyond what the file could
  hold: the "string length 2^58" trap of a misplaced patch), header_truncated, misaligned, overlap,
  truncated (file shorter than its tensors need), oversize (longer than its header describes),
  tensor_count_mismatch, last_tensor_mismatch; and also bad_tensor_type, bad_shape, bad_alignment,
  duplicate_name, unexpected_offset (llama.cpp refuses those files too), unreadable (CLI only).
  Every problem is severity "error" today. A string/array that runs past the end of the file is
  absurd_count when its length is absurd (over a hard limit), header_truncated when it is sane
  (the file was cut there).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import struct
import sys

MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
FIXED_HEADER = 24  # magic(4) version(4) tensor_count(u64 @8) kv_count(u64 @16)
DEFAULT_ALIGNMENT = 32
CHUNK = 64 * 1024  # remote reads grow the buffer this much at a time

# Limits that tell a corrupt length from a real one.
MAX_KEY_LENGTH = 65535  # the GGUF spec's limit for keys
MAX_TENSOR_NAME = 63  # GGML_MAX_NAME is 64 including the NUL
MAX_STRING_LENGTH = 256 * 1024 * 1024  # far above any real value (chat templates, tokenizer json)
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_ARRAY_DEPTH = 8
MAX_HEADER_BYTES = 1024 * 1024 * 1024  # reading further means a corrupt count is walking the tensor data
MAX_EMPTY_RUN = 4096  # that many empty strings in a row: zeros read as strings
MAX_ARRAY_COUNT = 2 ** 32  # vocabularies and merges are a few 100k; beyond this a count is garbage
MIN_KV_BYTES = 8 + 1 + 4 + 1  # key length, a 1-byte key, value type, a 1-byte value
MIN_TENSOR_INFO_BYTES = 8 + 1 + 4 + 4 + 8  # name length, 1-byte name, n_dims=0, type, offset

SMALL_STRING = 200  # string KVs up to this long are kept in the result
MAX_KEPT_KVS = 64
MAX_PER_CODE = 5  # per-tensor problems beyond this are counted, not listed

# KV value types (GGUF spec).
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)
SCALAR_FORMATS = {
    UINT8: "<B", INT8: "<b", UINT16: "<H", INT16: "<h", UINT32: "<I", INT32: "<i", FLOAT32: "<f",
    BOOL: "<?", UINT64: "<Q", INT64: "<q", FLOAT64: "<d",
}
SCALAR_SIZES = {t: struct.calcsize(f) for t, f in SCALAR_FORMATS.items()}
VALUE_TYPE_NAMES = {
    UINT8: "u8", INT8: "i8", UINT16: "u16", INT16: "i16", UINT32: "u32", INT32: "i32", FLOAT32: "f32",
    BOOL: "bool", STRING: "str", ARRAY: "arr", UINT64: "u64", INT64: "i64", FLOAT64: "f64",
}

# ggml tensor types: id -> (name, elements per block, bytes per block).
# Checked entry by entry against gguf.constants.GGML_QUANT_SIZES (gguf 0.19.0) by the tests.
GGML_TYPES = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    9: ("Q8_1", 32, 40),
    10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
    15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66),
    17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18),
    21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82),
    23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1),
    25: ("I16", 1, 2),
    26: ("I32", 1, 4),
    27: ("I64", 1, 8),
    28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2),
    34: ("TQ1_0", 256, 54),
    35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17),
    40: ("NVFP4", 64, 36),
    41: ("Q1_0", 128, 18),
}

# general.file_type values (llama.cpp's llama_ftype), for the human summary.
FILE_TYPE_NAMES = {
    0: "ALL_F32", 1: "MOSTLY_F16", 2: "MOSTLY_Q4_0", 3: "MOSTLY_Q4_1", 7: "MOSTLY_Q8_0", 8: "MOSTLY_Q5_0",
    9: "MOSTLY_Q5_1", 10: "MOSTLY_Q2_K", 11: "MOSTLY_Q3_K_S", 12: "MOSTLY_Q3_K_M", 13: "MOSTLY_Q3_K_L",
    14: "MOSTLY_Q4_K_S", 15: "MOSTLY_Q4_K_M", 16: "MOSTLY_Q5_K_S", 17: "MOSTLY_Q5_K_M", 18: "MOSTLY_Q6_K",
    19: "MOSTLY_IQ2_XXS", 20: "MOSTLY_IQ2_XS", 21: "MOSTLY_Q2_K_S", 22: "MOSTLY_IQ3_XS", 23: "MOSTLY_IQ3_XXS",
    24: "MOSTLY_IQ1_S", 25: "MOSTLY_IQ4_NL", 26: "MOSTLY_IQ3_S", 27: "MOSTLY_IQ3_M", 28: "MOSTLY_IQ2_S",
    29: "MOSTLY_IQ2_M", 30: "MOSTLY_IQ4_XS", 31: "MOSTLY_IQ1_M", 32: "MOSTLY_BF16", 36: "MOSTLY_TQ1_0",
    37: "MOSTLY_TQ2_0", 38: "MOSTLY_MXFP4_MOE", 39: "MOSTLY_NVFP4", 40: "MOSTLY_Q1_0", 1024: "GUESSED",
}

SUMMARY_KEYS = ("general.architecture", "general.name", "general.file_type", "general.size_label",
                "general.quantization_version")

U32 = struct.Struct("<I")
U64 = struct.Struct("<Q")


class HeaderProblem(Exception):
    """Parsing cannot go on: the header is broken at `offset`."""

    def __init__(self, code, message, offset):
        Exception.__init__(self, message)
        self.code = code
        self.message = message
        self.offset = offset


class Truncated(Exception):
    """A read ran past the end of the file."""

    def __init__(self, offset, length):
        Exception.__init__(self, "%d bytes at offset %d" % (length, offset))
        self.offset = offset
        self.length = length


class RangeReader:
    """Sequential reads over read_at(offset, length), fetched CHUNK bytes at a time.

    Skips never fetch: a long string or array is stepped over without reading it.
    """

    def __init__(self, read_at, file_size, chunk=CHUNK):
        self.read_at = read_at
        self.file_size = file_size
        self.chunk = chunk
        self.pos = 0
        self.buf = b""
        self.buf_start = 0

    def remaining(self):
        return self.file_size - self.pos

    def take(self, n):
        start = self.ensure(n)
        self.pos += n
        return self.buf[start:start + n]

    def peek(self, n):
        """Up to n bytes from pos, without moving: fills the buffer for what follows."""
        n = min(n, self.remaining())
        start = self.ensure(n)
        return self.buf[start:start + n]

    def skip(self, n):
        if self.pos + n > self.file_size:
            raise Truncated(self.pos, n)
        self.pos += n

    def u32(self):
        start = self.ensure(4)
        self.pos += 4
        return U32.unpack_from(self.buf, start)[0]

    def u64(self):
        start = self.ensure(8)
        self.pos += 8
        return U64.unpack_from(self.buf, start)[0]

    def scalar(self, value_type):
        size = SCALAR_SIZES[value_type]
        start = self.ensure(size)
        self.pos += size
        return struct.unpack_from(SCALAR_FORMATS[value_type], self.buf, start)[0]

    def ensure(self, n):
        """Make [pos, pos+n) buffered; return where it starts in self.buf."""
        if self.pos + n > self.file_size:
            raise Truncated(self.pos, n)
        rel = self.pos - self.buf_start
        if 0 <= rel and rel + n <= len(self.buf):
            return rel
        if self.pos > MAX_HEADER_BYTES:
            raise HeaderProblem("absurd_count", "The header would go past %d bytes (at offset %d): a count or"
                                " length is corrupt and the parser is walking the tensor data."
                                % (MAX_HEADER_BYTES, self.pos), self.pos)
        kept = self.buf[rel:] if 0 <= rel < len(self.buf) else b""
        self.buf = kept + self.fetch(self.pos + len(kept), max(n - len(kept), self.chunk))
        self.buf_start = self.pos
        if n > len(self.buf):
            raise Truncated(self.pos, n)  # the file is shorter than file_size said
        return 0

    def fetch(self, offset, length):
        length = min(length, self.file_size - offset)
        parts = []
        got = 0
        while got < length:  # range reads may come back short
            part = self.read_at(offset + got, length - got)
            if not part:
                break
            parts.append(part)
            got += len(part)
        return b"".join(parts)


class Problems:
    """Collects problems; per-tensor codes are listed MAX_PER_CODE times, then counted."""

    def __init__(self):
        self.items = []
        self.counts = {}

    def add(self, code, message, offset=None, severity="error"):
        self.counts[code] = self.counts.get(code, 0) + 1
        if self.counts[code] <= MAX_PER_CODE:
            self.items.append({"code": code, "severity": severity, "message": message, "offset": offset})

    def finish(self):
        for code, count in self.counts.items():
            if count > MAX_PER_CODE:
                self.items.append({"code": code, "severity": "error", "offset": None,
                                   "message": "... and %d more %s problems" % (count - MAX_PER_CODE, code)})
        return self.items

    def has_errors(self):
        return any(p["severity"] == "error" for p in self.items)


class Tensor:
    __slots__ = ("name", "dims", "type_id", "offset", "nbytes", "info_offset")

    def __init__(self, name, dims, type_id, offset, nbytes, info_offset):
        self.name = name
        self.dims = dims
        self.type_id = type_id
        self.offset = offset
        self.nbytes = nbytes
        self.info_offset = info_offset


def align(value, alignment):
    return (value + alignment - 1) // alignment * alignment


def empty_result(file_size):
    return {
        "ok": False, "version": None, "tensor_count": None, "kv_count": None, "alignment": DEFAULT_ALIGNMENT,
        "header_end": None, "data_start": None, "data_end": None, "expected_size": None,
        "file_size": file_size, "tensors": 0, "first_tensor": None, "last_tensor": None,
        "kv": {}, "arrays": {}, "problems": [],
    }


# ---------------------------------------------------------------------------------------------
# The fixed header


def magic_hint(head):
    """Name the usual impostors: what was downloaded instead of the model."""
    if head.startswith(b"version https://git-lfs"):
        return " It is a git-lfs pointer file, not the model: fetch the LFS object."
    lowered = head[:64].lower()
    if lowered.lstrip().startswith((b"<!doctype", b"<html", b"{")):
        return " It looks like an HTML/JSON error page saved in place of the model."
    if not head.strip(b"\0"):
        return " The file starts with zero bytes (preallocated, or a download that never wrote)."
    return ""


def read_fixed_header(reader, result):
    if reader.file_size == 0:
        raise HeaderProblem("header_truncated", "The file is empty.", 0)
    head = reader.peek(64)
    if head.startswith(b"version https://git-lfs"):
        raise HeaderProblem("lfs_pointer", "A git-lfs pointer file, not the model: fetch the LFS object.", 0)
    if head[:4] != MAGIC[:len(head[:4])]:
        raise HeaderProblem("bad_magic", "Magic is %r (hex %s), not b'GGUF'.%s"
                            % (head[:4], head[:4].hex(), magic_hint(head)), 0)
    try:
        reader.take(4)
        version = reader.u32()
        result["version"] = version
        check_version(version)
        result["tensor_count"] = reader.u64()
        result["kv_count"] = reader.u64()
    except Truncated:
        raise HeaderProblem("header_truncated", "The file (%d bytes) ends inside the %d-byte fixed header."
                            % (reader.file_size, FIXED_HEADER), reader.pos) from None


def check_version(version):
    if version in SUPPORTED_VERSIONS:
        return
    swapped = struct.unpack("<I", struct.pack(">I", version))[0]
    if swapped in SUPPORTED_VERSIONS:
        why = " It is a big-endian GGUF v%d file, which this check does not read." % swapped
    elif version == 1:
        why = " GGUF v1 (32-bit counts, before Oct 2023) is no longer loaded by llama.cpp."
    else:
        why = ""
    raise HeaderProblem("bad_version", "Version %d is not one of %s.%s" % (version, SUPPORTED_VERSIONS, why), 4)


def header_bytes_hex(reader):
    head = reader.fetch(8, 24)  # range reads may come back short
    return " ".join(head[i:i + 8].hex() for i in range(0, len(head), 8))


# Structural errors that a misplaced patch produces: the parser loses step and reads garbage.
CORRUPTION_SIGNS = ("absurd_count", "bad_kv_type", "bad_shape")


def patch_hint(reader, result):
    """Point at the classic cause: a u64 count written one byte off corrupts its neighbours."""
    return (" This is the signature of a corrupted header, typically one patched one byte off (e.g. kv_count"
            " written at offset 17 or 15 instead of 16), which corrupts kv_count/tensor_count or the first"
            " key's length so the parser loses step: header says tensor_count=%s (u64 @8), kv_count=%s"
            " (u64 @16); bytes 8..31: %s."
            % (result["tensor_count"], result["kv_count"], header_bytes_hex(reader)))


def check_counts(reader, result):
    """Each KV and tensor info takes a minimum number of bytes: counts beyond that are corrupt."""
    tensors, kvs = result["tensor_count"], result["kv_count"]
    least = FIXED_HEADER + kvs * MIN_KV_BYTES + tensors * MIN_TENSOR_INFO_BYTES
    if least > reader.file_size:
        which = "kv_count" if kvs * MIN_KV_BYTES > tensors * MIN_TENSOR_INFO_BYTES else "tensor_count"
        offset = 16 if which == "kv_count" else 8
        raise HeaderProblem(
            "absurd_count",
            "%s=%d is absurd for a %d-byte file (tensor_count=%d, kv_count=%d need at least %d bytes of header;"
            " or the file is cut short)." % (which, result[which], reader.file_size, tensors, kvs, least)
            + patch_hint(reader, result), offset)


# ---------------------------------------------------------------------------------------------
# KVs


def read_length(reader, kind, cap, where):
    """A u64 string length, judged before anything is read: absurd, or past the end of the file."""
    offset = reader.pos
    try:
        length = reader.u64()
    except Truncated:
        raise HeaderProblem("header_truncated", "The file ends inside the header, at %s." % where, offset) from None
    if kind == "key" and length == 0:
        raise HeaderProblem("absurd_count", "Empty key (length 0 at offset %d) at %s." % (offset, where), offset)
    past_end = length > reader.remaining()
    if length > cap:
        raise HeaderProblem("absurd_count", "%s length %d (0x%x) at offset %d, %s, is absurd: over the %d-byte limit%s."
                            % (kind.capitalize(), length, length, offset, where, cap,
                               " and past the end of the %d-byte file" % reader.file_size if past_end else ""),
                            offset)
    if past_end:  # a sane length the file cannot hold: most likely the file was cut there
        raise HeaderProblem("header_truncated", "The file (%d bytes) ends inside the %s at %s: %d bytes declared at"
                            " offset %d, %d left (cut short, or a corrupt length)."
                            % (reader.file_size, kind, where, length, offset, reader.remaining()), offset)
    return length


def read_key(reader, index, previous_key):
    where = "KV #%d (after %s)" % (index, repr(previous_key) if previous_key else "the fixed header")
    length = read_length(reader, "key", MAX_KEY_LENGTH, where)
    offset = reader.pos
    raw = reader.take(length)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise HeaderProblem("absurd_count", "Key at offset %d, %s, is not text: %r." % (offset, where, raw[:40]),
                            offset - 8) from None


def read_value_type(reader, where):
    offset = reader.pos
    try:
        value_type = reader.u32()
    except Truncated:
        raise HeaderProblem("header_truncated", "The file ends inside the header, at %s." % where, offset) from None
    if value_type not in VALUE_TYPE_NAMES:
        raise HeaderProblem("bad_kv_type", "Unknown KV value type %d (0x%x) at offset %d, %s."
                            % (value_type, value_type, offset, where), offset)
    return value_type


def read_string_value(reader, where):
    """The string if it is small enough to keep, else None (stepped over, not fetched)."""
    length = read_length(reader, "string", MAX_STRING_LENGTH, where)
    if length > SMALL_STRING:
        reader.skip(length)
        return None
    return reader.take(length).decode("utf-8", "replace")


def skip_strings(reader, count, where):
    """Step over `count` strings (a tokenizer vocab): only their lengths are read."""
    empty_run = 0
    for _ in range(count):
        length = read_length(reader, "string", MAX_STRING_LENGTH, where)
        reader.skip(length)
        empty_run = 0 if length else empty_run + 1
        if empty_run > MAX_EMPTY_RUN:
            raise HeaderProblem("absurd_count", "More than %d empty strings in a row in %s (at offset %d): zeros read"
                                " as strings, so the array count is corrupt." % (MAX_EMPTY_RUN, where, reader.pos),
                                reader.pos)


def skip_array(reader, where, depth=0):
    """Step over an array value; return (element type name, count)."""
    if depth > MAX_ARRAY_DEPTH:
        raise HeaderProblem("bad_kv_type", "Arrays nested more than %d deep at offset %d, %s."
                            % (MAX_ARRAY_DEPTH, reader.pos, where), reader.pos)
    element_type = read_value_type(reader, where)
    offset = reader.pos
    try:
        count = reader.u64()
    except Truncated:
        raise HeaderProblem("header_truncated", "The file ends inside the header, at %s." % where, offset) from None
    least = count * SCALAR_SIZES.get(element_type, 8)
    if least > reader.remaining():
        if count > MAX_ARRAY_COUNT:
            raise HeaderProblem("absurd_count", "Array count %d (0x%x) at offset %d, %s, is absurd: it runs"
                                " past the end of the %d-byte file." % (count, count, offset, where, reader.file_size),
                                offset)
        raise HeaderProblem("header_truncated", "The file ends inside the array at %s (offset %d)."
                            % (where, offset), offset)
    if element_type == STRING:
        skip_strings(reader, count, where)
    elif element_type == ARRAY:
        for _ in range(count):
            skip_array(reader, where, depth + 1)
    else:
        reader.skip(least)
    return VALUE_TYPE_NAMES[element_type], count


def keepable(value):
    """JSON has no NaN/inf: keep those as text."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    return value


def read_kvs(reader, result):
    seen = set()
    previous_key = None
    for index in range(result["kv_count"]):
        key_offset = reader.pos
        key = read_key(reader, index, previous_key)
        where = "KV #%d %r" % (index, key)
        if key in seen:
            raise HeaderProblem("duplicate_name", "Duplicate key %r at offset %d." % (key, key_offset), key_offset)
        seen.add(key)
        value_type = read_value_type(reader, where)
        try:
            read_kv_value(reader, result, key, value_type, where)
        except Truncated as cut:
            message = "The file ends inside the value of %s." % where
            raise HeaderProblem("header_truncated", message, cut.offset) from None
        previous_key = key
    return previous_key


def read_kv_value(reader, result, key, value_type, where):
    if value_type == ARRAY:
        element, count = skip_array(reader, where)
        if len(result["arrays"]) < MAX_KEPT_KVS:
            result["arrays"][key] = {"type": element, "count": count}
        return
    if value_type == STRING:
        value = read_string_value(reader, where)
    else:
        value = reader.scalar(value_type)
    if key == "general.alignment":
        result["alignment"] = check_alignment(value, value_type, reader.pos)
    if value is not None and len(result["kv"]) < MAX_KEPT_KVS:
        result["kv"][key] = keepable(value)


def check_alignment(value, value_type, offset):
    if value_type != UINT32:
        raise HeaderProblem("bad_alignment", "general.alignment is a %s; llama.cpp requires a u32."
                            % VALUE_TYPE_NAMES[value_type], offset)
    if value <= 0 or value & (value - 1):
        raise HeaderProblem("bad_alignment", "general.alignment %d is not a power of 2." % value, offset)
    return value


# ---------------------------------------------------------------------------------------------
# Tensor infos


def tensor_nbytes(dims, type_id):
    """Bytes of tensor data, or None when the type is unknown."""
    if type_id not in GGML_TYPES:
        return None
    _name, block, size = GGML_TYPES[type_id]
    elements = 1
    for d in dims:
        elements *= d
    return elements // block * size


def read_tensor_info(reader, index, previous):
    where = "tensor info #%d (after %s)" % (index, previous)
    info_offset = reader.pos
    length = read_length(reader, "tensor name", MAX_TENSOR_NAME, where)
    try:
        name = reader.take(length).decode("utf-8", "replace")
        where = "tensor info #%d %r" % (index, name)
        dims_offset = reader.pos
        n_dims = reader.u32()
        if n_dims > MAX_DIMS:
            raise HeaderProblem("bad_shape", "%s has n_dims=%d (max %d) at offset %d."
                                % (where, n_dims, MAX_DIMS, dims_offset), dims_offset)
        dims = [reader.u64() for _ in range(n_dims)]
        type_id = reader.u32()
        offset = reader.u64()
    except Truncated:
        raise HeaderProblem("header_truncated", "The file (%d bytes) ends inside %s, which starts at offset %d."
                            % (reader.file_size, where, info_offset), info_offset) from None
    return Tensor(name, dims, type_id, offset, tensor_nbytes(dims, type_id), info_offset)


def check_tensor_info(tensor, problems):
    """Problems that leave the header readable: reported, parsing goes on."""
    if tensor.type_id not in GGML_TYPES:
        problems.add("bad_tensor_type", "Tensor %r has unknown ggml type %d (info at offset %d)."
                     % (tensor.name, tensor.type_id, tensor.info_offset), tensor.info_offset)
        return
    type_name, block, _size = GGML_TYPES[tensor.type_id]
    if any(d >= 2 ** 63 for d in tensor.dims):
        problems.add("bad_shape", "Tensor %r has a negative/overflowing dimension %s."
                     % (tensor.name, tensor.dims), tensor.info_offset)
    elif tensor.dims and tensor.dims[0] % block:
        problems.add("bad_shape", "Tensor %r: row of %d elements is not a multiple of the %s block size %d."
                     % (tensor.name, tensor.dims[0], type_name, block), tensor.info_offset)


def read_tensor_infos(reader, result, problems, last_key):
    tensors = []
    names = set()
    for index in range(result["tensor_count"]):
        # Naming the last key shows a tensor name read as a key (kv_count one too big), or the reverse.
        previous = repr(tensors[-1].name) if tensors else "the last KV %r" % (last_key,)
        tensor = read_tensor_info(reader, index, previous)
        if tensor.name in names:
            raise HeaderProblem("duplicate_name", "Duplicate tensor name %r at offset %d."
                                % (tensor.name, tensor.info_offset), tensor.info_offset)
        names.add(tensor.name)
        check_tensor_info(tensor, problems)
        tensors.append(tensor)
        result["tensors"] = len(tensors)
        result["first_tensor"] = tensors[0].name
        result["last_tensor"] = tensor.name
    return tensors


def read_header(reader, result, problems):
    """Fixed header, every KV, every tensor info: only then is the header's end known."""
    read_fixed_header(reader, result)
    check_counts(reader, result)
    try:
        last_key = read_kvs(reader, result)
        tensors = read_tensor_infos(reader, result, problems, last_key)
    except HeaderProblem as problem:
        if problem.code in CORRUPTION_SIGNS:
            problem.message += patch_hint(reader, result)
        raise
    result["header_end"] = reader.pos
    result["data_start"] = align(reader.pos, result["alignment"])
    return tensors


# ---------------------------------------------------------------------------------------------
# Tensor data layout


def check_alignment_of_tensors(tensors, alignment, problems):
    for t in tensors:
        if t.offset % alignment:
            problems.add("misaligned", "Tensor %r offset %d is not a multiple of the alignment %d."
                         % (t.name, t.offset, alignment), t.info_offset)


def check_overlaps(tensors, problems):
    ordered = sorted((t for t in tensors if t.nbytes is not None), key=lambda t: t.offset)
    for i in range(1, len(ordered)):
        before, after = ordered[i - 1], ordered[i]
        if after.offset < before.offset + before.nbytes:
            problems.add("overlap", "Tensor %r [%d, %d) overlaps %r [%d, %d) (offsets relative to"
                         " the data start)." % (after.name, after.offset, after.offset + after.nbytes, before.name,
                                                before.offset, before.offset + before.nbytes), after.info_offset)


def check_within_file(tensors, data_start, file_size, problems):
    for t in tensors:
        if t.nbytes is not None and data_start + t.offset + t.nbytes > file_size:
            problems.add("truncated", "Tensor %r data [%d, %d) runs past the end of the %d-byte file."
                         % (t.name, data_start + t.offset, data_start + t.offset + t.nbytes, file_size),
                         t.info_offset)


def check_contiguous(tensors, alignment, problems):
    """llama.cpp wants each tensor right after the previous one, padded: 'has offset X, expected Y'."""
    expected = 0
    for t in tensors:
        if t.nbytes is None:
            return
        if t.offset != expected:
            problems.add("unexpected_offset", "Tensor %r has offset %d, expected %d (llama.cpp refuses this:"
                         " tensors must follow each other, padded to %d)." % (t.name, t.offset, expected, alignment),
                         t.info_offset)
            return
        expected += align(t.nbytes, alignment)


def check_size(result, tensors, problems):
    data_start, alignment, file_size = result["data_start"], result["alignment"], result["file_size"]
    if any(t.nbytes is None for t in tensors):
        return  # an unknown type was reported already; the size cannot be known
    end = max([t.offset + t.nbytes for t in tensors] or [0])
    result["data_end"] = data_start + end if tensors else result["header_end"]
    result["expected_size"] = data_start + align(end, alignment)
    if file_size < result["data_end"]:
        problems.add("truncated", "The file is %d bytes, %d SHORT of data_start %d + end of tensor data %d = %d"
                     " (truncated download or copy?)." % (file_size, result["data_end"] - file_size, data_start, end,
                                                          result["data_end"]), file_size)
    elif file_size > result["expected_size"]:
        problems.add("oversize", "The file is %d bytes, %d BIGGER than data_start %d + padded end of tensor"
                     " data %d = %d: the header does not describe it all (tensor infos lost or data appended?)."
                     % (file_size, file_size - result["expected_size"], data_start, align(end, alignment),
                        result["expected_size"]), result["expected_size"])


def check_layout(result, tensors, problems):
    alignment = result["alignment"]
    check_alignment_of_tensors(tensors, alignment, problems)
    check_overlaps(tensors, problems)
    check_within_file(tensors, result["data_start"], result["file_size"], problems)
    if not (problems.counts.get("misaligned") or problems.counts.get("overlap")):
        check_contiguous(tensors, alignment, problems)
    check_size(result, tensors, problems)


def check_expectations(result, complete, expect_tensors, expect_last, problems):
    if expect_tensors is not None and result["tensor_count"] is not None and result["tensor_count"] != expect_tensors:
        problems.add("tensor_count_mismatch", "The header has %d tensors, expected %d."
                     % (result["tensor_count"], expect_tensors), 8)
    if expect_last is not None and complete and result["last_tensor"] != expect_last:
        problems.add("last_tensor_mismatch", "The last tensor is %r, expected %r."
                     % (result["last_tensor"], expect_last), None)


# ---------------------------------------------------------------------------------------------
# Entry points


def check(read_at, file_size, expect_tensors=None, expect_last=None):
    """Check the GGUF file behind read_at(offset, length) -> bytes; never reads tensor data."""
    result = empty_result(file_size)
    problems = Problems()
    reader = RangeReader(read_at, file_size)
    complete = False
    try:
        tensors = read_header(reader, result, problems)
        complete = True
        check_layout(result, tensors, problems)
    except HeaderProblem as problem:
        problems.add(problem.code, problem.message, problem.offset)
    except Truncated as cut:  # read_at gave less than file_size promised: the file shrank
        problems.add("header_truncated", "The file ended at offset %d while reading the header (%d bytes"
                     " expected there)." % (cut.offset, cut.length), cut.offset)
    check_expectations(result, complete, expect_tensors, expect_last, problems)
    result["problems"] = problems.finish()
    result["ok"] = not problems.has_errors()
    return result


def check_file(path, expect_tensors=None, expect_last=None):
    """check() on a local file. Raises OSError when the file cannot be opened or read."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size

        def read_at(offset, length):
            f.seek(offset)
            return f.read(length)

        return check(read_at, size, expect_tensors=expect_tensors, expect_last=expect_last)


def unreadable_result(path, error):
    result = empty_result(None)
    result["problems"] = [{"code": "unreadable", "severity": "error", "offset": None,
                           "message": "Cannot read %s: %s" % (path, error)}]
    return result


def describe_kv(key, value):
    if key == "general.file_type" and value in FILE_TYPE_NAMES:
        return "%s (%s)" % (value, FILE_TYPE_NAMES[value])
    return str(value)


def expected_size_text(result):
    """Writers pad the end to the alignment; a file that stops where the data ends is fine too."""
    low, high = result["data_end"], result["expected_size"]
    if low is None or low == high:
        return str(high)
    return "%s..%s (data end..padded)" % (low, high)


def summary(path, result):
    lines = ["%s: %s" % (path, "OK" if result["ok"] else "PROBLEMS")]
    lines.append("  GGUF v%s, %s KVs, %s tensors (%s read), alignment %s" % (
        result["version"], result["kv_count"], result["tensor_count"], result["tensors"], result["alignment"]))
    lines.append("  header ends at %s, data starts at %s" % (result["header_end"], result["data_start"]))
    lines.append("  size %s bytes, expected %s" % (result["file_size"], expected_size_text(result)))
    if result["tensors"]:
        lines.append("  tensors: first %s, last %s" % (result["first_tensor"], result["last_tensor"]))
    for key in SUMMARY_KEYS:
        if key in result["kv"]:
            lines.append("  %s = %s" % (key, describe_kv(key, result["kv"][key])))
    for key, info in sorted(result["arrays"].items()):
        if key.startswith("tokenizer.ggml.tokens"):
            lines.append("  %s = arr[%s,%d]" % (key, info["type"], info["count"]))
    for p in result["problems"]:
        at = "" if p["offset"] is None else " @%d" % p["offset"]
        lines.append("  %s %s%s: %s" % (p["severity"], p["code"], at, p["message"]))
    return "\n".join(lines)


def parse_args(argv):
    parser = argparse.ArgumentParser(description="Check a GGUF file's header and layout (reads no tensor data).")
    parser.add_argument("file")
    parser.add_argument("--expect-tensors", type=int, metavar="N", help="the tensor count it must have")
    parser.add_argument("--last-tensor", metavar="NAME", help="the name the last tensor info must have")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    try:
        result = check_file(args.file, expect_tensors=args.expect_tensors, expect_last=args.last_tensor)
        code = 0 if result["ok"] else 1
    except OSError as e:
        result = unreadable_result(args.file, e)
        code = 2
    if args.json:
        print(json.dumps(result))
    else:
        print(summary(args.file, result), file=sys.stdout if code != 2 else sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
