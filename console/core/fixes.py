"""What `x` does about an alert: a typed action the app runs through that action's own
confirmation, never a string it parses back. A kill names its process by pid and start time,
so a pid reused by another process is never the one killed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from samai.remote.model import Process

FixKind = Literal["kill", "stop", "restart", "clean", "uninstall"]


@dataclass(frozen=True)
class FixAction:
    kind: FixKind
    stage: str = ""  # stop, restart: the stage
    pid: int = 0  # kill: the process, as it was when the alert was raised
    start_time: float = 0.0
    python: str = ""  # uninstall: the environment's interpreter, as the stages name it
    package: str = ""  # uninstall: the distribution to remove from it

    @classmethod
    def kill(cls, process: Process) -> FixAction:
        return cls("kill", pid=process.pid, start_time=process.start_time)

    @classmethod
    def stop(cls, stage: str) -> FixAction:
        return cls("stop", stage=stage)

    @classmethod
    def restart(cls, stage: str) -> FixAction:
        return cls("restart", stage=stage)

    @classmethod
    def uninstall(cls, python: str, package: str) -> FixAction:
        return cls("uninstall", python=python, package=package)

    def __str__(self) -> str:
        """As `doctor` prints it: kill PID START, stop STAGE, restart STAGE, clean, uninstall PACKAGE PYTHON."""
        if self.kind == "kill":
            return f"kill {self.pid} {self.start_time}"
        if self.kind == "uninstall":
            return f"uninstall {self.package} {self.python}"
        return f"{self.kind} {self.stage}".rstrip()


CLEAN = FixAction("clean")
