"""The fix one key away is the right one: a running server's key restarts it, a port held by a
process the plan stops is not a blocker (and its holder is shown whole), eval needs its server
up and says once when it is down, a failed fire stays as an alert, and the disk reserve is
an alert that holds back only the stages that write. Real processes, sockets and the real TUI."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from samai.console.app import SamaiApp
from samai.console.core import config, units
from samai.console.core.detectors import detect
from samai.console.core.disk.budget import disk_budget
from samai.console.core.preflight import poison_artifacts, preflight
from samai.console.screens.dialogs import ConfirmDialog
from samai.widgets.alerts import AlertsPane
from samai.widgets.disk import DiskPane
from tests.box_tools import stage_argv, stage_env
from tests.helpers import confirm_dialog, pilot_until, start_time_of

SIZE = (140, 45)
LONG_TAG = "--tag=" + "previous-run-of-serve-" * 6  # far past the 50 characters a check once kept

PIPE = """
pipeline = "fixpaths"
[target]
poll_interval = 0.2
python = "{python}"
[workspace]
path = "{ws}"
[budget]
reserve_gb = {reserve}
[artifacts.base]
path = "models/base"
size_gb = 0.00001
[artifacts.merged]
path = "models/merged"
size_gb = 0.00002
intermediate = true
[artifacts.gguf]
path = "out.gguf"
size_gb = 0.00001
[stages.convert]
key = "t"
command = "echo CONVERTED > out.gguf"
needs = ["merged"]
makes = ["gguf"]
frees = ["merged"]
[stages.serve]
key = "v"
command = "{serve}"
ports = [{port}]
[stages.eval]
key = "e"
command = "{python} -m samai_box.stages.eval --url http://127.0.0.1:{port} --data data/eval.jsonl --out runs/eval/one \
--max-tokens 4"
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def port() -> int:
    return _free_port()


@pytest.fixture
def listener(tmp_path: Path, port: int) -> Path:
    """The serve stage's stand-in: binds its port (its arguments only make its command line long)."""
    script = tmp_path / "listener.py"
    script.write_text(f"import socket, time\ns = socket.socket()\ns.bind(('127.0.0.1', {port}))\ns.listen()\n"
                      "print('BOUND', flush=True)\ntime.sleep(60)\n")
    return script


def _config(tmp_path: Path, ws: Path, port: int, serve: str = "true", reserve: float = 0) -> config.Config:
    f = tmp_path / "fixpaths.toml"
    f.write_text(PIPE.format(python=sys.executable, ws=ws, reserve=reserve, port=port, serve=serve))
    return config.load(f)




def _dialog_text(dialog: ConfirmDialog) -> str:
    return "\n".join(str(w.render()) for w in dialog.query("Static"))


def _record(ws: Path, stage: str) -> dict:
    path = ws / ".samai" / "state" / f"{stage}.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _alive(ws: Path, stage: str) -> bool:
    pid = _record(ws, stage).get("pid")
    return bool(pid) and psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# ------------------------------------------------------------------ item 7: replacing a server


@pytest.mark.slow
async def test_the_key_of_a_running_stage_opens_its_restart(tmp_path, workspace, port, listener):
    cfg = _config(tmp_path, workspace, port, serve=f"{sys.executable} {listener}")
    app = SamaiApp(cfg)
    async with app.run_test(size=SIZE) as pilot:
        await pilot_until(pilot, lambda: app.state.snapshot)
        await pilot.press("v")
        dialog = await pilot_until(pilot, lambda: isinstance(app.screen, ConfirmDialog) and app.focused and app.screen)
        assert dialog.plan.action == "fire"
        await confirm_dialog(pilot)
        await pilot_until(pilot, lambda: (workspace / "logs" / "serve.log").exists()
                     and "BOUND" in (workspace / "logs" / "serve.log").read_text())
        first = _record(workspace, "serve")["pid"]
        await pilot_until(pilot, lambda: not app.busy and app.state.snapshot.state("serve")
                     and app.state.snapshot.state("serve").alive
                     and any(s.port == port for s in app.state.snapshot.listeners))

        await pilot.press("v")  # the server runs: its key offers the restart, not a fire the box refuses
        dialog = await pilot_until(pilot, lambda: isinstance(app.screen, ConfirmDialog) and app.focused and app.screen)
        assert dialog.plan.action == "restart" and not dialog.plan.blocked
        assert dialog.plan.details[0].startswith(f"stage serve is running (pid {first}): its key restarts it")
        text = _dialog_text(dialog)
        assert "restart stage serve" in text and "already running" not in text
        assert f"port {port} is held by this stage's own run: restart stops it first" in text
        assert str(dialog.query_one("#confirm").label) == "Confirm restart"
        await confirm_dialog(pilot)
        await pilot_until(pilot, lambda: _record(workspace, "serve").get("pid") not in (None, first)
                     and _alive(workspace, "serve"))
        await pilot_until(pilot, lambda: not psutil.pid_exists(first) or psutil.Process(first).status() == "zombie")
        await pilot_until(pilot, lambda: not app.busy)


@pytest.mark.slow
async def test_a_port_held_by_the_stages_previous_run_is_shown_whole_and_restart_replaces_it(tmp_path, workspace,
                                                                                             port, listener):
    # The previous run: its chain was killed hard (SIGKILL: its end never ran, nothing stopped its
    # survivors), its server (same group) still holds the port.
    cfg = _config(tmp_path, workspace, port, serve=f"{sys.executable} {listener} {LONG_TAG}")
    app = SamaiApp(cfg)
    async with app.run_test(size=SIZE) as pilot:
        await pilot_until(pilot, lambda: app.state.snapshot)
        await pilot.press("v")
        await pilot_until(pilot, lambda: isinstance(app.screen, ConfirmDialog) and app.focused)
        await confirm_dialog(pilot)
        serve_log = workspace / "logs" / "serve.log"  # written once the fire has started the chain
        await pilot_until(pilot, lambda: serve_log.exists() and "BOUND" in serve_log.read_text() and not app.busy)
        os.kill(_record(workspace, "serve")["pid"], signal.SIGKILL)

        def server():
            snap = app.state.snapshot
            held = [s for s in snap.listeners if s.port == port and s.pid] if not app.busy else []
            rec = snap.state("serve")
            return snap.process(held[0].pid) if held and rec and rec.status != "running" else None

        holder = await pilot_until(pilot, server)
        assert LONG_TAG in holder.command and "CHAIN_DONE" not in (workspace / "logs" / "serve.log").read_text()
        pre = preflight(cfg, app.state.snapshot, cfg.stage("serve"))
        check = next(c for c in pre.checks if f"port {port}" in c.text)
        assert check.severity == "warning" and "held (this stage's previous run): will be stopped first" in check.text
        assert f"pid {holder.pid}" in check.text and holder.command in check.text  # whole, not cut at 50
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.start_time))
        assert re.search(rf"started {re.escape(when)} \(\d+s ago\)", check.text)
        assert str(int(holder.start_time)) not in check.text  # no raw epoch

        await pilot.press("v")  # its key offers the fire, which stops the old server first, by pid and start time
        dialog = await pilot_until(pilot, lambda: isinstance(app.screen, ConfirmDialog) and app.focused and app.screen)
        assert dialog.plan.action == "fire" and not dialog.plan.blocked
        assert [h.pid for h in dialog.plan.holders] == [holder.pid]
        text = _dialog_text(dialog)
        assert holder.command in text and f"started {when} (" in text and "✗" not in text
        assert str(dialog.query_one("#confirm").label) == "Confirm fire"
        await confirm_dialog(pilot)
        await pilot_until(pilot, lambda: not psutil.pid_exists(holder.pid)
                     or psutil.Process(holder.pid).status() == "zombie")
        await pilot_until(pilot, lambda: not app.busy)
        await pilot_until(pilot, lambda: (workspace / "logs" / "serve.log").read_text().count("BOUND") >= 1
                     and any(s.port == port and s.pid not in (None, holder.pid) for s in app.state.snapshot.listeners))


@pytest.mark.slow
async def test_a_stray_holder_is_stopped_first_not_a_blocker_and_shown_whole(tmp_path, workspace, port, listener,
                                                                             spawn):
    stray = spawn(sys.executable, str(listener), LONG_TAG, stdout=subprocess.PIPE, text=True)
    assert stray.stdout.readline() == "BOUND\n"
    command = " ".join(psutil.Process(stray.pid).cmdline())
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(start_time_of(stray.pid)))
    app = SamaiApp(_config(tmp_path, workspace, port, serve=f"{sys.executable} {listener}"))
    async with app.run_test(size=SIZE) as pilot:
        await pilot_until(pilot, lambda: app.state.snapshot
                     and any(s.pid == stray.pid for s in app.state.snapshot.listeners))
        await pilot.press("v")
        dialog = await pilot_until(pilot, lambda: isinstance(app.screen, ConfirmDialog) and app.focused and app.screen)
        assert dialog.plan.action == "fire" and not dialog.plan.blocked
        assert [h.pid for h in dialog.plan.holders] == [stray.pid]
        check = next(c for c in dialog.plan.checks if f"port {port}" in c.text)
        assert check.severity == "warning" and "will be stopped first" in check.text
        text = _dialog_text(dialog)
        assert text.count(command) == 2  # in the check and in the plan's step, whole both times
        assert text.count(f"started {when} (") == 2
        assert str(dialog.query_one("#confirm").label) == "Confirm fire"  # not "Fire anyway"
        await confirm_dialog(pilot)
        assert stray.wait(15) is not None
        await pilot_until(pilot, lambda: not app.busy)
        await pilot_until(pilot, lambda: "BOUND" in (workspace / "logs" / "serve.log").read_text())


# ------------------------------------------------------------------ item 9: eval against a server that is down


async def test_eval_preflight_blocks_while_nothing_listens_and_passes_with_a_listener(tmp_path, workspace, port, box):
    cfg = _config(tmp_path, workspace, port)
    eval_stage = cfg.stage("eval")
    pre = preflight(cfg, await box.snapshot(), eval_stage)
    assert pre.blocked
    assert any(c.severity == "error" and f"nothing listens on port {port}" in c.text
               and "fire serve (key v) first" in c.text for c in pre.checks)

    server = socket.socket()
    server.bind(("127.0.0.1", port))
    server.listen()
    try:
        pre = preflight(cfg, await box.snapshot(), eval_stage)
    finally:
        server.close()
    assert not pre.blocked
    assert any(c.severity == "ok" and f"port {port} is listening (pid {os.getpid()})" in c.text for c in pre.checks)


def _eval_data(ws: Path, n: int = 64) -> None:
    (ws / "data").mkdir(exist_ok=True)
    (ws / "data" / "eval.jsonl").write_text("".join(json.dumps({"id": i, "prompt": f"{i}*2", "gold": 2 * i}) + "\n"
                                                    for i in range(n)))


def test_eval_against_a_closed_port_says_so_once_and_fails(workspace):
    _eval_data(workspace)
    with socket.socket() as closed:  # bound, never listening: every connection is refused
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        run = subprocess.run(stage_argv("stages.eval", "--url", f"http://127.0.0.1:{port}", "--data",
                                        "data/eval.jsonl", "--out", "runs/eval/down"), env=stage_env(), cwd=workspace,
                             capture_output=True, text=True, timeout=60)
    lines = run.stdout.splitlines()
    assert run.returncode == 2
    refused = [line for line in lines if "refused" in line.lower()]
    assert len(refused) == 1, lines  # once, not once per item
    assert refused[0].startswith(f"cannot reach the server at http://127.0.0.1:{port}")
    assert "stopped at item 1 of 64" in refused[0]
    assert lines[-1] == f"EVAL_RC=2 server unreachable at http://127.0.0.1:{port}: 0 of 64 items asked"
    summary = json.loads((workspace / "runs" / "eval" / "down" / "summary.json").read_text())
    assert summary["errors"] == 64 and summary["n"] == 0 and summary["unreachable"] == f"http://127.0.0.1:{port}"


@pytest.mark.slow
async def test_a_failed_fire_stays_in_the_alerts_pane(tmp_path, workspace, port):
    _eval_data(workspace)
    app = SamaiApp(_config(tmp_path, workspace, port))
    async with app.run_test(size=SIZE) as pilot:
        await pilot_until(pilot, lambda: app.state.snapshot)
        await pilot.press("e")
        dialog = await pilot_until(pilot, lambda: isinstance(app.screen, ConfirmDialog) and app.focused and app.screen)
        assert dialog.plan.blocked and "nothing listens on port" in _dialog_text(dialog)
        await confirm_dialog(pilot)  # "Fire anyway"
        alert = await pilot_until(
            pilot, lambda: next((a for a in app.state.alerts if "cannot reach the server" in a.text), None))
        assert alert.severity == "error" and alert.stage == "eval" and "stage eval failed" in alert.text
        box = app.box_screen
        await pilot_until(pilot, lambda: "cannot reach the server" in str(box.query_one(AlertsPane).render()))
        # It belongs to that run: polls that see the run do not resolve it (the next run will).
        pid = _record(workspace, "eval")["pid"]
        seen = await pilot_until(pilot, lambda: getattr(app.state.snapshot.state("eval"), "pid", None) == pid
                            and app.state.received_at)
        await pilot_until(pilot, lambda: app.state.received_at > seen)
        assert any("cannot reach the server" in a.text for a in app.state.active_alerts())


# ------------------------------------------------------------------ item 10: disk


def _snapshot_args(cfg: config.Config) -> dict:
    return {"artifacts": [(a.name, a.path) for a in cfg.artifacts] + poison_artifacts(cfg)}


@pytest.mark.slow
async def test_a_reserve_above_the_free_space_is_an_alert_and_holds_back_only_writing_stages(tmp_path, workspace,
                                                                                             port, box):
    (workspace / "models" / "merged").mkdir(parents=True)
    (workspace / "models" / "merged" / "w.bin").write_bytes(b"m" * 20_000)
    reserve = shutil.disk_usage(workspace).free / 1e9 + 1  # a gigabyte more than is free now
    cfg = _config(tmp_path, workspace, port, reserve=round(reserve, 3))
    snap = await box.snapshot(**_snapshot_args(cfg))
    assert [f.code for f in detect(cfg, snap)].count("disk_reserve") == 1
    assert preflight(cfg, snap, cfg.stage("convert")).blocked  # it writes: the reserve holds it back
    serve = preflight(cfg, snap, cfg.stage("serve"))  # writes nothing
    assert not serve.blocked
    assert any(c.severity == "warning" and "not a blocker for this stage" in c.text for c in serve.checks)

    app = SamaiApp(cfg)
    async with app.run_test(size=SIZE) as pilot:
        alert = await pilot_until(pilot, lambda: next((a for a in app.state.alerts if a.code == "disk_reserve"), None))
        assert alert.severity == "error" and "below the reserve" in alert.text
        await pilot_until(pilot, lambda: "below the reserve" in str(app.box_screen.query_one(AlertsPane).render()))


@pytest.mark.slow
async def test_the_clean_dialog_lists_each_paths_size(tmp_path, workspace, port):
    (workspace / "models" / "merged").mkdir(parents=True)
    (workspace / "models" / "merged" / "w.bin").write_bytes(b"m" * 20_000)
    (workspace / "out.gguf").write_bytes(b"g" * 5_000)  # convert made its output: merged is reclaimable
    app = SamaiApp(_config(tmp_path, workspace, port))
    async with app.run_test(size=SIZE) as pilot:
        await pilot_until(pilot, lambda: app.state.snapshot and any(
            a.reclaimable for a in disk_budget(app.config, app.state.snapshot).artifacts))
        await pilot.press("c")
        dialog = await pilot_until(pilot, lambda: isinstance(app.screen, ConfirmDialog) and app.focused and app.screen)
        assert dialog.plan.action == "clean" and dialog.plan.paths == ("models/merged",)
        text = _dialog_text(dialog)
        assert "models/merged: 20.0 KB" in text and "in all 20.0 KB" in text
        await pilot.press("escape")
        await pilot_until(pilot, lambda: not isinstance(app.screen, ConfirmDialog))
    assert (workspace / "models" / "merged" / "w.bin").exists()


@pytest.mark.slow
async def test_the_disk_pane_toggles_the_largest_users(tmp_path, workspace, port):
    (workspace / "models" / "base").mkdir(parents=True)
    (workspace / "models" / "base" / "w.bin").write_bytes(b"b" * 3_000)
    (workspace / "models" / "merged").mkdir(parents=True)
    (workspace / "models" / "merged" / "w.bin").write_bytes(b"m" * 20_000)
    (workspace / "out.gguf").write_bytes(b"g" * 7_000)
    (workspace / "scratch" / "dumps").mkdir(parents=True)  # declared nowhere: the biggest user
    (workspace / "scratch" / "dumps" / "core").write_bytes(os.urandom(200_000))
    (workspace / "scratch" / "[b]x\x1b[2J").write_bytes(b"h" * 10)  # a hostile name, shown literally
    (workspace / "link").symlink_to("/usr")  # a link is a link: /usr is not walked
    app = SamaiApp(_config(tmp_path, workspace, port))
    async with app.run_test(size=(160, 50)) as pilot:
        pane = app.box_screen.query_one(DiskPane)
        await pilot_until(pilot, lambda: "out.gguf" not in str(pane.render()) and "gguf" in str(pane.render())
                     and "7.0 KB" in str(pane.render()))
        assert "largest users" not in str(pane.render())
        await pilot.press("u")
        await pilot_until(pilot, lambda: "measured" in str(pane.render()))
        shown = str(pane.render())
        assert "largest users of the workspace" in shown and "ran out of time" not in shown
        order = [shown.index(path) for path in ("scratch/dumps", "models/merged", "out.gguf", "models/base")]
        assert order == sorted(order)  # biggest first, an undeclared folder among them
        assert "scratch/[b]x␛[2J" in shown and "link " in shown
        assert "\x1b" not in shown
        total = sum(f.lstat().st_blocks * 512 for f in workspace.rglob("*") if not f.is_dir() or f.is_symlink())
        # /usr not counted: the workspace holds the box tools (about 1 MB on disk) and small files
        assert total < 5_000_000 and f"in all {units.size(total)}" in shown, shown
        await pilot.press("u")
        await pilot_until(pilot, lambda: "largest users" not in str(pane.render()))


def test_eval_without_its_data_says_so_in_one_line(workspace):
    run = subprocess.run(stage_argv("stages.eval", "--url", "http://127.0.0.1:1", "--data", "data/eval.jsonl",
                                    "--out", "runs/eval/x"), env=stage_env(), cwd=workspace, capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 2 and "Traceback" not in run.stdout + run.stderr
    assert run.stdout.startswith("EVAL_RC=2 cannot read the eval set data/eval.jsonl: ")
