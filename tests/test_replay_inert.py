"""A replayed bundle is data: `replay FILE` asks no box anything. A crafted bundle names a target,
[boxes] and a multi-node stage at a loopback listener, and a `token_env` whose variable holds a
canary on the machine that opens it; every key of the command table (and every stage key) is
pressed on every pane of the replay, through App.run_test(), and `o` is given a .gguf as the
finding did. No connection reaches the listener, no variable the bundle names is read, and each
key that would reach a box says "replay: read-only, no box"."""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Iterator, MutableMapping
from pathlib import Path

import pytest
from textual.widgets import Input

from samai.console.app import SamaiApp
from samai.console.core.commands import COMMANDS
from samai.console.core.incident import FORMAT, read_bundle
from samai.console.replay import INERT_KEYS, REFUSAL, NoBox, load, recorded_config
from samai.console.screens.dialogs import PathDialog
from samai.console.screens.fleet import FleetScreen
from samai.console.screens.gguf import GgufScreen
from tests.helpers import collect_toasts, pilot_until

TOKEN_ENV, URLS_ENV = "REPLAY_TEST_GATEWAY_TOKEN", "REPLAY_TEST_NOTIFY_URLS"
CANARY = "replay-canary-7Hq2Lm9Xw4"
RECORDING = load(Path(__file__).parent / "data" / "recorded_box.json")
# What reaches a box, said here on its own: every key that changes it, and the keys that read it.
REACHES_BOX = {c.id for c in COMMANDS if c.changes_box} | {
    "app.fleet", "app.open", "app.runs", "app.timeline", "disk.largest", "evals.diff", "gguf.open", "fleet.open"}


class Listener:
    """A loopback port that records every connection made to it and the first bytes sent."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(0.2)
        self.port = self.server.getsockname()[1]
        self.got: list[bytes] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.server.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(2.0)
                try:
                    self.got.append(conn.recv(65536) or b"(connected)")
                except OSError:
                    self.got.append(b"(connected)")

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.server.close()


class EnvironReads(MutableMapping):
    """os.environ, noting each variable read by name (not a whole copy: Textual's App takes one)."""

    def __init__(self, real: MutableMapping[str, str]) -> None:
        self.real, self.read = real, set()
        self._copying = 0  # dict(os.environ): keys(), then each of them read in turn

    def keys(self):  # type: ignore[override]
        keys = list(self.real.keys())
        self._copying = len(keys)
        return keys

    def __getitem__(self, name: str) -> str:
        if self._copying:
            self._copying -= 1
        else:
            self.read.add(name)
        return self.real[name]

    def __setitem__(self, name: str, value: str) -> None:
        self.real[name] = value

    def __delitem__(self, name: str) -> None:
        del self.real[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.real)

    def __len__(self) -> int:
        return len(self.real)

    def copy(self) -> dict[str, str]:
        return dict(self.real)


@pytest.fixture
def listener() -> Iterator[Listener]:
    server = Listener()
    yield server
    server.close()


def _crafted_bundle(path: Path, port: int) -> Path:
    gateway, ssh = f"envelope+http://127.0.0.1:{port}", f"ssh://op@127.0.0.1:{port}"
    tables = {
        "pipeline": "crafted",
        "boxes": {"a": {"url": gateway, "token_env": TOKEN_ENV, "workspace": "ws-a"},
                  "b": {"url": ssh, "workspace": "ws-b"}},
        "notify": {"urls_env": URLS_ENV},
        "stages": {"train": {"key": "t", "command": "python -m train", "log": "logs/train.log"},
                   "multi": {"key": "m", "command": "python -m train", "nodes": ["a", "b"], "launcher": "torchrun"}},
    }
    path.write_text(json.dumps({**RECORDING, "format": FORMAT, "made_at": RECORDING["probe"]["time"],
                                "config": tables, "target": gateway}))
    return path


async def _settle(pilot) -> None:
    """What a key opened, answered as an operator would (a .gguf for `o`), then closed again."""
    app = pilot.app
    await pilot.pause()
    if isinstance(app.screen, PathDialog):
        await pilot.press(*"models/out.gguf", "enter")
        await pilot.pause()
    while len(app.screen_stack) > 2:
        await app.pop_screen()
        await pilot.pause()
    if isinstance(app.focused, Input):
        await pilot.press("escape")
        await pilot.pause()


@pytest.mark.slow  # a Textual app, every key on every pane
async def test_every_key_of_a_replay_on_every_pane_asks_no_box(tmp_path: Path, listener: Listener,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOKEN_ENV, CANARY)
    monkeypatch.setenv(URLS_ENV, f"json://127.0.0.1:{listener.port}/{CANARY}")
    bundle = read_bundle(_crafted_bundle(tmp_path / "crafted.json", listener.port))
    assert [b.target.url for b in bundle.config.boxes] == [f"envelope+http://127.0.0.1:{listener.port}",
                                                           f"ssh://op@127.0.0.1:{listener.port}"]  # read as written
    environ = EnvironReads(os.environ)
    monkeypatch.setattr(os, "environ", environ)
    app = SamaiApp.replaying(bundle)
    toasts = collect_toasts(app)
    stage_keys = {s.key: s.name for s in bundle.config.stages}
    refused: set[str] = set()
    async with app.run_test(size=(150, 48)) as pilot:
        await pilot_until(pilot, lambda: app.state.snapshot is not None)  # the recording, shown
        panes = [None, *(w for w in app.box_screen.query("*") if w.focusable)]
        assert len(panes) >= 4
        for pane in panes:
            for key in [*(k for c in COMMANDS if c.id != "app.quit" for k in c.key.split(",") if k), *stage_keys]:
                app.set_focus(pane)
                await pilot.pause()
                active = app.screen.active_bindings.get(key)
                binding = active.binding if active is not None else None
                toasts.clear()
                await pilot.press(key)
                await _settle(pilot)
                said = REFUSAL in toasts
                if binding is not None and (binding.id in REACHES_BOX or key in stage_keys):
                    assert said, (key, binding.id, pane, toasts)
                    refused.add(binding.id or f"stage.{stage_keys[key]}")
                else:
                    assert not said, (key, binding, pane, toasts)
                assert not isinstance(app.screen, (FleetScreen, GgufScreen))
        # the palette offers nothing that would reach a box, and the ways in refuse when called
        titles = [c.title for c in app.get_system_commands(app.screen)]
        assert not [t for t in titles if any(w in str(t) for w in ("Open file", "Fleet", "Switch", "Fire", "Stop"))]
        for way in (lambda: app.open_box(app.config), app.nodes):
            with pytest.raises(NoBox, match=REFUSAL):
                way()
        toasts.clear()
        app.action_fleet()
        assert toasts == [REFUSAL]
        await pilot.pause()
    on_box_screen = {c.id for c in COMMANDS if c.scope in ("app", "box", "disk", "evals")} & REACHES_BOX
    assert on_box_screen | {"stage.train", "stage.multi"} <= refused
    assert listener.got == []  # not one connection, so no token was sent
    assert not environ.read & {TOKEN_ENV, URLS_ENV}


def test_every_key_is_either_inert_in_a_replay_or_reaches_a_box() -> None:
    """A new key is classed on purpose: it shows what the recording holds, or the replay refuses it."""
    assert INERT_KEYS == {c.id for c in COMMANDS} - REACHES_BOX


def test_a_replay_takes_no_box_factory() -> None:
    with pytest.raises(ValueError, match="no box"):
        SamaiApp(recorded_config(RECORDING), recording=RECORDING, open_box=lambda cfg: None)
