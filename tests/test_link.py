"""Outages over an emulated 100 ms link to a real sshd (issue 16, item 6): the CLI's `tail --follow`
and the TUI's log pane see the box go away and come back, and lose or repeat no line.

The console connects to the link emulator's port, which relays to sshd; known_hosts holds the
server's key for that port too, so the host key is checked as for any box."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from samai.console.app import SamaiApp
from samai.console.core import config
from samai.widgets.logview import LogView
from tests import sshd
from tests.helpers import pilot_until, wait_for
from tests.linkem import Link, Mode

# CI sets SAMAI_REQUIRE_SSHD=1, so that a missing server fails there instead of skipping quietly.
pytestmark = pytest.mark.skipif(not sshd.available() and not os.environ.get("SAMAI_REQUIRE_SSHD"),
                                reason="needs root and openssh-server (.ci/run installs it)")

RTT = 0.1
OUTAGE_S = 5.0  # longer than the keepalive's 1 s x 3: the console must notice it, not ride it out


@pytest.fixture(scope="module")
def sshd_server():
    srv = sshd.SshServer(sshd.new_root()).start()
    yield srv
    srv.stop()


@pytest.fixture
def link(sshd_server) -> Iterator[Link]:
    with Link("127.0.0.1", sshd_server.port, rtt=RTT) as lk:
        # The server's own key, for the address the console dials: checked, never skipped.
        kind, key = (sshd_server.root / "keys" / "host.pub").read_text().split()[:2]
        with open(sshd_server.client_home / ".ssh" / "known_hosts", "a") as f:
            f.write(f"[127.0.0.1]:{lk.port} {kind} {key}\n")
        yield lk


@pytest.fixture
def ssh_home(sshd_server, monkeypatch) -> Path:
    monkeypatch.setenv("HOME", str(sshd_server.client_home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    return sshd_server.client_home


def _config_file(workspace: Path, link: Link) -> Path:
    f = workspace.parent / "link.toml"
    f.write_text(f'[target]\nurl = "ssh://root@127.0.0.1:{link.port}"\npython = "{sys.executable}"\n'
                 'poll_interval = 0.3\ntimeout = 5\nkeepalive_interval = 1\nkeepalive_count = 3\n'
                 'connect_timeout = 3\n'
                 f'[workspace]\npath = "{workspace}"\n'
                 '[stages.slow]\nkey = "z"\ncommand = "sleep 30"\n')
    return f


def _append(log: Path, first: int, last: int) -> None:
    with open(log, "a") as f:
        f.write("".join(f"line {i}\n" for i in range(first, last + 1)))


class _Lines:
    """A stream's lines as they come, each with when it came (a reader thread: never blocks the test)."""

    def __init__(self, stream) -> None:
        self.lines: list[tuple[float, str]] = []
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream) -> None:
        for line in stream:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def texts(self) -> list[str]:
        return [text for _, text in self.lines]

    def first(self, word: str, since: float) -> float | None:
        return next((t for t, text in self.lines if word in text and t >= since), None)


def _outage(link: Link, mode: Mode, log: Path, first: int, last: int) -> float:
    """An outage while lines first..last are appended, half before and half after it ends; its start."""
    started = time.monotonic()
    link.outage(OUTAGE_S, mode=mode)
    middle = (first + last) // 2
    _append(log, first, middle)
    time.sleep(OUTAGE_S / 2)
    _append(log, middle + 1, last)
    return started


def test_the_cli_tail_follow_rides_out_a_blackhole_and_a_reset_over_a_slow_link(sshd_server, ssh_home, link,
                                                                                  workspace) -> None:
    log = workspace / "link.log"
    _append(log, 1, 10)
    proc = subprocess.Popen([sys.executable, "-m", "samai.console", "--config", str(_config_file(workspace, link)),
                             "tail", str(log), "-n", "10", "--follow"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ, HOME=str(ssh_home)))
    out, err = _Lines(proc.stdout), _Lines(proc.stderr)
    try:
        wait_for(lambda: len(out.lines) >= 10, 30)
        modes: tuple[Mode, ...] = ("blackhole", "reset")
        for n, mode in enumerate(modes):
            started = _outage(link, mode, log, 11 + 20 * n, 30 + 20 * n)
            wait_for(lambda n=n: sum("reconnected" in e for e in err.texts()) > n and len(out.lines) >= 30 + 20 * n,
                     30)
            noticed, back = err.first("not answering", started), err.first("reconnected", started)
            assert noticed and back, err.texts()
            print(f"\n{mode}: noticed after {noticed - started:.1f} s, "
                  f"reconnected {back - started - OUTAGE_S:.1f} s after the link came back")
        assert out.texts() == [f"line {i}" for i in range(1, 51)]
        assert proc.poll() is None
        assert link.stats().resets >= 1  # the reset outage did cut the live connection
    finally:
        proc.kill()
        proc.wait()


def _numbered(app: SamaiApp) -> list[str]:
    return [line for line in app.box_screen.query_one(LogView).lines if line.startswith("line ")]


async def test_the_tui_log_pane_loses_and_repeats_no_line_through_an_outage(sshd_server, ssh_home, link,
                                                                             workspace) -> None:
    log = workspace / "logs" / "slow.log"  # the first stage's: the log pane shows it from the start
    log.parent.mkdir()
    _append(log, 1, 10)
    app = SamaiApp(config.load(_config_file(workspace, link)))
    async with app.run_test(size=(140, 45)) as pilot:
        await pilot_until(pilot, lambda: app.connection.state == "connected" and len(_numbered(app)) >= 10, 30)
        started = time.monotonic()
        link.outage(OUTAGE_S)
        _append(log, 11, 20)
        await pilot_until(pilot, lambda: app.connection.state != "connected", 20)
        noticed = time.monotonic()
        _append(log, 21, 30)
        await pilot_until(pilot, lambda: app.connection.state == "connected" and len(_numbered(app)) >= 30, 30)
        print(f"\nTUI: noticed after {noticed - started:.1f} s, "
              f"connected {time.monotonic() - started - OUTAGE_S:.1f} s after the link came back")
        assert _numbered(app) == [f"line {i}" for i in range(1, 31)]
        assert app.connection.state == "connected"
