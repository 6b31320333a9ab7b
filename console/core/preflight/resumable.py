"""Whether a training run about to fire could be resumed after it dies (issue 48): the checks
the fire's preflight adds for a training stage (code `not_resumable`), each a warning where it is
the operator's choice (no checkpoints kept, only the model saved, a save interval that loses more
than [train] max_loss_minutes of work at the step rate last measured) and an error where the run
could not resume from a whole checkpoint taken before its trouble (a save_total_limit the NaN
guard's window would use up). Read off the stage's command as the train stage reads its flags
(remote/box/stages/train.py), and `save_only_model` wherever a command sets it."""

from __future__ import annotations

import math
from dataclasses import dataclass

from samai.console.core import units
from samai.console.core.config import Config, Stage, command_words
from samai.remote.model import Severity

CODE = "not_resumable"
# The train stage's defaults (remote/box/stages/train.py): kept checkpoints, sick steps that stop a run.
SAVE_TOTAL_LIMIT, NAN_PATIENCE = 3, 5


@dataclass(frozen=True)
class SaveFlags:
    save_steps: int | None  # None: a checkpoint each epoch
    total_limit: int
    patience: int
    model_only: bool


def save_flags(stage: Stage) -> SaveFlags:
    words = command_words(stage.command) or ()

    def number(flag: str, default: int | None) -> int | None:
        for i, word in enumerate(words):
            value = word.split("=", 1)[1] if word.startswith(flag + "=") else \
                words[i + 1] if word == flag and i + 1 < len(words) else None
            if value is not None:
                try:
                    return int(value)
                except ValueError:
                    return default  # the stage refuses it itself
        return default

    model_only = any(w in ("--save-only-model", "--save_only_model") or "save_only_model=true" in w.lower()
                     or "save_only_model=True" in w for w in words)
    return SaveFlags(number("--save-steps", None), number("--save-total-limit", SAVE_TOTAL_LIMIT) or SAVE_TOTAL_LIMIT,
                     number("--nan-patience", NAN_PATIENCE) or NAN_PATIENCE, model_only)


def resumable_checks(cfg: Config, stage: Stage, step_rate: float | None = None) -> list[tuple[Severity, str]]:
    """(severity, text) of each reason a run of this training stage could not be resumed as it is;
    [] for a stage that does not train. step_rate: optimizer steps a second, as last measured."""
    if not stage.role.trains:
        return []
    if not stage.checkpoints:
        return [("warning", f"{CODE}: stage {stage.name} keeps no checkpoints: a run that dies starts again from "
                            f"step 0 (declare checkpoints = \"FOLDER\" in [stages.{stage.name}])")]
    flags = save_flags(stage)
    found: list[tuple[Severity, str]] = []
    if flags.model_only:
        found.append(("warning", f"{CODE}: save_only_model keeps no optimizer, scheduler or RNG state: a run resumed "
                                 "from its checkpoints is not the same run"))
    if flags.save_steps is not None and flags.total_limit * flags.save_steps <= flags.patience:
        keep = math.ceil((flags.patience + 1) / flags.save_steps)
        found.append(("error", f"{CODE}: --save-total-limit {flags.total_limit} with a checkpoint every "
                               f"{flags.save_steps} steps keeps none from before a NaN the guard takes "
                               f"{flags.patience} steps to see: keep at least {keep}"))
    if flags.save_steps is not None and step_rate:
        lost = flags.save_steps / step_rate
        if lost > cfg.train.max_loss_minutes * 60:
            found.append(("warning", f"{CODE}: a checkpoint every {flags.save_steps} steps at {step_rate:.3g} steps/s "
                                     f"is one every {units.duration(lost)}: a death loses up to that much work, more "
                                     f"than [train] max_loss_minutes ({cfg.train.max_loss_minutes:g} min)"))
    return found
