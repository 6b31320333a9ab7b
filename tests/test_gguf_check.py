"""gguf_check: real GGUF files written by gguf-py's GGUFWriter, then broken the ways surgery and downloads do."""

from __future__ import annotations

import json
import os
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader, GGUFWriter
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, LlamaFileType

from samai.remote.box import gguf_format
from samai.remote.box.gguf_check import check, check_file
from samai.remote.box.gguf_format import CHUNK, GGML_TYPES
from tests.box_tools import tool_argv

VOCAB = 50_000
BIG_TENSOR_BYTES = 256 * 1024  # the last tensor: far more than one read chunk, so reading it would show
TENSORS = [  # name, array, raw ggml type
    ("token_embd.weight", np.arange(4 * 64, dtype=np.float32).reshape(4, 64), None),
    ("blk.0.attn_norm.weight", np.ones(64, dtype=np.float16), None),
    # Q8_0 rows: 2 blocks of 34 bytes = 64 elements each.
    ("blk.0.attn_q.weight", np.full((3, 2 * 34), 7, dtype=np.uint8), GGMLQuantizationType.Q8_0),
    ("blk.0.ffn_down.weight", np.ones((5, 7), dtype=np.float16), None),
    ("output.weight", np.zeros(BIG_TENSOR_BYTES // 4, dtype=np.float32), None),
]
NAMES = [name for name, _, _ in TENSORS]


@dataclass
class Model:
    path: Path
    data: bytes
    data_offset: int  # gguf-py's own reading, the oracle
    tensor_offsets: list[int]  # relative to the data start, from gguf-py

    def broken(self, tmp_path: Path, data: bytes | bytearray, name: str = "broken.gguf") -> Path:
        out = tmp_path / name
        out.write_bytes(bytes(data))
        return out

    def info_field(self, name: str, field: str) -> int:
        """Absolute offset of a tensor info's `type` or `offset` field, found by its name."""
        entry = struct.pack("<Q", len(name)) + name.encode()
        at = self.data.index(entry, 0, self.data_offset) + len(entry)
        n_dims = struct.unpack_from("<I", self.data, at)[0]
        type_at = at + 4 + 8 * n_dims
        return type_at if field == "type" else type_at + 4


def write_model(path: Path, tensors=TENSORS, vocab: int = VOCAB) -> None:
    w = GGUFWriter(str(path), "llama")
    w.add_name("tiny surgery test")
    w.add_file_type(LlamaFileType.MOSTLY_Q8_0)
    w.add_quantization_version(2)
    w.add_uint8("test.u8", 200)
    w.add_int8("test.i8", -5)
    w.add_uint16("test.u16", 60000)
    w.add_int16("test.i16", -300)
    w.add_int32("test.i32", -70000)
    w.add_float32("test.f32", 0.5)
    w.add_uint64("test.u64", 2**40)
    w.add_int64("test.i64", -(2**40))
    w.add_float64("test.f64", 1.25)
    w.add_bool("test.bool", True)
    w.add_uint32("llama.context_length", 128)
    w.add_string("tokenizer.chat_template", "{{ messages }}" * 400)  # a long string: stepped over
    w.add_array("tokenizer.ggml.tokens", [f"tok{i}" for i in range(vocab)])
    w.add_array("tokenizer.ggml.scores", [0.25] * vocab)
    w.add_array("tokenizer.ggml.token_type", [1] * vocab)
    w.add_array("test.nested", [["a", "bb"], ["ccc"], ["d"]])
    for name, array, raw in tensors:
        w.add_tensor(name, array, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Model:
    path = tmp_path_factory.mktemp("gguf") / "model.gguf"
    write_model(path)
    reader = GGUFReader(str(path))
    assert [t.name for t in reader.tensors] == NAMES
    offsets = [int(t.data_offset) - int(reader.data_offset) for t in reader.tensors]
    return Model(path, path.read_bytes(), int(reader.data_offset), offsets)


def codes(result: dict) -> list[str]:
    return [p["code"] for p in result["problems"]]


def problem(result: dict, code: str) -> dict:
    return next(p for p in result["problems"] if p["code"] == code)


def in_memory(data: bytes | bytearray, log: list | None = None, max_reply: int | None = None):
    def read_at(offset: int, length: int) -> bytes:
        if log is not None:
            log.append((offset, length))
        n = length if max_reply is None else min(length, max_reply)
        return bytes(data[offset:offset + n])

    return read_at


def patched(data: bytes, at: int, fmt: str, value) -> bytearray:
    out = bytearray(data)
    struct.pack_into(fmt, out, at, value)
    return out


# ------------------------------------------------------------------------------------------------
# A good file


@pytest.mark.slow
def test_valid_file_passes(model: Model) -> None:
    r = check_file(model.path, expect_tensors=len(NAMES), expect_last=NAMES[-1])
    assert r["problems"] == []
    assert r["ok"] is True
    assert (r["version"], r["tensor_count"], r["tensors"], r["alignment"]) == (3, len(NAMES), len(NAMES), 32)
    assert (r["first_tensor"], r["last_tensor"]) == (NAMES[0], NAMES[-1])
    assert r["data_start"] == model.data_offset
    assert r["header_end"] == model.info_field(NAMES[-1], "offset") + 8  # after the LAST tensor info
    assert r["header_end"] <= r["data_start"] < r["header_end"] + 32
    assert r["expected_size"] == r["file_size"] == len(model.data)
    assert r["data_end"] == model.data_offset + model.tensor_offsets[-1] + BIG_TENSOR_BYTES
    assert r["kv"]["general.architecture"] == "llama"
    assert r["kv"]["general.file_type"] == 7
    assert r["kv"]["test.i64"] == -(2**40) and r["kv"]["test.bool"] is True and r["kv"]["test.f64"] == 1.25
    assert "tokenizer.chat_template" not in r["kv"]  # long strings are skipped, not kept
    assert r["arrays"]["tokenizer.ggml.tokens"] == {"type": "str", "count": VOCAB}
    assert r["arrays"]["test.nested"] == {"type": "arr", "count": 3}
    assert r["kv_count"] == len(r["kv"]) + len(r["arrays"]) + 1  # + the chat template
    json.dumps(r)


def test_remote_check_reads_only_the_header(model: Model) -> None:
    log: list[tuple[int, int]] = []
    r = check(in_memory(model.data, log), len(model.data))
    assert r == check_file(model.path)
    header_end = r["header_end"]
    last_read_end = max(offset + length for offset, length in log)
    assert last_read_end <= header_end + CHUNK  # one chunk of overshoot at most
    assert last_read_end < r["data_start"] + model.tensor_offsets[-1] + BIG_TENSOR_BYTES // 2
    assert sum(length for _, length in log) <= header_end + 2 * CHUNK
    assert len(log) <= header_end // CHUNK + 6  # moderately sized reads, not one per string


def test_short_range_replies_are_stitched(model: Model) -> None:
    r = check(in_memory(model.data, max_reply=1000), len(model.data))
    assert r["ok"] and r["last_tensor"] == NAMES[-1]


def test_vocab_only_file_without_tensors(tmp_path: Path) -> None:
    path = tmp_path / "vocab.gguf"
    write_model(path, tensors=[], vocab=100)
    r = check_file(path, expect_tensors=0)
    assert r["ok"], r["problems"]
    assert r["tensors"] == 0 and r["last_tensor"] is None
    assert r["header_end"] <= r["file_size"] <= r["data_start"]


def test_file_without_trailing_padding_is_fine(model: Model, tmp_path: Path) -> None:
    r = check_file(model.path)
    path = model.broken(tmp_path, model.data[: r["data_end"]])
    assert check_file(path)["ok"]  # llama.cpp loads it: the data ends inside the file


# ------------------------------------------------------------------------------------------------
# The CLI


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(tool_argv("gguf_check", *args), capture_output=True, text=True, timeout=30)


def test_cli_summary_and_exit_codes(model: Model, tmp_path: Path) -> None:
    good = run_cli(str(model.path), "--expect-tensors", str(len(NAMES)), "--last-tensor", NAMES[-1])
    assert good.returncode == 0, good.stdout + good.stderr
    for text in ("OK", "GGUF v3", "general.architecture = llama", "7 (MOSTLY_Q8_0)", NAMES[0], NAMES[-1],
                 f"data starts at {model.data_offset}", f"arr[str,{VOCAB}]"):
        assert text in good.stdout
    bad = run_cli(str(model.path), "--expect-tensors", "427", "--last-tensor", "blk.31.post_attention_norm.weight")
    assert bad.returncode == 1
    assert "tensor_count_mismatch" in bad.stdout and "last_tensor_mismatch" in bad.stdout


def test_cli_json(model: Model, tmp_path: Path) -> None:
    out = run_cli(str(model.path), "--json")
    assert out.returncode == 0
    assert json.loads(out.stdout) == json.loads(json.dumps(check_file(model.path)))
    broken = model.broken(tmp_path, model.data[:-1000])
    out = run_cli(str(broken), "--json")
    assert out.returncode == 1
    assert "truncated" in codes(json.loads(out.stdout))


def test_cli_unreadable_file(tmp_path: Path) -> None:
    out = run_cli(str(tmp_path / "missing.gguf"), "--json")
    assert out.returncode == 2
    assert codes(json.loads(out.stdout)) == ["unreadable"]
    assert run_cli(str(tmp_path)).returncode == 2  # a directory


# ------------------------------------------------------------------------------------------------
# Header surgery gone wrong


def test_kv_count_patched_one_byte_late_reproduces_the_incident(model: Model) -> None:
    """The playbook's incident: kv_count + 1 written at offset 17 instead of 16."""
    kv_count = struct.unpack_from("<Q", model.data, 16)[0]
    data = patched(model.data, 17, "<Q", kv_count + 1)
    r = check(in_memory(data), len(data))
    assert not r["ok"]
    p = r["problems"][0]
    assert p["code"] in ("absurd_count", "absurd_count")
    # The clobbered byte is the low byte of the first key's length, at offset 24.
    assert p["offset"] == 24 and "offset 24" in p["message"]
    assert "one byte off" in p["message"] and f"kv_count={r['kv_count']}" in p["message"]


def test_kv_count_patched_one_byte_early(model: Model) -> None:
    kv_count = struct.unpack_from("<Q", model.data, 16)[0]
    data = patched(model.data, 15, "<Q", kv_count + 1)
    r = check(in_memory(data), len(data))
    p = problem(r, "absurd_count")
    assert p["offset"] == 8 and "one byte off" in p["message"]
    assert r["tensor_count"] == len(NAMES) + ((kv_count + 1) << 56)  # its top byte got kv_count's low byte


def test_kv_count_one_too_many_reads_a_tensor_info_as_a_kv(model: Model) -> None:
    """The extra 'KV' eats the first tensor info; then a dimension is read as a string length."""
    kv_count = struct.unpack_from("<Q", model.data, 16)[0]
    data = patched(model.data, 16, "<Q", kv_count + 1)
    r = check(in_memory(data), len(data))
    p = r["problems"][0]
    assert p["code"] == "absurd_count"
    value = struct.unpack_from("<Q", data, p["offset"])[0]
    assert value > len(data) and str(value) in p["message"] and f"offset {p['offset']}" in p["message"]
    assert "'token_embd.weight'" in p["message"]  # the tensor name that was taken for a key


def test_absurd_string_length_names_offset_and_value(model: Model) -> None:
    entry = struct.pack("<Q", len("tokenizer.chat_template")) + b"tokenizer.chat_template"
    length_at = model.data.index(entry) + len(entry) + 4  # after the value type
    data = patched(model.data, length_at, "<Q", 2**58)
    r = check(in_memory(data), len(data))
    p = problem(r, "absurd_count")
    assert p["offset"] == length_at
    assert str(2**58) in p["message"] and "tokenizer.chat_template" in p["message"]
    assert codes(r) == ["absurd_count"]


def test_unknown_kv_value_type(model: Model) -> None:
    entry = struct.pack("<Q", len("test.u8")) + b"test.u8"
    type_at = model.data.index(entry) + len(entry)
    data = patched(model.data, type_at, "<I", 13)
    r = check(in_memory(data), len(data))
    assert codes(r) == ["bad_kv_type"] and r["problems"][0]["offset"] == type_at


def test_bad_magic_and_lfs_pointer(tmp_path: Path, model: Model) -> None:
    garbage = model.broken(tmp_path, os.urandom(4096).replace(b"GGUF", b"xxxx"), "garbage.gguf")
    assert codes(check_file(garbage)) == ["bad_magic"]
    pointer = b"version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 5000000000\n"
    r = check_file(model.broken(tmp_path, pointer, "pointer.gguf"))
    assert codes(r) == ["lfs_pointer"] and "git-lfs" in r["problems"][0]["message"]


def test_bad_version(model: Model) -> None:
    data = patched(model.data, 4, "<I", 7)
    assert codes(check(in_memory(data), len(data))) == ["bad_version"]
    data = patched(model.data, 4, ">I", 3)  # a big-endian file's version, read little-endian
    r = check(in_memory(data), len(data))
    assert codes(r) == ["bad_version"] and "big-endian" in r["problems"][0]["message"]


def test_empty_and_tiny_files(tmp_path: Path, model: Model) -> None:
    assert codes(check_file(model.broken(tmp_path, b"", "empty.gguf"))) == ["header_truncated"]
    assert codes(check_file(model.broken(tmp_path, model.data[:20], "tiny.gguf"))) == ["header_truncated"]


# ------------------------------------------------------------------------------------------------
# Truncation and layout


def test_truncated_inside_the_data(model: Model, tmp_path: Path) -> None:
    r = check_file(model.broken(tmp_path, model.data[:-1000]))
    assert not r["ok"]
    assert codes(r).count("truncated") == 2  # the last tensor's data is cut, so the file is short
    messages = [p["message"] for p in r["problems"] if p["code"] == "truncated"]
    assert any("SHORT" in m for m in messages) and any(NAMES[-1] in m for m in messages)
    assert r["tensors"] == len(NAMES)  # the header itself is intact


def test_truncated_inside_the_tensor_infos(model: Model, tmp_path: Path) -> None:
    """The playbook's other incident: the header taken to end after the KVs, tensor infos cut off."""
    first_info = model.data.index(struct.pack("<Q", len(NAMES[0])) + NAMES[0].encode())
    header_end = model.info_field(NAMES[-1], "offset") + 8
    for cut in (header_end - 3, first_info + 30, first_info + 4):
        r = check_file(model.broken(tmp_path, model.data[:cut]))
        assert codes(r) == ["header_truncated"], (cut, r["problems"])
        assert r["header_end"] is None and r["tensors"] < len(NAMES)


def test_truncated_inside_the_vocab(model: Model, tmp_path: Path) -> None:
    """A download cut early is a cut file, not a corrupt header, even where the vocab cannot fit."""
    for cut in (model.data_offset // 2, 3000):
        r = check_file(model.broken(tmp_path, model.data[:cut]))
        assert codes(r) == ["header_truncated"], (cut, r["problems"])
        assert "one byte off" not in r["problems"][0]["message"]


def test_appended_bytes(model: Model, tmp_path: Path) -> None:
    r = check_file(model.broken(tmp_path, model.data + b"\0" * 64))
    assert codes(r) == ["oversize"] and "BIGGER" in r["problems"][0]["message"]


def test_expectation_mismatches(model: Model) -> None:
    r = check_file(model.path, expect_tensors=427, expect_last="blk.31.post_attention_norm.weight")
    assert codes(r) == ["tensor_count_mismatch", "last_tensor_mismatch"]
    assert not r["ok"]
    assert "427" in r["problems"][0]["message"] and NAMES[-1] in r["problems"][1]["message"]


def test_misaligned_tensor_offset(model: Model) -> None:
    at = model.info_field(NAMES[2], "offset")
    data = patched(model.data, at, "<Q", model.tensor_offsets[2] + 1)
    r = check(in_memory(data), len(data))
    p = problem(r, "misaligned")
    assert NAMES[2] in p["message"] and not r["ok"]


def test_overlapping_tensors(model: Model) -> None:
    at = model.info_field(NAMES[1], "offset")
    data = patched(model.data, at, "<Q", 0)  # aligned, but on top of the first tensor
    r = check(in_memory(data), len(data))
    assert "overlap" in codes(r) and "misaligned" not in codes(r)


def test_gap_between_tensors(model: Model) -> None:
    """Aligned and not overlapping, yet llama.cpp wants each tensor right after the one before."""
    at = model.info_field(NAMES[-1], "offset")
    data = patched(model.data, at, "<Q", model.tensor_offsets[-1] + 32)
    r = check(in_memory(data), len(data))
    assert "unexpected_offset" in codes(r) and "truncated" in codes(r)


def test_unknown_ggml_type(model: Model) -> None:
    data = patched(model.data, model.info_field(NAMES[1], "type"), "<I", 99)
    r = check(in_memory(data), len(data))
    assert codes(r) == ["bad_tensor_type"] and NAMES[1] in r["problems"][0]["message"]
    assert r["expected_size"] is None  # unknowable: no size verdict on a guess


def test_row_not_a_multiple_of_the_block(model: Model) -> None:
    data = patched(model.data, model.info_field(NAMES[3], "type"), "<I", int(GGMLQuantizationType.Q4_0))
    r = check(in_memory(data), len(data))
    assert "bad_shape" in codes(r)  # rows of 7 elements cannot be Q4_0 (blocks of 32)
    assert NAMES[3] in problem(r, "bad_shape")["message"]


# ------------------------------------------------------------------------------------------------
# Tables and portability


def test_ggml_type_table_matches_gguf_py() -> None:
    for type_id, (name, block, size) in GGML_TYPES.items():
        quant = GGMLQuantizationType(type_id)
        assert quant.name == name
        assert GGML_QUANT_SIZES[quant] == (block, size), name
    required = {"F32", "F16", "BF16", "F64", "I8", "I16", "I32", "I64", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
                "Q8_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS",
                "IQ3_S", "IQ1_S", "IQ1_M", "IQ4_NL", "IQ4_XS", "MXFP4"}
    assert required <= {name for name, _, _ in GGML_TYPES.values()}


def test_file_type_names_match_gguf_py() -> None:
    for value, name in gguf_format.FILE_TYPE_NAMES.items():
        assert LlamaFileType(value).name == name


def test_never_raises_on_cut_or_flipped_bytes(tmp_path: Path) -> None:
    """Whatever the damage, a verdict comes back: every cut point of a small file, and random byte flips."""
    path = tmp_path / "small.gguf"
    write_model(path, tensors=TENSORS[:4], vocab=40)
    data = path.read_bytes()
    header_end = check_file(path)["header_end"]
    for cut in range(0, header_end + 8, 3):
        r = check(in_memory(data[:cut]), cut)
        assert not r["ok"] and r["problems"], cut
        json.dumps(r)
    rng = np.random.default_rng(7)
    for at in rng.integers(0, header_end, 400):
        flipped = bytearray(data)
        flipped[at] ^= 0xFF
        json.dumps(check(in_memory(flipped), len(flipped)))


# ------------------------------------------------------------------------------------------------
# Real GGUFs, written by llama.cpp's tools: the vocab-only files of its test suite and a quantized
# model (tests/gguf_artifacts.py downloads and caches them), each checked against gguf-py's reader.

# The first test that needs them may download them (~330 MB) and gguf-py's read of the model takes
# tens of seconds on a busy machine: over the suite's 120 s.
REAL_FILES = pytest.mark.timeout(900)
READER_CHECKED_VOCABS = ("ggml-vocab-llama-spm", "ggml-vocab-bert-bge", "ggml-vocab-gpt-2", "ggml-vocab-phi-3")
GGUF_HEADER_FIELDS = 3  # GGUFReader lists GGUF.version, GGUF.tensor_count and GGUF.kv_count as fields


@dataclass(frozen=True)
class ReaderView:
    """What gguf-py's GGUFReader reads of a file, kept without the reader (it holds the whole vocab)."""

    tensor_count: int
    kv_count: int
    alignment: int
    data_offset: int
    last_tensor: str | None
    data_end: int | None  # absolute end of the last tensor's data
    scalars: dict  # key -> value, for the scalar and string KVs
    arrays: dict  # key -> (element type name, count), for arrays of scalars or strings


def reader_view(path: Path) -> ReaderView:
    from gguf.constants import GGUFValueType

    reader = GGUFReader(str(path))
    scalars, arrays = {}, {}
    for key, field in list(reader.fields.items())[GGUF_HEADER_FIELDS:]:
        if field.types[0] == GGUFValueType.ARRAY:
            if field.types[1] != GGUFValueType.ARRAY:
                arrays[key] = (gguf_format.VALUE_TYPE_NAMES[int(field.types[1])], len(field.data))
        else:
            scalars[key] = field.contents()
    last = reader.tensors[-1] if reader.tensors else None
    return ReaderView(len(reader.tensors), len(reader.fields) - GGUF_HEADER_FIELDS, int(reader.alignment),
                      int(reader.data_offset), last.name if last else None,
                      int(last.data_offset) + int(last.n_bytes) if last else None, scalars, arrays)


def assert_agrees(r: dict, view: ReaderView) -> None:
    """Our header walk against gguf-py's full read: counts, layout, last tensor, every KV we keep."""
    assert (r["tensor_count"], r["tensors"], r["kv_count"]) == (view.tensor_count, view.tensor_count, view.kv_count)
    assert (r["alignment"], r["data_start"], r["last_tensor"]) == (view.alignment, view.data_offset, view.last_tensor)
    assert r["data_end"] == (view.data_end if view.tensor_count else r["header_end"])
    for key, value in r["kv"].items():
        assert view.scalars[key] == pytest.approx(value) if isinstance(value, float) else view.scalars[key] == value
    assert {k: (a["type"], a["count"]) for k, a in r["arrays"].items() if a["type"] != "arr"} == view.arrays


@pytest.fixture(scope="module")
def vocab_files() -> list[Path]:
    from tests.gguf_artifacts import llama_vocab_files

    return llama_vocab_files()


@pytest.fixture(scope="module")
def gemma() -> Path:
    from tests.gguf_artifacts import gemma_q4_k_m

    return gemma_q4_k_m()


@pytest.fixture(scope="module")
def gemma_view(gemma: Path) -> ReaderView:
    return reader_view(gemma)  # ~750 MB and seconds for gguf-py: once per module


@pytest.mark.slow
@REAL_FILES
def test_llama_cpp_vocab_files_pass_and_say_why_they_are_short(vocab_files: list[Path]) -> None:
    """Vocab-only files (no tensors) end where their header ends, a few bytes under expected_size."""
    assert len(vocab_files) >= 15
    for path in vocab_files:
        r = check_file(path, expect_tensors=0)
        assert r["ok"] and r["problems"] == [], (path.name, r["problems"])
        assert r["tensor_count"] == 0 and r["header_end"] == r["data_end"] == r["file_size"], path.name
        assert r["data_start"] == r["expected_size"] == -(-r["file_size"] // 32) * 32, path.name
        if r["expected_size"] > r["file_size"]:
            assert "vocab-only" in r["size_note"] and str(r["header_end"]) in r["size_note"], path.name
        assert r["arrays"]["tokenizer.ggml.tokens"]["count"] > 1000, path.name
    shown = run_cli(str(vocab_files[0]))
    assert shown.returncode == 0 and "No tensors (a vocab-only file)" in shown.stdout


@pytest.mark.slow
@REAL_FILES
def test_llama_cpp_vocab_files_agree_with_gguf_py(vocab_files: list[Path]) -> None:
    checked = [p for p in vocab_files if p.stem in READER_CHECKED_VOCABS]  # GGUFReader takes seconds each
    assert len(checked) == len(READER_CHECKED_VOCABS)
    for path in checked:
        assert_agrees(check_file(path), reader_view(path))


@pytest.mark.slow
@REAL_FILES
def test_a_real_quantized_model_agrees_with_gguf_py(gemma: Path, gemma_view: ReaderView) -> None:
    r = check_file(gemma, expect_tensors=gemma_view.tensor_count, expect_last=gemma_view.last_tensor)
    assert r["ok"] and r["problems"] == []
    assert_agrees(r, gemma_view)
    assert r["kv"]["general.architecture"] == "gemma3" and r["kv"]["general.file_type"] == 15  # MOSTLY_Q4_K_M
    assert r["expected_size"] == r["data_end"] == r["file_size"] and r["size_note"] is None


@REAL_FILES
def test_a_real_vocabulary_costs_a_few_round_trips_and_no_tensor_data(gemma: Path) -> None:
    """262k tokens: read in reads of up to MAX_FETCH where the header is known to go on (11, not 70
    of CHUNK: each one a round trip to a remote box), still never past the header by more than a CHUNK."""
    whole = check_file(gemma)
    with open(gemma, "rb") as f:
        head = f.read(whole["header_end"] + 2 * CHUNK)
    log: list[tuple[int, int]] = []
    assert check(in_memory(head, log), whole["file_size"]) == whole
    assert len(log) <= whole["header_end"] // gguf_format.MAX_FETCH + 8, len(log)
    assert max(offset + length for offset, length in log) <= whole["header_end"] + CHUNK


def real_cuts(r: dict) -> dict[str, int]:
    """Where a download is cut, by what it leaves: inside the counts, the KVs, the tensor infos, the data."""
    size, header_end = r["file_size"], r["header_end"]
    cuts = {"fixed header": 20, "after the counts": 200, "first KB": 1024, "mid header": header_end // 2,
            "last header bytes": header_end - 3}
    if r["tensor_count"]:
        cuts.update({"first data": r["data_start"] + 1000, "last byte": size - 1})
    return cuts


def assert_cut_is_named(r: dict, where: str) -> None:
    assert not r["ok"], where
    code = r["problems"][0]["code"]
    assert code in ("header_truncated", "truncated"), (where, r["problems"])
    assert not any("one byte off" in p["message"] for p in r["problems"]), (where, r["problems"])
    assert "fetch it again" in r["problems"][0]["message"] or code == "truncated", (where, r["problems"])


@pytest.mark.slow
@REAL_FILES
def test_cut_real_files_are_truncations_never_corruption(vocab_files: list[Path], gemma: Path) -> None:
    for path in [*vocab_files, gemma]:
        whole = check_file(path)
        with open(path, "rb") as f:
            for where, cut in real_cuts(whole).items():
                f.seek(0)
                head = f.read(min(cut, whole["header_end"] + 64 * 1024))  # past the header: never read
                r = check(in_memory(head), cut)
                assert_cut_is_named(r, f"{path.name} cut at {cut} ({where})")
                json.dumps(r)


@REAL_FILES
def test_a_real_model_cut_in_its_first_kb_is_truncated_not_absurd(gemma: Path, tmp_path: Path) -> None:
    """The issue's case: 236 tensors and 33 KVs cannot fit in 4 KB, and that is a cut, not a bad patch."""
    cut = tmp_path / "cut.gguf"
    with open(gemma, "rb") as f:
        cut.write_bytes(f.read(4096))
    r = check_file(cut)
    assert codes(r) == ["header_truncated"]
    message = r["problems"][0]["message"]
    assert "236 tensors and 33 KVs" in message and "fetch it again" in message
    assert "patch" not in message
    out = run_cli(str(cut))
    assert out.returncode == 1 and "header_truncated" in out.stdout


@REAL_FILES
def test_counts_no_model_has_are_absurd_and_say_redo_the_patch(gemma: Path) -> None:
    with open(gemma, "rb") as f:
        head = f.read(4096)
    for at, value in ((8, 2 ** 58), (16, 10 ** 12)):
        data = patched(head, at, "<Q", value)
        r = check(in_memory(data), len(data))
        assert codes(r) == ["absurd_count"], (at, r["problems"])
        message = r["problems"][0]["message"]
        assert r["problems"][0]["offset"] == at and str(value) in message
        assert "one byte off" in message and "Redo the patch on a fresh copy" in message


def token_length_at(data: bytes) -> int:
    """The offset of the first token's u64 length in tokenizer.ggml.tokens."""
    entry = struct.pack("<Q", len("tokenizer.ggml.tokens")) + b"tokenizer.ggml.tokens"
    return data.index(entry) + len(entry) + 4 + 4 + 8  # value type ARRAY, element type STRING, count


@pytest.mark.slow
@REAL_FILES
@pytest.mark.parametrize("bit", [22, 14])
def test_a_flipped_token_length_is_named_not_blamed_on_the_download(vocab_files: list[Path], gemma: Path,
                                                                     bit: int) -> None:
    """A length under the hard cap but beyond any token (4 MB, 16 KB) is bad_string_length, never a cut."""
    for path in [*vocab_files, gemma]:
        whole = check_file(path)
        with open(path, "rb") as f:
            data = bytearray(f.read(whole["header_end"] + 64 * 1024))
        at = token_length_at(data)
        length = struct.unpack_from("<Q", data, at)[0]
        data[at + bit // 8] ^= 1 << (bit % 8)
        r = check(in_memory(data), whole["file_size"])
        assert codes(r) == ["bad_string_length"], (path.name, r["problems"])
        message = r["problems"][0]["message"]
        assert r["problems"][0]["offset"] == at and str(length ^ (1 << bit)) in message, path.name
        assert "not a cut file" in message and "one byte off" not in message, path.name


@REAL_FILES
def test_a_cut_real_file_never_exits_0(vocab_files: list[Path], tmp_path: Path) -> None:
    path = min(vocab_files, key=lambda p: p.stat().st_size)
    data = path.read_bytes()
    for cut in (len(data) - 1, len(data) // 2, 100):
        (tmp_path / "cut.gguf").write_bytes(data[:cut])
        out = run_cli(str(tmp_path / "cut.gguf"), "--json")
        assert out.returncode == 1 and codes(json.loads(out.stdout)) == ["header_truncated"], cut


# ------------------------------------------------------------------------------------------------
# `samai-console check gguf`: the box's check, as cheap as on the box; gguf-py only with --deep

CONSOLE_CHECK = """
import json, sys
from samai.console.cli import main
code = main(sys.argv[1:])
print(json.dumps({"rc": code, "gguf_loaded": "gguf" in sys.modules}), file=sys.stderr)
"""


def console_check(*args: str) -> tuple[dict, dict]:
    """`samai-console check gguf ... --json` in a process of its own: its JSON, and whether gguf-py was loaded."""
    import sys

    done = subprocess.run([sys.executable, "-c", CONSOLE_CHECK, "check", "gguf", *args, "--json"],
                          capture_output=True, text=True, timeout=300)
    return json.loads(done.stdout), json.loads(done.stderr.strip().splitlines()[-1])


@REAL_FILES
def test_console_check_of_a_real_model_does_not_load_gguf_py_unless_deep(gemma: Path) -> None:
    """gguf-py's reader loads the whole vocabulary (seconds and ~750 MB here): only --deep runs it."""
    result, run = console_check(str(gemma))
    assert run == {"rc": 0, "gguf_loaded": False} and result["ok"] and result["deep"] is False
    assert (result["header_end"], result["data_end"]) == (result["data_offset"] - 8, result["size"])
    assert result["bytes_read"] < 8 * 1024 * 1024  # the header, not the 253 MB


@pytest.mark.slow
@REAL_FILES
def test_console_check_deep_runs_gguf_py_too(vocab_files: list[Path]) -> None:
    path = min(vocab_files, key=lambda p: p.stat().st_size)
    result, run = console_check(str(path), "--deep")
    assert run == {"rc": 0, "gguf_loaded": True} and result["ok"] and result["deep"] is True


@pytest.mark.slow
@REAL_FILES
def test_console_check_says_why_a_vocab_only_file_is_short(vocab_files: list[Path]) -> None:
    from tests.helpers import run_cli as console_cli

    path = next(p for p in vocab_files if p.stem == "ggml-vocab-llama-spm")
    result, _run = console_check(str(path))
    assert result["ok"] and result["tensor_count"] == 0
    assert result["header_end"] == result["data_end"] == result["size"] < result["expected_size"]
    assert "vocab-only" in result["size_note"]
    text = console_cli("check", "gguf", str(path))
    assert text.returncode == 0 and "vocab-only" in text.stdout and f"header_end {result['header_end']}" in text.stdout


@REAL_FILES
def test_console_check_of_a_cut_real_model_exits_1(gemma: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut.gguf"
    with open(gemma, "rb") as f:
        cut.write_bytes(f.read(100_000))
    result, run = console_check(str(cut), "--deep")  # a cut file is not handed to gguf-py at all
    assert run == {"rc": 1, "gguf_loaded": False}
    assert [p["code"] for p in result["problems"]] == ["header_truncated"]


async def test_the_console_reads_a_local_file_as_it_reads_a_remote_one(box, vocab_files: list[Path],
                                                                        tmp_path: Path) -> None:
    """check gguf on a local target reads the file itself (what the box's tool costs); on a remote
    one, byte ranges through the probe: the same findings either way, on llama.cpp's own file
    whole and cut inside its vocabulary."""
    from samai.console.core.checks import check_gguf

    real = vocab_files[0]
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(real.read_bytes()[: real.stat().st_size // 2])
    for path in (real, cut):
        local = await check_gguf(box, str(path), expect_tensors=None, expect_last=None, local=True)
        remote = await check_gguf(box, str(path), expect_tensors=None, expect_last=None, local=False)
        assert local.to_json() == remote.to_json()
    assert local.problems and not local.ok
