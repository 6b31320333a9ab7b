"""What `x` does about an alert: a typed action the app runs through that action's own
confirmation, never a string it parses back. A kill names its process by pid and start time,
so a pid reused by another process is never the one killed."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING

from samai.console.core.kinds import ActionKind

if TYPE_CHECKING:
    from samai.remote.model import Process


@dataclass(frozen=True)
class FixKind:
    """How one kind is offered as a fix: what a FixAction of it carries and which app method runs it."""

    shown: tuple[str, ...]  # its FixAction fields after the kind, as `doctor` prints them
    method: str  # the app's method that runs it (through that action's own confirmation)
    args: tuple[str, ...]  # its FixAction fields, in the order that method takes them


FIXES: Mapping[ActionKind, FixKind] = MappingProxyType({
    ActionKind.KILL: FixKind(("pid", "start_time"), "action_kill_pid", ("pid", "start_time")),
    ActionKind.STOP: FixKind(("stage",), "action_stop", ("stage",)),
    ActionKind.RESTART: FixKind(("stage",), "action_restart", ("stage",)),
    ActionKind.RESUME: FixKind(("stage",), "action_resume", ("stage",)),
    ActionKind.CLEAN: FixKind((), "action_clean", ()),
    ActionKind.PRUNE: FixKind(("stage",), "action_prune", ("stage",)),
    ActionKind.UNINSTALL: FixKind(("package", "python"), "action_uninstall", ("python", "package")),
})


@dataclass(frozen=True)
class FixAction:
    kind: ActionKind  # one of FIXES (a name of one is taken too); any other is a ValueError
    stage: str = ""  # stop, restart, resume, prune: the stage
    pid: int = 0  # kill: the process, as it was when the alert was raised
    start_time: float = 0.0
    python: str = ""  # uninstall: the environment's interpreter, as the stages name it
    package: str = ""  # uninstall: the distribution to remove from it

    def __post_init__(self) -> None:
        kind = ActionKind(self.kind)
        if kind not in FIXES:
            raise ValueError(f"{kind} is not offered as a fix (one of {', '.join(FIXES)})")
        object.__setattr__(self, "kind", kind)

    @classmethod
    def kill(cls, process: Process) -> FixAction:
        return cls(ActionKind.KILL, pid=process.pid, start_time=process.start_time)

    @classmethod
    def stop(cls, stage: str) -> FixAction:
        return cls(ActionKind.STOP, stage=stage)

    @classmethod
    def restart(cls, stage: str) -> FixAction:
        return cls(ActionKind.RESTART, stage=stage)

    @classmethod
    def resume(cls, stage: str) -> FixAction:
        return cls(ActionKind.RESUME, stage=stage)

    @classmethod
    def prune(cls, stage: str) -> FixAction:
        return cls(ActionKind.PRUNE, stage=stage)

    @classmethod
    def uninstall(cls, python: str, package: str) -> FixAction:
        return cls(ActionKind.UNINSTALL, python=python, package=package)

    @property
    def call(self) -> tuple[str, tuple]:
        """The app method that runs this fix, and its arguments."""
        fix = FIXES[self.kind]
        return fix.method, tuple(getattr(self, name) for name in fix.args)

    def __str__(self) -> str:
        """As `doctor` prints it: kill PID START, stop STAGE, restart STAGE, resume STAGE, clean,
        prune STAGE, uninstall PACKAGE PYTHON."""
        return " ".join([self.kind.value, *(str(getattr(self, name)) for name in FIXES[self.kind].shown)]).rstrip()


CLEAN = FixAction(ActionKind.CLEAN)
