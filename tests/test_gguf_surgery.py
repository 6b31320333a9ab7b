"""GGUF surgery (issue 19, playbook §5): the box tool through the real Box on this machine, the
action layer, the CLI. Real files only: llama.cpp's ggml-vocab GGUFs, the Gemma 3 270M Q4_K_M
model, and small models written by gguf-py's GGUFWriter; donors served over loopback HTTP by a
server that honours Range (and one that ignores it). Every output passes our checker and
gguf-py's GGUFReader, and its tensors' bytes equal their source's (sha256)."""

from __future__ import annotations

import hashlib
import json
import struct
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader, GGUFWriter
from gguf.constants import GGMLQuantizationType
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from samai.console.core import config
from samai.console.core.actions import Actions, Decision
from samai.console.core.audit import AuditLog
from samai.remote.box import gguf_surgery, gguf_write
from samai.remote.box.gguf_check import check, check_file, inspect
from samai.remote.boxapi import Box, BoxError
from samai.remote.local import LocalTransport
from samai.remote.model import GgufWriteResult
from tests.helpers import run_cli
from tests.httpfiles import FileServer

REAL_FILES = pytest.mark.timeout(900)
FUZZ = settings(max_examples=100, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
WRITE_TIMEOUT = 300.0


# ------------------------------------------------------------------------------------------------
# Files


@pytest.fixture(scope="module")
def gemma() -> Path:
    from tests.gguf_artifacts import gemma_q4_k_m

    return gemma_q4_k_m()


@pytest.fixture(scope="module")
def vocab() -> Path:
    from tests.gguf_artifacts import llama_vocab_files

    return next(p for p in llama_vocab_files() if p.name == "ggml-vocab-llama-spm.gguf")


def write_tiny(path: Path, prefix: str = "tiny", extra_kv: bool = True) -> Path:
    """A small real model: F32, F16 and Q8_0 tensors, a vocabulary, one of each KV kind."""
    w = GGUFWriter(str(path), "llama")
    w.add_name("tiny donor")
    w.add_uint32("llama.context_length", 128)
    if extra_kv:
        w.add_float32("test.f32", 0.5)
        w.add_bool("test.bool", True)
        w.add_array("tokenizer.ggml.tokens", [f"tok{i}" for i in range(300)])
    w.add_tensor(f"{prefix}.embd.weight", np.arange(4 * 64, dtype=np.float32).reshape(4, 64))
    w.add_tensor(f"{prefix}.norm.weight", np.linspace(0, 1, 64, dtype=np.float16))
    w.add_tensor(f"{prefix}.q.weight", np.full((3, 2 * 34), 7, dtype=np.uint8), raw_dtype=GGMLQuantizationType.Q8_0)
    w.add_tensor(f"{prefix}.out.weight", np.arange(5 * 7, dtype=np.float32).reshape(5, 7))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def gemma_reader(gemma: Path) -> GGUFReader:
    return GGUFReader(str(gemma))  # its 262144 tokens take gguf-py seconds: once per module


@pytest.fixture(scope="module")
def gemma_digests(gemma_reader: GGUFReader) -> dict[str, str]:
    return tensor_digests(gemma_reader)


def tensor_digests(file: Path | GGUFReader) -> dict[str, str]:
    """Each tensor's sha256 as gguf-py reads it: the oracle the outputs are compared with."""
    reader = file if isinstance(file, GGUFReader) else GGUFReader(str(file))
    return {t.name: hashlib.sha256(bytes(t.data.tobytes())).hexdigest() for t in reader.tensors}


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def assert_sound(path: Path, tensors: int, last: str | None) -> GGUFReader:
    """Our checker and gguf-py's reader both accept it, with the tensors expected."""
    result = check_file(str(path), expect_tensors=tensors, expect_last=last)
    assert result["ok"], result["problems"]
    reader = GGUFReader(str(path))
    assert len(reader.tensors) == tensors
    if last is not None:
        assert reader.tensors[-1].name == last
    return reader


def field(reader: GGUFReader, key: str):
    return reader.fields[key].contents()


def neighbours(reader: GGUFReader, first_of: str, count: int) -> list[str]:
    """`count` tensors that follow each other in the file's data area, from the first whose name
    starts with first_of."""
    order = sorted(reader.tensors, key=lambda t: int(t.data_offset))
    start = next(i for i, t in enumerate(order) if t.name.startswith(first_of))
    return [t.name for t in order[start:start + count]]


# ------------------------------------------------------------------------------------------------
# Box and actions


async def write(box: Box, **request) -> GgufWriteResult:
    return await box.gguf_write(request, timeout=WRITE_TIMEOUT)


def pipeline(tmp_path: Path, ws: Path, capacity_gb: float | None = None) -> config.Config:
    f = tmp_path / "surgery.toml"
    budget = f"[budget]\ncapacity_gb = {capacity_gb}\nreserve_gb = 0.001\n" if capacity_gb else ""
    f.write_text(f'[workspace]\npath = "{ws}"\n{budget}')
    return config.load(str(f))


def confirming(shown: list):
    async def operator(plan):
        shown.append(plan)
        return Decision.confirmed(plan, "test")

    return operator


# ------------------------------------------------------------------------------------------------
# show


@pytest.mark.slow
@REAL_FILES
async def test_show_a_real_model_agrees_with_gguf_py_and_stays_bounded(box: Box, gemma: Path,
                                                                      gemma_reader: GGUFReader) -> None:
    header = await box.gguf_show(str(gemma))
    reader = gemma_reader
    assert header.ok and header.file_size == gemma.stat().st_size
    assert header.tensor_count == len(reader.tensors) == len(header.tensors)
    assert header.data_start == int(reader.data_offset)
    assert [t.name for t in header.tensors] == [t.name for t in reader.tensors]
    for shown, real in zip(header.tensors, reader.tensors, strict=True):
        assert shown.offset == int(real.data_offset) - int(reader.data_offset)
        assert shown.size == int(real.n_bytes) and shown.shape == tuple(int(d) for d in real.shape)
        assert shown.type == real.tensor_type.name
    kvs = {kv.key: kv for kv in header.kvs}
    assert len(kvs) == header.kv_count == len(reader.fields) - 3  # gguf-py adds version and both counts
    assert kvs["general.name"].value == field(reader, "general.name")
    tokens = kvs["tokenizer.ggml.tokens"]
    assert tokens.type == "arr[str]" and tokens.count == 262144
    assert tokens.value.startswith("[262144 items of str] <pad>, <eos>") and len(tokens.value) < 400
    assert header.header_end <= header.data_start < header.header_end + header.alignment
    reply = gguf_surgery.handle({"op": "show", "workspace": str(box.workspace), "path": str(gemma)})
    assert len(json.dumps(reply)) < 64 * 1024  # 262144 tokens are not sent


async def test_show_read_only_installs_nothing(workspace: Path, tmp_path: Path) -> None:
    tiny = write_tiny(tmp_path / "tiny.gguf")
    box = Box(LocalTransport(), str(workspace), python=sys.executable, readonly=True)
    try:
        header = await box.gguf_show(str(tiny))
        assert header.ok and [t.name for t in header.tensors][-1] == "tiny.out.weight"
        with pytest.raises(BoxError, match="read-only"):
            await box.gguf_write({"op": "extract", "path": str(tiny), "tensors": ["tiny.q.weight"], "out": "x.gguf"},
                                 timeout=WRITE_TIMEOUT)
    finally:
        await box.close()
    assert not (workspace / ".samai").exists() and not (workspace / "x.gguf").exists()


# ------------------------------------------------------------------------------------------------
# set_kv


@pytest.mark.slow
@REAL_FILES
async def test_set_kv_on_a_real_model_keeps_every_tensor(box: Box, gemma: Path, gemma_reader: GGUFReader,
                                                         gemma_digests: dict[str, str], workspace: Path) -> None:
    before = file_digest(gemma)
    result = await write(box, op="set_kv", path=str(gemma), out="edited.gguf",
                         set={"general.name": "edited by surgery, a longer name than before",
                              "gemma3.context_length": "4096", "test.added": "7"}, types={"test.added": "u16"})
    assert result.ok, result.error
    assert [a.name for a in result.assertions] == ["tensor_count", "last_tensor", "size", "sha256", "check"]
    assert all(a.ok for a in result.assertions)
    out = workspace / "edited.gguf"
    reader = assert_sound(out, 236, "blk.17.post_ffw_norm.weight")
    assert field(reader, "general.name") == "edited by surgery, a longer name than before"
    assert field(reader, "gemma3.context_length") == 4096
    assert field(reader, "test.added") == 7 and reader.fields["test.added"].types[0].name == "UINT16"
    assert reader.fields["gemma3.context_length"].types == gemma_reader.fields["gemma3.context_length"].types
    assert len(reader.fields["tokenizer.ggml.tokens"].data) == 262144
    assert tensor_digests(reader) == gemma_digests
    assert out.stat().st_size == result.bytes
    assert file_digest(gemma) == before  # the input is never modified
    assert not (workspace / "edited.gguf.part").exists()


@pytest.mark.slow
async def test_set_kv_types_new_keys_and_refuses_what_it_cannot_keep(box: Box, tmp_path: Path,
                                                                       workspace: Path) -> None:
    tiny = write_tiny(tmp_path / "tiny.gguf")
    result = await write(box, op="set_kv", path=str(tiny), out="t.gguf",
                         set={"test.bool": "false", "test.f32": "2.25", "new.list": '["a", "b"]'},
                         types={"new.list": "arr[str]"})
    assert result.ok, result.error
    reader = assert_sound(workspace / "t.gguf", 4, "tiny.out.weight")
    assert field(reader, "test.bool") is False and field(reader, "test.f32") == 2.25
    assert field(reader, "new.list") == ["a", "b"]
    assert tensor_digests(workspace / "t.gguf") == tensor_digests(tiny)
    refusals = {
        "new key without type": ({"new.key": "1"}, {}, "its type is needed"),
        "not an integer": ({"llama.context_length": "many"}, {}, "not an integer"),
        "too big for u32": ({"llama.context_length": str(2 ** 32)}, {}, "does not fit a u32"),
        "type change": ({"llama.context_length": "5"}, {"llama.context_length": "str"}, "change its type"),
        "alignment": ({"general.alignment": "64"}, {}, "every tensor's place"),
    }
    for n, (changes, types, why) in enumerate(refusals.values()):
        refused = await write(box, op="set_kv", path=str(tiny), out=f"r{n}.gguf", set=changes, types=types)
        assert not refused.ok and why in refused.error and not refused.assertions
        assert not (workspace / f"r{n}.gguf").exists() and not (workspace / f"r{n}.gguf.part").exists()


@pytest.mark.slow
async def test_set_kv_on_a_vocab_only_file(box: Box, vocab: Path, workspace: Path) -> None:
    result = await write(box, op="set_kv", path=str(vocab), out="v.gguf", set={"general.name": "vocab edited"})
    assert result.ok, result.error
    reader = assert_sound(workspace / "v.gguf", 0, None)
    assert field(reader, "general.name") == "vocab edited"
    original = GGUFReader(str(vocab))
    assert field(reader, "tokenizer.ggml.tokens") == field(original, "tokenizer.ggml.tokens")


# ------------------------------------------------------------------------------------------------
# add_tensors and extract, from a donor over HTTP


@pytest.mark.slow
@REAL_FILES
async def test_transplant_from_a_real_model_over_http_fetches_only_its_header_and_tensors(
        box: Box, gemma: Path, gemma_reader: GGUFReader, gemma_digests: dict[str, str], workspace: Path) -> None:
    tiny = write_tiny(workspace / "tiny.gguf")
    names = [*neighbours(gemma_reader, "blk.3.", 3), "blk.9.ffn_down.weight"]  # two runs of the donor's data
    with FileServer(gemma.parent) as server:
        url = server.url(gemma.name)
        result = await write(box, op="add_tensors", path="tiny.gguf", donor=url, tensors=names,
                             out="grafted.gguf", expect_tensors=8, expect_last="blk.9.ffn_down.weight")
        gets = server.gets(gemma.name)
    assert result.ok, result.error
    out = workspace / "grafted.gguf"
    got = tensor_digests(assert_sound(out, 8, "blk.9.ffn_down.weight"))
    base = tensor_digests(tiny)
    assert {n: got[n] for n in names} == {n: gemma_digests[n] for n in names}
    assert {n: got[n] for n in base} == base
    assert all(status == 206 for _, status in gets)
    header = int(gemma_reader.data_offset)
    data_reads = [r for r, _ in gets if int(r.split("=")[1].split("-")[0]) >= header]
    assert len(data_reads) == 2  # the three neighbours came in one range
    tensor_bytes = sum(int(t.n_bytes) for t in gemma_reader.tensors if t.name in names)
    assert result.fetched < header + tensor_bytes + 2 * 1024 * 1024
    assert result.fetched < gemma.stat().st_size / 10 and result.donor_size == gemma.stat().st_size


async def test_a_server_that_ignores_range_is_refused_before_any_download(box: Box, tmp_path: Path,
                                                                          workspace: Path) -> None:
    write_tiny(tmp_path / "donor.gguf", prefix="donor")
    write_tiny(workspace / "base.gguf")
    with FileServer(tmp_path, ignore_range=True) as server:
        result = await write(box, op="add_tensors", path="base.gguf", donor=server.url("donor.gguf"),
                             tensors=["donor.q.weight"], out="never.gguf")
        gets = server.gets("donor.gguf")
    assert not result.ok and "not 206" in result.error and "nothing was downloaded" in result.error
    assert result.fetched == 0 and len(gets) == 1 and gets[0][1] == 200
    assert not (workspace / "never.gguf").exists() and not (workspace / "never.gguf.part").exists()


@pytest.mark.slow
@REAL_FILES
async def test_extract_from_a_url_makes_a_small_model_with_the_inputs_kvs(
        box: Box, gemma: Path, gemma_reader: GGUFReader, gemma_digests: dict[str, str], workspace: Path) -> None:
    names = ["output_norm.weight", "blk.0.attn_q.weight", "blk.17.ffn_gate.weight"]
    with FileServer(gemma.parent) as server:
        result = await write(box, op="extract", path=server.url(gemma.name), tensors=names, out="small.gguf")
    assert result.ok, result.error
    out = workspace / "small.gguf"
    reader = assert_sound(out, 3, "blk.17.ffn_gate.weight")
    assert set(reader.fields) == set(gemma_reader.fields)
    for key in ("general.name", "gemma3.context_length", "tokenizer.ggml.bos_token_id"):
        assert field(reader, key) == field(gemma_reader, key)
    tokens, original = reader.fields["tokenizer.ggml.tokens"], gemma_reader.fields["tokenizer.ggml.tokens"]
    assert len(tokens.data) == len(original.data) and tokens.contents(slice(0, 5)) == original.contents(slice(0, 5))
    assert tensor_digests(reader) == {n: gemma_digests[n] for n in names}
    assert out.stat().st_size < 16 * 1024 * 1024 and result.fetched < gemma.stat().st_size / 10


async def test_tensor_names_the_donor_lacks_or_the_input_has_are_refused(box: Box, tmp_path: Path,
                                                                          workspace: Path) -> None:
    write_tiny(workspace / "base.gguf")
    donor = write_tiny(workspace / "donor.gguf", prefix="donor")
    missing = await write(box, op="add_tensors", path="base.gguf", donor=str(donor), tensors=["nope"], out="a.gguf")
    assert not missing.ok and "no tensor named 'nope'" in missing.error
    clash = await write(box, op="add_tensors", path="base.gguf", donor="base.gguf", tensors=["tiny.q.weight"],
                        out="b.gguf")
    assert not clash.ok and "already" in clash.error
    wrong = await write(box, op="add_tensors", path="base.gguf", donor=str(donor), tensors=["donor.q.weight"],
                        out="c.gguf", expect_tensors=7)
    assert not wrong.ok and "expected 7 tensors, but the output would have 5" in wrong.error
    last = await write(box, op="add_tensors", path="base.gguf", donor=str(donor), tensors=["donor.q.weight"],
                       out="d.gguf", expect_last="blk.31.post_attention_norm.weight")
    assert not last.ok and "'donor.q.weight'" in last.error
    assert not any(workspace.glob("[abcd].gguf*"))


# ------------------------------------------------------------------------------------------------
# The playbook's incidents as inputs


def kv_count_patched_one_byte_off(good: bytes) -> bytes:
    """§5: kv_count + 1 written at offset 17 instead of 16 ('string length 2^58')."""
    out = bytearray(good)
    struct.pack_into("<Q", out, 17, struct.unpack_from("<Q", good, 16)[0] + 1)
    return bytes(out)


def header_end_taken_after_the_kvs(good: bytes) -> bytes:
    """§5: the header cut where the KVs end (the tensor infos dropped), the data area right after
    it, and tensor_count still counting them all: 'failed to read tensor info'."""
    result, _tensors, spans = inspect(lambda o, n: good[o:o + n], len(good))
    kvs_end = spans[-1][3]
    return good[:kvs_end] + b"\0" * (-kvs_end % 32) + good[result["data_start"]:]


@pytest.mark.slow
@pytest.mark.parametrize("incident", ["kv_count_one_byte_off", "header_end_after_the_kvs"])
async def test_surgery_refuses_to_build_on_a_broken_header_and_names_it(box: Box, tmp_path: Path, workspace: Path,
                                                                        incident: str) -> None:
    good_path = write_tiny(tmp_path / "good.gguf")
    good = good_path.read_bytes()
    broken = (kv_count_patched_one_byte_off(good) if incident == "kv_count_one_byte_off"
              else header_end_taken_after_the_kvs(good))
    (workspace / "broken.gguf").write_bytes(broken)
    verdict = check_file(str(workspace / "broken.gguf"))
    assert not verdict["ok"]
    code = verdict["problems"][0]["code"]
    if incident == "kv_count_one_byte_off":
        assert code == "absurd_count" and "one byte off" in verdict["problems"][0]["message"]
    header = await box.gguf_show("broken.gguf")
    assert not header.ok and header.problems[0].code == code
    donor = write_tiny(workspace / "donor.gguf", prefix="donor")
    for request in ({"op": "set_kv", "path": "broken.gguf", "set": {"general.name": "x"}},
                    {"op": "add_tensors", "path": "broken.gguf", "donor": str(donor), "tensors": ["donor.q.weight"]},
                    {"op": "add_tensors", "path": str(donor), "donor": "broken.gguf", "tensors": ["tiny.q.weight"]},
                    {"op": "extract", "path": "broken.gguf", "tensors": ["tiny.q.weight"]}):
        result = await write(box, **request, out="out.gguf")
        assert not result.ok and "not a sound GGUF" in result.error and code in result.error, result.error
        assert not (workspace / "out.gguf").exists() and not (workspace / "out.gguf.part").exists()


# ------------------------------------------------------------------------------------------------
# Where OUT may go


@pytest.mark.slow
async def test_out_must_be_a_new_file_inside_the_workspace(box: Box, tmp_path: Path, workspace: Path) -> None:
    tiny = write_tiny(workspace / "tiny.gguf")
    before = file_digest(tiny)
    (workspace / "taken.gguf").write_bytes(b"keep")
    (tmp_path / "elsewhere").mkdir()
    (workspace / "link").symlink_to(tmp_path / "elsewhere")
    cases = {str(tmp_path / "outside.gguf"): "outside the workspace", "../outside.gguf": "outside the workspace",
             "tiny.gguf": "is the input", str(tiny): "is the input", "taken.gguf": "exists already",
             "link/out.gguf": "symlink"}
    for out, why in cases.items():
        result = await write(box, op="set_kv", path="tiny.gguf", out=out, set={"general.name": "x"})
        assert not result.ok and why in result.error, (out, result.error)
    assert file_digest(tiny) == before and (workspace / "taken.gguf").read_bytes() == b"keep"
    assert not (tmp_path / "outside.gguf").exists() and not any((tmp_path / "elsewhere").iterdir())
    made = await write(box, op="set_kv", path="tiny.gguf", out="new/folder/t.gguf", set={"general.name": "x"})
    assert made.ok and (workspace / "new/folder/t.gguf").is_file()
    no_place = gguf_surgery.handle({"op": "set_kv", "workspace": "/", "path": str(tiny), "out": "", "set": {}})
    assert no_place["ok"] is False and "system or shared folder" in no_place["failure"]


def test_an_output_whose_bytes_differ_from_the_source_fails_the_sha256_assertion(tmp_path: Path) -> None:
    """The assertions read back what was written: a byte changed in OUT.part is named, with numbers."""
    from samai.remote.box.gguf_source import LocalSource

    tiny = write_tiny(tmp_path / "tiny.gguf")
    source = LocalSource(str(tiny))
    try:
        header = gguf_surgery.Header(source, "input")
        layout = gguf_write.Layout(3, [raw for _, _, raw in header.raw_kvs()], header.kept_tensors(), 32)
        folder = gguf_surgery.os.open(str(tmp_path), gguf_surgery.os.O_RDONLY)
        part_fd = gguf_write.create_part(folder, "out.gguf")
        try:
            gguf_write.write_part(part_fd, layout)
            assert all(a["ok"] for a in gguf_write.verify(part_fd, layout, 4, "tiny.out.weight"))
            part = tmp_path / "out.gguf.part"
            data = bytearray(part.read_bytes())
            data[layout.data_start + layout.tensors[2].offset] ^= 0xFF
            part.write_bytes(bytes(data))  # the same file, changed where it is: what a reader of fd sees
            checked = {a["name"]: a for a in gguf_write.verify(part_fd, layout, 4, "tiny.out.weight")}
        finally:
            gguf_surgery.os.close(part_fd)
            gguf_surgery.os.close(folder)
    finally:
        source.close()
    assert not checked["sha256"]["ok"] and "'tiny.q.weight'" in checked["sha256"]["detail"]
    assert "its source's" in checked["sha256"]["detail"] and checked["size"]["ok"]


# ------------------------------------------------------------------------------------------------
# The action layer: disk budget, confirmation, audit, read-only


async def test_an_output_the_disk_budget_cannot_hold_is_blocked(box: Box, tmp_path: Path, workspace: Path) -> None:
    tiny = write_tiny(workspace / "tiny.gguf")
    cfg = pipeline(tmp_path, workspace, capacity_gb=0.000001)  # a 1 KB quota: a full disk for this output
    shown: list = []
    actions = Actions(box, cfg, AuditLog(tmp_path / "audit.jsonl"), readonly=False, confirm=confirming(shown))
    outcome = await actions.gguf({"op": "set_kv", "path": str(tiny), "out": "big.gguf", "set": {"general.name": "x"}})
    assert not outcome.ok and outcome.plan.blocked
    assert any(c.severity == "error" and "under the reserve" in c.text for c in outcome.plan.checks)
    assert not (workspace / "big.gguf").exists()


@pytest.mark.slow
async def test_the_action_is_planned_confirmed_audited_and_refused_read_only(box: Box, tmp_path: Path,
                                                                               workspace: Path) -> None:
    write_tiny(workspace / "tiny.gguf")
    donor = write_tiny(workspace / "donor.gguf", prefix="donor")
    cfg = pipeline(tmp_path, workspace)
    request = {"op": "add_tensors", "path": "tiny.gguf", "donor": str(donor), "tensors": ["donor.q.weight"],
               "out": "both.gguf"}
    readonly_box = Box(LocalTransport(), str(workspace), python=sys.executable, readonly=True)
    try:
        asked: list = []
        refused = await Actions(readonly_box, cfg, AuditLog(tmp_path / "ro.jsonl"), readonly=True,
                                confirm=confirming(asked)).gguf(request)
    finally:
        await readonly_box.close()
    assert refused.status == "refused" and "read-only" in refused.message and not asked
    assert not (workspace / "both.gguf").exists()
    shown: list = []
    audit = tmp_path / "audit.jsonl"
    outcome = await Actions(box, cfg, AuditLog(audit), readonly=False, confirm=confirming(shown)).gguf(request)
    assert outcome.ok, outcome.message
    read = outcome.result.assertions[-1]  # a local target: gguf-py's reader has read OUT too
    assert read.name == "gguf_py" and read.ok and "GGUFReader reads 5 tensors" in read.detail
    [plan] = shown
    assert plan.action == "gguf" and "--from" in plan.command and "donor.q.weight" in plan.command
    assert any("5 tensors" in d for d in plan.details) and plan.gguf_bytes == (workspace / "both.gguf").stat().st_size
    assert any(c.severity == "ok" and "stays free" in c.text for c in plan.checks)
    lines = [json.loads(line) for line in audit.read_text().splitlines()]
    assert [e.get("result") for e in lines] == [None, "done"] and lines[0]["command"] == plan.command
    assert_sound(workspace / "both.gguf", 5, "donor.q.weight")
    assert tensor_digests(workspace / "both.gguf")["donor.q.weight"] == tensor_digests(donor)["donor.q.weight"]


@pytest.mark.slow
def test_cli_show_set_kv_and_read_only(tmp_path: Path, workspace: Path) -> None:
    tiny = write_tiny(workspace / "tiny.gguf")
    cfg = tmp_path / "surgery.toml"
    cfg.write_text(f'[workspace]\npath = "{workspace}"\n')
    shown = run_cli("--config", str(cfg), "gguf", "show", "tiny.gguf", "--json")
    assert shown.returncode == 0, shown.stderr
    header = json.loads(shown.stdout)
    assert header["ok"] and [t["name"] for t in header["tensors"]][-1] == "tiny.out.weight"
    text = run_cli("--config", str(cfg), "gguf", "show", str(tiny))
    assert "tiny.q.weight" in text.stdout and "Q8_0" in text.stdout and "[300 items of str]" in text.stdout
    ro = run_cli("--config", str(cfg), "--readonly", "gguf", "set-kv", "tiny.gguf", "general.name=x", "--out",
                 "ro.gguf", "--yes")
    assert ro.returncode == 1 and "read-only" in ro.stderr and not (workspace / "ro.gguf").exists()
    unconfirmed = run_cli("--config", str(cfg), "gguf", "set-kv", "tiny.gguf", "general.name=x", "--out", "n.gguf")
    assert unconfirmed.returncode == 1 and "--yes" in unconfirmed.stderr and not (workspace / "n.gguf").exists()
    done = run_cli("--config", str(cfg), "gguf", "set-kv", "tiny.gguf", "general.name=cli", "test.new=3", "--type",
                   "i32", "--out", "cli.gguf", "--yes")
    assert done.returncode == 1 and "would change its type" in done.stderr  # general.name is a str, not an i32
    done = run_cli("--config", str(cfg), "gguf", "set-kv", "tiny.gguf", "test.new=3", "--type", "i32",
                   "--out", "cli.gguf", "--yes")
    assert done.returncode == 0, done.stderr
    assert "✓ sha256" in done.stdout and field(assert_sound(workspace / "cli.gguf", 4, None), "test.new") == 3
    bad = run_cli("--config", str(cfg), "gguf", "set-kv", "tiny.gguf", "no-equals", "--out", "z.gguf", "--yes")
    assert bad.returncode == 2 and "KEY=VALUE" in bad.stderr


# ------------------------------------------------------------------------------------------------
# Garbage never crashes the tool


NAMES = ["tiny.gguf", "donor.gguf", "out.gguf", "sub/out.gguf", "../out.gguf", "/etc/passwd", "", ".", "tiny.gguf/x"]
TENSORS = ["tiny.q.weight", "tiny.out.weight", "donor.q.weight", "donor.embd.weight", "nope", ""]
KEYS = ["general.name", "llama.context_length", "test.f32", "test.bool", "tokenizer.ggml.tokens",
        "general.alignment", "new.key", ""]
TYPES = ["u8", "i16", "u32", "u64", "f32", "f64", "bool", "str", "arr[str]", "arr[u8]", "arr[arr]", "uint32", "x"]
TEXT = st.one_of(st.text(max_size=30), st.sampled_from(NAMES + TENSORS + KEYS + TYPES))
VALUE = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), TEXT),
                     lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(TEXT, inner, max_size=4)),
                     max_leaves=10)
SETS = st.dictionaries(st.one_of(st.sampled_from(KEYS), st.text(max_size=10)),
                       st.one_of(st.sampled_from(["1", "-3", "2.5", "true", "x" * 300, '["a", 1]', "[1, 2]", "0x10"]),
                                 VALUE), max_size=4)
PATHS = ["tiny.gguf", "tiny.gguf", "donor.gguf", "missing.gguf", "/etc/passwd", "."]
OUTS = ["out.gguf", "out.gguf", "sub/out.gguf", "../out.gguf", "tiny.gguf", "", "tiny.gguf/x"]
SENSIBLE = st.fixed_dictionaries(
    {"op": st.sampled_from(["show", "set_kv", "add_tensors", "extract"]), "path": st.sampled_from(PATHS),
     "out": st.sampled_from(OUTS), "donor": st.sampled_from(["donor.gguf", "donor.gguf", "tiny.gguf", "missing.gguf"]),
     "tensors": st.lists(st.sampled_from(TENSORS), min_size=1, max_size=4)},
    optional={"set": SETS, "types": st.dictionaries(st.sampled_from(KEYS), st.sampled_from(TYPES), max_size=3),
              "expect_tensors": st.integers(-1, 9), "expect_last": st.sampled_from(TENSORS), "plan": st.booleans()})
FIELDS = ["op", "path", "out", "donor", "tensors", "set", "types", "expect_tensors", "expect_last", "plan", "pin",
          "redirect_hosts"]
# A request that makes sense, with at most one field replaced by anything JSON can hold.
REQUEST = st.tuples(SENSIBLE, st.one_of(st.none(), st.tuples(st.sampled_from(FIELDS), VALUE))).map(
    lambda pair: {**pair[0], **dict([pair[1]] if pair[1] else [])})


@pytest.mark.slow
@FUZZ
@given(request=REQUEST)
def test_fuzzed_requests_get_a_reply_never_a_crash(tmp_path_factory: pytest.TempPathFactory, request: dict) -> None:
    ws = tmp_path_factory.mktemp("ws")
    write_tiny(ws / "tiny.gguf")
    write_tiny(ws / "donor.gguf", prefix="donor")
    reply = gguf_surgery.handle({**request, "workspace": str(ws)})
    assert isinstance(reply, dict) and json.dumps(reply)
    if "error" in reply or reply.get("ok") is False:
        return
    if request["op"] != "show" and not reply.get("planned"):
        out = ws / str(request["out"])
        assert check_file(str(out))["ok"]


@pytest.fixture(scope="module")
def donor_bytes(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return write_tiny(tmp_path_factory.mktemp("donor") / "donor.gguf", prefix="donor").read_bytes()


@pytest.mark.slow
@FUZZ
@given(data=st.data())
def test_fuzzed_donor_headers_over_http_are_refused_clearly(tmp_path_factory: pytest.TempPathFactory,
                                                           donor_bytes: bytes, data) -> None:
    """A donor header cut or with bytes changed, served by a real HTTP server: a clear refusal or a
    sound output, never a traceback."""
    header_end = check(lambda o, n: donor_bytes[o:o + n], len(donor_bytes))["header_end"]
    mutated = bytearray(donor_bytes)
    for at, value in data.draw(st.lists(st.tuples(st.integers(0, header_end - 1), st.integers(0, 255)),
                                        min_size=1, max_size=6)):
        mutated[at] = value
    cut = data.draw(st.one_of(st.none(), st.integers(0, len(mutated))))
    served = bytes(mutated[:cut] if cut is not None else mutated)
    root = tmp_path_factory.mktemp("served")
    (root / "donor.gguf").write_bytes(served)
    ws = tmp_path_factory.mktemp("ws")
    write_tiny(ws / "base.gguf")
    with FileServer(root) as server:
        reply = gguf_surgery.handle({"op": "add_tensors", "workspace": str(ws), "path": "base.gguf",
                                     "donor": server.url("donor.gguf"), "tensors": ["donor.q.weight"],
                                     "out": "out.gguf"})
    assert isinstance(reply, dict) and "error" not in reply
    if reply["ok"]:
        assert_sound(ws / "out.gguf", 5, "donor.q.weight")
    else:
        assert reply["failure"] and not (ws / "out.gguf").exists() and not (ws / "out.gguf.part").exists()
