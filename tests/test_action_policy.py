"""The action layer's one confirmation policy, through the real CLI, the real TUI and real processes.

A blocked plan needs an explicit override AND a confirmation; without a terminal and without
--yes nothing runs; what the operator saw (the CLI's prompt, the TUI's kill dialog) is the very
plan that runs; every pid the console stops on the operator's behalf is in the audit log."""

from __future__ import annotations

import json
import os
import pty
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from textual.widgets import Button, RadioButton, RadioSet, Static

from samai.console.app import SamaiApp
from samai.console.core import config
from samai.console.core.audit import AuditLog
from samai.console.screens.dialogs import KillDialog
from samai.widgets.processes import ProcessPane
from tests.helpers import pilot_until, start_time_of, wait_for
from tests.test_redact_shapes import SECRET_ENV, SECRETS, secret_stage_toml

PIPELINE = """
[target]
poll_interval = 0.2
python = "{python}"
[workspace]
path = "{ws}"
[artifacts.base]
path = "models/base"
[stages.needy]
key = "e"
command = "echo NEEDY RAN; sleep 37.125"
needs = ["base"]
[stages.plain]
key = "p"
command = "echo PLAIN RAN; sleep 38.375"
[stages.serve]
key = "v"
command = "{python} {listener}"
ports = [{port}]
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def port() -> int:
    return _free_port()


@pytest.fixture
def cfg_file(tmp_path: Path, workspace: Path, port: int) -> Path:
    listener = tmp_path / "listener.py"  # the serve stage's stand-in: it binds its port, or fails
    listener.write_text(f"import socket, time\ns = socket.socket()\ns.bind(('127.0.0.1', {port}))\ns.listen()\n"
                        "print('BOUND', flush=True)\ntime.sleep(30)\n")
    f = tmp_path / "policy.toml"
    f.write_text(PIPELINE.format(ws=workspace, python=sys.executable, port=port, listener=listener))
    return f


def _lines(isolated_dirs: Path) -> list[dict]:
    path = isolated_dirs / "xdg_state_home" / "samai" / "audit.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _cli(*args: str, stdin=subprocess.DEVNULL) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "samai.console", *args], capture_output=True, text=True,
                          stdin=stdin, timeout=60)


def _running(needle: str) -> list[int]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if any(needle in part for part in p.info["cmdline"] or ()):
            found.append(p.pid)
    return found


def _stop_stages(workspace: Path) -> None:
    for rec in (workspace / ".samai" / "state").glob("*.json"):
        pgid = json.loads(rec.read_text())["pid"]
        try:
            os.killpg(pgid, 9)
        except ProcessLookupError:
            pass


@pytest.mark.slow
def test_a_blocked_fire_needs_force_and_a_confirmation(cfg_file: Path, workspace: Path, isolated_dirs) -> None:
    record = workspace / ".samai" / "state" / "needy.json"
    try:
        r = _cli("--config", str(cfg_file), "fire", "needy", "--yes")  # a yes is no override
        said = [line for line in r.stderr.splitlines() if line.startswith("samai-console:")]
        assert r.returncode == 1 and len(said) == 1 and "add --force" in said[0], r.stderr

        r = _cli("--config", str(cfg_file), "fire", "needy", "--force")  # an override, but nobody confirmed it
        assert r.returncode == 1 and "--force --yes" in r.stderr, r.stderr
        assert not record.exists() and not _running("37.125")
        assert all(e["phase"] == "outcome" and e["confirmation"] == "declined" for e in _lines(isolated_dirs))

        r = _cli("--config", str(cfg_file), "fire", "needy", "--force", "--yes")
        assert r.returncode == 0, r.stderr
        pid = json.loads(record.read_text())["pid"]
        intent, outcome = _lines(isolated_dirs)[-2:]
        assert intent["phase"] == "intent" and intent["id"] == outcome["id"]
        assert (outcome["confirmation"], outcome["via"], outcome["result"]) == ("override", "--force --yes", "done")
        assert outcome["pid"] == pid and intent["blocked_by"] == ["needs base (models/base): missing"]
    finally:
        _stop_stages(workspace)


def _at_a_terminal(cfg_file: Path, answer: str, *args: str) -> subprocess.CompletedProcess:
    """The CLI with a terminal on stdin, the operator's answer already typed."""
    master, slave = pty.openpty()
    try:
        os.write(master, answer.encode() + b"\n")
        return subprocess.run([sys.executable, "-m", "samai.console", "--config", str(cfg_file), *args],
                              stdin=slave, capture_output=True, text=True, timeout=60)
    finally:
        os.close(slave)
        os.close(master)


@pytest.mark.slow
def test_force_at_a_terminal_shows_the_blocked_plan_and_runs_it_only_on_yes(cfg_file: Path, workspace: Path,
                                                                           isolated_dirs) -> None:
    record = workspace / ".samai" / "state" / "needy.json"
    try:
        r = _at_a_terminal(cfg_file, "n", "fire", "needy", "--force")
        assert r.returncode == 1 and "BLOCKED" in r.stderr and "echo NEEDY RAN; sleep 37.125" in r.stderr
        assert not record.exists() and not _running("37.125")
        r = _at_a_terminal(cfg_file, "y", "fire", "needy", "--force")
        assert r.returncode == 0, r.stderr
        assert "BLOCKED" in r.stderr and record.exists()
        outcome = _lines(isolated_dirs)[-1]
        assert (outcome["confirmation"], outcome["via"]) == ("override", "--force prompt")
    finally:
        _stop_stages(workspace)


@pytest.mark.slow
def test_the_prompt_and_the_audit_log_show_no_secret_of_any_shape(tmp_path: Path, workspace: Path,
                                                                  isolated_dirs) -> None:
    f = tmp_path / "leaky.toml"
    f.write_text(f'[target]\npython = "{sys.executable}"\n[workspace]\npath = "{workspace}"\n'
                 + secret_stage_toml("leaky", "j", then='printf "%s|%s" "$HF_TOKEN" "$DB_PASSWORD" > ran'))
    asked = _at_a_terminal(f, "n", "fire", "leaky")
    assert asked.returncode == 1 and "Proceed?" in asked.stdout + asked.stderr, asked.stderr
    shown = asked.stdout + asked.stderr
    assert "sshpass -p *** ssh -p 2222 op@gpu-box" in shown and "env DB_PASSWORD=***" in shown  # the plan is shown
    fired = _cli("--config", str(f), "fire", "leaky", "--yes")
    assert fired.returncode == 0, fired.stderr
    audit = (isolated_dirs / "xdg_state_home" / "samai" / "audit.jsonl").read_text()
    assert [e["phase"] for e in map(json.loads, audit.splitlines())] == ["outcome", "intent", "outcome"]
    assert [s for s in SECRETS if s in shown + fired.stdout + fired.stderr + audit] == []
    ran = workspace / "ran"  # what runs is the command and env as configured, secrets and all
    assert wait_for(lambda: ran.exists() and ran.read_text()) == f"{SECRET_ENV['HF_TOKEN']}|{SECRET_ENV['DB_PASSWORD']}"


@pytest.mark.slow
def test_a_stray_listener_is_stopped_by_the_fire_plan_and_audited_by_pid(cfg_file: Path, workspace: Path, port: int,
                                                                         spawn, isolated_dirs) -> None:
    stray = spawn(sys.executable, "-c", f"import socket,time\ns=socket.socket()\ns.bind(('127.0.0.1',{port}))\n"
                  "s.listen()\nprint('up', flush=True)\ntime.sleep(60)", stdout=subprocess.PIPE, text=True)
    assert stray.stdout.readline() == "up\n"
    started = start_time_of(stray.pid)
    try:
        # A holder the plan stops first is shown (pid, command) but does not block: no --force needed.
        r = _cli("--config", str(cfg_file), "fire", "serve", "--yes")
        assert r.returncode == 0, r.stderr
        assert f"pid {stray.pid}" in r.stderr and "will be stopped first" in r.stderr
        assert stray.wait(10) is not None
        log = workspace / "logs" / "serve.log"
        wait_for(lambda: "BOUND" in log.read_text())  # the stage found its port free

        lines = _lines(isolated_dirs)
        fire = next(e for e in lines if e["phase"] == "intent" and e["action"] == "fire")
        assert [(h["pid"], h["port"]) for h in fire["holders"]] == [(stray.pid, port)]
        assert abs(fire["holders"][0]["start_time"] - started) < 0.05
        kills = [e for e in lines if e["action"] == "kill" and e["pid"] == stray.pid]
        assert [e["phase"] for e in kills] == ["intent", "outcome"] and kills[0]["id"] == kills[1]["id"]
        assert kills[0]["parent"] == fire["id"] and kills[1]["result"] == "done"
        assert stray.pid in kills[1]["signalled"]
        fired = [e for e in lines if e["action"] == "fire" and e["phase"] == "outcome" and e["id"] == fire["id"]]
        assert fired and fired[0]["result"] == "done"
        # In the log's order: the fire's intent, then the kill, then the fire's outcome.
        order = [(e["action"], e["phase"]) for e in lines if e["confirmation"] != "declined"]
        assert order == [("fire", "intent"), ("kill", "intent"), ("kill", "outcome"), ("fire", "outcome")]
    finally:
        _stop_stages(workspace)


async def test_run_takes_only_a_decision_made_for_that_plan_and_fitting_it(tmp_path: Path, cfg_file: Path, box,
                                                                          workspace: Path) -> None:
    from samai.console.core.actions import Actions, Decision

    cfg = config.load(cfg_file)
    audit = AuditLog(tmp_path / "audit.jsonl")

    async def never(plan):
        raise AssertionError("not asked")

    actions = Actions(box, cfg, audit, readonly=False, confirm=never)
    plain, needy = await actions.plan_fire("plain"), await actions.plan_fire("needy")
    assert not plain.blocked and needy.blocked
    for plan, decision, why in (
            (plain, Decision.override(plain, "forged"), "not blocked"),  # an override for what was not shown blocked
            (needy, Decision.confirmed(needy, "--yes"), "explicit override"),  # a yes for a blocked plan
            (plain, Decision.confirmed(needy, "dialog"), "not given for this plan"),
            (plain, "--yes", "not given for this plan")):
        outcome = await actions.run(plan, decision)
        assert outcome.status == "refused" and why in outcome.message, outcome.message
    assert not (workspace / ".samai" / "state").exists() and not _running("38.375")
    assert all(json.loads(line)["phase"] == "outcome" for line in audit.path.read_text().splitlines())




def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def _kill_from_the_dialog(app: SamaiApp, pilot, leader: int, needle: str, scope: str, signal: str):
    """Select the process by a filter, press k, choose the scope, read the plan shown, press the signal."""
    pane = app.box_screen.query_one(ProcessPane)
    pane.table.focus()
    await pilot.press("slash")
    await pilot.press(*needle, "enter")
    await pilot_until(pilot, lambda: pane.selected() and pane.selected().pid == leader)
    await pilot.press("k")
    dialog = await pilot_until(pilot, lambda: isinstance(app.screen, KillDialog) and app.focused and app.screen)
    dialog.query_one(f"#scope-{scope}", RadioButton).value = True
    await pilot_until(pilot, lambda: dialog.group == (scope == "group"))
    shown = dialog.selected(signal)
    await pilot_until(pilot, lambda: shown.command in str(dialog.query_one("#plan", Static).render()))
    dialog.query_one(f"#{signal}", Button).press()
    await pilot_until(pilot, lambda: not app.busy and not isinstance(app.screen, KillDialog))
    return shown


def _chosen(dialog: KillDialog) -> list[tuple[list[bool], list[str]]]:
    """Each choice of the dialog: its buttons' values, and the mark each is drawn with."""
    return [([b.value for b in choice.query(RadioButton)], [str(b.render())[1] for b in choice.query(RadioButton)])
            for choice in dialog.query(RadioSet)]


@pytest.mark.slow
async def test_the_kill_dialog_draws_only_the_chosen_scope_as_chosen(tmp_path: Path, workspace: Path, spawn) -> None:
    f = tmp_path / "scope.toml"
    f.write_text(f'[target]\npoll_interval = 0.2\npython = "{sys.executable}"\n[workspace]\npath = "{workspace}"\n')
    victim = spawn("sleep", "53.25")
    app = SamaiApp(config.load(f))
    async with app.run_test(size=(140, 45)) as pilot:
        await pilot_until(pilot, lambda: app.state.snapshot and app.state.snapshot.process(victim.pid))
        pane = app.box_screen.query_one(ProcessPane)
        pane.table.focus()
        await pilot.press("slash")
        await pilot.press(*"53\\.25", "enter")
        await pilot_until(pilot, lambda: pane.selected() and pane.selected().pid == victim.pid)
        await pilot.press("k")
        dialog = await pilot_until(pilot, lambda: isinstance(app.screen, KillDialog) and app.focused and app.screen)
        assert _chosen(dialog) == [([True, False], ["●", "○"])]  # one choice, one button on: only it drawn filled
        assert dialog.query_one(RadioSet).pressed_button is dialog.query_one("#scope-process", RadioButton)
        await pilot.click("#scope-group")
        await pilot_until(pilot, lambda: dialog.group)
        assert _chosen(dialog) == [([False, True], ["○", "●"])]
        assert dialog.query_one(RadioSet).pressed_button is dialog.query_one("#scope-group", RadioButton)
        await pilot.press("escape")
        await pilot_until(pilot, lambda: not isinstance(app.screen, KillDialog) and not app.busy)
    assert victim.poll() is None


@pytest.mark.slow
async def test_the_kill_dialog_runs_the_plan_it_shows(tmp_path: Path, workspace: Path, spawn, isolated_dirs) -> None:
    f = tmp_path / "kill.toml"
    f.write_text(f'[target]\npoll_interval = 0.2\npython = "{sys.executable}"\n[workspace]\npath = "{workspace}"\n'
                 '[stages.a]\nkey = "d"\ncommand = "true"\n')
    # Two process groups, each a shell and two sleeps.
    one = spawn("setsid", "sh", "-c", "sleep 51.5 & sleep 51.5 & wait; echo group-one")
    two = spawn("setsid", "sh", "-c", "sleep 52.5 & sleep 52.5 & wait; echo group-two")
    members = {}
    for leader in (one, two):
        wait_for(lambda leader=leader: len(psutil.Process(leader.pid).children()) == 2)
        members[leader.pid] = [c.pid for c in psutil.Process(leader.pid).children()]
    app = SamaiApp(config.load(f))
    async with app.run_test(size=(140, 45)) as pilot:
        await pilot_until(pilot, lambda: app.state.snapshot and app.state.snapshot.process(two.pid))
        alone = await _kill_from_the_dialog(app, pilot, one.pid, "group-one", "process", "TERM")
        whole = await _kill_from_the_dialog(app, pilot, two.pid, "group-two", "group", "KILL")
    assert (alone.pid, alone.signal, alone.group) == (one.pid, "TERM", False)
    assert (whole.pid, whole.signal, whole.group) == (two.pid, "KILL", True)
    assert one.wait(10) is not None and all(_alive(p) for p in members[one.pid])  # the leader alone
    assert two.wait(10) is not None
    wait_for(lambda: not any(_alive(p) for p in members[two.pid]))  # the whole group
    for p in members[one.pid]:
        os.kill(p, 9)
    ran = [e for e in _lines(isolated_dirs) if e["action"] == "kill" and e["phase"] == "intent"]
    assert [(e["pid"], e["signal"], e["group"], e["command"]) for e in ran] == [
        (alone.pid, "TERM", False, alone.command), (whole.pid, "KILL", True, whole.command)]
    assert f"process group {two.pid}" in whole.command


@pytest.mark.slow
async def test_a_restart_is_not_blocked_by_its_own_server_and_stops_a_stray_one(cfg_file: Path, box, workspace: Path,
                                                                                port: int, spawn) -> None:
    from samai.console.core.actions import Actions, Decision

    cfg = config.load(cfg_file)
    shown = []

    async def operator(plan):  # confirms what it is shown; overrides only what it was shown blocked
        shown.append(plan)
        return Decision.override(plan, "test") if plan.blocked else Decision.confirmed(plan, "test")

    actions = Actions(box, cfg, AuditLog(workspace.parent / "audit.jsonl"), readonly=False, confirm=operator)
    log = workspace / "logs" / "serve.log"
    try:
        assert (await actions.fire("serve")).ok
        wait_for(lambda: "BOUND" in log.read_text())
        restart = await actions.plan_restart("serve")
        assert not restart.blocked and restart.holders == ()  # its own server goes with the stop
        await box.stop("serve", grace=1)

        stray = spawn(sys.executable, "-c", f"import socket,time\ns=socket.socket()\ns.bind(('127.0.0.1',{port}))\n"
                      "s.listen()\nprint('up', flush=True)\ntime.sleep(60)", stdout=subprocess.PIPE, text=True)
        assert stray.stdout.readline() == "up\n"
        outcome = await actions.restart("serve")
        assert outcome.ok, outcome.message
        # The stray is one the plan stops first (shown as such), not a blocker.
        assert not shown[-1].blocked and [h.pid for h in shown[-1].holders] == [stray.pid]
        assert any(f"pid {stray.pid}" in c.text and "will be stopped first" in c.text for c in shown[-1].checks)
        assert stray.wait(10) is not None
        wait_for(lambda: "BOUND" in log.read_text())
    finally:
        await box.stop("serve", grace=1)
