"""A recorded box: one probe reply plus log contents, rendered without a live target.

Used for the README's screenshot and the snapshot tests, where every pixel must be the same
on every run; also handy to show a colleague exactly what the console showed.

A replay (`samai-console replay FILE`: an incident bundle someone else made) is data, never a
config to act on: its app has no way to open a box. Its box factory refuses whatever target the
bundle names (`no_box`), so no transport is opened and no variable the bundle names (a
`token_env`) is read; and every key that would reach a box says REFUSAL instead (`refuses`): the
keys that only show what the bundle holds (INERT_KEYS) work as usual."""

from __future__ import annotations

import base64
import json
import posixpath
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from samai.console.core import config as config_mod
from samai.console.core.commands import COMMANDS
from samai.remote import model
from samai.remote.errors import BoxError
from samai.remote.follow import LogFollower
from samai.remote.model import Snapshot

if TYPE_CHECKING:
    from samai.remote.boxapi import Box

RECORDED_RTT = 0.042
REFUSAL = "replay: read-only, no box"
# The command table's keys that only show what the recording holds; every other key reaches a box.
INERT_KEYS = frozenset({
    "app.quit", "app.help", "app.next_log", "app.pick_log", "app.log_back", "app.log_forward",
    "log.follow", "log.filter", "log.clear_filter", "log.filter_cancel", "log.next_marker", "log.prev_marker",
    "log.wrap", "log.copy", "log.save", "log.top", "log.bottom",
    "processes.filter", "processes.sort", "processes.all", "processes.up", "processes.down", "processes.page_up",
    "processes.page_down", "processes.first", "processes.last",
    "fleet.back", "gguf.close", "gguf.filter", "gguf.filter_cancel",
})
# A Textual widget's own action that a command names too (fleet.open: a DataTable's enter): the
# fleet it opens a box from is refused itself, and the dialogs' tables take it as theirs.
_WIDGET_ACTIONS = frozenset({"select_cursor"})


def _action_name(action: str) -> str:
    """`screen.fire('train')` -> fire."""
    return action.split("(", 1)[0].rsplit(".", 1)[-1]


_INERT_ACTIONS = frozenset(_action_name(c.action) for c in COMMANDS if c.id in INERT_KEYS)
# What a replay refuses, by action (a stage's key is bound as `screen.fire(...)`, with no command id).
REFUSED_ACTIONS = frozenset(_action_name(c.action) for c in COMMANDS if c.id not in INERT_KEYS) \
    - _INERT_ACTIONS - _WIDGET_ACTIONS


class NoBox(BoxError):
    """A replay was asked for a box: it has none."""


def no_box(cfg: config_mod.Config) -> Box:
    """A replay's box factory: whatever the bundle names, no box (the one way a replay app opens one)."""
    raise NoBox(REFUSAL)


def refuses(action: str) -> bool:
    """Whether a replay refuses this action (a key's, a click's): it would reach a box."""
    return _action_name(action) in REFUSED_ACTIONS


def load(path: str | Path) -> dict:
    return json.loads(Path(path).read_text("utf-8"))


def recorded_config(recording: dict, pipeline: str = "tiny") -> config_mod.Config:
    return replace(config_mod.load_builtin(pipeline), workspace=recording["workspace"])


def recorded_snapshot(recording: dict, followers: list[LogFollower]) -> Snapshot:
    """The recorded probe reply, with each follower's log served whole from the recording."""
    logs = recording.get("logs", {})
    raw = dict(recording["probe"], logs=[_chunk(f, logs) for f in followers])
    return model.snapshot(raw, RECORDED_RTT)


def log_key(path: str) -> str:
    """A log's key in a recording: its file name without the extension (logs/train.log: train)."""
    return posixpath.splitext(posixpath.basename(path))[0]


def _chunk(follower: LogFollower, logs: dict[str, str]) -> dict:
    """What the probe would answer this follower: the recorded log from where it stands."""
    whole = logs.get(log_key(follower.path), "").encode()
    offset = follower.offset or 0
    data = whole[offset:]
    return {"path": follower.path, "offset": offset, "next_offset": len(whole), "size": len(whole), "inode": 1,
            "line_end": whole.rfind(b"\n") + 1 or None, "data": base64.b64encode(data).decode(), "hits": []}


def show(app, recording: dict) -> None:
    """Render the recording into a running SamaiApp (started with poll=False)."""
    for _ in range(2):  # the second time with the log pane on the running stage it switched to
        followers = app.state.followers(app.box_screen.session.cursor)
        app.show_snapshot(recorded_snapshot(recording, followers), followers)
    app.box_screen.query_one("#log").flush_now()
