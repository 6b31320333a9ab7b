"""A checkpoint is whole by its content, not by its file names (issue 46, item 4): zero-byte
files (what a full disk leaves), links (out of the workspace, dangling, or to a good file), a FIFO
(a resumed run would hang on it), a trainer_state.json whose global_step is not the folder's, a
safetensors file shorter or longer than its header says, a torch zip without its end record: each
is one line of the checkpoint's problems and makes it not complete; and the console's resume
takes the newest whole one, passing over each newer one with why.

The layouts are generated (hypothesis) and judged by the box's own tool; the judgement is compared
with an oracle written plainly here. The safetensors header check is compared with the safetensors
library itself, on files written by it and then altered. Each layout is sealed as it is, with the
completeness record the train stage writes last (tests/test_checkpoint_record.py holds a folder to
its record): what is judged here is the content the record vouches for."""

from __future__ import annotations

import asyncio
import io
import json
import os
import struct
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.numpy import save_file

from samai.console.core import config
from samai.console.core.training import resume
from samai.remote import model
from samai.remote.box import checkpoints as box_checkpoints
from samai.remote.box import tensorfiles
from samai.remote.boxapi import Box
from samai.remote.local import LocalTransport
from tests.test_checkpoints import FOLDER, OLD, checkpoint, seal, settle, torch_like

NEEDED = ("trainer_state.json", "optimizer.pt", "scheduler.pt", "adapter_model.safetensors", "adapter_config.json")
OPTIONAL = ("rng_state.pth", "training_args.bin")
STATES = ("good", "absent", "empty", "truncated", "zeros", "trailing", "link_out", "link_in", "dangling", "fifo",
          "folder", "wrong_step")


def good_bytes(name: str, step: int) -> bytes:
    """What the Trainer (and peft) write under this name, in small."""
    if name == "trainer_state.json":
        return json.dumps({"global_step": step, "epoch": 1.0, "log_history": [{"loss": 1.5, "step": step}]}).encode()
    if name == "adapter_config.json":
        return json.dumps({"peft_type": "LORA", "r": 8}).encode()
    if name.endswith(".safetensors"):
        out = io.BytesIO()
        from safetensors.numpy import save

        out.write(save({"base_model.model.layers.0.q_proj.lora_A.weight": np.ones((4, 16), np.float32),
                        "base_model.model.layers.0.q_proj.lora_B.weight": np.zeros((16, 4), np.float32)}))
        return out.getvalue()
    return torch_like(300)


def altered(name: str, step: int, state: str) -> bytes:
    data = good_bytes(name, step)
    if state == "empty":
        return b""
    if state == "truncated":  # the end of the save lost (a zip's end record, a safetensors' last tensor)
        return data[:-30] if len(data) > 60 else data[:len(data) // 2]
    if state == "zeros":  # a crash's allocated, never written blocks
        return b"\0" * len(data)
    if state == "trailing":
        return data + b"\0" * 16 if not name.endswith(".json") else data + b"}"
    if state == "wrong_step":
        return good_bytes(name, step + 1) if name == "trainer_state.json" else data
    return data


def spoils(name: str, state: str) -> bool:
    """Whether a file in this state makes its checkpoint not whole (a wrong step is a state of
    trainer_state.json only: the other files are written as good ones)."""
    return state not in ("good", "absent") and not (state == "wrong_step" and name != "trainer_state.json")


def whole_by_oracle(layout: dict[str, str]) -> bool:
    """The rule, plainly: every needed file there and unspoilt, every other one unspoilt or not there."""
    return (all(layout[n] != "absent" and not spoils(n, layout[n]) for n in NEEDED)
            and not any(spoils(n, layout[n]) for n in OPTIONAL))


def make(ws: Path, outside: Path, step: int, layout: dict[str, str]) -> Path:
    folder = ws / FOLDER / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    for name, state in layout.items():
        path = folder / name
        if state == "absent":
            continue
        if state == "link_out":
            target = outside / f"{step}-{name}"
            target.write_bytes(good_bytes(name, step))
            path.symlink_to(target)
        elif state == "link_in":  # a good file elsewhere in the workspace: a link all the same
            target = ws / f"{step}-{name}"
            target.write_bytes(good_bytes(name, step))
            path.symlink_to(target)
        elif state == "dangling":
            path.symlink_to(outside / "nothing-here")
        elif state == "fifo":
            os.mkfifo(path)
        elif state == "folder":
            path.mkdir()
            (path / "inside").write_bytes(b"x")
        else:
            path.write_bytes(altered(name, step, state))
    seal(folder)
    for entry in folder.iterdir():  # settled: a save long over
        os.utime(entry, (OLD, OLD), follow_symlinks=False)
    return folder


LAYOUT = st.fixed_dictionaries({name: st.sampled_from(STATES) for name in NEEDED + OPTIONAL})


@settings(max_examples=120, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(1, 10**6), LAYOUT), min_size=1, max_size=4, unique_by=lambda c: c[0]))
def test_the_judgement_of_any_layout_is_the_oracles_and_the_resume_takes_the_newest_whole(
        tmp_path_factory: pytest.TempPathFactory, layouts: list[tuple[int, dict[str, str]]]) -> None:
    root = tmp_path_factory.mktemp("layouts")
    ws, outside = root / "ws", root / "outside"
    ws.mkdir()
    outside.mkdir()
    for step, layout in layouts:
        make(ws, outside, step, layout)
    raw = box_checkpoints.checkpoints({"workspace": str(ws), "folder": FOLDER})
    found = model.checkpoints(json.loads(json.dumps(raw)))  # as the console reads the box's reply
    by_step = {c.step: c for c in found.checkpoints}
    for step, layout in layouts:
        judged = by_step[step]
        assert judged.complete is whole_by_oracle(layout), (layout, judged.problems)
        for name, state in layout.items():  # every file that spoils it is named in a line of its own
            if spoils(name, state):
                assert any(line.startswith(name) for line in judged.problems), (name, state, judged.problems)
            adapter_config_needed = layout["adapter_model.safetensors"] != "absent"  # beside an adapter's weights
            if state == "absent" and name in NEEDED and (name != "adapter_config.json" or adapter_config_needed):
                assert any(line.startswith("missing ") and name in line for line in judged.problems), judged.problems
        if judged.complete:
            assert judged.finite is True and not judged.problems
    newest_whole = max((step for step, layout in layouts if whole_by_oracle(layout)), default=None)
    choice = resume.choose(found, [])
    assert (choice.chosen.step if choice.chosen else None) == newest_whole
    assert [p.name for p in choice.passed] == [f"checkpoint-{s}" for s in sorted(by_step, reverse=True)
                                               if newest_whole is None or s > newest_whole]


async def test_the_issues_layouts_through_the_box_are_passed_over_for_an_older_whole_one(
        workspace: Path, tmp_path: Path) -> None:
    """What the issue tried, each in a checkpoint newer than a whole one: the resume takes the
    whole one and says why it passed over each (the FIFO is never opened for a blocking read)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    checkpoint(workspace, 100)
    tried = {200: ("optimizer.pt", "empty", "optimizer.pt is empty"),
             300: ("scheduler.pt", "empty", "scheduler.pt is empty"),
             400: ("optimizer.pt", "link_out", "optimizer.pt is a symbolic link, not a regular file"),
             500: ("scheduler.pt", "dangling", "scheduler.pt is a symbolic link, not a regular file"),
             600: ("optimizer.pt", "fifo", "optimizer.pt is a FIFO, not a regular file"),
             700: ("trainer_state.json", "link_in", "trainer_state.json is a symbolic link, not a regular file"),
             800: ("trainer_state.json", "wrong_step", "trainer_state.json says global_step 801, not the folder's "
                                                       "step 800"),
             900: ("adapter_model.safetensors", "truncated", "adapter_model.safetensors is "),
             950: ("optimizer.pt", "truncated", "optimizer.pt is cut short (its zip has no end record)"),
             960: ("scheduler.pt", "zeros", "scheduler.pt is neither a zip nor a pickle: not a torch file")}
    for step, (name, state, _) in tried.items():
        layout = dict.fromkeys(NEEDED + OPTIONAL, "good")
        layout[name] = state
        make(workspace, outside, step, layout)
    (workspace / FOLDER / "checkpoint-1000").symlink_to(workspace / FOLDER / "checkpoint-100")
    text = (f'[workspace]\npath = "{workspace}"\n[stages.sft]\nkey = "t"\nrole = "train"\ncommand = "true"\n'
            f'log = "logs/train.log"\ncheckpoints = "{FOLDER}"\n')
    (workspace / "logs").mkdir()
    (workspace / "logs" / "train.log").write_text("=== samai chain sft: pid 1 started 2026-12-02T00:00:00Z\n")
    cfg = config.parse(text, "(test)")
    box = Box(LocalTransport(), str(workspace), python=sys.executable)
    try:
        choice = await asyncio.wait_for(resume.resume_choice(box, cfg, cfg.stage("sft")), 120)
    finally:
        await box.close()
    assert choice.chosen is not None and choice.chosen.name == "checkpoint-100"
    whys = {p.name: p.why for p in choice.passed}
    assert whys["checkpoint-1000"] == "checkpoint-1000 is a symbolic link, not a folder"
    for step, (_, _, why) in tried.items():
        assert whys[f"checkpoint-{step}"].startswith(why), whys[f"checkpoint-{step}"]
    assert whys["checkpoint-900"].endswith(": cut short")
    assert (workspace / FOLDER / "checkpoint-600" / "optimizer.pt").exists()  # the FIFO left as it was


def test_a_real_trainer_state_is_whole_in_the_folder_of_its_step(workspace: Path) -> None:
    """The tiny pipeline's own trainer_state.json (a real Trainer's, saved in its checkpoint-12):
    whole in checkpoint-12, and in checkpoint-11 the line that says why not."""
    state = (Path(__file__).parent / "data" / "trainer_state_tiny.json").read_bytes()
    for step in (12, 11):
        (checkpoint(workspace, step) / "trainer_state.json").write_bytes(state)
        settle(seal(workspace / FOLDER / f"checkpoint-{step}"))
    raw = box_checkpoints.checkpoints({"workspace": str(workspace), "folder": FOLDER})
    by_step = {c["step"]: c for c in raw["checkpoints"]}
    assert by_step[12]["complete"] and not by_step[12]["problems"]
    assert by_step[11]["problems"] == ["trainer_state.json says global_step 12, not the folder's step 11"]


def test_a_torch_zip_is_whole_with_its_end_record_small_or_zip64(tmp_path: Path, monkeypatch) -> None:
    """A torch file's end: the end record last (its comment reaching the end exactly) and the
    central directory just before it, in a plain zip and in one with zip64 end records."""
    plain = torch_like(1000)
    monkeypatch.setattr(zipfile, "ZIP_FILECOUNT_LIMIT", 0)  # as a large archive's: zip64 end records
    large = torch_like(1000)
    monkeypatch.undo()
    assert b"PK\x06\x06" in large and b"PK\x06\x06" not in plain
    commented = io.BytesIO()
    with zipfile.ZipFile(commented, "w") as z:
        z.writestr("archive/data.pkl", b"\x80\x02.")
        z.comment = b"PK\x05\x06 a comment that looks like an end record"
    for data, whole in ((plain, True), (large, True), (commented.getvalue(), True), (plain[:-1], False),
                        (large[:-22], False), (plain[:-22] + plain[-22:-2] + b"\0\1", False),
                        (plain[:200] + plain[-22:], False), (large[:-200] + large[-98:], False)):
        path = tmp_path / "f.pt"
        path.write_bytes(data)
        fd = os.open(path, os.O_RDONLY)
        try:
            assert tensorfiles.zip_whole(fd, len(data)) is whole
        finally:
            os.close(fd)


# ------------------------------------------------------------ the safetensors header, against the library

TENSORS = st.dictionaries(st.text(st.characters(codec="ascii", exclude_characters="\0"), min_size=1, max_size=12),
                          st.tuples(st.sampled_from(["float32", "float16", "int64", "uint8", "bool"]),
                                    st.lists(st.integers(0, 5), max_size=3)), min_size=0, max_size=4)
EDITS = st.lists(st.one_of(
    st.tuples(st.just("cut"), st.integers(1, 64)),
    st.tuples(st.just("append"), st.binary(min_size=1, max_size=16)),
    st.tuples(st.just("field"), st.sampled_from(["dtype", "shape", "data_offsets"]),
              st.one_of(st.sampled_from(["F32", "F4", "BF16", "F8_E8M0", "Q4", ""]),
                        st.lists(st.integers(-2, 80), max_size=3), st.just(None), st.floats(0, 3))),
    st.tuples(st.just("length"), st.integers(-8, 8)),
    st.tuples(st.just("metadata"), st.one_of(st.none(), st.integers(), st.dictionaries(
        st.text(max_size=3), st.one_of(st.text(max_size=3), st.integers()), max_size=2)))), max_size=3)


def edited(blob: bytes, edits: list) -> bytes:
    (n,) = struct.unpack("<Q", blob[:8])
    header, data = json.loads(blob[8:8 + n]), blob[8 + n:]
    length_delta, tail = 0, b""
    for edit in edits:
        if edit[0] == "cut":
            data = data[:-edit[1]] if edit[1] <= len(data) else b""
        elif edit[0] == "append":
            tail += edit[1]
        elif edit[0] == "field":
            tensors = [k for k in header if k != "__metadata__"]
            if tensors:
                header[tensors[0]][edit[1]] = edit[2]
        elif edit[0] == "length":
            length_delta = edit[1]
        else:
            header["__metadata__"] = edit[1]
    text = json.dumps(header).encode()
    return struct.pack("<Q", max(0, len(text) + length_delta)) + text + data + tail


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(TENSORS, EDITS)
def test_the_header_check_agrees_with_the_safetensors_library(tmp_path: Path, tensors, edits) -> None:
    """Whatever the edit, the box's check passes a file exactly when the library opens it."""
    arrays = {name: np.zeros(shape, dtype) for name, (dtype, shape) in tensors.items()}
    path = tmp_path / "w.safetensors"
    save_file(arrays, str(path))
    blob = edited(path.read_bytes(), edits)
    path.write_bytes(blob)
    try:
        with safe_open(str(path), "np") as f:
            f.keys()
        theirs = True
    except Exception:
        theirs = False
    fd = os.open(path, os.O_RDONLY)
    try:
        tensorfiles.safetensors_header(fd, "w.safetensors", len(blob))
        ours = True
    except tensorfiles.Unfit:
        ours = False
    finally:
        os.close(fd)
    assert ours is theirs, blob[:300]


CONTENT = st.one_of(st.binary(max_size=400),
                    st.binary(max_size=400).map(lambda b: b"PK\x03\x04" + b),  # a zip's start, anything after
                    st.binary(max_size=400).map(lambda b: struct.pack("<Q", len(b)) + b),  # a header length, any header
                    st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                                 lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
                                     st.sampled_from(["global_step", "dtype", "shape", "data_offsets", "x"]), inner,
                                     max_size=4), max_leaves=12).map(lambda v: json.dumps(v).encode()))


@settings(max_examples=300, deadline=None, database=None)
@given(st.sampled_from(["trainer_state.json", "adapter_config.json", "optimizer.pt", "rng_state.pth",
                        "training_args.bin", "adapter_model.safetensors", "model.safetensors"]), CONTENT)
def test_any_bytes_in_any_file_are_a_problem_line_or_whole_never_a_crash(tmp_path_factory, name: str,
                                                                          data: bytes) -> None:
    folder = tmp_path_factory.mktemp("f")
    (folder / name).write_bytes(data)
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        found = box_checkpoints.unfit_files(fd, [(name, os.stat(folder / name))], 7)
    finally:
        os.close(fd)
    assert all(entry == name and line.startswith(name) and "\n" not in line for entry, line in found)


def test_each_problem_is_one_line_whatever_the_names(workspace: Path) -> None:
    """Names are anyone's: a file name or a tensor name with a line break or a bidi override is
    quoted in its problem line, which stays one line."""
    folder = checkpoint(workspace, 5)
    (folder / "x\n\u202e.pt").write_bytes(b"")
    header = json.dumps({"a\nb\x1b[2J": {"dtype": "F32", "shape": [4], "data_offsets": [0, 12]}}).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 12)
    settle(folder)
    [judged] = box_checkpoints.checkpoints({"workspace": str(workspace), "folder": FOLDER})["checkpoints"]
    assert not judged["complete"]
    assert '"x\\n\\u202e.pt" is empty' in judged["problems"]
    assert ('model.safetensors: tensor "a\\nb\\u001b[2J" holds 12 bytes, its dtype and shape make 16'
            in judged["problems"])
    assert all(line.isprintable() for line in judged["problems"])



def test_a_real_torch_save_is_whole_and_any_cut_of_it_is_not(tmp_path: Path) -> None:
    """tests/data/scheduler_torch.pt: a real Trainer checkpoint's scheduler.pt (torch 2.14's
    torch.save, whose zip has zip64 end records): whole as it is, cut short at any length not."""
    data = (Path(__file__).parent / "data" / "scheduler_torch.pt").read_bytes()
    assert b"PK\x06\x06" in data[-120:]
    for cut in [0, *range(1, 120), *range(120, len(data), 97)]:
        path = tmp_path / "scheduler.pt"
        path.write_bytes(data[:len(data) - cut])
        fd = os.open(path, os.O_RDONLY)
        try:
            tensorfiles.torch_file(fd, "scheduler.pt", len(data) - cut)
            whole = True
        except tensorfiles.Unfit:
            whole = False
        finally:
            os.close(fd)
        assert whole is (cut == 0), cut
