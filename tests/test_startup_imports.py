"""Start-up: the TUI's path imports no transport it does not use, nothing that only actions,
dialogs or `check` need, and no plotting library (the curves pane mounts its plot after the first
paint); the ssh and envelope targets still open through the same code path."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from samai.console.core import config
from samai.console.core.connect import open_box
from samai.remote.targets import open_transport
from tests.helpers import pilot_until

# What the TUI imports before its first paint (`samai-console` with no command, local target).
TUI_PATH = """
import json, sys
from samai.console import cli
from samai.console.core import config
from samai.console.app import SamaiApp
cfg = config.load()
SamaiApp(cfg, poll=False)
print(json.dumps(sorted(sys.modules)))
"""
# The box screen's session (the state, the detectors, the Box and the reply types) is made after
# the first paint, with the first poll; so are the commands' module and the plotting library.
SESSION = ("samai.console.core.session", "samai.console.core.state", "samai.console.core.detectors",
           "samai.console.core.connect", "samai.remote.boxapi", "samai.remote.model", "samai.remote.follow")
NOT_BEFORE_FIRST_PAINT = ("asyncssh", "httpx", "psutil", "samai.remote.ssh", "samai.remote.envelope",
                          "samai.console.core.actions", "samai.console.core.checks", "samai.console.screens.dialogs",
                          "samai.console.cli_box", "textual_plotext", "plotext", *SESSION)
# The TUI run (headless) to the moment after its first frame: what it has loaded then.
FIRST_PAINT = """
import asyncio, json, sys
from samai.console.core import config
from samai.console.app import SamaiApp
from samai.console.screens.box import BoxScreen

seen = []
start = BoxScreen._start

def first_frame_done(screen):
    seen.append(sorted(sys.modules))
    start(screen)

BoxScreen._start = first_frame_done

async def main():
    app = SamaiApp(config.load(), poll=False)
    async with app.run_test(size=(150, 45)) as pilot:
        while not seen:
            await pilot.pause(0.05)
        for _ in range(200):  # the session's modules load in a thread, after the first frame
            if app.box_screen.query_one("#log").border_title:  # the first stage's log, shown once they are
                break
            await pilot.pause(0.05)
        print(json.dumps({"then": seen[0], "after": sorted(sys.modules)}))

asyncio.run(main())
"""


@pytest.mark.slow
def test_the_tui_path_imports_no_transport_and_nothing_only_actions_need(tmp_path) -> None:
    done = subprocess.run([sys.executable, "-c", TUI_PATH], capture_output=True, text=True, timeout=60,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    loaded = set(json.loads(done.stdout.strip().splitlines()[-1]))
    assert "samai.console.app" in loaded and "samai.remote.local" in loaded
    assert sorted(loaded & set(NOT_BEFORE_FIRST_PAINT)) == []


@pytest.mark.slow
def test_the_box_screen_is_painted_before_its_session_is_loaded(tmp_path) -> None:
    done = subprocess.run([sys.executable, "-c", FIRST_PAINT], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path, env={**os.environ, "HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    modules = json.loads(done.stdout.strip().splitlines()[-1])
    assert sorted(set(modules["then"]) & set(SESSION)) == []  # painted without them
    assert set(SESSION) - {"samai.console.core.connect", "samai.remote.follow"} <= set(modules["after"])


def _config(tmp_path, url: str) -> config.Config:
    f = tmp_path / "t.toml"
    f.write_text(f'[target]\nurl = "{url}"\nkeepalive_interval = 7.0\nkeepalive_count = 4\nconnect_timeout = 3.0\n'
                 'max_channels = 2\ntoken_env = "MY_GATEWAY_TOKEN"\n')
    return config.load(f)


async def test_an_ssh_target_opens_its_transport_with_the_configured_options(tmp_path) -> None:
    from samai.remote.ssh import SshOptions, SshTarget, SshTransport

    box = open_box(_config(tmp_path, "ssh://ops@gpu-box:2222"))
    try:
        assert isinstance(box.transport, SshTransport)
        assert box.transport.target == SshTarget("gpu-box", "ops", 2222)
        assert box.transport.options == SshOptions(7.0, 4, 3.0, 2)
    finally:
        await box.close()  # nothing was connected
    assert isinstance(open_transport("ssh://gpu-box"), SshTransport)


async def test_an_envelope_target_opens_its_transport_with_the_configured_token_variable(tmp_path) -> None:
    from samai.remote.envelope import EnvelopeTransport

    box = open_box(_config(tmp_path, "envelope+http://127.0.0.1:9"))
    try:
        assert isinstance(box.transport, EnvelopeTransport)
        assert box.transport.token_env == "MY_GATEWAY_TOKEN"
    finally:
        await box.close()


async def test_the_curves_pane_plots_what_it_was_given_before_its_plot_was_mounted() -> None:
    from textual.app import App

    from samai.console.core.training.trainlog import TrainPoint
    from samai.widgets.curves import CurvesPane

    class Curves(App):
        def compose(self):
            pane = CurvesPane()
            pane.add([TrainPoint(step=s, loss=1.0 / s, grad_norm=1.0) for s in range(1, 6)])
            assert pane.plot is None
            yield pane

    app = Curves()
    async with app.run_test(size=(80, 20)) as pilot:
        pane = app.query_one(CurvesPane)
        await pilot_until(pilot, lambda: pane.plot is not None and pane.plot in pane.children)  # plotext loads first
        await pilot.pause()
        assert pane.border_subtitle == "5 steps"
        assert "loss" in "".join(line.text for line in pane.plot.render_lines(pane.plot.region.reset_offset))


def test_the_core_imports_neither_textual_nor_the_shell(tmp_path) -> None:
    """console/core is the domain: every module of it loads without Textual, the app or the CLI."""
    from pathlib import Path

    import samai.console.core as core

    names = sorted(p.stem for p in Path(core.__file__).parent.glob("*.py") if p.stem != "__init__")
    script = ("import json, sys\n" + "".join(f"import samai.console.core.{n}\n" for n in names)
              + "print(json.dumps(sorted(sys.modules)))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    loaded = set(json.loads(done.stdout.strip().splitlines()[-1]))
    assert len(names) >= 10 and {f"samai.console.core.{n}" for n in names} <= loaded
    shell = {m for m in loaded if m.split(".")[0] in ("textual", "rich") or m.startswith("samai.widgets")
             or m in ("samai.console.app", "samai.console.cli")}
    assert not shell, sorted(shell)
