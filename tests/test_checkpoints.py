"""A training run's checkpoints, listed and judged by the box (issue 31, part 2's ground): whole
(the Trainer's state all there, nothing temporary, not still being written) and finite (no NaN or
inf in the adapter's weights, written here with the safetensors library itself); the folder
confined to the workspace; and the train stage's `checkpoints` key validated. Each checkpoint
made here is sealed as the train stage seals one (its completeness record written last, by the
stage's own code): what is tested here is its content (tests/test_checkpoint_record.py: the record)."""

from __future__ import annotations

import io
import json
import os
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.numpy import save_file

from samai.console.core import config
from samai.console.core.config import ConfigError
from samai.remote.box import checkpoints as box_checkpoints
from samai.remote.box import sealed
from samai.remote.boxapi import BoxError

FOLDER = "runs/train/checkpoints"
OLD = time.time() - 60  # written a minute ago: settled


def checkpoint(ws: Path, step: int, *, weights: dict[str, np.ndarray] | None = None, drop: str = "",
               extra: str = "", settled: bool = True, whole: bool = True) -> Path:
    """A checkpoint-STEP folder as transformers' Trainer writes one for a peft model, sealed with
    its completeness record as the train stage does (whole=False: no record)."""
    folder = ws / FOLDER / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    files = {"trainer_state.json": json.dumps({"global_step": step, "log_history": []}).encode(),
             "optimizer.pt": torch_like(2048), "scheduler.pt": torch_like(512), "rng_state.pth": torch_like(256),
             "adapter_config.json": b"{}", "training_args.bin": torch_like(64)}
    for name, data in files.items():
        if name != drop:
            (folder / name).write_bytes(data)
    if drop != "adapter_model.safetensors":
        save_file(weights or {"base_model.model.layers.0.q_proj.lora_A.weight": np.ones((8, 64), np.float32)},
                  str(folder / "adapter_model.safetensors"))
    if extra:
        (folder / extra).write_bytes(b"half")
    if whole:
        seal(folder)
    if settled:
        settle(folder)
    return folder


def seal(folder: Path) -> Path:
    """The completeness record of what the folder holds now, written last as the train stage writes it."""
    sealed.seal(str(folder), int(folder.name.split("-")[1]))
    return folder


def torch_like(size: int) -> bytes:
    """What torch.save writes since 1.6: a zip archive of the pickle and its storages."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        z.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
        z.writestr("archive/data/0", b"\1" * size)
    return out.getvalue()


def settle(folder: Path) -> Path:
    for f in folder.iterdir():
        os.utime(f, (OLD, OLD))
    return folder


async def test_the_newest_first_each_judged_whole_and_finite(box, workspace) -> None:
    checkpoint(workspace, 400)
    checkpoint(workspace, 800, drop="optimizer.pt")
    checkpoint(workspace, 1200, extra="adapter_model.safetensors.tmp")
    nan = np.ones((4, 16), np.float32)
    nan[2, 3] = np.nan
    checkpoint(workspace, 1600, weights={"lora_A": np.ones((2, 2), np.float32), "lora_B": nan})
    checkpoint(workspace, 2000, settled=False)
    (workspace / FOLDER / "runs-note.txt").write_text("not a checkpoint")
    found = await box.checkpoints(FOLDER)
    by_step = {c.step: c for c in found.checkpoints}
    assert [c.step for c in found.checkpoints] == [2000, 1600, 1200, 800, 400]
    good = by_step[400]
    assert good.complete and good.finite and not good.problems and good.name == "checkpoint-400"
    assert good.bytes > 2048 + 512 and good.weights == "adapter_model.safetensors"
    assert not by_step[800].complete and by_step[800].missing == ("optimizer.pt or optimizer.bin or global_step*",)
    assert not by_step[1200].complete and by_step[1200].temporary == ("adapter_model.safetensors.tmp",)
    assert by_step[1600].complete and by_step[1600].finite is False and by_step[1600].nonfinite == ("lora_B",)
    assert by_step[2000].complete and by_step[2000].settling  # whole: whether a save is under way, the console weighs


def _zip(path: Path, cut: int = 0) -> None:
    """A torch file as torch.save writes one since 1.6 (a zip archive), cut short by `cut` bytes."""
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", b"\x80\x02}q\x00." * 200)
        z.writestr("archive/data/0", os.urandom(4096))
    if cut:
        data = path.read_bytes()
        path.write_bytes(data[:-cut])


async def test_a_save_cut_short_is_not_whole(box, workspace) -> None:
    _zip(checkpoint(workspace, 100) / "optimizer.pt")
    _zip(checkpoint(workspace, 200) / "optimizer.pt", cut=30)  # the end record gone
    (checkpoint(workspace, 300) / "trainer_state.json").write_text('{"global_step": 300, "log_hist')
    for step in (100, 200, 300):  # sealed as they are: what is judged here is their content
        settle(seal(workspace / FOLDER / f"checkpoint-{step}"))
    by_step = {c.step: c for c in (await box.checkpoints(FOLDER)).checkpoints}
    assert by_step[100].complete and not by_step[100].problems
    assert not by_step[200].complete and by_step[200].problems == ("optimizer.pt is cut short (its zip has no end "
                                                                   "record)",)
    assert not by_step[300].complete
    assert by_step[300].problems == ("trainer_state.json does not parse as a JSON object",)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, None])
def test_the_finite_check_of_each_float_type(tmp_path: Path, dtype: str, bad) -> None:
    values = np.linspace(-65000, 65000, 3001).astype(dtype)  # large, small, negative, zero: all finite
    if bad is not None:
        values[1777] = bad
    save_file({"w": values, "int": np.arange(10, dtype=np.int64)}, str(tmp_path / "a.safetensors"))
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        bad_tensors, problem = box_checkpoints.nonfinite_tensors(fd, "a.safetensors")
    finally:
        os.close(fd)
    assert problem is None and bad_tensors == ([] if bad is None else ["w"])


def test_bfloat16_nan_and_inf_are_found() -> None:
    """numpy has no bfloat16: its words, written by hand (1.0, +inf, -inf, a NaN, the largest)."""
    for word, is_finite in ((0x3F80, True), (0x7F80, False), (0xFF80, False), (0x7FC0, False), (0x7F7F, True)):
        data = (0x3F80).to_bytes(2, "little") * 7 + word.to_bytes(2, "little")
        r, w = os.pipe()
        os.write(w, data)
        os.close(w)
        try:
            assert box_checkpoints.finite(r, len(data), "BF16") is is_finite, hex(word)
        finally:
            os.close(r)


@settings(max_examples=150, deadline=None, database=None)
@given(st.binary(max_size=600))
def test_any_bytes_as_weights_are_a_problem_or_a_verdict_never_a_crash(tmp_path_factory, data: bytes) -> None:
    folder = tmp_path_factory.mktemp("w")
    (folder / "x.safetensors").write_bytes(data)
    fd = os.open(folder, os.O_RDONLY)
    try:
        bad, problem = box_checkpoints.nonfinite_tensors(fd, "x.safetensors")
    finally:
        os.close(fd)
    assert isinstance(bad, list) and (problem is None or isinstance(problem, str))


async def test_a_folder_outside_the_workspace_or_through_a_symlink_is_refused(box, workspace, tmp_path) -> None:
    outside = tmp_path / "elsewhere"
    checkpoint(outside, 100)  # a checkpoint-100 under elsewhere/runs/train/checkpoints
    with pytest.raises(BoxError, match="checkpoints"):
        await box.checkpoints("../elsewhere/" + FOLDER)
    (workspace / "runs").mkdir()
    (workspace / "runs" / "train").symlink_to(outside / "runs" / "train")
    with pytest.raises(BoxError):
        await box.checkpoints(FOLDER)
    assert (await box.checkpoints("runs/none")).checkpoints == ()  # no folder yet: no checkpoint


def test_checkpoints_belong_to_a_train_stage_inside_the_workspace() -> None:
    base = '[workspace]\npath = "/ws"\n[stages.{name}]\nkey = "t"\ncommand = "x"\ncheckpoints = {value}\n'
    assert config.parse(base.format(name="train", value='"runs/ck"'), "t.toml").stage("train").checkpoints == "runs/ck"
    for name, value, expected in (("serve", '"runs/ck"', "a stage of role train"),
                                  ("train", '"../ck"', "a path inside the workspace"),
                                  ("train", "3", "a string")):
        with pytest.raises(ConfigError, match=expected) as e:
            config.parse(base.format(name=name, value=value), "t.toml")
        assert f"stages.{name}.checkpoints" in str(e.value) and "t.toml" in str(e.value)
    for pipeline in ("tiny", "samai-8b", "samai-vl"):
        train = config.load_builtin(pipeline).stage_by_role("train")
        assert train is not None and train.checkpoints == FOLDER
