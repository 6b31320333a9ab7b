"""The wire between the console and the box tools (remote/box/wire.py): both ends agree on it.

mypy (`make lint`) checks what it can see: each request the Box builds against its tool's request
type, each key a tool reads by subscript, each key a reply parser reads. These tests hold the rest:

- every request the Box builds, and every reply its tool writes, is of the declared type, key by
  key and value by value, and the tool takes the request: each tool runs in this process, as
  procfs.serve runs it on the box, on a Box method's own request (InProcessBox);
- every literal key a tool reads from its typed request (through `.get()` and `in` too, which a
  type checker lets through: PEP 589) is one its request type declares;
- every field a reply parser picks by name (model._pick) is a key of its tool's reply type;
- the log and marker entries follow.py and marker.py build are LogSpec's and MarkerSpec's keys.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import io
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGUFWriter

from samai.console.core.multinode import Program
from samai.console.core.preflight.nodes import read_node
from samai.remote import boxapi, model
from samai.remote.box import checkpoints, clean, gguf_surgery, kill, launch, probe, procfs, runhash, watchers, wire
from samai.remote.boxapi import Box, BoxError
from samai.remote.boxtools import module_of, tool_names
from samai.remote.follow import LogCursor
from samai.remote.local import LocalTransport
from samai.remote.marker import Marker
from samai.remote.transport import RunResult

BOX = Path(wire.__file__).parent

# Each tool the console runs: its module's handler (what `serve` runs on the box) and its types.
HANDLERS: dict[str, Callable[[Any], Any]] = {
    "launch": launch.launch, "kill": kill.kill, "clean": clean.clean, "checkpoints": checkpoints.checkpoints,
    "watchers": watchers.handle, "gguf_surgery": gguf_surgery.handle, "runhash": runhash.runhash,
}
DECLARED: dict[str, tuple[Any, Any]] = {
    "probe": (wire.ProbeRequest, wire.ProbeReply),
    "launch": (wire.LaunchRequest, wire.LaunchReply),
    "kill": (wire.KillRequest, wire.KillReply),
    "clean": (wire.CleanRequest, wire.CleanReply),
    "checkpoints": (wire.CheckpointsRequest, wire.CheckpointsReply),
    "watchers": (wire.WatchersRequest, wire.WatchersReply),
    "gguf_surgery": (wire.GgufRequest, None),  # show: the header; a write: GgufWriteReply (reply_type)
    "runhash": (wire.RunhashRequest, wire.RunhashReply),
}


def reply_type(module: str, request: Mapping[str, Any]) -> Any:
    if module == "gguf_surgery":
        return None if request.get("op") == "show" else wire.GgufWriteReply
    return DECLARED[module][1]


# ------------------------------------------------------------ a value against its declared type


def problems(value: Any, hint: Any, where: str = "") -> list[str]:
    """What in value (as JSON gives it) is not of the type hint: keys a TypedDict does not
    declare or requires and lacks, and values of another type. [] when it fits."""
    if hint is Any:
        return []
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if typing.is_typeddict(hint):
        if type(value) is not dict:
            return [f"{where or hint.__name__}: {type(value).__name__}, not an object"]
        hints = typing.get_type_hints(hint)
        found = [f"{where}.{k}: not a key of {hint.__name__}" for k in value if k not in hints]
        found += [f"{where}.{k}: required by {hint.__name__}, missing" for k in hint.__required_keys__
                  if k not in value]
        for key, item in value.items():
            if key in hints:
                found += problems(item, hints[key], f"{where}.{key}")
        return found
    if origin is typing.Union:
        return [] if any(not problems(value, a, where) for a in args) else [f"{where}: {value!r:.60} is not {hint}"]
    if origin is typing.Literal:
        return [] if value in args else [f"{where}: {value!r:.60} is none of {args}"]
    if origin is list:
        if type(value) is not list:
            return [f"{where}: {type(value).__name__}, not a list"]
        return [p for i, item in enumerate(value) for p in problems(item, args[0], f"{where}[{i}]")]
    if origin is dict:
        if type(value) is not dict:
            return [f"{where}: {type(value).__name__}, not an object"]
        return [p for k, item in value.items() for p in problems(item, args[1], f"{where}[{k!r}]")]
    if hint is float:
        return [] if type(value) in (int, float) else [f"{where}: {value!r:.60} is not a number"]
    if hint is type(None):
        return [] if value is None else [f"{where}: {value!r:.60} is not null"]
    return [] if type(value) is hint else [f"{where}: {value!r:.60} is not {hint.__name__}"]


def test_the_check_of_a_declared_type_finds_a_renamed_key_and_a_wrong_value() -> None:
    assert problems({"pid": 5, "start_time": 1.5, "group": False, "protect": [1]}, wire.KillRequest) == []
    assert problems({"pid": 5, "grase": 1.0}, wire.KillRequest) == [".grase: not a key of KillRequest"]
    assert problems({"pid": "5", "protect": [True]}, wire.KillRequest) == [".pid: '5' is not int",
                                                                          ".protect[0]: True is not int"]
    assert problems({"workspace": "w"}, wire.CleanRequest) == [".paths: required by CleanRequest, missing"]
    assert problems({"processes": "all"}, wire.ProbeRequest) == [".processes: 'all' is not typing.Union[bool, "
                                                                 "typing.Literal['stages']]"]


# ------------------------------------------------------------ the box's own code, in this process


class InProcessBox:
    """A Transport that runs each box tool's own code in this process, as procfs.serve and the
    --serve probe run it on the box, and keeps every (tool, request, reply). A request a tool
    cannot read is its exit 2, as on the box: the Box raises it."""

    name = "in-process"
    generation = 0

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any, Any]] = []

    async def run(self, argv: Sequence[str], *, stdin: bytes = b"", timeout: float,
                  retry_safe: bool = False) -> RunResult:
        if list(argv[:2]) == ["test", "-f"]:
            return RunResult(0, b"", b"")  # the tools are installed
        module = argv[3]
        out, err, given = io.StringIO(), io.StringIO(), sys.stdin
        sys.stdin = io.StringIO(stdin.decode())
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                rc = procfs.serve(module, HANDLERS[module])
        finally:
            sys.stdin = given
        self.calls.append((module, json.loads(stdin), json.loads(out.getvalue()) if rc == 0 else None))
        return RunResult(rc, out.getvalue().encode(), err.getvalue().encode())

    async def open_stream(self, argv: Sequence[str], *, preamble: bytes = b"") -> InProcessProbe:
        assert "--serve" in argv
        return InProcessProbe(self)

    async def close(self) -> None:
        return None

    def of(self, module: str) -> list[tuple[Any, Any]]:
        return [(request, reply) for m, request, reply in self.calls if m == module]


class InProcessProbe:
    """A --serve probe: each request line answered by probe.answer with one Memory, as on the box."""

    persistent = True

    def __init__(self, box: InProcessBox) -> None:
        self.box = box
        self.memory = probe.Memory()

    async def request(self, line: bytes, *, timeout: float) -> bytes:
        whole = self.memory.held.expand(json.loads(line))  # what answer() reads it as: kept for the test
        answer = probe.answer(json.dumps(whole), self.memory)
        self.box.calls.append(("probe", whole, json.loads(answer.partition(b"\n")[0])))
        self.memory.serving.after_reply()
        return answer

    async def close(self) -> None:
        self.memory.gpus.close()
        for key in list(self.memory.logs.fds):
            self.memory.logs.close(key)


def assert_agreed(box: InProcessBox) -> None:
    """Every request the Box sent is of its tool's request type and was taken (no bad request,
    no error reply), and every reply is of its tool's reply type."""
    assert box.calls
    for module, request, reply in box.calls:
        assert problems(request, DECLARED[module][0], f"{module} request") == []
        assert reply is not None, f"{module} could not read {request}"
        assert "error" not in reply, f"{module}: {reply['error']}"
        declared = reply_type(module, request)
        if declared is not None:
            assert problems(reply, declared, f"{module} reply") == []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
async def wired(workspace: Path):
    transport = InProcessBox()
    box = Box(transport, str(workspace), python=sys.executable)
    yield transport, box
    await box.close()


async def test_the_probe_takes_every_request_the_box_builds(wired: tuple[InProcessBox, Box], workspace: Path) -> None:
    transport, box = wired
    log = workspace / "logs" / "train.log"
    log.parent.mkdir()
    log.write_text("step 1 loss=2.0\nstep 2 loss=1.5\n")
    (workspace / "reports").mkdir()
    (workspace / "reports" / "eval.json").write_text('{"score": 1}')
    (workspace / "out").mkdir()
    (workspace / "out" / "weights.bin").write_bytes(b"x" * 100)
    cursor = LogCursor(str(log), last_lines=10, markers=(Marker("loss", r"loss=(\S+)"),))
    port = free_port()  # nothing listens: answered at once
    for _ in range(2):  # the second is sent as changes to the first (request_cache), its processes as changes too
        snap = await box.snapshot(artifacts=[("weights", "out")], logs=[cursor], reports=["reports/*.json"],
                                  processes="stages", writers=True, binaries=["sh"], serving=[port], canary=[port])
        assert snap.logs[0].hits and snap.reports and snap.artifacts[0].exists
    await box.snapshot()
    assert (await box.disk_users(top=3)).top
    assert "logs/" in (await box.list_dir(".", prefix="l")).names
    assert (await box.python_packages([sys.executable], ["pytest"]))[0].get("pytest") is not None
    assert (await box.tail(str(log), last_lines=1)).data == b"step 2 loss=1.5\n"
    assert await box.file_size(str(log)) == log.stat().st_size
    assert await box.read_range(str(log), 0, 3) == b"step"
    assert len(transport.of("probe")) == 9
    assert_agreed(transport)


@pytest.mark.slow  # a stage fired and stopped, a process killed: real processes waited on
async def test_the_tools_take_every_request_the_box_builds(wired: tuple[InProcessBox, Box], workspace: Path,
                                                           spawn: Any) -> None:
    transport, box = wired
    fired = await box.fire("wire", "sleep 30", "logs/wire.log", env={"WIRE": "1"}, verify_s=0.3)
    assert fired.ok and fired.state == "running", fired
    record = (await box.snapshot()).state("wire")
    assert record is not None and record.alive
    stopped = await box.stop("wire", grace=2.0, by="tester@console: stop")
    assert stopped.ok and stopped.result in ("exited", "killed"), stopped

    sleeper = spawn("sleep", "30")
    snap = await box.snapshot()
    proc = next(p for p in snap.processes if p.pid == sleeper.pid)
    killed = await box.kill(sleeper.pid, proc.start_time, boot=snap.boot, grace=1.0, protect=[1], group=False)
    assert killed.ok and killed.signalled == (sleeper.pid,), killed

    (workspace / "junk").mkdir()
    (workspace / "junk" / "a").write_bytes(b"12345")
    removed = await box.remove(["junk", "nothing", "../outside"])
    assert removed.freed == 5 and removed.missing == ("nothing",) and removed.refused

    step = workspace / "run" / "checkpoint-10"
    step.mkdir(parents=True)
    (step / "trainer_state.json").write_text('{"global_step": 10}')
    listed = await box.checkpoints("run", weights=False)
    assert [c.step for c in listed.checkpoints] == [10] and not listed.checkpoints[0].complete

    assert (await box.watchers()).watchers == ()
    beat = await box.watch_beat("w1", {"who": "tester@console", "interval": 10.0}, 60.0, {"sent": {}})
    assert beat.leading and beat.leader == "w1"
    acked = await box.acknowledge(["disk_low"], "tester@console", {"disk_low": "the disk is low"})
    assert "disk_low" in acked.acks
    assert not (await box.watch_beat("w1", {"who": "tester@console"}, 60.0, None, release=True)).leading
    assert_agreed(transport)
    assert {m for m, _, _ in transport.calls} >= {"launch", "kill", "clean", "checkpoints", "watchers", "probe"}


def tiny_gguf(path: Path) -> Path:
    w = GGUFWriter(str(path), "llama")
    w.add_name("wire-test")
    for i in range(2):
        w.add_tensor(f"blk.{i}.weight", np.full((4, 32), i, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


async def test_gguf_surgery_takes_every_request_the_box_builds(wired: tuple[InProcessBox, Box],
                                                               workspace: Path) -> None:
    transport, box = wired
    tiny_gguf(workspace / "m.gguf")
    header = await box.gguf_show("m.gguf")
    assert [t.name for t in header.tensors] == ["blk.0.weight", "blk.1.weight"]
    request = {"op": "extract", "path": "m.gguf", "tensors": ["blk.1.weight"], "out": "one.gguf"}
    planned = await box.gguf_plan(request)
    assert planned.ok and planned.planned and planned.pin is not None, planned
    written = await box.gguf_write({**request, "pin": planned.pin}, timeout=30.0)
    assert written.ok and (workspace / "one.gguf").exists(), written
    assert_agreed(transport)
    with pytest.raises(BoxError) as refused:
        await box.gguf_show("missing.gguf")
    assert "bad request" not in str(refused.value)  # the tool read the request: the file is what is missing


async def test_runhash_takes_the_request_the_console_builds(wired: tuple[InProcessBox, Box], workspace: Path) -> None:
    transport, box = wired
    (workspace / "train.py").write_text("print('hi')\n")
    reading = await read_node("n0", box, Program(sys.executable, "", "train.py", "train.py"))
    assert reading.sha256 and reading.program.endswith("train.py") and not reading.program_error, reading
    assert_agreed(transport)


# ------------------------------------------------------------ what the type checker cannot see


def declared_keys(kind: Any) -> set[str]:
    return set(typing.get_type_hints(kind))


WIRE_TYPES = {name: kind for name, kind in vars(wire).items() if typing.is_typeddict(kind)}


def typed_params(function: ast.FunctionDef) -> dict[str, Any]:
    """The function's parameters annotated with a wire type: name -> the type."""
    out = {}
    for arg in function.args.args + function.args.kwonlyargs:
        note = arg.annotation
        name = note.id if isinstance(note, ast.Name) else note.value if isinstance(note, ast.Constant) else None
        if name in WIRE_TYPES:
            out[arg.arg] = WIRE_TYPES[name]
    return out


def keys_read(function: ast.FunctionDef, param: str) -> list[tuple[int, str]]:
    """(line, key) for each literal key read from param: param["k"], param.get("k"), "k" in
    param, and a helper's read, helper(param, "k") (gguf_surgery's text(req, "path"))."""
    def named(node: ast.AST) -> bool:
        return isinstance(node, ast.Name) and node.id == param

    def text(node: ast.AST) -> str | None:
        return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None

    found = []
    for node in ast.walk(function):
        key = None
        if isinstance(node, ast.Subscript) and named(node.value):
            key = text(node.slice)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and named(node.func.value):
            key = text(node.args[0]) if node.func.attr in ("get", "pop", "setdefault") and node.args else None
        elif isinstance(node, ast.Call) and len(node.args) >= 2 and named(node.args[0]):
            key = text(node.args[1])
        elif isinstance(node, ast.Compare) and len(node.comparators) == 1 and named(node.comparators[0]):
            key = text(node.left) if isinstance(node.ops[0], (ast.In, ast.NotIn)) else None
        if key is not None:
            found.append((node.lineno, key))
    return found


def box_functions() -> list[tuple[str, ast.FunctionDef]]:
    return [(path.name, node) for path in sorted(BOX.glob("*.py"))
            for node in ast.walk(ast.parse(path.read_text(), str(path))) if isinstance(node, ast.FunctionDef)]


def test_every_key_a_tool_reads_from_its_request_is_declared() -> None:
    undeclared, read = [], set()
    for file, function in box_functions():
        for param, kind in typed_params(function).items():
            for line, key in keys_read(function, param):
                read.add(kind)
                if key not in declared_keys(kind):
                    undeclared.append(f"{file}:{line} {function.name}: {param}[{key!r}] is no key of {kind.__name__}")
    assert undeclared == []
    assert read >= {request for request, _ in DECLARED.values()}  # each tool's request is typed where it is read


def test_the_check_of_a_tools_reads_finds_a_key_renamed_on_the_box() -> None:
    source = ('def kill(req: KillRequest) -> None:\n'
              '    req.get("grase")\n    "stge" in req\n    req["pid"]\n    text(req, "workspce")\n')
    function = ast.parse(source).body[0]
    assert isinstance(function, ast.FunctionDef)
    keys = [key for _, key in keys_read(function, "req")]
    assert sorted(keys) == ["grase", "pid", "stge", "workspce"]
    assert [k for k in keys if k not in declared_keys(wire.KillRequest)] == ["grase", "stge", "workspce"]


def test_each_tool_serves_the_handler_that_takes_its_typed_request() -> None:
    """HANDLERS is what each tool's `__main__` serves, and that handler's request is its wire type."""
    for module, handler in HANDLERS.items():
        tree = ast.parse((BOX / f"{module}.py").read_text())
        served = [node.args[1].id for node in ast.walk(tree) if isinstance(node, ast.Call)
                  and isinstance(node.func, ast.Name) and node.func.id == "serve" and len(node.args) >= 2
                  and isinstance(node.args[1], ast.Name)]
        assert served == [handler.__name__], module
        first = next(iter(typing.get_type_hints(handler).values()))
        assert first is DECLARED[module][0] or module == "gguf_surgery", module  # its handle takes any JSON
    typed = {(file, f.name): typed_params(f) for file, f in box_functions()}
    assert typed["probe.py", "probe"] == {"req": wire.ProbeRequest}
    assert typed["gguf_surgery.py", "show"] == typed["gguf_surgery.py", "write"] == {"req": wire.GgufRequest}


def test_each_tool_is_named_by_its_constant() -> None:
    names = {value for key, value in vars(wire.Tool).items() if key.isupper()}
    assert names <= set(tool_names())
    assert {module_of(n) for n in names} >= set(HANDLERS) | {"probe", "install"}
    source = Path(boxapi.__file__).read_text()
    assert re.findall(r"""["'][A-Za-z_/]+\.py\b""", source) == []  # no tool by a bare file name


# Each reply parser that picks a dataclass's fields by name from its tool's reply: (dataclass,
# reply type, the fields it does not take from the reply by that name).
PICKED = [
    (model.Disk, wire.DiskEntry, set()),
    (model.ArtifactSize, wire.ArtifactEntry, set()),
    (model.DiskUser, wire.DiskUserEntry, set()),
    (model.DiskUsers, wire.UsersReply, set()),
    (model.Memory, wire.MemoryReading, set()),
    (model.FireResult, wire.LaunchReply, {"stage"}),
    (model.SignalResult, wire.KillReply, set()),
    (model.Checkpoints, wire.CheckpointsReply, set()),
    (model.Checkpoint, wire.CheckpointEntry, set()),
    (model.StageRecord, wire.StageState, set()),
    (model.GgufWriteResult, wire.GgufWriteReply, {"error"}),  # error: the reply's "failure"
    (model.GgufAssertion, wire.Assertion, set()),
]


@pytest.mark.parametrize(("kind", "reply", "elsewhere"), PICKED, ids=[k.__name__ for k, _, _ in PICKED])
def test_each_field_a_parser_picks_is_a_key_of_its_reply(kind: Any, reply: Any, elsewhere: set[str]) -> None:
    fields = {f.name for f in dataclasses.fields(kind)} - elsewhere
    assert fields - declared_keys(reply) == set()


def test_a_binary_check_reads_the_keys_the_probe_writes() -> None:
    assert set(model.BinaryCheck._fields) == declared_keys(wire.BinaryEntry)


def test_a_log_cursor_and_a_marker_send_the_keys_the_probe_declares() -> None:
    cursor = LogCursor("logs/train.log", markers=(Marker("loss", r"loss=(\S+)"),), older=(5,))
    entry = cursor.request()
    assert set(entry) == declared_keys(wire.LogSpec)
    assert set(entry["markers"][0]) == declared_keys(wire.MarkerSpec)
    assert problems(entry, wire.LogSpec) == []


# ------------------------------------------------------------ on the oldest Python a box may have


def python_3_8() -> str | None:
    """A Python 3.8 to run the tools with: SAMAI_PYTHON38, else python3.8 on the PATH, if it runs as 3.8."""
    found = os.environ.get("SAMAI_PYTHON38") or shutil.which("python3.8")
    if not found:
        return None
    try:
        said = subprocess.run([found, "-S", "-c", "import sys; print(sys.version_info[:2])"], capture_output=True,
                              text=True, timeout=30)
    except OSError:
        return None
    return found if said.stdout.strip() == "(3, 8)" else None


@pytest.mark.slow
@pytest.mark.skipif(python_3_8() is None, reason="no Python 3.8 here (SAMAI_PYTHON38 names one)")
async def test_the_tools_and_their_wire_types_run_on_python_3_8(workspace: Path) -> None:
    """The tests above run the tools on this Python; the box may have 3.8: wire.py's TypedDicts
    and every tool that imports them are built there too, through the Box as it runs them."""
    box = Box(LocalTransport(), str(workspace), python=python_3_8() or "")
    try:
        assert (await box.snapshot()).host
        fired = await box.fire("old", "true", "logs/old.log", verify_s=2.0)
        assert fired.state in ("running", "done"), fired
        assert (await box.stop("never")).result == "gone"
        assert (await box.remove(["nothing"])).missing == ("nothing",)
        assert (await box.checkpoints("run")).checkpoints == ()
        assert (await box.watchers()).watchers == ()
        with pytest.raises(BoxError, match="No such file"):
            await box.gguf_show("missing.gguf")
    finally:
        await box.close()
