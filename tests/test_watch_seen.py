"""What the console's status line says of the box's watchers (console/core/watch/seen.py): "watched
by" only from a live heartbeat of the lease's real holder, read from a real watch folder through
the box tool, and through the TUI's status bar."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from samai.console.app import SamaiApp
from samai.console.core import config
from samai.console.core.watch.seen import watched_words
from samai.remote.box import watchers
from samai.remote.model import watch_shared
from samai.widgets.status import StatusBar
from tests.helpers import pilot_until


def folder(workspace: Path) -> Path:
    path = workspace / ".samai" / "watch"
    path.mkdir(parents=True, exist_ok=True)
    return path


def beat_file(workspace: Path, watcher: str, written: float, who: str = "", interval: float = 10.0) -> None:
    """A heartbeat as a box process can write it (not through the tool)."""
    beat = {"id": watcher, "who": who, "interval": interval, "written": written, "last_poll": written,
            "last_sent": written}
    (folder(workspace) / f"W-{watcher}.json").write_text(json.dumps(beat))


def lease(workspace: Path, holder: str, until: float = 1e18) -> None:
    (folder(workspace) / "leader.json").write_text(json.dumps({"id": holder, "until": until, "since": 1.0}))


def words(workspace: Path) -> tuple[str, bool]:
    shared = watch_shared(watchers.handle({"workspace": str(workspace), "op": "read"}))
    return watched_words(shared, shared.now)


def test_a_forged_lease_of_a_watcher_that_never_beat_is_not_watched_whoever_else_beats(workspace: Path) -> None:
    lease(workspace, "ghost")
    assert words(workspace) == ("not watched", False)
    beat_file(workspace, "standby", time.time(), "op@other")
    said, ok = words(workspace)
    assert not ok and "watched by" not in said and said == "no watcher leads (1 standing by)"


def test_the_lease_holder_watches_while_it_beats_and_is_silent_after(workspace: Path) -> None:
    beat_file(workspace, "real", time.time(), "op@laptop")
    lease(workspace, "real")
    said, ok = words(workspace)
    assert ok and said.startswith("watched by op@laptop")
    beat_file(workspace, "real", time.time() - 600, "op@laptop")  # it stopped beating ten minutes ago
    said, ok = words(workspace)
    assert not ok and said.startswith("watcher op@laptop silent for 10m")


NOW_ISH = st.floats(min_value=-7200, max_value=600)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(beats=st.dictionaries(st.sampled_from(["a", "b", "c"]), st.tuples(NOW_ISH, st.sampled_from([0.5, 10.0, 1e9])),
                             max_size=3),
       holder=st.sampled_from(["a", "b", "c", "ghost"]), until=st.sampled_from([0.0, 1e18]))
def test_watched_by_names_only_the_lease_holder_with_a_live_beat(workspace: Path, beats, holder: str,
                                                                 until: float) -> None:
    for path in folder(workspace).iterdir():
        path.unlink()
    now = time.time()
    for name, (age, interval) in beats.items():
        beat_file(workspace, name, now + age, f"op@{name}", interval)
    lease(workspace, holder, until)
    said, _ = words(workspace)
    if said.startswith("watched by "):
        age, interval = beats[holder]
        assert said.startswith(f"watched by op@{holder}") and until > now
        assert -5 <= -age <= min(max(3 * interval, 30), 900)  # the box's own bound on a live holder


PIPE = """
pipeline = "seen"
[target]
poll_interval = 0.2
python = "{python}"
[workspace]
path = "{ws}"
[stages.hello]
key = "h"
command = "echo hello"
"""


@pytest.mark.slow
async def test_the_status_bar_says_watched_only_for_a_live_leader(tmp_path: Path, workspace: Path) -> None:
    lease(workspace, "ghost")  # held by nobody that beats, and another watcher alive beside it
    beat_file(workspace, "standby", time.time(), "op@other", interval=600)
    path = tmp_path / "seen.toml"
    path.write_text(PIPE.format(python=sys.executable, ws=workspace))
    app = SamaiApp(config.load(path))
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot_until(pilot, lambda: app.connection.watched)
        bar = str(app.screen.query_one(StatusBar).render())
        assert "no watcher leads (1 standing by)" in bar and "watched by" not in bar, bar
