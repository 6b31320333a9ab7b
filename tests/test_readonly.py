"""--readonly writes nothing on the box: no workspace, no tools, no state. Its probe runs from
stdin, and the read-only Box refuses every tool that changes the box by itself too."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from samai.console.app import SamaiApp
from samai.console.core import config
from samai.console.core.connect import open_box
from samai.remote.boxapi import Box, BoxError
from samai.remote.local import LocalTransport
from tests import sshd
from tests.helpers import action_layer, run_cli

CONFIG = """
[target]
poll_interval = 0.2
python = "{python}"
[workspace]
path = "{ws}"
[artifacts.base]
path = "models/base"
size_gb = 0.1
[stages.hello]
key = "h"
command = "echo hello"
"""


def _config_file(tmp_path: Path, workspace: Path, url: str = "local") -> Path:
    f = tmp_path / "ro.toml"
    f.write_text(CONFIG.format(python=sys.executable, ws=workspace).replace("[target]\n",
                                                                             f'[target]\nurl = "{url}"\n'))
    return f


@pytest.fixture
def missing_workspace(tmp_path: Path) -> Path:
    return tmp_path / "not-yet" / "ws"


@pytest.fixture
def readonly_workspace(tmp_path: Path) -> Path:
    """An empty workspace whose mode forbids writing (root ignores the mode: the console must not try)."""
    ws = tmp_path / "ro-ws"
    ws.mkdir()
    ws.chmod(0o555)
    yield ws
    ws.chmod(0o755)


def _contents(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() else ["(missing)"]


@pytest.mark.slow
def test_snapshot_in_readonly_creates_no_workspace(tmp_path, missing_workspace, spawn):
    victim = spawn("sleep", "47.25")
    f = _config_file(tmp_path, missing_workspace)
    r = run_cli("--config", str(f), "--readonly", "snapshot", "--json")
    assert r.returncode == 0, r.stderr
    assert f'"pid": {victim.pid}' in r.stdout  # a real snapshot: the probe ran
    assert not missing_workspace.parent.exists()
    r = run_cli("--config", str(f), "--readonly", "snapshot")
    assert r.returncode == 0 and "processes" in r.stdout, r.stderr
    assert not missing_workspace.parent.exists()


@pytest.mark.slow
def test_snapshot_fire_and_tail_in_readonly_leave_a_readonly_workspace_untouched(tmp_path, readonly_workspace):
    f = _config_file(tmp_path, readonly_workspace)
    r = run_cli("--config", str(f), "--readonly", "snapshot")
    assert r.returncode == 0, r.stderr
    r = run_cli("--config", str(f), "--readonly", "fire", "hello", "--yes")
    assert r.returncode == 1 and "read-only" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    r = run_cli("--config", str(f), "--readonly", "tail", str(f))
    assert r.returncode == 0 and "echo hello" in r.stdout, r.stderr
    assert _contents(readonly_workspace) == []
    assert stat.S_IMODE(readonly_workspace.stat().st_mode) == 0o555


@pytest.mark.slow
async def test_a_readonly_box_refuses_every_write_by_itself(missing_workspace, spawn):
    victim = spawn("sleep", "47.5")
    box = Box(LocalTransport(), str(missing_workspace), python=sys.executable, readonly=True)
    try:
        snap = await box.snapshot(artifacts=[("base", "models/base")])
        proc = snap.process(victim.pid)
        assert proc is not None and proc.argv == ("sleep", "47.5")
        for attempt in (lambda: box.fire("hello", "echo hi", "logs/hello.log"),
                        lambda: box.stop("hello"),
                        lambda: box.kill(victim.pid, proc.start_time, boot=snap.boot),
                        lambda: box.remove(["models"]),
                        lambda: box.ensure_tools()):
            with pytest.raises(BoxError, match="read-only"):
                await attempt()
        assert (await box.snapshot()).process(victim.pid)  # and it reads on
    finally:
        await box.close()
    assert victim.poll() is None
    assert not missing_workspace.parent.exists()


async def test_the_readonly_probe_reads_logs_and_files_without_its_tools_installed(tmp_path, readonly_workspace):
    log = tmp_path / "train.log"
    log.write_text("".join(f"step {i}\n" for i in range(100)))
    cfg = config.load(_config_file(tmp_path, readonly_workspace))
    box = open_box(cfg, readonly=True)
    try:
        chunk = await box.tail(str(log), last_lines=3)
        assert chunk.data == b"step 97\nstep 98\nstep 99\n"
        assert await box.read_range(str(log), 0, 6) == b"step 0\n"
    finally:
        await box.close()
    assert _contents(readonly_workspace) == []


@pytest.mark.slow
async def test_the_tui_in_readonly_polls_without_writing(tmp_path, missing_workspace):
    app = SamaiApp(config.load(_config_file(tmp_path, missing_workspace)), readonly=True)
    async with app.run_test(size=(140, 45)) as pilot:
        deadline = time.monotonic() + 20
        polls = set()
        while len(polls) < 4 and time.monotonic() < deadline:  # a few polls, each a real probe reply
            if app.state.snapshot is not None:
                polls.add(app.state.snapshot.time)
            await pilot.pause(0.1)
        assert len(polls) >= 4
        assert app.connection.state == "connected"
        outcome = await action_layer(app).fire("hello")
        assert outcome.status == "refused"
    assert not missing_workspace.parent.exists()


# ------------------------------------------------------------------ over a real SSH server

needs_sshd = pytest.mark.skipif(not sshd.available() and not os.environ.get("SAMAI_REQUIRE_SSHD"),
                                reason="needs root and openssh-server (.ci/run installs it)")


@pytest.fixture(scope="module")
def sshd_server():
    srv = sshd.SshServer(sshd.new_root()).start()
    yield srv
    srv.stop()


@needs_sshd
async def test_readonly_over_ssh_writes_nothing(sshd_server, tmp_path, monkeypatch, spawn):
    monkeypatch.setenv("HOME", str(sshd_server.client_home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    workspace = tmp_path / "remote-ws"
    victim = spawn("sleep", "47.75")
    cfg = config.load(_config_file(tmp_path, workspace, sshd_server.url()))
    box = open_box(cfg, readonly=True)
    try:
        assert (await box.snapshot()).process(victim.pid)
        assert (await box.snapshot()).process(victim.pid)  # the same probe, asked again
        with pytest.raises(BoxError, match="read-only"):
            await box.fire("hello", "echo hi", "logs/hello.log")
    finally:
        await box.close()
    assert not workspace.exists()
    r = run_cli("--config", str(_config_file(tmp_path, workspace, sshd_server.url())), "--readonly", "snapshot",
                "--json", env={"HOME": str(sshd_server.client_home)})
    assert r.returncode == 0 and f'"pid": {victim.pid}' in r.stdout, r.stderr
    assert not workspace.exists()


# ------------------------------------------------------------------ through the exec gateway

TOKEN = "readonly-test-token"


@pytest.fixture
def gateway(tmp_path, monkeypatch):
    home = tmp_path / "gw"
    home.mkdir()
    monkeypatch.setenv("SAMAI_ENVELOPE_TOKEN", TOKEN)
    proc = subprocess.Popen([sys.executable, "-m", "samai.console", "envelope-server", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=home)
    try:
        line = proc.stdout.readline()
        assert line.startswith("listening on http://"), line
        yield "envelope+" + line.split()[-1]
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.slow
async def test_readonly_through_the_gateway_sends_the_probe_with_every_request(tmp_path, gateway, spawn):
    workspace = tmp_path / "gw-ws"
    victim = spawn("sleep", "47.8")
    box = open_box(config.load(_config_file(tmp_path, workspace, gateway)), readonly=True)
    try:
        for _ in range(2):  # each request is a new process on the box: each one gets the probe's code
            assert (await box.snapshot()).process(victim.pid)
        with pytest.raises(BoxError, match="read-only"):
            await box.remove(["models"])
    finally:
        await box.close()
    assert not workspace.exists()
