"""The train stage's checkpoints written whole: a checkpoint-STEP folder is whole or absent.

The HF Trainer writes checkpoint-STEP in place, file by file, and then deletes the oldest beyond
save_total_limit: a run killed in the middle leaves a folder that looks newest and is not whole,
and one killed between its rotation and its last file may have no whole checkpoint left. Here the
Trainer writes each checkpoint into a temporary sibling (tmp-checkpoint-STEP/, sealed.py), every
file reaches the disk, the completeness record is written last, and the folder is renamed into
place; only then are the old ones deleted (each renamed away first). The box's judgement
(checkpoints.py) holds every checkpoint to its record.

SAMAI_FAULT_SAVE=N is a test hook, read by this stage only (never set it on a real run): the stage
SIGKILLs its own process at the N-th point of its checkpoint saves, counted over the process: half
of each file written and the file whole (each file's bytes are rewritten in two halves to stop
between them), half of the record and the record whole, the folder renamed into place, each old
checkpoint moved aside and deleted. Each point passed is said in the log as
`SAMAI_FAULT_SAVE point N step S: WHAT` (with `: SIGKILL` on the one it dies at); N=0 kills at none.

Runs ON the box, in the box venv, imported by train.py (transformers imported when asked).
"""

from __future__ import annotations

import contextlib
import os
import signal
from typing import Any, Callable, Iterator

from .. import sealed
from .common import say

FAULT_ENV = "SAMAI_FAULT_SAVE"


class Faults:
    """The fault hook of SAMAI_FAULT_SAVE (see the module's notes)."""

    def __init__(self, kill_at: int, step: Callable[[], int]) -> None:
        self.kill_at, self.step, self.count = kill_at, step, 0
        self.done: dict[str, set[str]] = {}  # per folder being written: the files already stopped in

    @classmethod
    def from_env(cls, step: Callable[[], int]) -> Faults | None:
        raw = os.environ.get(FAULT_ENV, "")
        return cls(int(raw), step) if raw.isdigit() else None

    def point(self, what: str) -> None:
        self.count += 1
        kill = self.count == self.kill_at
        say("%s point %d step %d: %s%s" % (FAULT_ENV, self.count, self.step(), what, ": SIGKILL" if kill else ""))
        if kill:
            os.kill(os.getpid(), signal.SIGKILL)

    def files_written(self, folder: str) -> None:
        """Stop in each file of the folder written since the last call, in the order they were
        written: all of them taken away, then each written again in two halves, a point between
        the halves and one after (at each point the files after it are not there yet)."""
        done = self.done.setdefault(folder, set())
        if not os.path.isdir(folder):
            return
        new = sorted((os.stat(os.path.join(folder, n)).st_mtime_ns, n) for n in sealed.listing(folder) if n not in done)
        data = {}
        for _, name in new:
            done.add(name)
            with open(os.path.join(folder, name), "rb") as f:
                data[name] = f.read()
            os.unlink(os.path.join(folder, name))
        for _, name in new:
            with open(os.path.join(folder, name), "wb") as f:
                half = len(data[name]) // 2
                f.write(data[name][:half])
                f.flush()
                self.point("half of %s written" % name)
                f.write(data[name][half:])
            self.point("%s written" % name)

    @contextlib.contextmanager
    def watching(self, folder: str) -> Iterator[None]:
        """While the Trainer writes a checkpoint into folder: after each torch.save and the
        Trainer's state, the files it wrote are stopped in."""
        import torch
        from transformers.trainer_callback import TrainerState

        save, to_json = torch.save, TrainerState.save_to_json

        def saved(*args: Any, **kwargs: Any) -> None:
            save(*args, **kwargs)
            self.files_written(folder)

        def state_saved(state: Any, path: str) -> None:
            to_json(state, path)
            self.files_written(folder)

        torch.save, TrainerState.save_to_json = saved, state_saved
        try:
            yield
        finally:
            torch.save, TrainerState.save_to_json = save, to_json


def whole_saving_trainer() -> Any:
    """transformers' Trainer, its checkpoints written whole (see the module's notes)."""
    from transformers import Trainer

    class WholeSaves(Trainer):
        staging: str | None = None
        faults: Faults | None = None

        # No public hook of the Trainer chooses where a checkpoint is written or runs before its
        # rotation: both happen in the private _save_checkpoint, which asks the private
        # _get_output_dir for the folder of checkpoint-STEP. So these two are wrapped, nothing
        # more: the folder is the staging one while super() writes, then this seals, renames and
        # rotates what it wrote (the Trainer's own rotation sees only the staging folder).
        def _get_output_dir(self, trial: Any) -> str:
            return self.staging or super()._get_output_dir(trial)

        def _save_checkpoint(self, model: Any, trial: Any) -> None:
            run_dir = super()._get_output_dir(trial)
            name = "checkpoint-%d" % self.state.global_step
            staging = os.path.join(run_dir, sealed.staged_name(name))
            if self.is_local_process_zero():
                sealed.remove_tree(staging)  # what a save of this step killed earlier left
            self.accelerator.wait_for_everyone()
            self.staging = staging
            try:
                with self.faults.watching(os.path.join(staging, name)) if self.faults else contextlib.nullcontext():
                    super()._save_checkpoint(model, trial)
            finally:
                self.staging = None
            self.accelerator.wait_for_everyone()  # every rank's files (rng states, DeepSpeed's shards) written
            if self.args.should_save:
                self.put_in_place(run_dir, staging, name)
            self.accelerator.wait_for_everyone()
            if not self.args.should_save and self.is_local_process_zero() and os.path.isdir(
                    os.path.join(staging, name)):  # another node's own disk: its ranks' shards
                self.put_in_place(run_dir, staging, name)

        def put_in_place(self, run_dir: str, staging: str, name: str) -> None:
            staged, faults = os.path.join(staging, name), self.faults
            if faults:
                faults.files_written(staged)
            sealed.seal(staged, self.state.global_step,
                        midway=(lambda: faults.point("half of %s written" % sealed.RECORD)) if faults else None)
            if faults:
                faults.point("%s written" % sealed.RECORD)
            sealed.publish(staged, os.path.join(run_dir, name))
            if faults:
                faults.point("%s renamed into place" % name)
            for leftover in sealed.leftovers(run_dir):  # this one's folder, and what killed saves left
                sealed.remove_tree(os.path.join(run_dir, leftover))
            if self.args.save_total_limit:
                best = os.path.basename(self.state.best_model_checkpoint or "")
                sealed.rotate(run_dir, self.args.save_total_limit, protect=(name, best),
                              said=(lambda old, what: faults.point("%s %s" % (old, what))) if faults else None)

    return WholeSaves
