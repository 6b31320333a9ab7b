"""The GGUF format as a reader sees it: its constants and type tables, range reads, and the header
(fixed part, every KV, every tensor info) read into a result without ever reading tensor data.

Runs ON the box (standard library only, Python >= 3.8) and in the console. The reader reports
what makes the header unreadable (HeaderProblem: it cannot go on) and what it reads wrong in one
tensor info (into a Problems); what the layout means for a loader is judged in gguf_check.py.

  read_header(RangeReader(read_at, file_size), empty_result(file_size), Problems()) -> [Tensor]
      read_at(offset, length) -> bytes returns up to `length` bytes from `offset`.
  read_header(reader, result, problems, spans, table=TensorTable(keep=False)) fills `table`:
      the tensor infos in columns (a name and three numbers each), without a Tensor per info.

Every number a header declares is judged before anything is read or allocated for it: against
the bytes the file has left (a count needs at least so many bytes per item) and against the
limits below (over_limit); so the work and the memory of a check follow the bytes actually
there, up to MAX_HEADER_BYTES, never a count the file chose.
"""

from __future__ import annotations

import math
import struct
from array import array
from typing import Any, Callable, Iterable, Mapping, Sequence, Tuple

MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
FIXED_HEADER = 24  # magic(4) version(4) tensor_count(u64 @8) kv_count(u64 @16)
DEFAULT_ALIGNMENT = 32
CHUNK = 64 * 1024  # remote reads grow the buffer this much at a time
MAX_FETCH = 1024 * 1024  # one read when the header is known to go on (a vocabulary): fewer round trips

# Limits that tell a corrupt length from a real one.
MAX_KEY_LENGTH = 65535  # the GGUF spec's limit for keys
MAX_TENSOR_NAME = 63  # GGML_MAX_NAME is 64 including the NUL

# What a header may declare. Past one of these the check reports over_limit (the number declared
# and the limit) and reads no further: reading on would cost time and memory in proportion to a
# number the file chose. Each is far above what real models have (figures from llama.cpp's
# converters and the models they convert, as of 2025):
MAX_TENSORS = 1 << 16
# tensors: a few hundred for dense models (Gemma 3 270M: 236; Llama 3 70B: 723), about a thousand
# for the largest MoEs with merged experts (DeepSeek-V3 and Kimi K2: 1,000-1,100), ~2-3k for a 400B MoE
# with its experts split (the older Mixtral-style files). 65,536 is over 20x that, and a header
# that big still checks in about a second, in under 10 MB (bench/gguf_check_speed.py).
MAX_KVS = 1 << 16
# KVs: tens (Gemma 3: 33; a projector ~40). As high as the tensors' limit because the classic bad
# patch, kv_count written one byte late, reads as ~256x the real count: the parse must still go on
# to where it loses step, which is what names the patch.
MAX_KEY_BYTES = 4 * 1024 * 1024
# all keys together (each is kept: surgery copies every KV by its place): MAX_KVS keys of 64 bytes,
# longer than any key llama.cpp writes (< 50 bytes); a real header's keys take 1-3 KB.
MAX_ARRAY_ITEMS = 1 << 22
# items in one array: the largest vocabularies have 256k-262k tokens (Gemma 3: 262,144), the longest
# merge lists ~280k (Llama 3): 15x that.
MAX_STRING_LENGTH = 64 * 1024 * 1024
# one string: chat templates take KBs; a whole tokenizer.json (tokenizer.huggingface.json), which
# llama.cpp's converters do not write, 7-35 MB (Gemma 3's: 33 MB).
MAX_HEADER_BYTES = 64 * 1024 * 1024
# the whole header: 6.5 MB for Gemma 3's 262k-token vocabulary, the largest llama.cpp writes; 10x
# that leaves room for a whole tokenizer.json besides. It bounds the walk's time (a string costs
# 8 bytes at least) and the memory of the keys kept.

# What real files hold, well above what llama.cpp's own files have (keys < 50 bytes, tokens and
# merges <= 1025, chat templates 12 KB): a length past these that the parse then trips over is
# a corrupt length (a flipped bit), not a cut file. Counts up to MAX_TENSORS and MAX_KVS are real.
PLAUSIBLE_KEY = 256
PLAUSIBLE_ARRAY_STRING = 16 * 1024
PLAUSIBLE_VALUE = 1024 * 1024
BIG_STRING_KEYS = ("tokenizer.huggingface.json", "tokenizer.rwkv.world")  # whole tokenizers: MBs
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_ARRAY_DEPTH = 8
MAX_EMPTY_RUN = 4096  # that many empty strings (or arrays) in a row: zeros read as items
MIN_KV_BYTES = 8 + 1 + 4 + 1  # key length, a 1-byte key, value type, a 1-byte value
MIN_TENSOR_INFO_BYTES = 8 + 1 + 4 + 4 + 8  # name length, 1-byte name, n_dims=0, type, offset
U64_MAX = 2 ** 64 - 1

# The fix for a cut file, said wherever a problem says the file ends early.
CUT_HINT = (" The download or copy was cut short: fetch it again and compare its size (and sha256)"
            " with the source's.")

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
# The least bytes an array item takes: what a declared count is held against before it is walked.
MIN_ITEM_BYTES = dict(SCALAR_SIZES)
MIN_ITEM_BYTES.update({STRING: 8, ARRAY: 4 + 8})  # a string's u64 length; an array's element type and count
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

U32 = struct.Struct("<I")
U64 = struct.Struct("<Q")
Span = Tuple[str, int, int, int]  # a KV in the file: (key, value type, start, end), as read_kvs keeps them
ReadAt = Callable[[int, int], bytes]  # read_at(offset, length): up to length bytes from offset


class HeaderProblem(Exception):
    """Parsing cannot go on: the header is broken at `offset`."""

    def __init__(self, code: str, message: str, offset: int) -> None:
        Exception.__init__(self, message)
        self.code = code
        self.message = message
        self.offset = offset


def over_header_limit(what: str, offset: int) -> HeaderProblem:
    return HeaderProblem("over_limit", "%s takes the header past %d bytes (MAX_HEADER_BYTES), the most this check"
                         " reads: real headers take under 10 MB (a 262k-token vocabulary), so a count or length is"
                         " corrupt or the file is not a model; not read on." % (what, MAX_HEADER_BYTES), offset)


class OddLength:
    """The first string length beyond what real files hold: where a later failure comes from."""

    __slots__ = ("offset", "length", "kind", "where", "bound")
    offset: int
    length: int
    kind: str
    where: object  # a str, or a Where
    bound: int

    def __init__(self, offset: int, length: int, kind: str, where: object, bound: int) -> None:
        self.offset = offset
        self.length = length
        self.kind = kind
        self.where = where
        self.bound = bound


class Truncated(Exception):
    """A read ran past the end of the file."""

    def __init__(self, offset: int, length: int) -> None:
        Exception.__init__(self, "%d bytes at offset %d" % (length, offset))
        self.offset = offset
        self.length = length


class RangeReader:
    """Sequential reads over read_at(offset, length), fetched CHUNK bytes at a time.

    Skips never fetch: a long string or array is stepped over without reading it. Where the
    header is known to reach (`ahead`, set by the parser), a fetch takes up to MAX_FETCH at once:
    a vocabulary costs a few round trips to a remote box, not one per CHUNK.
    """

    def __init__(self, read_at: ReadAt, file_size: int, chunk: int = CHUNK) -> None:
        self.read_at = read_at
        self.file_size = file_size
        self.chunk = chunk
        self.pos = 0
        self.buf = b""
        self.buf_start = 0
        self.odd_length: OddLength | None = None  # an OddLength, once one is read: the parse may have lost step there
        self.ahead = 0  # an offset the header certainly reaches (never past it: no tensor data is read)

    def remaining(self) -> int:
        return self.file_size - self.pos

    def take(self, n: int) -> bytes:
        start = self.ensure(n)
        self.pos += n
        return self.buf[start:start + n]

    def peek(self, n: int) -> bytes:
        """Up to n bytes from pos, without moving: fills the buffer for what follows."""
        n = min(n, self.remaining())
        start = self.ensure(n)
        return self.buf[start:start + n]

    def skip(self, n: int) -> None:
        self.reach(n)
        self.pos += n

    def u32(self) -> int:
        start = self.ensure(4)
        self.pos += 4
        return U32.unpack_from(self.buf, start)[0]

    def u64(self) -> int:
        start = self.ensure(8)
        self.pos += 8
        return U64.unpack_from(self.buf, start)[0]

    def unpack(self, fields: struct.Struct) -> tuple[Any, ...]:
        """A struct.Struct's fields from pos, moving past them."""
        start = self.ensure(fields.size)
        self.pos += fields.size
        return fields.unpack_from(self.buf, start)

    def scalar(self, value_type: int) -> Any:
        size = SCALAR_SIZES[value_type]
        start = self.ensure(size)
        self.pos += size
        return struct.unpack_from(SCALAR_FORMATS[value_type], self.buf, start)[0]

    def reach(self, n: int) -> None:
        """[pos, pos+n) is in the file (else Truncated) and in the header's limit (else over_limit)."""
        end = self.pos + n
        if end > self.file_size:
            raise Truncated(self.pos, n)
        if end > MAX_HEADER_BYTES:
            raise over_header_limit("Reading %d bytes at offset %d" % (n, self.pos), self.pos)

    def ensure(self, n: int) -> int:
        """Make [pos, pos+n) buffered; return where it starts in self.buf."""
        rel = self.pos - self.buf_start
        end = self.pos + n
        if 0 <= rel and rel + n <= len(self.buf) and end <= self.file_size and end <= MAX_HEADER_BYTES:
            return rel
        self.reach(n)
        kept = self.buf[rel:] if 0 <= rel < len(self.buf) else b""
        known = min(self.ahead, self.pos + MAX_FETCH) - self.pos - len(kept)
        self.buf = kept + self.fetch(self.pos + len(kept), max(n - len(kept), self.chunk, known))
        self.buf_start = self.pos
        if n > len(self.buf):
            raise Truncated(self.pos, n)  # the file is shorter than file_size said
        return 0

    def fetch(self, offset: int, length: int) -> bytes:
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

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self.counts: dict[str, int] = {}

    def add(self, code: str, message: str, offset: int | None = None, severity: str = "error") -> None:
        self.counts[code] = self.counts.get(code, 0) + 1
        if self.counts[code] <= MAX_PER_CODE:
            self.items.append({"code": code, "severity": severity, "message": message, "offset": offset})

    def finish(self) -> list[dict[str, Any]]:
        for code, count in self.counts.items():
            if count > MAX_PER_CODE:
                self.items.append({"code": code, "severity": "error", "offset": None,
                                   "message": "... and %d more %s problems" % (count - MAX_PER_CODE, code)})
        return self.items

    def has_errors(self) -> bool:
        return any(p["severity"] == "error" for p in self.items)


class Tensor:
    __slots__ = ("name", "dims", "type_id", "offset", "nbytes", "info_offset")
    name: str
    dims: list[int]
    type_id: int
    offset: int
    nbytes: int | None  # None for an unknown type
    info_offset: int

    def __init__(self, name: str, dims: list[int], type_id: int, offset: int, nbytes: int | None,
                 info_offset: int) -> None:
        self.name = name
        self.dims = dims
        self.type_id = type_id
        self.offset = offset
        self.nbytes = nbytes
        self.info_offset = info_offset


class TensorTable:
    """The tensor infos as read, in columns: each tensor's name, data offset, size and info offset,
    about 120 bytes a tensor with its name, where a Tensor object adds some 300 (at MAX_TENSORS:
    8 MB, not 22); the Tensors themselves only when `keep` (surgery builds on them). Tensor i is
    at index i of each column."""

    def __init__(self, keep: bool = True) -> None:
        self.kept: list[Tensor] | None = [] if keep else None
        self.names: list[str] = []
        self.name_set: set[str] = set()  # the same strings: a duplicate is found as it is read
        self.offsets = array("Q")
        self.sizes = array("Q")  # nbytes; 0 where odd_sizes says otherwise
        self.odd_sizes: dict[int, int | None] = {}  # index -> nbytes a u64 cannot hold, or None for an unknown type
        self.info_offsets = array("Q")
        self.in_order = True  # offsets never decrease (what writers do): no sort for the overlap check
        self.data_end = 0  # the end of the data furthest along, relative to the data start
        self.unknown_sizes = 0  # tensors of an unknown type: the size of the data cannot be known

    def __len__(self) -> int:
        return len(self.names)

    def add(self, tensor: Tensor) -> None:
        index = len(self.names)
        self.names.append(tensor.name)
        self.name_set.add(tensor.name)
        if index and tensor.offset < self.offsets[-1]:
            self.in_order = False
        self.offsets.append(tensor.offset)
        self.info_offsets.append(tensor.info_offset)
        size = tensor.nbytes
        if size is None or size > U64_MAX:
            self.odd_sizes[index] = size
            self.sizes.append(0)
        else:
            self.sizes.append(size)
        if size is None:
            self.unknown_sizes += 1
        else:
            self.data_end = max(self.data_end, tensor.offset + size)
        if self.kept is not None:
            self.kept.append(tensor)

    def nbytes(self, index: int) -> int | None:
        """Tensor index's bytes of data; None for an unknown type."""
        return self.odd_sizes.get(index, self.sizes[index]) if self.odd_sizes else self.sizes[index]

    def by_offset(self) -> Sequence[int]:
        """The indices in the order of their data (read order for ties), without a sort when it is that."""
        if self.in_order:
            return range(len(self.names))
        return sorted(range(len(self.names)), key=self.offsets.__getitem__)


def align(value: int, alignment: int) -> int:
    return (value + alignment - 1) // alignment * alignment


def empty_result(file_size: int | None) -> dict[str, Any]:
    return {
        "ok": False, "version": None, "tensor_count": None, "kv_count": None, "alignment": DEFAULT_ALIGNMENT,
        "header_end": None, "data_start": None, "data_end": None, "expected_size": None,
        "size_note": None, "file_size": file_size, "tensors": 0, "first_tensor": None, "last_tensor": None,
        "kv": {}, "arrays": {}, "problems": [],
    }


# ---------------------------------------------------------------------------------------------
# The fixed header


def magic_hint(head: bytes) -> str:
    """Name the usual impostors: what was downloaded instead of the model."""
    if head.startswith(b"version https://git-lfs"):
        return " It is a git-lfs pointer file, not the model: fetch the LFS object."
    lowered = head[:64].lower()
    if lowered.lstrip().startswith((b"<!doctype", b"<html", b"{")):
        return " It looks like an HTML/JSON error page saved in place of the model."
    if not head.strip(b"\0"):
        return " The file starts with zero bytes (preallocated, or a download that never wrote)."
    return ""


def read_fixed_header(reader: RangeReader, result: dict[str, Any]) -> None:
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
                            % (reader.file_size, FIXED_HEADER) + CUT_HINT, reader.pos) from None


def check_version(version: int) -> None:
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


def header_bytes_hex(reader: RangeReader) -> str:
    head = reader.fetch(8, 24)  # range reads may come back short
    return " ".join(head[i:i + 8].hex() for i in range(0, len(head), 8))


# Structural errors that a misplaced patch produces: the parser loses step and reads garbage.
CORRUPTION_SIGNS = ("absurd_count", "bad_kv_type", "bad_shape")


def patch_hint(reader: RangeReader, result: Mapping[str, Any]) -> str:
    """Point at the classic cause: a u64 count written one byte off corrupts its neighbours."""
    return (" This is the signature of a corrupted header, typically one patched one byte off (e.g. kv_count"
            " written at offset 17 or 15 instead of 16), which corrupts kv_count/tensor_count or the first"
            " key's length so the parser loses step: header says tensor_count=%s (u64 @8), kv_count=%s"
            " (u64 @16); bytes 8..31: %s. Redo the patch on a fresh copy of the original file, writing each"
            " count as a u64 at its own offset (tensor_count @8, kv_count @16)."
            % (result["tensor_count"], result["kv_count"], header_bytes_hex(reader)))


def first_name_intact(reader: RangeReader) -> bool:
    """Whether what follows the counts reads as the first key (or tensor name): ASCII of a sane
    length. A patch one byte off clobbers it; a cut file has it (or ends before it: cut, too)."""
    head = reader.peek(8 + PLAUSIBLE_KEY)
    if len(head) < 8:
        return True
    length = U64.unpack_from(head)[0]
    name = head[8:8 + length]
    return 0 < length <= PLAUSIBLE_KEY and all(0x21 <= b < 0x7F for b in name)


def check_counts(reader: RangeReader, result: Mapping[str, Any]) -> None:
    """Each KV and tensor info takes a minimum number of bytes. Counts a model can have in a file
    too short for them: the file was cut. Counts no model has: the header is corrupt."""
    tensors, kvs = result["tensor_count"], result["kv_count"]
    least = FIXED_HEADER + kvs * MIN_KV_BYTES + tensors * MIN_TENSOR_INFO_BYTES
    if least <= reader.file_size:
        return
    if tensors <= MAX_TENSORS and kvs <= MAX_KVS and first_name_intact(reader):
        raise HeaderProblem("header_truncated", "The file is %d bytes, shorter than the header of the %d tensors"
                            " and %d KVs it declares (at least %d bytes): it ends inside its header."
                            % (reader.file_size, tensors, kvs, least) + CUT_HINT, reader.file_size)
    which = "kv_count" if kvs > MAX_KVS or tensors <= MAX_TENSORS else "tensor_count"
    raise HeaderProblem(
        "absurd_count",
        "%s=%d is absurd for this file: tensor_count=%d, kv_count=%d would need at least %d bytes of header, the"
        " file has %d, and %s." % (which, result[which], tensors, kvs, least, reader.file_size,
                                   "no model has that many" if tensors > MAX_TENSORS or kvs > MAX_KVS
                                   else "no key follows the counts at offset 24")
        + patch_hint(reader, result), 16 if which == "kv_count" else 8)


def check_declared_counts(result: Mapping[str, Any]) -> None:
    """Counts the file has room for but no model comes near: refused before the first KV is read."""
    for name, limit, offset, items, why in (
            ("tensor_count", MAX_TENSORS, 8, "tensors", "the largest real models have a few thousand"),
            ("kv_count", MAX_KVS, 16, "KVs", "real models have tens")):
        if result[name] > limit:
            raise HeaderProblem("over_limit", "%s=%d (u64 @%d) is over the %d %s this check reads (MAX_%s): %s,"
                                " so the count is corrupt or the file is not a model; not read on."
                                % (name, result[name], offset, limit, items, items.upper(), why), offset)


# ---------------------------------------------------------------------------------------------
# KVs


def read_length(reader: RangeReader, kind: str, cap: int, where: object, plausible: int | None = None) -> int:
    """A u64 string length, judged before anything is read: absurd, or past the end of the file.
    One over `plausible` (but under the cap) is noted on the reader: if the parse fails after it,
    that length is named as the cause."""
    offset = reader.pos
    try:
        length = reader.u64()
    except Truncated:
        raise HeaderProblem("header_truncated", "The file ends inside the header, at %s." % where
                            + CUT_HINT, offset) from None
    if kind == "key" and length == 0:
        raise HeaderProblem("absurd_count", "Empty key (length 0 at offset %d) at %s." % (offset, where), offset)
    past_end = length > reader.remaining()
    if plausible is not None and plausible < length <= cap and reader.odd_length is None:
        reader.odd_length = OddLength(offset, length, kind, where, plausible)
    if length > cap and kind == "string" and not past_end:  # a format the spec allows, a size no model has
        raise HeaderProblem("over_limit", "String length %d at offset %d, %s, is over the %d bytes (MAX_STRING_LENGTH)"
                            " this check reads: a whole tokenizer.json takes 35 MB at most; not read on."
                            % (length, offset, where, cap), offset)
    if length > cap:
        raise HeaderProblem("absurd_count", "%s length %d (0x%x) at offset %d, %s, is absurd: over the %d-byte limit%s."
                            % (kind.capitalize(), length, length, offset, where, cap,
                               " and past the end of the %d-byte file" % reader.file_size if past_end else ""),
                            offset)
    if past_end:  # a sane length the file cannot hold: most likely the file was cut there
        raise HeaderProblem("header_truncated", "The file (%d bytes) ends inside the %s at %s: %d bytes declared at"
                            " offset %d, %d left." % (reader.file_size, kind, where, length, offset, reader.remaining())
                            + CUT_HINT, offset)
    if reader.pos + length > MAX_HEADER_BYTES:
        raise over_header_limit("The %s at %s (%d bytes declared at offset %d)" % (kind, where, length, offset), offset)
    return length


def read_key(reader: RangeReader, index: int, previous_key: str | None) -> str:
    where = "KV #%d (after %s)" % (index, repr(previous_key) if previous_key else "the fixed header")
    length = read_length(reader, "key", MAX_KEY_LENGTH, where, PLAUSIBLE_KEY)
    offset = reader.pos
    raw = reader.take(length)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise HeaderProblem("absurd_count", "Key at offset %d, %s, is not text: %r." % (offset, where, raw[:40]),
                            offset - 8) from None


def read_value_type(reader: RangeReader, where: str) -> int:
    offset = reader.pos
    try:
        value_type = reader.u32()
    except Truncated:
        raise HeaderProblem("header_truncated", "The file ends inside the header, at %s." % where
                            + CUT_HINT, offset) from None
    if value_type not in VALUE_TYPE_NAMES:
        raise HeaderProblem("bad_kv_type", "Unknown KV value type %d (0x%x) at offset %d, %s."
                            % (value_type, value_type, offset, where), offset)
    return value_type


def read_string_value(reader: RangeReader, key: str, where: str) -> str | None:
    """The string if it is small enough to keep, else None (stepped over, not fetched)."""
    plausible = MAX_STRING_LENGTH if key in BIG_STRING_KEYS else PLAUSIBLE_VALUE
    length = read_length(reader, "string", MAX_STRING_LENGTH, where, plausible)
    if length > SMALL_STRING:
        reader.skip(length)
        return None
    return reader.take(length).decode("utf-8", "replace")


def skip_strings(reader: RangeReader, count: int, where: str) -> None:
    """Step over `count` strings (a tokenizer vocab): only their lengths are read."""
    empty_run = 0
    for left in range(count - 1, -1, -1):
        length = read_length(reader, "string", MAX_STRING_LENGTH, where, PLAUSIBLE_ARRAY_STRING)
        reader.skip(length)
        reader.ahead = reader.pos + 8 * left  # each string left has its u64 length at least
        empty_run = next_empty_run(reader, empty_run, length, "strings", where)


def skip_arrays(reader: RangeReader, count: int, where: str, depth: int) -> None:
    """Step over `count` arrays, the items of an array of arrays."""
    empty_run = 0
    for _ in range(count):
        _element, items = skip_array(reader, where, depth + 1)
        empty_run = next_empty_run(reader, empty_run, items, "arrays", where)


def next_empty_run(reader: RangeReader, run: int, size: int, items: str, where: str) -> int:
    """The run of empty items after one of `size`: a long one is zeros read as items, not a vocabulary."""
    run = 0 if size else run + 1
    if run > MAX_EMPTY_RUN:
        raise HeaderProblem("absurd_count", "More than %d empty %s in a row in %s (at offset %d): zeros read"
                            " as %s, so the array count is corrupt." % (MAX_EMPTY_RUN, items, where, reader.pos, items),
                            reader.pos)
    return run


def skip_array(reader: RangeReader, where: str, depth: int = 0) -> tuple[str, int]:
    """Step over an array value; return (element type name, count)."""
    if depth > MAX_ARRAY_DEPTH:
        raise HeaderProblem("bad_kv_type", "Arrays nested more than %d deep at offset %d, %s."
                            % (MAX_ARRAY_DEPTH, reader.pos, where), reader.pos)
    element_type = read_value_type(reader, where)
    offset = reader.pos
    try:
        count = reader.u64()
    except Truncated:
        raise HeaderProblem("header_truncated", "The file ends inside the header, at %s." % where
                            + CUT_HINT, offset) from None
    check_array_count(reader, count, count * MIN_ITEM_BYTES[element_type], offset, where)
    if element_type == STRING:
        skip_strings(reader, count, where)
    elif element_type == ARRAY:
        skip_arrays(reader, count, where, depth)
    else:
        reader.skip(count * SCALAR_SIZES[element_type])
    return VALUE_TYPE_NAMES[element_type], count


def check_array_count(reader: RangeReader, count: int, least: int, offset: int, where: str) -> None:
    """A count is held against the bytes left (its items' least size) and the limit before it is walked."""
    if least > reader.remaining():
        if count > MAX_ARRAY_ITEMS:
            raise HeaderProblem("absurd_count", "Array count %d (0x%x) at offset %d, %s, is absurd: it runs"
                                " past the end of the %d-byte file." % (count, count, offset, where, reader.file_size),
                                offset)
        raise HeaderProblem("header_truncated", "The file ends inside the array at %s (offset %d)."
                            % (where, offset) + CUT_HINT, offset)
    if count > MAX_ARRAY_ITEMS:
        raise HeaderProblem("over_limit", "Array count %d at offset %d, %s, is over the %d items (MAX_ARRAY_ITEMS) this"
                            " check reads: the largest vocabularies have 262k tokens; not read on."
                            % (count, offset, where, MAX_ARRAY_ITEMS), offset)


def keepable(value: Any) -> Any:
    """JSON has no NaN/inf: keep those as text."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    return value


def read_kvs(reader: RangeReader, result: dict[str, Any], spans: list[Span] | None = None) -> str | None:
    """Every KV, each judged; with `spans` (a list), each KV's (key, value type, start, end) in
    the file is appended to it: what surgery copies or re-encodes."""
    seen = set()
    previous_key = None
    key_bytes = 0
    for index in range(result["kv_count"]):
        key_offset = reader.pos
        key = read_key(reader, index, previous_key)
        key_bytes += reader.pos - key_offset - 8
        if key_bytes > MAX_KEY_BYTES:
            raise HeaderProblem("over_limit", "The keys up to KV #%d (at offset %d) take %d bytes, over the %d bytes"
                                " (MAX_KEY_BYTES) this check keeps: real headers' keys take a few KB; not read on."
                                % (index, key_offset, key_bytes, MAX_KEY_BYTES), key_offset)
        where = "KV #%d %r" % (index, key)
        if key in seen:
            raise HeaderProblem("duplicate_name", "Duplicate key %r at offset %d." % (key, key_offset), key_offset)
        seen.add(key)
        value_type = read_value_type(reader, where)
        try:
            read_kv_value(reader, result, key, value_type, where)
        except Truncated as cut:
            message = "The file ends inside the value of %s." % where + CUT_HINT
            raise HeaderProblem("header_truncated", message, cut.offset) from None
        if spans is not None:
            spans.append((key, value_type, key_offset, reader.pos))
        previous_key = key
    return previous_key


def read_kv_value(reader: RangeReader, result: dict[str, Any], key: str, value_type: int, where: str) -> None:
    if value_type == ARRAY:
        element, count = skip_array(reader, where)
        if len(result["arrays"]) < MAX_KEPT_KVS:
            result["arrays"][key] = {"type": element, "count": count}
        return
    if value_type == STRING:
        value = read_string_value(reader, key, where)
    else:
        value = reader.scalar(value_type)
    if key == "general.alignment":
        result["alignment"] = check_alignment(value, value_type, reader.pos)
    if value is not None and has_room(result["kv"], key):
        result["kv"][key] = keepable(value)


def has_room(kept: Mapping[str, Any], key: str) -> bool:
    """The first MAX_KEPT_KVS KVs are kept; past them, as many again of those a check reads (a
    projector's clip.* keys, a text model's embedding length), whatever the KVs before them."""
    if len(kept) < MAX_KEPT_KVS:
        return True
    return len(kept) < 2 * MAX_KEPT_KVS and (key.startswith("clip.") or key.endswith(".embedding_length"))


def check_alignment(value: Any, value_type: int, offset: int) -> int:
    if value_type != UINT32:
        raise HeaderProblem("bad_alignment", "general.alignment is a %s; llama.cpp requires a u32."
                            % VALUE_TYPE_NAMES[value_type], offset)
    if value <= 0 or value & (value - 1):
        raise HeaderProblem("bad_alignment", "general.alignment %d is not a power of 2." % value, offset)
    return value


# ---------------------------------------------------------------------------------------------
# Tensor infos


def tensor_nbytes(dims: Iterable[int], type_id: int) -> int | None:
    """Bytes of tensor data, or None when the type is unknown."""
    if type_id not in GGML_TYPES:
        return None
    _name, block, size = GGML_TYPES[type_id]
    elements = 1
    for d in dims:
        elements *= d
    return elements // block * size


class Where:
    """A place in the header, put into words only when a message names it (not once per tensor)."""

    __slots__ = ("words", "args")
    words: str
    args: tuple[object, ...]

    def __init__(self, words: str, *args: object) -> None:
        self.words = words
        self.args = args

    def __str__(self) -> str:
        return self.words % self.args


# What follows a tensor's n_dims, by n_dims: its dims (u64 each), its type (u32), its offset (u64).
INFO_TAILS = [struct.Struct("<" + "Q" * n + "IQ") for n in range(MAX_DIMS + 1)]


def read_tensor_info(reader: RangeReader, index: int, previous: Where) -> Tensor:
    """One tensor info; `previous` is a Where naming what came before it."""
    where = Where("tensor info #%d (after %s)", index, previous)
    info_offset = reader.pos
    length = read_length(reader, "tensor name", MAX_TENSOR_NAME, where)
    try:
        name = reader.take(length).decode("utf-8", "replace")
        where = Where("tensor info #%d %r", index, name)
        dims_offset = reader.pos
        n_dims = reader.u32()
        if n_dims > MAX_DIMS:
            raise HeaderProblem("bad_shape", "%s has n_dims=%d (max %d) at offset %d."
                                % (where, n_dims, MAX_DIMS, dims_offset), dims_offset)
        fields = reader.unpack(INFO_TAILS[n_dims])
        dims, type_id, offset = list(fields[:n_dims]), fields[n_dims], fields[n_dims + 1]
    except Truncated:
        raise HeaderProblem("header_truncated", "The file (%d bytes) ends inside %s, which starts at offset %d."
                            % (reader.file_size, where, info_offset) + CUT_HINT, info_offset) from None
    return Tensor(name, dims, type_id, offset, tensor_nbytes(dims, type_id), info_offset)


def check_tensor_info(tensor: Tensor, problems: Problems) -> None:
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


def read_tensor_infos(reader: RangeReader, result: dict[str, Any], problems: Problems, last_key: str | None,
                      table: TensorTable) -> None:
    """Each tensor info into `table`, judged as it is read: a Tensor lives only as long as it is
    read, unless the table keeps them."""
    try:
        for index in range(result["tensor_count"]):
            # Naming the last key shows a tensor name read as a key (kv_count one too big), or the reverse.
            previous = Where("%r", table.names[-1]) if table.names else Where("the last KV %r", last_key)
            tensor = read_tensor_info(reader, index, previous)
            if tensor.name in table.name_set:
                raise HeaderProblem("duplicate_name", "Duplicate tensor name %r at offset %d."
                                    % (tensor.name, tensor.info_offset), tensor.info_offset)
            check_tensor_info(tensor, problems)
            table.add(tensor)
    finally:
        result["tensors"] = len(table)
        result["first_tensor"] = table.names[0] if table.names else None
        result["last_tensor"] = table.names[-1] if table.names else None


def odd_length_problem(odd: OddLength, failure: HeaderProblem) -> HeaderProblem:
    """The parse failed after a length no real file has: that length is the corruption, not a cut."""
    return HeaderProblem(
        "bad_string_length",
        "The %s length %d (0x%x) at offset %d, %s, is more than real files hold (%d bytes at most), and the"
        " parse lost step after stepping over it (then: %s) A corrupt length (a flipped bit, a bad write), not"
        " a cut file: fetch the file again and compare its sha256 with the source's; if you patched its"
        " header, redo the patch on a fresh copy." % (odd.kind, odd.length, odd.length, odd.offset, odd.where,
                                                      odd.bound, first_sentence(failure.message)), odd.offset)


def first_sentence(message: str) -> str:
    """A failure's own finding, without the hint that would send the operator the wrong way."""
    end = message.find(". ")
    return message if end < 0 else message[:end + 1]


def read_header(reader: RangeReader, result: dict[str, Any], problems: Problems, spans: list[Span] | None = None,
                table: TensorTable | None = None) -> list[Tensor] | None:
    """Fixed header, every KV, every tensor info: only then is the header's end known. With
    `spans`, each KV's place in the file is kept there (read_kvs). The tensor infos go into
    `table` (a TensorTable; by default a new one that keeps the Tensors); returns the Tensors kept."""
    table = TensorTable() if table is None else table
    read_fixed_header(reader, result)
    check_counts(reader, result)
    check_declared_counts(result)
    try:
        last_key = read_kvs(reader, result, spans)
        read_tensor_infos(reader, result, problems, last_key, table)
    except HeaderProblem as problem:
        if reader.odd_length is not None:
            raise odd_length_problem(reader.odd_length, problem) from None
        if problem.code in CORRUPTION_SIGNS:
            problem.message += patch_hint(reader, result)
        raise
    result["header_end"] = reader.pos
    result["data_start"] = align(reader.pos, result["alignment"])
    return table.kept
