"""Which artifacts the next poll sizes, and the last known size of the others.

Disk totals come with every poll at the cost of one statvfs; an artifact's size costs an lstat
of every file in it, and a provisioned venv holds some 40,000 files: walked every second, it
would cost the box more CPU than everything else the probe does. So a tree is walked on every
poll only while a running stage makes it; any other tree every REFRESH_S, or less often for a big
one (so that sizing stays near 0.1 % of the box's core at any size), and at once after an action
or a stage's change of state. Single files and missing paths cost one lstat each and are sized on
every poll (poison files among them)."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from samai.remote.model import ArtifactSize

REFRESH_S = 15.0
REFRESH_S_PER_FILE = 0.004  # an lstat costs some 4 us: a walk every files * 4 ms is 0.1 % of a core
SMALL_TREE_FILES = 64  # a tree this small costs no more than a stat call or two


class ArtifactSizer:
    def __init__(self, wanted: Sequence[tuple[str, str]]) -> None:
        self.wanted = list(wanted)  # (name, path), in the order the snapshot lists them
        self.known: dict[str, ArtifactSize] = {}
        self.sized_at: dict[str, float] = {}

    def due(self, now: float | None, live: Collection[str]) -> list[tuple[str, str]]:
        """The (name, path) pairs to size in the next poll; now: the time of the last snapshot."""
        return [(name, path) for name, path in self.wanted if self._due(name, now, live)]

    def merge(self, sized: Sequence[ArtifactSize], now: float) -> tuple[ArtifactSize, ...]:
        """Every artifact's latest size: those just sized, and the last known of the others."""
        for a in sized:
            self.known[a.name], self.sized_at[a.name] = a, now
        return tuple(self.known[name] for name, _ in self.wanted if name in self.known)

    def refresh_all(self) -> None:
        """Size everything in the next poll (after an action, or a stage started or ended)."""
        self.sized_at.clear()

    def _due(self, name: str, now: float | None, live: Collection[str]) -> bool:
        last, at = self.known.get(name), self.sized_at.get(name)
        if last is None or at is None or now is None or name in live or last.files <= SMALL_TREE_FILES:
            return True
        return now - at >= max(REFRESH_S, last.files * REFRESH_S_PER_FILE)
