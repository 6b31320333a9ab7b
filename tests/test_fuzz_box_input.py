"""Property-based fuzzing of what crosses between the console and the box: the probe's requests
(in-process and through a real `probe.py --serve`), its replies as the console converts them,
log decoding and line splitting, marker scanning, and GGUF headers.

Invariants: no exception but the documented one, the probe serves on, and the same result for
a whole input and for the same input in chunks."""

from __future__ import annotations

import base64
import importlib
import json
import os
import re
import subprocess
import tracemalloc
import types
import typing
from dataclasses import fields, is_dataclass
from importlib import resources
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from samai.remote import model
from samai.remote.boxapi import BoxError, HeldProcesses, _reply
from samai.remote.decode import LineDecoder
from samai.remote.follow import LogFollower
from samai.remote.marker_needles import required_needles
from samai.remote.model import Marker
from tests.box_tools import tool_argv

FUZZ = settings(max_examples=100, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
BOX_MODULES = ("procfs", "disk", "sockets", "markers", "logfiles", "procs", "probe", "gguf_check")
BOX_TOOLS = Path(str(resources.files("samai.remote.box")))

# ---------------------------------------------------------------- strategies

HUGE_INTS = st.sampled_from([2 ** 31, 2 ** 58, 2 ** 63 - 1, 2 ** 63, 2 ** 64, 10 ** 30, -1, -(2 ** 63)])
SCALARS = (st.none() | st.booleans() | st.integers() | HUGE_INTS | st.floats(allow_nan=True, allow_infinity=True)
           | st.text(max_size=12))
KEYS = st.sampled_from(["path", "pid", "data", "error", "name"]) | st.text(max_size=4)
JSON = st.recursive(SCALARS, lambda kids: st.lists(kids, max_size=3) | st.dictionaries(KEYS, kids, max_size=3),
                    max_leaves=8)
NUMBERS = st.none() | st.integers(min_value=-5, max_value=5000) | HUGE_INTS | st.floats() | st.text(max_size=5)


def deep(depth: int) -> str:
    return "[" * depth + "]" * depth


# ---------------------------------------------------------------- the probe, in-process


@pytest.fixture(scope="module")
def box():
    """The probe's modules (the package the box runs as samai_box)."""
    yield SimpleNamespace(**{name: importlib.import_module(f"samai.remote.box.{name}") for name in BOX_MODULES})


@pytest.fixture(scope="module")
def box_files(tmp_path_factory) -> SimpleNamespace:
    """A workspace with a log, a folder, a report and stage records, one of them not a record."""
    root = tmp_path_factory.mktemp("fuzzbox")
    log = root / "train.log"
    log.write_bytes(b"step 1 loss 2.0\nTraceback (most recent call last)\n\xff\xfe bad bytes\r\nEVAL_RC=0\npart")
    (root / "out").mkdir()
    (root / "out" / "summary.json").write_text('{"accuracy": 0.5}')
    state = root / ".samai" / "state"
    state.mkdir(parents=True)
    (state / "list.json").write_text("[1, 2]")
    (state / "odd.json").write_text('{"pid": "x", "start_time": [], "pgid": {}, "btime": "no"}')
    (state / "broken.json").write_text("{")
    return SimpleNamespace(root=root, paths=[str(log), str(root / "out"), str(root / "missing.log"),
                                             str(root / "out" / "summary.json")])


def path_strategy(files: SimpleNamespace):
    return st.sampled_from(files.paths) | st.text(max_size=10).map(lambda t: f"{files.root}/{t}") | JSON


def request_strategy(files: SimpleNamespace):
    paths = path_strategy(files)
    marker = st.fixed_dictionaries({"name": st.text(max_size=8) | JSON},
                                   optional={"pattern": st.sampled_from(["^Traceback ", "EVAL_RC=\\d+", "(", "(?i)x"])
                                             | JSON,
                                             "needles": st.lists(st.text(max_size=4), max_size=3) | JSON})
    log = st.fixed_dictionaries({"path": paths}, optional={
        "offset": NUMBERS, "inode": NUMBERS, "scan_from": NUMBERS, "last_lines": NUMBERS, "max_bytes": NUMBERS,
        "check": st.sampled_from(["", "cGFydA==", "!!"]) | JSON, "data": JSON,
        "markers": st.lists(marker, max_size=3) | JSON,
        "like": st.integers(-1, 3) | JSON, "drop": st.lists(st.sampled_from(["path", "offset", "x"])) | JSON})
    a_range = st.fixed_dictionaries({"path": paths}, optional={"start": NUMBERS, "end": NUMBERS})
    listed = lambda entry: st.lists(entry, max_size=3) | JSON  # noqa: E731
    return st.fixed_dictionaries(
        {"processes": st.sampled_from([False, 0, None, "", []]) | st.just(True)},
        optional={
            "workspace": st.just(str(files.root)) | JSON,
            "artifacts": listed(st.fixed_dictionaries({"path": paths}, optional={"name": JSON})),
            "artifact_budget_s": NUMBERS,
            "logs": listed(log),
            "ranges": listed(a_range),
            "reports": listed(st.fixed_dictionaries({"glob": st.just("out/*.json") | JSON}, optional={"max": NUMBERS})),
            "processes_since": JSON,
            "states": JSON,
            "writers": st.just(False) | JSON,
            "binaries": st.lists(paths, max_size=3) | JSON,
            "users": st.fixed_dictionaries({}, optional={"top": NUMBERS, "budget_s": NUMBERS}) | JSON,
            # changes to the request the probe holds (box/held.py): HELD stands for its mark
            "base": st.just("HELD") | JSON,
            "same": st.lists(st.sampled_from(["logs", "workspace", "ranges", "processes", "x"])) | JSON,
            "attach": JSON,
        })


SANE = {"processes": False, "logs": [{"path": "LOG", "offset": 0}], "ranges": [{"path": "LOG", "start": 0, "end": 3}]}


def sane_request(files: SimpleNamespace) -> str:
    return json.dumps(SANE).replace('"LOG"', json.dumps(files.paths[0]))


def assert_probe_reply(raw: bytes) -> dict:
    """A reply is one JSON object on one line (the error reply, or every key of a reply), then
    the bytes its entries' data_at point into, exactly those."""
    line, _, attached = raw.partition(b"\n")
    reply = json.loads(line)
    assert isinstance(reply, dict)
    if "error" in reply:
        assert set(reply) <= {"error", "held_unknown"} and isinstance(reply["error"], str) and not attached
        return reply
    assert {"time", "logs", "ranges", "processes", "states", "errors"} <= set(reply)
    spans = [entry["data_at"] for entry in reply["logs"] + reply["ranges"] if "data_at" in entry]
    assert sum(n for _, n in spans) == len(attached) and all(a + n <= len(attached) for a, n in spans)
    for entry in reply["logs"] + reply["ranges"]:
        assert "error" in entry or "data" in entry or "data_at" in entry
    return reply


def held_base(request, memory):
    """request with HELD replaced by the mark of the request the probe holds (if any)."""
    if isinstance(request, dict) and request.get("base") == "HELD":
        return {**request, "base": memory.held.mark}
    return request


@pytest.fixture(scope="module")
def memory(box):
    """One --serve probe's memory for every example, as one probe serves request after request
    (it holds descriptors of the logs it read: one per example would pile them up)."""
    return box.probe.Memory()


@pytest.mark.slow
@FUZZ
@given(data=st.data())
def test_probe_answers_any_request_with_a_reply_or_an_error_reply(box, box_files, memory, data) -> None:
    request = held_base(data.draw(request_strategy(box_files)), memory)
    assert_probe_reply(box.probe.answer(json.dumps(request), memory))
    # ... and serves on: the next sane request gets a whole reply.
    reply = assert_probe_reply(box.probe.answer(sane_request(box_files), memory))
    assert "error" not in reply and base64.b64decode(reply["ranges"][0]["data"]) == b"step"


def well_formed_request(files: SimpleNamespace):
    """Requests of the documented shape, with any values the shape allows."""
    names = st.text(st.characters(blacklist_characters="\0", blacklist_categories=("Cs",)), max_size=10)
    paths = st.sampled_from(files.paths) | names.map(lambda t: f"{files.root}/{t}")
    offset = st.none() | st.integers(0, 2 ** 63 - 1) | st.integers(0, 200)
    marker = st.fixed_dictionaries({"name": st.text(max_size=8)}, optional={
        "pattern": st.none() | st.sampled_from(["^Traceback ", "EVAL_RC=\\d+", "(", "(?i)x", "$", "a|^b"]),
        "needles": st.none() | st.lists(st.text(max_size=3), max_size=2)})
    log = st.fixed_dictionaries({"path": paths}, optional={
        "offset": offset, "inode": st.none() | st.integers(0, 2 ** 64 - 1), "scan_from": offset,
        "last_lines": offset, "max_bytes": offset, "check": st.sampled_from(["", "cGFydA==", "!!"]),
        "data": st.booleans(), "markers": st.lists(marker, max_size=3)})
    a_range = st.fixed_dictionaries({"path": paths, "start": offset.filter(bool), "end": offset.filter(bool)})
    return st.fixed_dictionaries({"processes": st.booleans()}, optional={
        "workspace": st.just(str(files.root)),
        "artifacts": st.lists(st.fixed_dictionaries({"path": paths}, optional={"name": st.text(max_size=5)}),
                              max_size=2),
        "artifact_budget_s": st.floats(0, 2),
        "logs": st.lists(log, max_size=3),
        "ranges": st.lists(a_range, max_size=2),
        "reports": st.lists(st.fixed_dictionaries({"glob": st.sampled_from(["out/*.json", "*", "[", "**"])},
                                                  optional={"max": st.integers(0, 2 ** 63 - 1)}), max_size=2),
        "processes_since": st.text(max_size=8),
        "states": st.booleans(),
        "binaries": st.lists(paths, max_size=2),
        "users": st.fixed_dictionaries({}, optional={"top": st.integers(0, 2 ** 63 - 1),
                                                      "budget_s": st.floats(0, 0.2)}),
    })


@pytest.mark.slow
@FUZZ
@given(data=st.data())
def test_a_well_formed_request_gets_a_whole_reply(box, box_files, memory, data) -> None:
    """Whatever its values, a request of the documented shape is served: what cannot be read
    (a missing file, a bad range, a pattern that does not compile, a malformed stage record)
    is an error entry of its own, never an error reply for the whole poll."""
    request = data.draw(well_formed_request(box_files))
    reply = assert_probe_reply(box.probe.answer(json.dumps(request), memory))
    assert "error" not in reply, reply


@FUZZ
@given(request=JSON)
def test_probe_answers_any_json_value(box, memory, request) -> None:
    assert_probe_reply(box.probe.answer(json.dumps(request), memory))


def test_probe_request_shapes_are_named_in_the_error(box, box_files) -> None:
    """A malformed request is refused whole, naming the key; it does not fail deep in a read."""
    answer = lambda req: json.loads(box.probe.answer(json.dumps(req)))  # noqa: E731
    assert answer({"logs": [{"path": "x", "offset": "12"}]}) == {
        "error": "ValueError: request.logs[0].offset must be an integer, not str"}
    assert "request.logs[0].offset is out of range" in answer({"logs": [{"path": "x", "offset": 2 ** 64}]})["error"]
    assert "request.ranges must be a list of objects" in answer({"ranges": {"path": "x"}})["error"]
    assert "artifact_budget_s" in answer({"artifact_budget_s": 1e308, "processes": False})["error"]
    assert "needles" in answer({"logs": [{"path": "x", "markers": [{"name": "a", "needles": [1]}]}]})["error"]
    assert "request.users must be an object" in answer({"users": [10], "processes": False})["error"]
    assert "request.users.budget_s" in answer({"users": {"budget_s": 1e9}, "processes": False})["error"]
    assert "request.users.top must be an integer" in answer({"users": {"top": "3"}, "processes": False})["error"]
    for name in ("a\0b", "\ud800"):
        assert "not a file name" in answer({"artifacts": [{"path": name}], "processes": False})["error"]
    assert "error" not in answer({"artifacts": [{"path": os.fsdecode(b"\xff")}], "processes": False})
    # A marker with no pattern matches its name; an empty needle means "no prefilter", not an error.
    log = box_files.paths[0]
    reply = answer({"processes": False, "logs": [{"path": log, "offset": 0, "markers": [
        {"name": "EVAL_RC", "pattern": None}, {"name": "x", "pattern": "loss", "needles": [""]}]}]})
    assert [h["marker"] for h in reply["logs"][0]["hits"]] == ["x", "EVAL_RC"]


def test_a_malformed_stage_record_is_an_error_entry_not_an_error_reply(box, box_files) -> None:
    """Stage records are files on the box: one that is not a record costs its own entry only."""
    reply = json.loads(box.probe.answer(json.dumps({"workspace": str(box_files.root)})))
    assert "error" not in reply
    assert {Path(e["what"]).name for e in reply["errors"]} >= {"list.json", "odd.json", "broken.json"}


@pytest.fixture(scope="module")
def serving_probe():
    probe = subprocess.Popen(tool_argv("probe", "--serve"), stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    yield probe
    probe.stdin.close()
    probe.wait(timeout=30)
    probe.stdout.close()
    probe.stderr.close()


def ask(probe: subprocess.Popen, line: bytes) -> bytes:
    probe.stdin.write(line + b"\n")
    probe.stdin.flush()
    length = int(probe.stdout.readline())
    return probe.stdout.read(length)


@pytest.mark.slow
@FUZZ
@given(data=st.data())
def test_a_serving_probe_answers_every_request_and_serves_on(serving_probe, box_files, data) -> None:
    """The real `probe.py --serve`: any request line, even one that is not JSON or not UTF-8,
    gets one reply, and the probe keeps serving."""
    line = data.draw(st.one_of(
        request_strategy(box_files).map(lambda r: json.dumps(r).encode()),
        JSON.map(lambda v: json.dumps(v).encode()),
        st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")),
        st.integers(1, 3000).map(lambda d: deep(d).encode()),
    ))
    assert_probe_reply(ask(serving_probe, line))
    assert "error" not in assert_probe_reply(ask(serving_probe, sane_request(box_files).encode()))
    assert serving_probe.poll() is None


# ---------------------------------------------------------------- probe replies, as the console reads them


def assert_typed(value, hint=None) -> None:
    """Every field of a converted reply has its annotated type, all the way down."""
    if is_dataclass(value) and hint is None:
        hints = typing.get_type_hints(type(value))
        for f in fields(value):
            assert_typed(getattr(value, f.name), hints[f.name])
        return
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is typing.Any or origin is dict:
        return
    if origin in (typing.Union, types.UnionType):
        assert value is None or any(_is(value, a) for a in args if a is not type(None)), (value, hint)
        if value is not None:
            assert_typed(value, next(a for a in args if a is not type(None) and _is(value, a)))
        return
    if origin is tuple:
        assert isinstance(value, tuple), (value, hint)
        kinds = [args[0]] * len(value) if len(args) == 2 and args[1] is Ellipsis else list(args)
        assert len(kinds) == len(value)
        for v, kind in zip(value, kinds, strict=True):
            assert_typed(v, kind)
        return
    assert _is(value, hint), (value, hint)
    if is_dataclass(value):
        assert_typed(value)


def _is(value, hint) -> bool:
    base = typing.get_origin(hint) or hint
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, base)


@pytest.fixture(scope="module")
def real_reply(box, box_files) -> dict:
    """A whole probe reply from this machine: processes, a log with hits, disks, states."""
    request = {"workspace": str(box_files.root), "artifacts": [{"name": "out", "path": "out"}],
               "logs": [{"path": box_files.paths[0], "offset": 0,
                         "markers": [Marker("Traceback", "^Traceback ").request()]}],
               "reports": [{"glob": "out/*.json"}], "binaries": ["out"], "writers": True}
    reply = json.loads(box.probe.answer(json.dumps(request)))
    assert reply["processes"] and reply["logs"][0]["hits"]
    return {**reply, "processes": reply["processes"][:4]}  # a few: enough to mutate, quick to show


@st.composite
def mutated(draw, value):
    """value with one nested part replaced by any JSON value, or removed."""
    if isinstance(value, dict) and value and draw(st.integers(0, 3)):
        key = draw(st.sampled_from(sorted(value)))
        if draw(st.integers(0, 5)) == 0:
            return {k: v for k, v in value.items() if k != key}
        return {**value, key: draw(mutated(value[key]))}
    if isinstance(value, list) and value and draw(st.integers(0, 3)):
        i = draw(st.integers(0, len(value) - 1))
        return value[:i] + [draw(mutated(value[i]))] + value[i + 1:]
    return draw(JSON)


def converts_or_refuses(convert, *args) -> None:
    try:
        result = convert(*args)
    except BoxError:
        return
    assert_typed(result)


@FUZZ
@given(data=st.data())
def test_a_mutated_probe_reply_is_a_snapshot_or_a_box_error(real_reply, data) -> None:
    reply = data.draw(mutated(real_reply))
    converts_or_refuses(model.snapshot, reply, 0.01)


@FUZZ
@given(data=st.data())
def test_processes_made_again_from_the_cache_are_those_made_afresh(real_reply, data) -> None:
    """A Box's ProcessCache skips the checks of an entry handed again as the same object: it
    gives what a fresh conversion gives, at any later reply time, and an entry that changed (a
    new object) is checked again."""
    cache = model.ProcessCache()
    model.snapshot(real_reply, 0.01, cache)
    entries = list(real_reply["processes"])
    i = data.draw(st.integers(0, len(entries) - 1))
    entries[i] = data.draw(mutated(entries[i]))
    later = {**real_reply, "processes": entries, "time": real_reply["time"] + data.draw(st.floats(0, 1e6))}
    try:
        fresh = model.snapshot(later, 0.01)
    except BoxError:
        with pytest.raises(BoxError):
            model.snapshot(later, 0.01, cache)
        return
    assert model.snapshot(later, 0.01, cache).processes == fresh.processes


@pytest.mark.slow
@FUZZ
@given(reply=st.dictionaries(st.sampled_from(["time", "boot_time", "host", "disks", "processes", "logs", "states",
                                              "writers", "binaries", "errors", "listeners", "artifacts", "reports",
                                              "probe_pid", "boot_id"]), JSON))
def test_any_reply_object_is_a_snapshot_or_a_box_error(reply) -> None:
    converts_or_refuses(model.snapshot, reply, 0.01)


@FUZZ
@given(data=st.data())
def test_a_mutated_users_reply_is_disk_users_or_a_box_error(box, box_files, data) -> None:
    real = json.loads(box.probe.answer(json.dumps({"workspace": str(box_files.root), "processes": False,
                                                   "users": {"top": 3}})))
    assert model.disk_users(real).top  # the real reply converts
    converts_or_refuses(model.disk_users, data.draw(mutated(real)))


def tool_reply(keys: list[str]):
    entry = st.dictionaries(st.sampled_from(["path", "bytes", "reason", "marker", "offset", "line"]), SCALARS,
                            max_size=4)
    return st.dictionaries(st.sampled_from(keys), SCALARS | JSON | st.lists(entry, max_size=2), max_size=6)


@FUZZ
@given(raw=tool_reply(["path", "data", "offset", "next_offset", "line_end", "tail", "size", "inode", "more", "hits",
                       "error", "missing", "rotated", "truncated"]))
def test_any_log_entry_is_a_log_chunk_or_a_box_error(raw) -> None:
    converts_or_refuses(model.log_chunk, raw)


@FUZZ
@given(raw=tool_reply(["ok", "state", "reason", "pid", "start_time", "rc", "log", "log_tail"]),
       clean=tool_reply(["removed", "refused", "missing"]),
       signal=tool_reply(["ok", "result", "reason", "signalled", "survivors"]))
def test_any_tool_reply_is_its_result_or_a_box_error(raw, clean, signal) -> None:
    converts_or_refuses(model.fire_result, raw, "train")
    converts_or_refuses(model.clean_result, clean)
    converts_or_refuses(model.signal_result, signal)


@FUZZ
@given(raw=st.dictionaries(st.sampled_from(["ranges", "logs"]), JSON | st.lists(
    tool_reply(["path", "start", "size", "data", "error"]), max_size=2)))
def test_the_one_range_or_log_asked_for_is_that_or_a_box_error(raw) -> None:
    """Box.read_range, file_size and read_log take the reply's one entry: any other shape is a BoxError."""
    for key, convert in (("ranges", model.byte_range), ("logs", model.log_chunk)):
        try:
            entry = model.only_entry(raw, key)
        except BoxError:
            continue
        converts_or_refuses(convert, entry)


@FUZZ
@given(first=st.sampled_from([None, "s.1"]), data=st.data())
def test_held_processes_fold_any_reply_or_raise_a_box_error(real_reply, first, data) -> None:
    held = HeldProcesses()
    held.mark = first
    held.by_pid = {p["pid"]: p for p in real_reply["processes"]}
    reply = data.draw(mutated({**real_reply, "processes_mark": "s.2", "processes_since": first,
                               "processes_gone": [1, 2]}))
    assume(isinstance(reply, dict))  # _reply makes sure of that
    try:
        folded = held.fold(reply)
    except BoxError:
        return
    assert isinstance(folded, dict)
    converts_or_refuses(model.snapshot, folded, 0.01)


@FUZZ
@given(raw=st.binary(max_size=60) | JSON.map(lambda v: json.dumps(v).encode())
       | st.integers(1, 100_000).map(lambda d: deep(d).encode()))
def test_any_reply_bytes_are_a_reply_object_or_a_box_error(raw) -> None:
    try:
        reply = _reply("probe.py", raw)
    except BoxError:
        return
    assert isinstance(reply, dict) and "error" not in reply


@pytest.mark.slow
@FUZZ
@given(at=JSON | st.lists(st.integers(-2, 200), max_size=3), keep=st.integers(0, 200))
def test_any_data_at_is_the_attached_bytes_or_a_box_error(box, box_files, at, keep) -> None:
    """Where an entry's bytes sit after the JSON is the box's word: anything it says is read as
    exactly those bytes, or refused."""
    request = {"processes": False, "attach": True, "logs": [{"path": box_files.paths[0], "offset": 0}]}
    line, _, attached = box.probe.answer(json.dumps(request)).partition(b"\n")
    reply = json.loads(line)
    reply["logs"][0]["data_at"] = at
    try:
        chunk = model.log_chunk(_reply("probe.py", json.dumps(reply).encode() + b"\n" + attached[:keep])["logs"][0])
    except BoxError:
        return
    assert chunk.data == attached[:keep][at[0]:at[0] + at[1]] and len(chunk.data) == at[1]


def test_a_reply_nested_too_deep_is_a_box_error() -> None:
    with pytest.raises(BoxError, match="not JSON"):
        _reply("probe.py", deep(100_000).encode())


def test_a_process_entry_of_the_wrong_type_is_a_box_error(real_reply) -> None:
    """A pid that is a string would sort, match and signal wrongly later: refused here, by name."""
    entry = {**real_reply["processes"][0], "pid": "1"}
    with pytest.raises(BoxError, match=r"Process\.pid is str"):
        model.snapshot({**real_reply, "processes": [entry]}, 0.01)
    with pytest.raises(BoxError, match="malformed reply"):
        model.snapshot({**real_reply, "writers": {"a": 5}}, 0.01)


# ---------------------------------------------------------------- log decoding and line splitting

LOG_BYTES = st.binary(max_size=300) | st.lists(st.sampled_from(
    [b"\n", b"\r", b"\r\n", b"a", b"loss 1.0", "é".encode(), "€".encode(), "😀".encode(), b"\xff", b"\xe2\x82",
     b"\xc3", b"\x1b[31m", b"\x00", b" " * 40]), max_size=60).map(b"".join)


def cuts(data: bytes):
    return st.lists(st.integers(0, len(data)), max_size=8).map(lambda points: sorted(set(points)))


def decode_in_chunks(data: bytes, points: list[int], max_line: int) -> list[str]:
    decoder = LineDecoder(max_line)
    lines, start = [], 0
    for point in [*points, len(data)]:
        lines += decoder.feed(data[start:point])
        start = point
    last = decoder.flush()
    return lines + ([] if last is None else [last])


@FUZZ
@given(data=st.data(), whole=LOG_BYTES, max_line=st.integers(1, 80) | st.just(64 * 1024))
def test_lines_are_the_same_whole_or_in_chunks(data, whole, max_line) -> None:
    """Split characters, CR, CRLF, invalid bytes and capped lines: any chunking, the same lines."""
    points = data.draw(cuts(whole))
    assert decode_in_chunks(whole, points, max_line) == decode_in_chunks(whole, [], max_line)


@FUZZ
@given(whole=LOG_BYTES)
def test_lines_are_those_of_a_plain_decode(whole) -> None:
    """Under the cap, each line is its bytes up to b"\\n", less one trailing CR, decoded with U+FFFD."""
    *complete, rest = whole.split(b"\n")
    plain = [(line[:-1] if line.endswith(b"\r") else line).decode("utf-8", "replace") for line in complete]
    if rest:
        plain.append((rest[:-1] if rest.endswith(b"\r") else rest).decode("utf-8", "replace"))
    assert decode_in_chunks(whole, [], 64 * 1024) == plain


@FUZZ
@given(line=st.binary(min_size=1, max_size=200), max_line=st.integers(1, 40))
def test_a_capped_line_keeps_its_head_and_says_how_much_was_cut(line, max_line) -> None:
    line = line.replace(b"\n", b"")
    assume(len(line) > max_line)
    [text] = LineDecoder(max_line).feed(line + b"\n")
    head, _, said = text.rpartition(" … [line cut: ")
    assert said == f"{len(line) - max_line:,} more bytes]"
    assert "\ufffd" not in head or "\ufffd" in line[:max_line].decode("utf-8", "replace")


def test_a_10_mb_line_in_chunks_keeps_only_the_cap() -> None:
    """The probe reads at most a few hundred KB at a time: a 10 MB line costs the cap, not 10 MB."""
    decoder = LineDecoder()
    block = ("€" * 21_845 + "x").encode()  # 64 KB, with characters split at every block edge
    tracemalloc.start()
    try:
        for _ in range(160):
            assert decoder.feed(block) == []
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert decoder.pending_bytes == 160 * len(block)
    assert peak < 2 * 1024 * 1024
    [line] = decoder.feed(b"\n")
    assert len(line.encode()) < 64 * 1024 + 100
    assert line.endswith(f"[line cut: {160 * len(block) - 64 * 1024:,} more bytes]")
    assert "\ufffd" not in line


# ---------------------------------------------------------------- marker scanning

ATOMS = ["a", "b", "x", " ", ":", "é", "[ab]", "[^a]", ".", "\\d", "\\w", "\\s", "\\b", "a*", "b+?", "x?", "(a|b)",
         "(?:ab|x)", "(a)\\1", "$", "\\Z", "\\A", "(?!a)", "(?<!b)", "(?=x)", "(?i)", "(?i:ab)", "^", "[", ")", "\\",
         "{99999999999}", "(" * 1200 + ")" * 1200]
PATTERNS = (st.lists(st.sampled_from(ATOMS), min_size=1, max_size=5).map("".join)
            | st.lists(st.sampled_from(ATOMS), min_size=1, max_size=4).map(lambda a: "^" + "".join(a))
            | st.text(max_size=6))
LOG_TEXT = st.lists(st.sampled_from(["a", "b", "x", " ", ":", "é", "A", "1", "ab", "\n", "\n", "\r"]),
                    max_size=80).map(lambda parts: "".join(parts).encode())


def reference_hits(data: bytes, markers: list[tuple[str, str]]) -> list[tuple[str, int]]:
    """re.search of each pattern over each complete line, on its own."""
    hits, start = [], 0
    for line in data.split(b"\n")[:-1]:
        hits += [(name, start) for name, pattern in markers if re.search(pattern.encode(), line)]
        start += len(line) + 1
    return hits


def compiles(pattern: str) -> bool:
    try:
        re.compile(pattern.encode())
    except (re.error, OverflowError, RecursionError):  # the last two: a repeat count or nesting beyond re's
        return False
    return True


def scan(box, data: bytes, markers: list[tuple[str, str]], needles: bool) -> list[tuple[str, int]]:
    specs = [Marker(name, pattern).request() if needles else {"name": name, "pattern": pattern}
             for name, pattern in markers]
    return [(h["marker"], h["offset"]) for h in box.markers.marker_hits(data, 0, box.markers.Markers(specs))]


@pytest.mark.filterwarnings("ignore::FutureWarning")  # "possible nested set": "[" and "[^a]" meet
@FUZZ
@given(data=LOG_TEXT, patterns=st.lists(PATTERNS, min_size=1, max_size=3), needles=st.booleans())
def test_marker_hits_are_those_of_re_search_on_each_line(box, data, patterns, needles) -> None:
    """Anchors, lookarounds, backreferences, (?i), needles or none: a hit wherever re finds one on
    the line alone, and nowhere else; a pattern that does not compile is re.error, nothing else."""
    markers = [(f"m{i}", p) for i, p in enumerate(patterns)]
    needle_sets = [required_needles(p) for p in patterns]  # the console's side: a set or None, never a crash
    assert all(n is None or (n and all(isinstance(s, str) and s for s in n)) for n in needle_sets)
    if not all(compiles(p) for p in patterns):
        with pytest.raises(re.error):
            scan(box, data, markers, needles)
        return
    assert scan(box, data, markers, needles) == reference_hits(data, markers)


def test_marker_hits_that_a_chunk_wide_search_used_to_miss(box) -> None:
    data = b"a\nab\nxb\nbx\nx\n"
    for pattern in ("a[^z]*b", "b$", "^a|b", "x(?!\\n)", "(?<!\\n)x", "b\\Z"):
        markers = [("m", pattern)]
        assert scan(box, data, markers, needles=False) == reference_hits(data, markers), pattern
    two = [("one", "(a)\\1"), ("two", "(b)\\1")]
    assert scan(box, b"aa\nbb\n", two, needles=False) == [("one", 0), ("two", 3)]


@pytest.mark.filterwarnings("ignore::FutureWarning")  # "possible nested set": "[" and "[^a]" meet
def test_a_pattern_beyond_re_limits_is_a_log_error_not_a_crash(box, box_files) -> None:
    """A repeat count over re's limit (OverflowError) or nesting past the recursion limit: no needles
    on the console, an error for that log alone on the box."""
    for pattern in ("a{99999999999}", "(" * 1200 + "a" + ")" * 1200):
        assert required_needles(pattern) is None
        request = {"processes": False, "logs": [{"path": box_files.paths[0], "offset": 0,
                                                 "markers": [Marker("m", pattern).request()]}]}
        reply = json.loads(box.probe.answer(json.dumps(request)))
        assert "error" not in reply and reply["logs"][0]["error"]


@pytest.mark.slow
@FUZZ
@given(data=st.data(), whole=LOG_TEXT, patterns=st.lists(PATTERNS.filter(compiles), min_size=1, max_size=2),
       max_bytes=st.integers(1, 40))
def test_marker_hits_are_the_same_read_whole_or_in_chunks(box, tmp_path_factory, data, whole, patterns,
                                                          max_bytes) -> None:
    """Through the probe's real reads of a real file, and the console's cursor: whole or a few
    bytes at a time (lines cut anywhere, the unfinished line scanned again), the same hits."""
    log = tmp_path_factory.mktemp("scan") / "chunked.log"
    log.write_bytes(whole)
    markers = tuple(Marker(f"m{i}", p) for i, p in enumerate(patterns))

    def hits_reading(step: int) -> list[tuple[str, int]]:
        follower = LogFollower(str(log), markers, last_lines=None, offset=0, max_bytes=step)
        hits = []
        for _ in range(len(whole) + 2):
            [raw] = box.logfiles.logs([follower.cursor().request()])
            chunk = model.log_chunk(raw)
            assert chunk.error is None
            hits += [(h.marker, h.offset) for h in follower.consume(chunk).hits]
            if not chunk.more:
                return hits
        raise AssertionError("the reads never reached the end")

    assert hits_reading(max_bytes) == hits_reading(1 << 20) == reference_hits(whole, list(
        (m.name, m.pattern) for m in markers))


# ---------------------------------------------------------------- GGUF headers

PROBLEM_CODES = {"lfs_pointer", "bad_magic", "bad_version", "bad_kv_type", "absurd_count", "header_truncated",
                 "misaligned", "overlap", "truncated", "oversize", "tensor_count_mismatch", "last_tensor_mismatch",
                 "bad_tensor_type", "bad_shape", "bad_alignment", "duplicate_name", "unexpected_offset",
                 "bad_string_length"}


@pytest.fixture(scope="module")
def real_gguf(tmp_path_factory) -> bytes:
    """A small GGUF written by gguf-py (llama.cpp's own writer): every KV type, arrays, tensors."""
    import numpy as np
    from gguf import GGUFWriter

    path = tmp_path_factory.mktemp("gguf") / "small.gguf"
    w = GGUFWriter(str(path), "llama")
    w.add_name("fuzz")
    w.add_uint32("llama.context_length", 64)
    w.add_int64("test.i64", -(2 ** 40))
    w.add_float32("test.f32", 0.5)
    w.add_bool("test.bool", True)
    w.add_string("tokenizer.chat_template", "{{ m }}" * 40)
    w.add_array("tokenizer.ggml.tokens", [f"t{i}" for i in range(8)])
    w.add_array("tokenizer.ggml.scores", [0.25] * 8)
    w.add_array("test.nested", [["a", "bb"], ["c"]])
    w.add_tensor("token_embd.weight", np.ones((8, 4), dtype=np.float32))
    w.add_tensor("output.weight", np.zeros((4, 8), dtype=np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    data = path.read_bytes()
    assert box_gguf().check(reader_of(data), len(data))["ok"]
    return data


def box_gguf():
    from samai.remote.box import gguf_check
    return gguf_check


def reader_of(data: bytes, step: int | None = None):
    """read_at over data; with step, range reads that come back at most step bytes long."""
    def read_at(offset: int, length: int) -> bytes:
        return data[offset:offset + min(length, step or length)]
    return read_at


def assert_findings(result: dict) -> None:
    assert isinstance(result["ok"], bool)
    assert {p["code"] for p in result["problems"]} <= PROBLEM_CODES
    assert result["ok"] == (not result["problems"])
    json.dumps(result, allow_nan=False)  # JSON-ready, as the CLI's --json prints it


@st.composite
def mutations(draw, data: bytes) -> bytes:
    """data with a few bytes flipped, inserted, removed or overwritten by a u64/u32, or cut short."""
    out = bytearray(data)
    header = min(len(out), 1200)  # where the KVs and tensor infos are
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, max(0, min(len(out), header) - 1)))
        kind = draw(st.sampled_from(["flip", "insert", "delete", "u64", "u32", "cut"]))
        if kind == "flip" and out:
            out[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "insert":
            out[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "delete":
            del out[at:at + draw(st.integers(1, 8))]
        elif kind in ("u64", "u32"):
            value = draw(st.sampled_from([0, 1, 2 ** 32 - 1, 2 ** 58, 2 ** 63, 2 ** 64 - 1])
                         | st.integers(0, 2 ** 64 - 1))
            packed = value.to_bytes(8, "little") if kind == "u64" else (value % 2 ** 32).to_bytes(4, "little")
            out[at:at + len(packed)] = packed
        else:
            del out[at:]
    return bytes(out)


@FUZZ
@given(data=st.binary(max_size=200) | st.binary(max_size=120).map(lambda b: b"GGUF\x03\x00\x00\x00" + b))
def test_random_bytes_give_findings(data) -> None:
    assert_findings(box_gguf().check(reader_of(data), len(data)))


@settings(FUZZ, max_examples=200)
@given(data=st.data())
def test_a_mutated_gguf_gives_findings_the_same_in_short_reads_and_bounded_memory(real_gguf, data) -> None:
    mutated = data.draw(mutations(real_gguf))
    tracemalloc.start()
    try:
        whole = box_gguf().check(reader_of(mutated), len(mutated))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert_findings(whole)
    assert peak < 8 * 1024 * 1024
    step = data.draw(st.integers(1, 64))
    assert box_gguf().check(reader_of(mutated, step), len(mutated)) == whole


def test_a_string_length_of_2_to_the_58_is_a_finding_not_an_allocation(real_gguf) -> None:
    at = real_gguf.index(b"tokenizer.chat_template") + len(b"tokenizer.chat_template") + 4  # past the value type
    patched = real_gguf[:at] + (2 ** 58).to_bytes(8, "little") + real_gguf[at + 8:]
    tracemalloc.start()
    try:
        result = box_gguf().check(reader_of(patched), len(patched))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [p["code"] for p in result["problems"]] == ["absurd_count"] and peak < 1024 * 1024


def test_a_file_that_claims_more_than_it_holds_gives_findings(real_gguf) -> None:
    """read_at returns less than file_size promised (the file shrank between stat and read)."""
    for cut in (10, 30, 200, len(real_gguf) - 1):
        assert_findings(box_gguf().check(reader_of(real_gguf[:cut]), len(real_gguf)))
