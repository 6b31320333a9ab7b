"""The SSH target against a real OpenSSH server on loopback (the box is this machine)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

import psutil
import pytest

from samai.console.app import SamaiApp
from samai.console.core import config
from samai.console.core.actions import Actions, Decision
from samai.console.core.audit import AuditLog
from samai.console.core.connect import open_box
from samai.remote.box.chainline import looks_like_chain
from samai.remote.boxapi import Box, BoxError
from samai.remote.follow import LogFollower
from samai.remote.ssh import SshOptions, SshTarget, SshTransport
from samai.remote.transport import TransportError, TransportTimeout
from tests import sshd
from tests.helpers import run_cli, until

# CI sets SAMAI_REQUIRE_SSHD=1, so that a missing server fails there instead of skipping quietly.
pytestmark = pytest.mark.skipif(not sshd.available() and not os.environ.get("SAMAI_REQUIRE_SSHD"),
                                reason="needs root and openssh-server (.ci/run installs it)")


@pytest.fixture(scope="module")
def sshd_server():
    srv = sshd.SshServer(sshd.new_root()).start()
    yield srv
    srv.stop()


@pytest.fixture
def ssh_home(sshd_server, monkeypatch) -> Path:
    """The operator's HOME: ~/.ssh/config with the alias, known_hosts, the key."""
    monkeypatch.setenv("HOME", str(sshd_server.client_home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    return sshd_server.client_home


def _transport(sshd_server, user: str = "root", **options) -> SshTransport:
    return SshTransport(SshTarget("127.0.0.1", user, sshd_server.port), SshOptions(**options))


@pytest.fixture
async def ssh_box(sshd_server, ssh_home, workspace):
    box = Box(_transport(sshd_server), str(workspace), python=sys.executable)
    yield box
    await box.close()


async def test_snapshot_over_ssh_sees_processes_and_listeners(ssh_box: Box, spawn) -> None:
    proc = spawn("sleep", "41.5")
    snap = await ssh_box.snapshot()
    seen = snap.process(proc.pid)
    assert seen and seen.argv == ("sleep", "41.5")
    assert abs(seen.start_time - psutil.Process(proc.pid).create_time()) < 0.05
    sshd_port = next(s for s in snap.listeners if s.port == ssh_box.transport.target.port)
    assert sshd_port.pid is not None


async def test_one_connection_serves_every_call(ssh_box: Box) -> None:
    for _ in range(5):
        await ssh_box.snapshot()
    assert ssh_box.transport.generation == 0  # never lost


async def test_channels_on_the_one_connection_are_bounded(sshd_server, ssh_home) -> None:
    transport = _transport(sshd_server, max_channels=2)
    before = set(sshd_server.session_processes())
    try:
        started = time.monotonic()
        calls = asyncio.gather(*(transport.run(["sleep", "0.5"], timeout=20) for _ in range(6)))
        # Two calls under way at once: as many connections as they took are open now.
        await until(lambda: sum(p.info["cmdline"] == ["sleep", "0.5"] for p in psutil.process_iter(["cmdline"])) >= 2)
        assert len(set(sshd_server.session_processes()) - before) == 1  # one connection carries them all
        assert all(r.rc == 0 for r in await calls)
        assert time.monotonic() - started >= 1.4  # six half-second calls, two at a time
    finally:
        await transport.close()


async def test_fire_stop_kill_and_tail_over_ssh(ssh_box: Box, workspace: Path, spawn) -> None:
    fired = await ssh_box.fire("remote", "echo started over ssh; sleep 60", "logs/remote.log", verify_s=0.5)
    assert fired.ok and fired.state == "running"
    chunk = await ssh_box.tail(str(workspace / "logs" / "remote.log"), last_lines=10)
    assert b"started over ssh" in chunk.data
    stopped = await ssh_box.stop("remote", grace=2)
    assert stopped.ok and stopped.result == "exited"
    assert not psutil.pid_exists(fired.pid) or psutil.Process(fired.pid).status() == psutil.STATUS_ZOMBIE

    victim = spawn("sleep", "42.5")
    start = psutil.Process(victim.pid).create_time()
    assert (await ssh_box.kill(victim.pid, start - 2, signal="KILL")).result == "refused"
    assert victim.poll() is None
    assert (await ssh_box.kill(victim.pid, start, signal="TERM", grace=2)).ok
    assert victim.wait(5) != 0


async def test_a_non_root_user_with_a_workspace_in_its_home(sshd_server, ssh_home) -> None:
    box = Box(_transport(sshd_server, user=sshd.TEST_USER), "samai/tiny")  # the box's own python3
    try:
        fired = await box.fire("whoami", "id -un; sleep 30", "logs/whoami.log", verify_s=0.5)
        assert fired.ok
        home = Path(f"/home/{sshd.TEST_USER}")
        said = (home / "samai" / "tiny" / "logs" / "whoami.log").read_text().splitlines()
        assert [line for line in said if not looks_like_chain(line)][0] == sshd.TEST_USER
        assert psutil.Process(fired.pid).username() == sshd.TEST_USER
        # a non-root user cannot signal root's processes, and says so
        me = psutil.Process()
        result = await box.kill(me.pid, me.create_time())
        assert not result.ok
        assert (await box.stop("whoami", grace=1)).ok
    finally:
        await box.close()


async def test_an_alias_from_ssh_config(sshd_server, ssh_home, workspace) -> None:
    cfg = config.load(_config_file(workspace, f"ssh://{sshd_server.alias}"))
    box = open_box(cfg)
    try:
        snap = await box.snapshot()
        assert snap.host and snap.processes
    finally:
        await box.close()


async def test_a_changed_host_key_is_refused_before_anything_runs(sshd_server, ssh_home, workspace, tmp_path) -> None:
    other = tmp_path / "other"
    sshd_server.write_known_hosts(sshd.keygen(other))  # known_hosts now holds a different key
    box = Box(_transport(sshd_server), str(workspace), python=sys.executable)
    try:
        with pytest.raises(TransportError, match="host key .* is not trusted.*known_hosts"):
            await box.snapshot()
        assert not (workspace / ".samai").exists()  # no upload, no command
        (ssh_home / ".ssh" / "known_hosts").write_text("")  # an unknown host: refused as well
        with pytest.raises(TransportError, match="not trusted"):
            await box.snapshot()
    finally:
        sshd_server.write_known_hosts((sshd_server.root / "keys" / "host.pub").read_text())
        await box.close()


async def test_a_cut_connection_resumes_the_tail_without_gaps_or_repeats(ssh_box: Box, sshd_server, workspace) -> None:
    log = workspace / "cut.log"
    follower = LogFollower(str(log), offset=0, max_bytes=4096)
    got: list[str] = []
    failures = 0
    with open(log, "w") as f:
        for burst in range(12):
            for i in range(150):
                f.write(f"burst {burst} line {i} {'z' * (i % 40)}\n")
            f.flush()
            if burst % 3 == 1:
                sshd_server.cut_connections()
            while True:
                try:
                    update = follower.consume(await ssh_box.read_log(follower.cursor()))
                except (TransportError, BoxError):
                    failures += 1
                    await asyncio.sleep(0.1)
                    continue
                got += update.lines
                if not update.more:
                    break
    assert failures >= 3 and ssh_box.transport.generation >= 3
    assert got == log.read_text().splitlines()


async def test_a_hung_command_hits_its_deadline_and_is_killed_on_the_box(sshd_server, ssh_home) -> None:
    transport = _transport(sshd_server)
    try:
        with pytest.raises(TransportTimeout, match="deadline"):  # the 77 s sleep would have ended without it
            await transport.run(["sleep", "77.25"], timeout=1.0)
        for _ in range(300):  # the box kills it after the call gave up: wait for that, 30 s at most
            left = [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", "77.25"]]
            if not left:
                break
            await asyncio.sleep(0.1)
        assert left == []
        assert (await transport.run(["echo", "still usable"], timeout=5)).stdout == b"still usable\n"
    finally:
        await transport.close()


async def test_injection_strings_stay_literal(ssh_box: Box, workspace: Path, tmp_path: Path) -> None:
    pwned = tmp_path / "pwned"
    name = "x'; touch samai-pwned #$(touch samai-pwned)`touch samai-pwned`;\necho"  # a file name
    (workspace / name).write_text("literal content\n")
    chunk = await ssh_box.tail(str(workspace / name), offset=0)
    assert chunk.data == b"literal content\n"
    evil = f"'; touch {pwned} #$(touch {pwned})`touch {pwned}`"
    fired = await ssh_box.fire("inj", 'printf "%s\\n" "$EVIL"', "logs/inj.log", env={"EVIL": evil}, verify_s=1.0)
    assert fired.state == "done"
    assert evil in (workspace / "logs" / "inj.log").read_text()
    odd = Box(ssh_box.transport, str(workspace / "it's a $(work) space"), python=sys.executable)
    assert (await odd.snapshot()).processes  # the workspace path itself is quoted, uploads work
    assert not pwned.exists()
    for cwd in (Path("/root"), workspace, Path.cwd()):  # wherever a shell would have run it
        assert not (cwd / "samai-pwned").exists()


async def test_a_fire_whose_connection_breaks_reports_what_happened(sshd_server, ssh_home, workspace,
                                                                    isolated_dirs) -> None:
    cfg = config.load(_config_file(workspace, sshd_server.url()))
    box = open_box(cfg)

    async def confirm(plan):
        return Decision.confirmed(plan, "test")

    actions = Actions(box, cfg, AuditLog(isolated_dirs / "audit.jsonl"), readonly=False, confirm=confirm)
    await box.snapshot()
    cut = asyncio.get_running_loop().call_later(1.0, sshd_server.cut_connections)  # while launch verifies
    try:
        outcome = await actions.fire("slow")
    finally:
        cut.cancel()
    assert not outcome.ok and "the box shows it was fired: pid" in outcome.message
    record = json.loads((workspace / ".samai" / "state" / "slow.json").read_text())
    assert f"pid {record['pid']}" in outcome.message
    assert len(list((workspace / ".samai" / "state").glob("slow.json"))) == 1  # fired once, not twice
    await box.stop("slow", grace=1)
    await box.close()


async def test_the_tui_over_ssh(sshd_server, ssh_home, workspace, spawn) -> None:
    victim = spawn("sleep", "43.75")
    app = SamaiApp(config.load(_config_file(workspace, sshd_server.url())))
    async with app.run_test(size=(140, 45)) as pilot:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not (app.state.snapshot and app.state.snapshot.process(victim.pid)):
            await pilot.pause(0.1)
        assert app.state.snapshot.process(victim.pid)
        assert app.connection.state == "connected"
        assert sshd_server.url() in str(app.box_screen.query_one("#status").render())


def test_the_cli_over_ssh(sshd_server, ssh_home, workspace) -> None:
    r = run_cli("--config", str(_config_file(workspace, sshd_server.url())), "snapshot", "--json",
                env={"HOME": str(ssh_home)})
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["processes"]
    bad = run_cli("--target", f"ssh://root@127.0.0.1:{sshd.free_port()}", "snapshot", env={"HOME": str(ssh_home)})
    assert bad.returncode == 2 and "cannot connect" in bad.stderr and bad.stderr.count("\n") == 1


def _config_file(workspace: Path, url: str) -> Path:
    f = workspace.parent / "ssh.toml"
    f.write_text(f'[target]\nurl = "{url}"\npython = "{sys.executable}"\npoll_interval = 0.3\n'
                 f'[workspace]\npath = "{workspace}"\n'
                 '[stages.slow]\nkey = "z"\ncommand = "sleep 30"\n')
    return f


def test_the_cli_tail_follow_over_ssh_resumes_after_its_connection_is_cut(sshd_server, ssh_home, workspace) -> None:
    """`tail --follow` over a real sshd whose connections are cut twice: it says so on stderr,
    reconnects, and prints every numbered line once."""
    import subprocess
    import threading

    from tests.helpers import wait_for

    log = workspace / "cli-cut.log"
    log.write_text("".join(f"line {i}\n" for i in range(1, 11)))
    proc = subprocess.Popen([sys.executable, "-m", "samai.console", "--config", str(_config_file(workspace,
                             sshd_server.url())), "tail", str(log), "-n", "10", "--follow"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ, HOME=str(ssh_home)))
    stderr: list[str] = []
    threading.Thread(target=lambda: stderr.extend(proc.stderr), daemon=True).start()
    try:
        seen = [proc.stdout.readline() for _ in range(10)]
        for cut in range(2):
            sshd_server.cut_connections()
            with open(log, "a") as f:
                f.write("".join(f"line {i}\n" for i in range(11 + 20 * cut, 31 + 20 * cut)))
            seen += [proc.stdout.readline() for _ in range(20)]
            assert wait_for(lambda cut=cut: sum("reconnected" in e for e in stderr) > cut, 30), stderr
        assert [line.strip() for line in seen] == [f"line {i}" for i in range(1, 51)]
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()
