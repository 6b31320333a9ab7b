"""A checkpoint is whole by its completeness record as well as by its content (issue 48, item 2).

The train stage seals each checkpoint with samai_complete.json, written last (remote/box/sealed.py,
its own code writes the records here); the box's judgement (remote/box/checkpoints.py) refuses a
folder without it, unless the request takes legacy checkpoints (an older train stage's, another
trainer's) by their content alone, and holds a sealed folder to its record: each file it names
there, of its size, and no file a resume loads that it does not name. What the content checks
cannot see is what these cases are made of: a file of the right kind but not the one sealed, an
optional file gone, a record of another step. The writer's side: a checkpoint is put in place in
one rename, and an old one deleted by a rename first, so no checkpoint-STEP is ever half there."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from samai.remote import model
from samai.remote.box import checkpoints as box_checkpoints
from samai.remote.box import sealed
from tests.test_checkpoints import FOLDER, checkpoint, seal, settle, torch_like

NO_RECORD = ("no samai_complete.json: not known to be whole (its save was cut short, or an older train stage or "
             "another trainer wrote it)")


def judged(ws: Path, legacy: bool | None = None) -> dict[int, model.Checkpoint]:
    request = {"workspace": str(ws), "folder": FOLDER} | ({"legacy": legacy} if legacy is not None else {})
    raw = box_checkpoints.checkpoints(request)  # type: ignore[arg-type]
    found = model.checkpoints(json.loads(json.dumps(raw)))  # as the console reads the box's reply
    return {c.step: c for c in found.checkpoints}


async def test_a_folder_without_its_record_is_passed_over_unless_legacy_ones_are_taken(box, workspace: Path) -> None:
    checkpoint(workspace, 4)
    checkpoint(workspace, 8, whole=False)  # every file whole by its content, no record
    by_step = {c.step: c for c in (await box.checkpoints(FOLDER)).checkpoints}  # through the Box, as a resume asks
    assert by_step[4].complete and not by_step[4].problems
    assert not by_step[8].complete and by_step[8].problems == (NO_RECORD,)
    legacy = judged(workspace, legacy=True)  # an older train stage's checkpoints, taken by their content
    assert legacy[8].complete and not legacy[8].problems and legacy[4].complete
    assert not judged(workspace, legacy=False)[8].complete


def _swap_rng(folder: Path) -> None:  # a whole torch file, but not the one sealed
    (folder / "rng_state.pth").write_bytes(torch_like(999))


def _other_step(folder: Path) -> None:
    (folder / sealed.RECORD).write_bytes((folder.parent / "checkpoint-4" / sealed.RECORD).read_bytes())


def _half_record(folder: Path) -> None:
    data = (folder / sealed.RECORD).read_bytes()
    (folder / sealed.RECORD).write_bytes(data[:len(data) // 2])


def _linked_record(folder: Path) -> None:
    (folder.parent / "kept.json").write_bytes((folder / sealed.RECORD).read_bytes())
    (folder / sealed.RECORD).unlink()
    (folder / sealed.RECORD).symlink_to(folder.parent / "kept.json")


def _escaping_record(folder: Path) -> None:
    record = json.loads((folder / sealed.RECORD).read_text())
    record["files"]["../checkpoint-4/optimizer.pt"] = 10
    (folder / sealed.RECORD).write_text(json.dumps(record))


def _shard_swapped(folder: Path) -> None:  # a whole torch file, but not the shard sealed
    (folder / "global_step8" / "zero_pp_rank_0_mp_rank_00_optim_states.pt").write_bytes(torch_like(301))


AFTER_SEALING = {
    "rng_state.pth removed": (lambda f: (f / "rng_state.pth").unlink(),
                              "rng_state.pth is not there as a regular file (samai_complete.json names it)"),
    "README.md grown": (lambda f: (f / "README.md").write_text("# another card, longer\n"),
                        "README.md is 23 bytes, samai_complete.json says 11"),
    "rng_state.pth another file": (_swap_rng, "rng_state.pth is "),
    "optimizer.bin added": (lambda f: (f / "optimizer.bin").write_bytes(torch_like(64)),
                            "optimizer.bin is not named in samai_complete.json: written after the checkpoint was "
                            "sealed"),
    "a record of another step": (_other_step, "samai_complete.json is the record of step 4, not of the folder's "
                                              "step 8"),
    "half a record": (_half_record, "samai_complete.json is not a completeness record (version 1)"),
    "a linked record": (_linked_record, "samai_complete.json is a symbolic link, not a regular file"),
    "a record naming a file elsewhere": (_escaping_record, "samai_complete.json holds an entry that is no file "
                                                           'name and size: "../checkpoint-4/optimizer.pt"'),
    "a shard not the one sealed": (_shard_swapped, "global_step8/zero_pp_rank_0_mp_rank_00_optim_states.pt is "),
}


@pytest.mark.parametrize("case", sorted(AFTER_SEALING))
def test_a_sealed_folder_is_held_to_its_record(workspace: Path, case: str) -> None:
    """Each change after sealing leaves every file whole by its content: only the record sees it."""
    change, line = AFTER_SEALING[case]
    checkpoint(workspace, 4)
    folder = workspace / FOLDER / "checkpoint-8"
    folder.mkdir(parents=True)
    for name, data in ((n, p.read_bytes()) for n, p in ((p.name, p) for p in (folder.parent / "checkpoint-4").iterdir())
                       if n != sealed.RECORD):
        (folder / name).write_bytes(data if name != "trainer_state.json" else b'{"global_step": 8}')
    (folder / "README.md").write_text("# the card\n")
    (folder / "global_step8").mkdir()  # DeepSpeed's shards, one level down
    (folder / "global_step8" / "zero_pp_rank_0_mp_rank_00_optim_states.pt").write_bytes(torch_like(300))
    settle(seal(folder))
    assert judged(workspace)[8].complete  # as sealed
    change(folder)
    settle(folder)
    ck = judged(workspace)[8]
    assert not ck.complete and any(p.startswith(line) for p in ck.problems), ck.problems
    assert judged(workspace)[4].complete


RECORDS = st.one_of(st.binary(max_size=300),
                    st.builds(lambda v, s, f: json.dumps({"samai_complete": v, "step": s, "files": f}).encode(),
                              st.sampled_from([1, 2, "1", None]), st.sampled_from([8, 7, "8", None, 8.0]),
                              st.one_of(st.dictionaries(st.text(max_size=12), st.integers(-2, 4000), max_size=4),
                                        st.lists(st.text(max_size=4), max_size=2), st.none())))


@settings(max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(RECORDS)
def test_any_bytes_as_the_record_are_a_problem_line_or_whole_never_a_crash(tmp_path_factory, data: bytes) -> None:
    ws = tmp_path_factory.mktemp("ws")
    folder = checkpoint(ws, 8)
    (folder / sealed.RECORD).write_bytes(data)
    settle(folder)
    ck = judged(ws)[8]
    assert all(isinstance(p, str) and p.isprintable() for p in ck.problems)
    if ck.complete:  # only a record of this step naming exactly what is there, as large as it is
        assert sealed.read_record(data, 8) == sealed.listing(str(folder))


def test_a_checkpoint_is_put_in_place_whole_and_an_old_one_goes_whole(tmp_path: Path) -> None:
    """The writer's side: the staged folder takes the place of one of the same step in one rename
    (the old one moved aside first), the rotation keeps the newest by step and never a protected
    one, and every folder it leaves mid-way is a tmp- one that neither the box nor a resume lists."""
    parent = tmp_path / FOLDER
    for step in (2, 4, 6):
        checkpoint(tmp_path, step)
    staged = parent / sealed.staged_name("checkpoint-6") / "checkpoint-6"
    staged.mkdir(parents=True)
    (staged / "trainer_state.json").write_text('{"global_step": 6, "new": true}')
    sealed.seal(str(staged), 6)
    sealed.publish(str(staged), str(parent / "checkpoint-6"))
    assert json.loads((parent / "checkpoint-6" / "trainer_state.json").read_text())["new"] is True
    assert not (parent / "tmp-replaced-checkpoint-6").exists()
    said: list[tuple[str, str]] = []
    assert sealed.rotate(str(parent), 1, protect=("checkpoint-6", "checkpoint-2"),
                         said=lambda n, w: said.append((n, w))) == ["checkpoint-4"]
    assert said == [("checkpoint-4", "moved aside"), ("checkpoint-4", "deleted")]
    assert sorted(os.listdir(parent)) == ["checkpoint-2", "checkpoint-6", "tmp-checkpoint-6"]
    assert sealed.leftovers(str(parent)) == ["tmp-checkpoint-6"]
    (parent / "tmp-deleted-checkpoint-2").mkdir()  # what a kill between the two steps of a deletion leaves
    assert sorted(judged(tmp_path)) == [2, 6]
