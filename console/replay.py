"""A recorded box: one probe reply plus log contents, rendered without a live target.

Used for the README's screenshot and the snapshot tests, where every pixel must be the same
on every run; also handy to show a colleague exactly what the console showed."""

from __future__ import annotations

import base64
import json
import posixpath
from dataclasses import replace
from pathlib import Path

from samai.console.core import config as config_mod
from samai.remote import model
from samai.remote.follow import LogFollower
from samai.remote.model import Snapshot

RECORDED_RTT = 0.042


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
        followers = app.state.followers()
        app.show_snapshot(recorded_snapshot(recording, followers), followers)
    app.box_screen.query_one("#log").flush_now()
