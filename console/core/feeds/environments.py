"""The training environments feed (§9): what is installed beside peft in the Pythons that run it,
read from their site-packages on the box at each connect and after an uninstall (it changes
only when someone installs), judged by torchao_beside_peft."""

from __future__ import annotations

from typing import Any

from samai.console.core.alertbook import Alert
from samai.console.core.detectors import WATCHED_PACKAGES, peft_pythons
from samai.console.core.feeds import Feed, Poll, Read, Surroundings
from samai.remote.model import PythonPackages


class EnvironmentsFeed(Feed):
    name = "environments"
    detectors = ("torchao_beside_peft",)

    def __init__(self, state, around: Surroundings) -> None:
        super().__init__(state, around)
        self.pythons = list(peft_pythons(self.config))
        self.environments: tuple[PythonPackages, ...] = ()
        self._due = False

    def fold(self, poll: Poll) -> list[Alert]:
        self._due |= poll.connected
        return []

    def refresh(self) -> None:
        """Read again (after an uninstall changed one)."""
        self._due = True

    def reads(self, now: float) -> list[Read]:
        if not self._due or not self.pythons:
            return []
        self._due = False
        return [Read("the training environments", lambda box: box.python_packages(self.pythons, WATCHED_PACKAGES),
                     self._read)]

    def _read(self, environments: tuple[PythonPackages, ...], now: float) -> list[Alert]:
        self.environments = environments
        return []

    def context(self) -> dict[str, Any]:
        return {"environments": self.environments}
