"""What a GGUF header may declare: tensors, KVs, array items, string lengths and header bytes up to
the limits in gguf_format.py (real models stay far below each), and past one a named finding
(over_limit, with the number declared and the limit) instead of reading on; the tensor table read
in columns, not a Python object per tensor; and a declared number never walks the reader over
bytes that only a sparse file or zeros hold.

The files over a limit that a loader would read are real GGUFs, written by gguf-py's GGUFWriter;
the hostile ones are built byte by byte, their room a hole in a sparse file."""

from __future__ import annotations

import json
import struct
import subprocess
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from samai.remote.box import gguf_check
from samai.remote.box.gguf_format import (
    ARRAY,
    CHUNK,
    MAX_ARRAY_ITEMS,
    MAX_FETCH,
    MAX_HEADER_BYTES,
    MAX_KEY_BYTES,
    MAX_KVS,
    MAX_STRING_LENGTH,
    MAX_TENSORS,
    STRING,
    UINT8,
    UINT32,
)
from tests.box_tools import tool_argv
from tests.helpers import run_cli

KNOWN_CODES = {"lfs_pointer", "bad_magic", "bad_version", "bad_kv_type", "absurd_count", "header_truncated",
               "misaligned", "overlap", "truncated", "oversize", "bad_tensor_type", "bad_shape", "bad_alignment",
               "duplicate_name", "unexpected_offset", "bad_string_length", "over_limit"}
CLI_TIMEOUT = 120  # generous: the check of a header at the limits takes about a second here


def write_tiny_tensors(path: Path, count: int) -> Path:
    """A valid GGUF of `count` one-byte I8 tensors, packed (general.alignment 1), by gguf-py's writer."""
    w = GGUFWriter(str(path), "llama")
    w.add_custom_alignment(1)
    i8 = np.dtype(np.int8)
    for i in range(count):
        w.add_tensor_info(f"t.{i}", (1,), i8, 1, raw_dtype=GGMLQuantizationType.I8)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    with open(path, "ab") as f:
        f.write(bytes(range(256)) * (count // 256) + bytes(count % 256))  # each tensor's one byte
    return path


def write_many_kvs(path: Path, count: int) -> Path:
    """A valid GGUF of `count` KVs (architecture and name among them) and no tensors."""
    w = GGUFWriter(str(path), "llama")
    for i in range(count - 1):
        w.add_uint8(f"k.{i}", i % 256)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    return path


def console_check(path: Path) -> tuple[int, dict]:
    """`samai-console check gguf PATH --json`, as a user runs it."""
    done = run_cli("check", "gguf", str(path), "--json", timeout=CLI_TIMEOUT)
    return done.returncode, json.loads(done.stdout)


def box_check(path: Path) -> subprocess.CompletedProcess:
    """The box's own tool, as the box runs it."""
    return subprocess.run(tool_argv("gguf_check", path), capture_output=True, text=True, timeout=CLI_TIMEOUT)


def codes(result: dict) -> list[str]:
    return [p["code"] for p in result["problems"]]


# ------------------------------------------------------------------------------------------------
# Real files at and past the tensor and KV limits


def test_the_writer_here_makes_files_gguf_py_reads(tmp_path: Path) -> None:
    path = write_tiny_tensors(tmp_path / "few.gguf", 300)
    reader = GGUFReader(str(path))
    assert [t.name for t in reader.tensors] == [f"t.{i}" for i in range(300)]
    assert [int(t.data_offset) - int(reader.data_offset) for t in reader.tensors] == list(range(300))
    result = gguf_check.check_file(str(path))
    assert result["ok"] and result["data_start"] == int(reader.data_offset) and result["tensors"] == 300


@pytest.mark.slow
def test_a_real_gguf_with_a_tensor_more_than_the_limit_is_refused_by_name(tmp_path: Path) -> None:
    """gguf-py writes it and llama.cpp would try to load it; check gguf names the count and the limit,
    exits 1 as for any finding, and does not read the tensor table (megabytes) to say so."""
    path = write_tiny_tensors(tmp_path / "many.gguf", MAX_TENSORS + 1)
    rc, result = console_check(path)
    assert rc == 1 and codes(result) == ["over_limit"], result["problems"]
    message = result["problems"][0]["message"]
    assert f"tensor_count={MAX_TENSORS + 1}" in message and f"{MAX_TENSORS} tensors" in message
    assert result["tensor_count"] == MAX_TENSORS + 1 and result["header_end"] is None
    assert result["bytes_read"] <= 2 * CHUNK < path.stat().st_size // 10
    box = box_check(path)
    assert box.returncode == 1 and "over_limit @8" in box.stdout and f"tensor_count={MAX_TENSORS + 1}" in box.stdout


@pytest.mark.slow
def test_a_real_gguf_at_the_tensor_limit_passes(tmp_path: Path) -> None:
    path = write_tiny_tensors(tmp_path / "at-limit.gguf", MAX_TENSORS)
    rc, result = console_check(path)
    assert rc == 0 and result["ok"] and result["problems"] == []
    assert result["tensor_count"] == MAX_TENSORS and result["last_tensor"] == f"t.{MAX_TENSORS - 1}"
    assert result["data_end"] == result["size"]


@pytest.mark.slow
def test_the_tensor_table_is_checked_in_columns_not_objects(tmp_path: Path) -> None:
    """At the limit, the check keeps about 120 bytes a tensor (its name, its offsets), not a Python
    object each (with a Tensor per info it peaked at 22 MB); surgery's view still has them all."""
    path = write_tiny_tensors(tmp_path / "at-limit.gguf", MAX_TENSORS)
    data = path.read_bytes()
    tracemalloc.start()
    try:
        result = gguf_check.check(lambda o, n: data[o:o + n], len(data))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result["ok"] and peak < 16 * 1024 * 1024, peak
    inspected, tensors, _spans = gguf_check.inspect(lambda o, n: data[o:o + n], len(data))
    assert inspected == result and len(tensors) == MAX_TENSORS and tensors[-1].offset == MAX_TENSORS - 1


@pytest.mark.slow
def test_a_real_gguf_with_a_kv_more_than_the_limit_is_refused_by_name(tmp_path: Path) -> None:
    rc, result = console_check(write_many_kvs(tmp_path / "kvs.gguf", MAX_KVS + 1))
    assert rc == 1 and codes(result) == ["over_limit"], result["problems"]
    message = result["problems"][0]["message"]
    assert f"kv_count={MAX_KVS + 1}" in message and f"{MAX_KVS} KVs" in message
    rc, result = console_check(write_many_kvs(tmp_path / "kvs-at-limit.gguf", MAX_KVS))
    assert rc == 0 and result["ok"] and result["kv_count"] == MAX_KVS


# ------------------------------------------------------------------------------------------------
# Hostile headers: declared numbers with room in the file (a hole) or zeros behind them


def text(data: bytes) -> bytes:
    return struct.pack("<Q", len(data)) + data


def kv(key: str, value_type: int, payload: bytes) -> bytes:
    return text(key.encode()) + struct.pack("<I", value_type) + payload


def header(kvs: list[bytes], tensors: int = 0, kv_count: int | None = None) -> bytes:
    """The fixed header and the KVs given (kv_count: more, when the rest is written later)."""
    return b"GGUF" + struct.pack("<IQQ", 3, tensors, len(kvs) if kv_count is None else kv_count) + b"".join(kvs)


def sparse(path: Path, head: bytes, size: int) -> Path:
    """head, then a hole: the file is `size` bytes, all zeros after head, and costs no disk."""
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(size)
    return path


def checked(path: Path) -> tuple[dict, int]:
    """check_file's verdict and how many bytes it read."""
    read = 0
    with open(path, "rb") as f:
        def read_at(offset: int, length: int) -> bytes:
            nonlocal read
            f.seek(offset)
            data = f.read(length)
            read += len(data)
            return data
        size = path.stat().st_size
        return gguf_check.check(read_at, size), read


ARCH = kv("general.architecture", STRING, text(b"llama"))


def test_an_array_longer_than_the_limit_is_refused_before_it_is_walked(tmp_path: Path) -> None:
    for element, item in ((STRING, 8), (UINT8, 1), (ARRAY, 12)):
        count = MAX_ARRAY_ITEMS + 1
        head = header([ARCH, kv("tokenizer.ggml.tokens", ARRAY, struct.pack("<IQ", element, count))])
        result, read = checked(sparse(tmp_path / "long.gguf", head, len(head) + count * item))
        assert codes(result) == ["over_limit"], (element, result["problems"])
        message = result["problems"][0]["message"]
        assert str(count) in message and f"{MAX_ARRAY_ITEMS} items" in message and "tokenizer.ggml.tokens" in message
        assert result["problems"][0]["offset"] == len(head) - 8 and read <= CHUNK


def test_a_string_longer_than_the_limit_is_refused_without_stepping_over_it(tmp_path: Path) -> None:
    length = MAX_STRING_LENGTH + 1
    head = header([ARCH, kv("tokenizer.huggingface.json", STRING, struct.pack("<Q", length))])
    result, read = checked(sparse(tmp_path / "long.gguf", head, len(head) + length))
    assert codes(result) == ["over_limit"], result["problems"]
    message = result["problems"][0]["message"]
    assert str(length) in message and str(MAX_STRING_LENGTH) in message and read <= CHUNK


def test_a_header_longer_than_the_limit_is_refused_where_it_passes_it(tmp_path: Path) -> None:
    """Two whole tokenizers, each under the string limit, together over the header's."""
    half = MAX_HEADER_BYTES // 2 + 1
    head = header([ARCH, kv("tokenizer.huggingface.json", STRING, struct.pack("<Q", half))], kv_count=3)
    second = text(b"tokenizer.rwkv.world") + struct.pack("<IQ", STRING, half)
    path = tmp_path / "long.gguf"
    with open(path, "wb") as f:
        f.write(head)
        f.seek(len(head) + half)  # the first tokenizer's bytes: a hole
        f.write(second)
        f.truncate(f.tell() + half)
    result, read = checked(path)
    assert codes(result) == ["over_limit"], result["problems"]
    message = result["problems"][0]["message"]
    assert str(MAX_HEADER_BYTES) in message and "tokenizer.rwkv.world" in message and read <= 2 * CHUNK


def test_keys_longer_together_than_the_limit_are_refused(tmp_path: Path) -> None:
    """Keys are kept (each KV's place, for surgery): together they may not hold more than a few MB,
    however many KVs of the longest plausible key (256 bytes) a header declares."""
    count = MAX_KEY_BYTES // 256 + 2
    head = header([ARCH] + [kv(f"{i:05d}".ljust(256, "k"), UINT8, b"\1") for i in range(count)])
    result, _read = checked(sparse(tmp_path / "keys.gguf", head, len(head)))
    assert codes(result) == ["over_limit"], result["problems"]
    message = result["problems"][0]["message"]
    assert str(MAX_KEY_BYTES) in message and f"KV #{MAX_KEY_BYTES // 256} " in message  # the first 256-byte key past it


def test_zeros_read_as_nested_arrays_are_not_walked_for_the_count(tmp_path: Path) -> None:
    """A million empty arrays declared over a hole: a finding after a few thousand, not a walk of 12 MB."""
    count = 1 << 20
    head = header([ARCH, kv("test.nested", ARRAY, struct.pack("<IQ", ARRAY, count))])
    result, read = checked(sparse(tmp_path / "nested.gguf", head, len(head) + 12 * count))
    assert codes(result) == ["absurd_count"] and "empty" in result["problems"][0]["message"], result["problems"]
    assert read <= 2 * MAX_FETCH


# ------------------------------------------------------------------------------------------------
# Fuzz: declared counts and lengths of every kind, over a file that may be mostly hole

FUZZ = settings(max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
EDGES = [0, 1, 2, 7, 63, 64, 255, 4096, MAX_TENSORS, MAX_TENSORS + 1, MAX_ARRAY_ITEMS, MAX_ARRAY_ITEMS + 1,
         MAX_STRING_LENGTH, MAX_STRING_LENGTH + 1, MAX_HEADER_BYTES, 2 ** 32, 2 ** 58, 2 ** 63, 2 ** 64 - 1]
DECLARED = st.sampled_from(EDGES) | st.integers(0, 2 ** 64 - 1) | st.integers(0, 1 << 24)
VALUE_TYPES = st.integers(0, 13)


@st.composite
def declared_string(draw) -> bytes:
    """A string whose declared length may or may not be what follows."""
    body = draw(st.binary(max_size=12))
    length = draw(st.just(len(body)) | DECLARED)
    return struct.pack("<Q", length) + body


@st.composite
def declared_value(draw, depth: int = 0) -> tuple[int, bytes]:
    value_type = draw(VALUE_TYPES)
    if value_type == STRING:
        return value_type, draw(declared_string())
    if value_type == ARRAY and depth < 2:
        element = draw(VALUE_TYPES)
        items = [draw(declared_value(depth + 1)) for _ in range(draw(st.integers(0, 3)))]
        count = draw(st.just(len(items)) | DECLARED)
        return value_type, struct.pack("<IQ", element, count) + b"".join(
            payload for kind, payload in items if kind == element or draw(st.booleans()))
    return value_type, draw(st.binary(min_size=0, max_size=8))


@st.composite
def declared_header(draw) -> bytes:
    kvs = []
    for i in range(draw(st.integers(0, 4))):
        key = draw(st.sampled_from([b"general.alignment", b"tokenizer.ggml.tokens", b"tokenizer.huggingface.json",
                                    b"k%d" % i]))
        value_type, payload = draw(declared_value())
        key_length = draw(st.just(len(key)) | DECLARED)
        kvs.append(struct.pack("<Q", key_length) + key + struct.pack("<I", value_type) + payload)
    infos = b""
    tensors = draw(st.integers(0, 3))
    for i in range(tensors):
        name = b"t%d" % i
        dims = draw(st.lists(DECLARED, max_size=3))
        n_dims = draw(st.just(len(dims)) | st.integers(0, 2 ** 32 - 1))
        infos += (struct.pack("<Q", draw(st.just(len(name)) | DECLARED)) + name + struct.pack("<I", n_dims)
                  + b"".join(struct.pack("<Q", d) for d in dims)
                  + struct.pack("<IQ", draw(st.integers(0, 42)), draw(DECLARED)))
    kv_count = draw(st.just(len(kvs)) | DECLARED)
    tensor_count = draw(st.just(tensors) | DECLARED)
    return b"GGUF" + struct.pack("<IQQ", 3, tensor_count, kv_count) + b"".join(kvs) + infos


def hole_reader(data: bytes, size: int, log: list[int]):
    """read_at over data and then zeros up to size (a sparse file), each reply's length logged."""
    def read_at(offset: int, length: int) -> bytes:
        length = max(0, min(length, size - offset))
        inside = data[offset:offset + length]
        reply = inside + bytes(length - len(inside))
        log.append(len(reply))
        return reply
    return read_at


def short_replies(read_at, step: int):
    """read_at whose replies are at most step bytes long, as range reads may be."""
    return lambda offset, length: read_at(offset, min(length, step))


@pytest.mark.slow
@FUZZ
@given(head=declared_header(), room=st.sampled_from([0, 64, 1 << 20, 1 << 30, 1 << 40, 1 << 62]),
       step=st.sampled_from([None, 7, 4096]))
def test_declared_numbers_never_cost_more_than_the_bytes_behind_them(head, room, step) -> None:
    """Any declared count or length, with the file's room for it from none to 4 EiB of hole: a
    verdict (JSON, codes of the contract), no exception, memory bounded, and the reader never
    reads more than the header's own bytes and a few MB of the hole (the MAX_EMPTY_RUN empties
    or a prefetch), whatever the numbers say."""
    size = len(head) + room
    log: list[int] = []
    read_at = hole_reader(head, size, log)
    if step:
        read_at = short_replies(read_at, step)
    tracemalloc.start()
    try:
        result = gguf_check.check(read_at, size)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    json.dumps(result, allow_nan=False)
    assert set(codes(result)) <= KNOWN_CODES and result["ok"] == (not result["problems"])
    assert sum(log) <= len(head) + 3 * MAX_FETCH, (sum(log), result["problems"])
    assert peak < 12 * 1024 * 1024, peak


@pytest.mark.parametrize("declared", [MAX_TENSORS + 1, 2 ** 32, 2 ** 63])
def test_a_declared_tensor_count_with_room_is_refused_before_any_read_of_the_table(declared: int) -> None:
    head = header([ARCH, kv("general.alignment", UINT32, struct.pack("<I", 32))], tensors=declared)
    log: list[int] = []
    size = len(head) + declared * 25 + 1 if declared < 2 ** 40 else 2 ** 63
    result = gguf_check.check(hole_reader(head, size, log), size)
    expected = "over_limit" if declared * 25 < size else "absurd_count"
    assert codes(result) == [expected], result["problems"]
    assert str(declared) in result["problems"][0]["message"] and sum(log) <= 2 * CHUNK
