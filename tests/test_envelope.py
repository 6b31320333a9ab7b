"""The envelope target against the reference gateway, a real HTTP server on loopback."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from samai.console.app import SamaiApp
from samai.console.core import config
from samai.remote.boxapi import Box
from samai.remote.envelope import EnvelopeTransport, put_payload, run_payload
from samai.remote.payload_lint import lint
from samai.remote.transport import TransportError
from tests.helpers import run_cli, start_time_of

TOKEN = "tok-" + "s3cret" * 6


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    """The reference gateway as an operator runs it: `samai-console envelope-server`."""
    home = tmp_path_factory.mktemp("gw")  # the gateway's cwd: where relative workspaces land
    log = home / "gateway.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "samai.console", "envelope-server", "--port", "0", "--faults"],
                                stdout=subprocess.PIPE, stderr=err, text=True, cwd=home,
                                env={**os.environ, "SAMAI_ENVELOPE_TOKEN": TOKEN})
        line = proc.stdout.readline()
        assert line.startswith("listening on http://"), line
        yield {"url": "envelope+" + line.split()[-1], "base": line.split()[-1], "log": log, "proc": proc}
        proc.terminate()
        proc.wait(10)


@pytest.fixture
def token(monkeypatch) -> str:
    monkeypatch.setenv("SAMAI_ENVELOPE_TOKEN", TOKEN)
    return TOKEN


@pytest.fixture
async def envelope_box(gateway, token, workspace):
    box = Box(EnvelopeTransport(gateway["url"], backoff=0.05), str(workspace), python=sys.executable)
    yield box
    await box.close()


def test_every_generated_payload_passes_the_linter() -> None:
    for payload in (run_payload(["python3", "-S", "/ws/.samai/tools/x/probe.py"], b'{"a": 1}', 30),
                    run_payload(["test", "-f", "it's \"quoted\""], b"", 5),
                    put_payload("/ws/.samai/tools/x/stages/train.py", b"\x00\xff" * 100, 0o644)):
        assert lint(payload) == []


@pytest.mark.slow
async def test_snapshot_fire_stop_kill_and_tail_over_the_envelope(envelope_box: Box, workspace: Path, spawn):
    victim = spawn("sleep", "44.5")
    snap = await envelope_box.snapshot()
    assert snap.process(victim.pid).argv == ("sleep", "44.5")
    fired = await envelope_box.fire("env", "echo through the gateway; sleep 30", "logs/env.log", verify_s=0.5)
    assert fired.ok and fired.state == "running"
    chunk = await envelope_box.tail(str(workspace / "logs" / "env.log"), offset=0)
    assert b"through the gateway" in chunk.data
    assert (await envelope_box.stop("env", grace=1)).ok
    start = start_time_of(victim.pid)
    assert (await envelope_box.kill(victim.pid, start - 5)).result == "refused"  # a second off may be btime
    assert (await envelope_box.kill(victim.pid, start, grace=1)).ok and victim.wait(5) != 0


@pytest.mark.slow
async def test_the_token_stays_out_of_urls_logs_and_process_lists(envelope_box: Box, gateway) -> None:
    seen_args = []
    task = asyncio.create_task(envelope_box.fire("t", "sleep 2.125", "logs/t.log", verify_s=1.0))
    while not task.done():  # every process list while the fire goes through the gateway
        seen_args += [" ".join(p.info["cmdline"] or []) for p in psutil.process_iter(["cmdline"])]
        await asyncio.sleep(0.05)
    await task
    assert any("sleep 2.125" in args for args in seen_args)  # the lists were taken while the stage ran
    assert not any(TOKEN in args for args in seen_args)
    assert TOKEN not in gateway["log"].read_text()
    assert TOKEN not in envelope_box.transport.base


async def test_without_the_token_the_call_is_refused_with_the_reason(gateway, workspace, monkeypatch) -> None:
    monkeypatch.setenv("SAMAI_ENVELOPE_TOKEN", "wrong")
    box = Box(EnvelopeTransport(gateway["url"]), str(workspace), python=sys.executable)
    with pytest.raises(TransportError, match="refused the token.*401"):
        await box.snapshot()
    monkeypatch.delenv("SAMAI_ENVELOPE_TOKEN")
    with pytest.raises(TransportError, match="set the environment variable SAMAI_ENVELOPE_TOKEN"):
        await box.snapshot()
    await box.close()


async def test_long_synchronous_calls_are_refused(gateway, token) -> None:
    transport = EnvelopeTransport(gateway["url"])
    with pytest.raises(TransportError, match="at most 120 s"):
        await transport.run(["sleep", "1"], timeout=300)
    await transport.close()


@pytest.mark.slow
async def test_the_tui_over_the_envelope(gateway, token, workspace, spawn) -> None:
    victim = spawn("sleep", "45.25")
    f = workspace.parent / "env.toml"
    f.write_text(f'[target]\nurl = "{gateway["url"]}"\npython = "{sys.executable}"\npoll_interval = 0.3\n'
                 f'[workspace]\npath = "{workspace}"\n[stages.a]\nkey = "z"\ncommand = "true"\n')
    app = SamaiApp(config.load(f))
    async with app.run_test(size=(140, 45)) as pilot:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not (app.state.snapshot and app.state.snapshot.process(victim.pid)):
            await pilot.pause(0.1)
        assert app.connection.state == "connected" and app.state.snapshot.process(victim.pid)


@pytest.mark.slow
def test_the_cli_over_the_envelope(gateway, workspace) -> None:
    r = run_cli("--target", gateway["url"], "snapshot", "--json", env={"SAMAI_ENVELOPE_TOKEN": TOKEN})
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["processes"]
    r = run_cli("--target", gateway["url"], "snapshot", env={"SAMAI_ENVELOPE_TOKEN": "nope"})
    assert r.returncode == 2 and "401" in r.stderr and "nope" not in r.stderr


def arm(gateway, mode: str, count: int = 1, **extra) -> None:
    import httpx

    r = httpx.post(f"{gateway['base']}/_faults", json={"mode": mode, "count": count, **extra},
                   headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200, r.text


@pytest.mark.slow
async def test_reads_survive_500_503_and_a_cut_body(envelope_box: Box, gateway) -> None:
    await envelope_box.snapshot()
    for mode in ("500", "503", "close_mid_body"):
        arm(gateway, mode, retry_after_s=0) if mode == "503" else arm(gateway, mode)
        assert (await envelope_box.snapshot()).processes  # retried: a read may run twice


@pytest.mark.slow
async def test_a_hang_and_a_trickle_hit_the_overall_deadline(gateway, token) -> None:
    transport = EnvelopeTransport(gateway["url"], margin=1.0)
    for mode in ("hang", "trickle"):
        arm(gateway, mode)
        # The gateway would hang for 180 s and trickle for longer than 3 s: the error is the client's own deadline.
        async with asyncio.timeout(60):  # only catches a hang
            with pytest.raises(TransportError, match="did not answer within 3 s"):
                await transport.run(["true"], timeout=2)
    await transport.close()


@pytest.mark.slow
@pytest.mark.parametrize("mode, ran", [("500", False), ("silent_spawn", False), ("close_mid_body", True)])
async def test_a_fire_that_breaks_is_sent_once_and_reported_from_the_box(gateway, token, workspace, isolated_dirs,
                                                                         mode, ran) -> None:
    from samai.console.core.actions import Actions, Decision
    from samai.console.core.audit import AuditLog
    from samai.console.core.connect import open_box

    f = workspace.parent / "fire.toml"
    f.write_text(f'[target]\nurl = "{gateway["url"]}"\npython = "{sys.executable}"\n'
                 f'[workspace]\npath = "{workspace}"\n[stages.once]\nkey = "z"\ncommand = "echo fired; sleep 20"\n')
    cfg = config.load(f)
    box = open_box(cfg)

    async def confirm(plan):
        return Decision.confirmed(plan, "test")

    actions = Actions(box, cfg, AuditLog(isolated_dirs / "audit.jsonl"), readonly=False, confirm=confirm)
    await box.snapshot()  # tools in place: the fault hits the launch itself
    arm(gateway, mode, after=1)  # the preflight's snapshot goes through, the launch does not
    outcome = await actions.fire("once")
    assert not outcome.ok
    expected = "the box shows it was fired" if ran else "the box shows no new launch"
    assert expected in outcome.message, outcome.message
    log = workspace / "logs" / "once.log"
    assert (log.read_text().count("=== samai chain once") if log.exists() else 0) == (1 if ran else 0)
    assert TOKEN not in (isolated_dirs / "audit.jsonl").read_text()  # audited, without the token
    if ran:
        await box.stop("once", grace=1)
    await box.close()


@pytest.mark.slow
def test_lint_payload_on_the_command_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import os\nnames = [n for n in os.listdir('.')]\ndef f():\n    return os.getpid()\n")
    r = run_cli("lint-payload", str(bad))
    assert r.returncode == 1 and f"{bad}:2:" in r.stdout and "no-comprehension" in r.stdout and "no-def" in r.stdout
    good = tmp_path / "good.py"
    good.write_text(run_payload(["true"], b"", 5))
    assert run_cli("lint-payload", str(good)).returncode == 0
