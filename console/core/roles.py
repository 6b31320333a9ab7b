"""What a stage is for. The console's behaviour follows the role, never the stage's name, and a
role carries what it means, so that a call site asks `stage.role.trains` instead of comparing a
string: a new role is one member here and the properties it answers yes to."""

from __future__ import annotations

from enum import StrEnum


class Role(StrEnum):
    PROVISION = "provision"
    FETCH = "fetch"
    TRAIN = "train"
    MERGE = "merge"
    CONVERT = "convert"
    QUANTIZE = "quantize"
    SERVE = "serve"
    EVAL = "eval"
    PUSH = "push"
    RESTORE = "restore"
    OTHER = "other"

    @property
    def trains(self) -> bool:
        """Its log is a training run's: the curve, its anomalies (NaN), its reference, a GPU it keeps busy."""
        return self is Role.TRAIN

    @property
    def resumable(self) -> bool:
        """It may keep checkpoints (`checkpoints = FOLDER`), and a run of it that died resumes from them."""
        return self is Role.TRAIN

    @property
    def serves(self) -> bool:
        """Its ports are a server's: read for /metrics, restarted when hung, asked the smoke question."""
        return self is Role.SERVE

    @property
    def runs_peft(self) -> bool:
        """It runs peft whatever module it runs: its Python's environment is checked for torchao (§9)."""
        return self in (Role.TRAIN, Role.MERGE)


ROLES = tuple(r.value for r in Role)
