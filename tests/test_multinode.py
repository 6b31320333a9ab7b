"""Multi-node stages: each node's command under torchrun or DeepSpeed's launcher, the preflight
across the nodes, and, for real, a tiny model trained across two SSH boxes on loopback (the
test sshd, separate workspaces sharing one provisioned box venv) with the gloo backend: a
real rendezvous and real ranks, one rank killed, its alert, and stop-all."""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from samai.console.core import config, paths
from samai.console.core.actions import ActionPlan, Actions, Decision
from samai.console.core.audit import AuditLog
from samai.console.core.config import ConfigError
from samai.console.core.connect import open_box
from samai.console.core.multinode import (
    MultiNodeError,
    MultiRun,
    NodeRun,
    last_step_in_log,
    launches,
    load_run,
    node_address,
    rank_in_log,
    ranks_in_log,
    save_run,
    world_size_in_log,
)
from samai.console.core.multinode.actions import MultiNodeActions
from samai.console.core.multinode.watch import watch
from samai.console.core.training.feed import TrainingFeed
from samai.remote.boxapi import Box
from tests import sshd
from tests.helpers import confirm_dialog, run_cli, stop_stages_under, unavailable_here
from tests.pipeline_helpers import PROVISION_TIMEOUT

TRAIN_TIMEOUT = 15 * 60

TRAIN = ("venv/bin/python -m samai_box.stages.train --base models/base --data data/train.jsonl --out runs/train "
         "--batch 4 --epochs {epochs}")


def fleet_toml(ws_a: Path | str, ws_b: Path | str, *, url_a: str = "local", url_b: str = "local",
               launcher: str = "torchrun", command: str = TRAIN.format(epochs=1), port: int = 29500,
               extra: str = "") -> str:
    return f'''
pipeline = "mn"
[boxes.a]
url = "{url_a}"
workspace = "{ws_a}"
[boxes.b]
url = "{url_b}"
workspace = "{ws_b}"
{extra}
[stages.train]
key = "3"
command = "{command}"
nodes = ["a", "b"]
launcher = "{launcher}"
rdzv_port = {port}
max_restarts = 1
poison = ["runs/train/final", "runs/train/TRAIN_DONE", "runs/train/TRAIN_NAN"]
markers = [{{ name = "TRAIN_DONE" }}, {{ name = "TRAIN_NAN", severity = "error" }}]
'''


def fleet(*args, **kw) -> config.Config:
    return config.parse(fleet_toml(*args, **kw), "multinode.toml")


# ------------------------------------------------------------------ config and commands


def test_the_multi_node_keys_and_their_mistakes(tmp_path: Path) -> None:
    cfg = fleet(tmp_path / "a", "samai/b", url_b="ssh://me@10.1.2.3:2222", port=29611,
                extra='[boxes.c]\nurl = "ssh://me@box-c"\nworkspace = "samai/c"\naddress = "10.9.9.9"\n')
    stage = cfg.stage("train")
    assert (stage.rdzv_port, stage.max_restarts, stage.launcher) == (29611, 1, "torchrun")
    assert [node_address(b) for b in cfg.boxes] == ["127.0.0.1", "10.1.2.3", "10.9.9.9"]
    assert config.parse(fleet_toml("/tmp/x-a", "/tmp/x-b").replace("max_restarts = 1\n", ""), "f").stage(
        "train").max_restarts == 0
    for broken, key in ((("rdzv_port = 29500", "rdzv_port = 70000"), "stages.train.rdzv_port"),
                        (("max_restarts = 1", "max_restarts = -1"), "stages.train.max_restarts"),
                        (('workspace = "/tmp/x-b"', 'workspace = "/tmp/x-b"\naddress = "a b"'), "boxes.b.address")):
        with pytest.raises(ConfigError) as e:
            config.parse(fleet_toml("/tmp/x-a", "/tmp/x-b").replace(*broken), "f.toml")
        assert f"f.toml: {key}: expected" in str(e.value)
    single = '[stages.t]\nkey = "3"\ncommand = "python3 t.py"\nrdzv_port = 29400\n'
    with pytest.raises(ConfigError, match=r"stages\.t\.rdzv_port: expected a multi-node stage"):
        config.parse(single, "one.toml")


def test_each_node_runs_the_program_under_torchrun_with_its_own_arguments(tmp_path: Path) -> None:
    cfg = fleet(tmp_path / "a", "samai/b", url_b="ssh://me@10.1.2.3:2222", port=29611)
    a, b = launches(cfg, cfg.stage("train"), "train-run1")
    program = ("-m samai_box.stages.train --base models/base --data data/train.jsonl --out runs/train --batch 4 "
               "--epochs 1")
    common = "--nnodes 2 --node-rank {} --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:29611 " \
             "--rdzv-id train-run1 --max-restarts 1"
    assert a.command == f"venv/bin/python -m torch.distributed.run {common.format(0)} {program}"
    assert b.command == f"venv/bin/python -m torch.distributed.run {common.format(1)} {program}"
    assert (a.node, a.rank, a.target, b.node, b.rank, b.target, b.workspace) == (
        "a", 0, "local", "b", 1, "ssh://me@10.1.2.3:2222", "samai/b")


def test_each_node_runs_deepspeeds_launcher_without_ssh(tmp_path: Path) -> None:
    cfg = fleet(tmp_path / "a", tmp_path / "b", launcher="deepspeed", port=29612)
    a, b = launches(cfg, cfg.stage("train"), "train-run2")
    hostfile = ".samai/multinode/train-run2.hostfile"
    assert b.command == (
        f"mkdir -p .samai/multinode && printf 'a slots=1\\nb slots=1\\n' > {hostfile} && "
        f"venv/bin/python -m deepspeed.launcher.runner --no_ssh --hostfile {hostfile} --num_nodes 2 --num_gpus 1 "
        "--node_rank 1 --master_addr 127.0.0.1 --master_port 29612 --no_local_rank "
        "--module samai_box.stages.train --base models/base --data data/train.jsonl --out runs/train --batch 4 "
        "--epochs 1")
    assert "--node_rank 0 " in a.command
    script = fleet(tmp_path / "a", tmp_path / "b", launcher="deepspeed", command="python3 train.py --lr 1")
    assert launches(script, script.stage("train"), "r")[0].command.endswith("--no_local_rank train.py --lr 1")


@pytest.mark.parametrize("command", ["bash train.sh", "venv/bin/python", "cd x && python3 train.py",
                                     "python3 -c 'print(1)'"])
def test_a_command_that_is_not_a_python_program_is_refused_naming_its_key(tmp_path: Path, command: str) -> None:
    cfg = fleet(tmp_path / "a", tmp_path / "b", command=command)
    with pytest.raises(MultiNodeError, match=r"^stages\.train\.command: a multi-node stage runs `PYTHON -m MODULE"):
        launches(cfg, cfg.stage("train"), "r")


def test_the_rank_and_the_last_step_read_from_a_nodes_log() -> None:
    log = (b"=== samai chain train: pid 1\nTRAIN_RANK rank=1 world_size=2 local_rank=0\n"
           b"train 139/800 [01:40<08:00, 1.39it/s]\n{'loss': '0.04', 'grad_norm': '0.6', 'epoch': '17.4'}\n"
           b"train 140/800 [01:41<08:00, 1.39it/s]\n[rank1]: RuntimeError: Connection reset by peer\n")
    assert (rank_in_log(log), world_size_in_log(log), last_step_in_log(log)) == (1, 2, 140)
    summary = b"Root Cause (first observed failure):\n[0]:\n  rank      : 3 (local_rank: 0)\n"
    assert rank_in_log(summary) == 3 and rank_in_log(b"garbage \xff\x00") is None
    two = b"TRAIN_RANK rank=2 world_size=4\nTRAIN_RANK rank=3 world_size=4\n"  # two processes on one node
    assert ranks_in_log(two) == [2, 3] and rank_in_log(two) == 3 and ranks_in_log(b"rank=0") == []
    assert last_step_in_log(b"{'loss': '0.5', 'grad_norm': '1.0', 'epoch': '0.1'}\n") == 1
    assert last_step_in_log(b"\x00\xff nothing") is None


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=4096))
def test_garbage_logs_never_crash_the_rank_or_step_reading(data: bytes) -> None:
    for value in (rank_in_log(data), world_size_in_log(data), last_step_in_log(data), *ranks_in_log(data)):
        assert value is None or (isinstance(value, int) and value >= 0)


@pytest.mark.parametrize("broken", ['{"nodes": 1}', "[]", "not json", '{"stage": "train"}',
                                    '"' + "[" * 5000 + '"', "RECORD_WITH_PID_TEXT"])
def test_a_broken_run_record_is_no_record(tmp_path: Path, broken: str) -> None:
    cfg = fleet(tmp_path / "a", tmp_path / "b")
    good = MultiRun("train", "torchrun", "r1", "127.0.0.1:1", 1.0,
                    (NodeRun("a", 0, "local", "/w/a", "logs/train.log", "cmd", 12, 3.5),))
    path = save_run(cfg, good)
    assert load_run(cfg, "train") == good
    if broken == "RECORD_WITH_PID_TEXT":
        broken = path.read_text().replace('"pid": 12', '"pid": "12"')
    path.write_text(broken)
    assert load_run(cfg, "train") is None


# ------------------------------------------------------------------ preflight across nodes (local boxes)


def _local_fleet(tmp_path: Path, port: int, script_b: str = "print('train')\n", url_b: str = "local"):
    wss = [tmp_path / "a", tmp_path / "b"]
    for ws, text in zip(wss, ("print('train')\n", script_b), strict=True):
        ws.mkdir()
        (ws / "train.py").write_text(text)
    return fleet(*wss, url_b=url_b, command=f"{sys.executable} train.py", port=port)


def _nodes(cfg: config.Config, *, readonly: bool = False, confirm=None) -> dict[str, Actions]:
    async def refuse(plan: ActionPlan) -> Decision:
        return Decision.declined(plan, "test")

    audit = AuditLog(paths.audit_log())
    return {b.name: Actions(open_box(cfg.on_box(b.name), readonly=readonly), cfg.on_box(b.name), audit,
                            readonly=readonly, confirm=confirm or refuse) for b in cfg.boxes}


async def _close(nodes: dict[str, Actions]) -> None:
    for actions in nodes.values():
        await actions.box.close()


def _texts(plan, severity: str) -> list[str]:
    return [c.text for c in plan.summary.checks if c.severity == severity]


@pytest.mark.slow
async def test_the_preflight_compares_the_program_on_every_node_and_the_masters_port(tmp_path: Path, spawn) -> None:
    port = sshd.free_port()
    cfg = _local_fleet(tmp_path, port, script_b="print('something else')\n")
    nodes = _nodes(cfg)
    holder = spawn(sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        await _listening(port)
        plan = await MultiNodeActions(cfg, nodes, confirm=nodes["a"].confirm).plan_fire("train")
        errors = _texts(plan, "error")
        digest = nodes["a"].box.tools.digest
        assert f"the same box tools on every node ({digest})" in _texts(plan, "ok")
        ours = [hashlib.sha256((tmp_path / n / "train.py").read_bytes()).hexdigest()[:16] for n in "ab"]
        assert f"the training program (script train.py) differs between the nodes: box a: {ours[0]}, box b: " \
               f"{ours[1]}" in errors
        assert any(e.startswith(f"the rendezvous port {port} on the master (box a, 127.0.0.1) is held: pid "
                                f"{holder.pid} ") for e in errors), errors
        assert "box a is reachable" in _texts(plan, "ok") and plan.blocked
        # Every node's box and exact command are in what the operator confirms.
        assert [f"[box {s.node}] " in plan.summary.command for s in plan.steps] == [True, True]
        assert all(s.plan.chain in plan.summary.command and s.plan.target == "local" for s in plan.steps)
        (tmp_path / "b" / "train.py").write_text("print('train')\n")
        holder.kill()
        holder.wait()
        again = await MultiNodeActions(cfg, nodes, confirm=nodes["a"].confirm).plan_fire("train")
        assert not _texts(again, "error"), _texts(again, "error")
        assert f"the rendezvous port {port} on the master (box a, 127.0.0.1) is free" in _texts(again, "ok")
    finally:
        await _close(nodes)


async def test_disk_and_poison_files_are_checked_on_each_node(tmp_path: Path) -> None:
    cfg = _local_fleet(tmp_path, sshd.free_port())
    (tmp_path / "b" / "runs" / "train").mkdir(parents=True)
    (tmp_path / "b" / "runs" / "train" / "TRAIN_DONE").write_text("an earlier run\n")
    nodes = _nodes(cfg)
    try:
        plan = await MultiNodeActions(cfg, nodes, confirm=nodes["a"].confirm).plan_fire("train")
    finally:
        await _close(nodes)
    warnings = _texts(plan, "warning")
    assert "box b: poison files from an earlier run: runs/train/TRAIN_DONE (restart clears them)" in warnings
    assert not any(w.startswith("box a: poison") for w in warnings)
    disk = [c.text for c in plan.summary.checks if "writes no declared artifact" in c.text]
    assert [d.split(":")[0] for d in disk] == ["box a", "box b"]


async def test_an_unreachable_node_blocks_the_fire(tmp_path: Path) -> None:
    cfg = _local_fleet(tmp_path, sshd.free_port(), url_b=f"ssh://root@127.0.0.1:{sshd.free_port()}")
    nodes = _nodes(cfg)
    try:
        plan = await MultiNodeActions(cfg, nodes, confirm=nodes["a"].confirm).plan_fire("train")
    finally:
        await _close(nodes)
    assert plan.blocked and any(e.startswith("box b is unreachable: ") for e in _texts(plan, "error"))


@pytest.mark.slow
async def test_read_only_refuses_before_asking_and_a_declined_fire_is_audited_per_node(tmp_path: Path) -> None:
    cfg = _local_fleet(tmp_path, sshd.free_port())
    asked: list[ActionPlan] = []

    async def ask(plan: ActionPlan) -> Decision:
        asked.append(plan)
        return Decision.declined(plan, "operator said no")

    nodes = _nodes(cfg, readonly=True, confirm=ask)
    try:
        refused = await MultiNodeActions(cfg, nodes, confirm=ask).fire("train")
    finally:
        await _close(nodes)
    assert refused.status == "refused" and "read-only" in refused.message and asked == []
    assert not paths.audit_log().exists()
    nodes = _nodes(cfg, confirm=ask)
    try:
        declined = await MultiNodeActions(cfg, nodes, confirm=ask).fire("train")
    finally:
        await _close(nodes)
    assert declined.status == "cancelled" and len(asked) == 1
    lines = [json.loads(line) for line in paths.audit_log().read_text().splitlines()]
    assert [(e["phase"], e["confirmation"], e["subject"].split(",")[0]) for e in lines] == [
        ("outcome", "declined", "stage train (box a"), ("outcome", "declined", "stage train (box b")]
    assert not list(tmp_path.glob("*/.samai/state/train.json"))  # nothing was launched anywhere


async def test_one_box_alone_never_fires_a_multi_node_stage(tmp_path: Path) -> None:
    cfg = _local_fleet(tmp_path, sshd.free_port())
    nodes = _nodes(cfg)
    try:
        plan = await nodes["a"].plan_fire("train")
        restart = await nodes["a"].plan_restart("train")
    finally:
        await _close(nodes)
    said = "stage train runs on the nodes a, b under torchrun: it is fired on every node at once, not on one box"
    assert plan.blocked and said in [c.text for c in plan.checks if c.severity == "error"]
    assert restart.blocked and said in [c.text for c in restart.checks if c.severity == "error"]


@pytest.mark.slow
def test_the_command_line_fires_and_stops_a_multi_node_stage_on_every_node(tmp_path: Path) -> None:
    cfg_file = tmp_path / "samai.toml"
    cfg_file.write_text(fleet_toml(tmp_path / "a", tmp_path / "b", command=f"{sys.executable} train.py",
                                   port=sshd.free_port()))
    _local_fleet(tmp_path, 1, script_b="print('another program')\n")  # the workspaces, b's program differs
    readonly = run_cli("--config", str(cfg_file), "--readonly", "fire", "train", "--yes")
    assert readonly.returncode == 1 and "read-only" in readonly.stderr, readonly.stderr
    blocked = run_cli("--config", str(cfg_file), "fire", "train", "--yes")
    assert blocked.returncode == 1 and "✗ the training program (script train.py) differs between the nodes" \
        in blocked.stderr and "add --force" in blocked.stderr, blocked.stderr
    assert not list(tmp_path.glob("*/.samai/state/train.json"))
    stop = run_cli("--config", str(cfg_file), "stop", "train", "--yes")
    assert stop.returncode == 0 and "box a: stage train (box a) was not running" in stop.stdout, stop.stdout
    assert "box b: stage train (box b) was not running" in stop.stdout
    audit = [json.loads(line) for line in paths.audit_log().read_text().splitlines()]
    stops = sorted((e["phase"], e["subject"]) for e in audit if e["action"] == "stop")  # the nodes at once
    assert stops == sorted((phase, f"stage train (box {n})") for n in "ab" for phase in ("intent", "outcome"))


async def _record_by_hand(cfg: config.Config, commands: dict[str, str]):
    """A multi-node run whose nodes' launches are real chains of the given commands (no torch here)."""
    nodes = _nodes(cfg)
    runs = []
    for rank, (name, command) in enumerate(commands.items()):
        fired = await nodes[name].box.fire("train", command, "logs/train.log", verify_s=0.5)
        assert fired.pid is not None, fired.reason
        runs.append(NodeRun(name, rank, "local", cfg.on_box(name).workspace, "logs/train.log", command, fired.pid,
                            fired.start_time))
    run = MultiRun("train", "torchrun", "train-by-hand", "127.0.0.1:1", time.time(), tuple(runs))
    save_run(cfg, run)
    return nodes, run


DIES = ("echo 'TRAIN_RANK rank=1 world_size=2 local_rank=0'; echo 'train 139/800 [01:40<08:00, 1.39it/s]'; "
        "echo 'train 140/800 [01:41<08:00, 1.39it/s]'; echo '[rank1]: RuntimeError: boom'; sleep 1; exit 1")


@pytest.mark.slow
async def test_a_node_that_died_while_another_runs_is_an_alert_whose_fix_stops_all(tmp_path: Path) -> None:
    cfg = _local_fleet(tmp_path, sshd.free_port())
    nodes, run = await _record_by_hand(cfg, {"a": "echo 'TRAIN_RANK rank=0 world_size=2'; sleep 300", "b": DIES})
    boxes = {n: a.box for n, a in nodes.items()}
    try:
        async def alerted():
            return (await watch(run, boxes))[1]

        (alert,) = await _until(alerted, 60, "the alert")
        assert alert.message == ("rank 1 on box b died at step 140 (failed); ranks on a will hang until the "
                                 "collective times out: stop all")
        read: dict = {}
        assert (await watch(run, boxes, read))[1] == [alert] and read == {("train-by-hand", "b"): (1, 140)}
        (tmp_path / "b" / "logs" / "train.log").write_text("rotated away\n")  # a dead node's log is read once
        assert (await watch(run, boxes, read))[1] == [alert]
        assert (alert.code, alert.severity, alert.action.kind, alert.action.stage) == ("rank_died", "error", "stop",
                                                                                       "train")
        multi = MultiNodeActions(cfg, nodes, confirm=_confirm)
        stopped = await multi.stop_all("train", grace=2)
        assert stopped.ok, stopped.message
        assert "box a: stage train (box a, last fired as pid" in stopped.message
        states, alerts = await watch(run, boxes)
        assert [(s.alive, s.status) for s in states] == [(False, "stopped"), (False, "failed")] and alerts == []
        assert not psutil.pid_exists(run.nodes[0].pid) or psutil.Process(run.nodes[0].pid).status() == "zombie"
    finally:
        await _close(nodes)


@pytest.mark.slow
async def test_a_node_relaunched_by_someone_else_is_not_this_run(tmp_path: Path) -> None:
    cfg = _local_fleet(tmp_path, sshd.free_port())
    nodes, run = await _record_by_hand(cfg, {"a": "sleep 300", "b": "sleep 300"})
    boxes = {n: a.box for n, a in nodes.items()}
    try:
        await nodes["b"].box.stop("train", grace=2)
        other = await nodes["b"].box.fire("train", "sleep 300", "logs/train.log", verify_s=0.5)
        states, (alert,) = await watch(run, boxes)
        assert states[1].status == f"replaced by pid {other.pid}" and states[1].alive is False
        assert alert.message.startswith("node rank 1 on box b died before its first logged step (replaced by pid ")
    finally:
        for actions in nodes.values():
            await actions.box.stop("train", grace=2)
        await _close(nodes)


@pytest.mark.slow
async def test_the_tui_raises_the_alert_and_x_stops_every_node_through_its_dialog(tmp_path: Path) -> None:
    from samai.console.app import SamaiApp
    from samai.console.screens.dialogs import ConfirmDialog
    from tests.helpers import collect_toasts, pilot_until

    cfg = _local_fleet(tmp_path, sshd.free_port())
    nodes, run = await _record_by_hand(cfg, {"a": "sleep 300", "b": DIES})
    await _close(nodes)
    app = SamaiApp(cfg, box="a")
    async with app.run_test(size=(170, 45)) as pilot:
        toasts = collect_toasts(app)

        async def until(predicate, what: str, timeout: float = 60):
            try:
                return await pilot_until(pilot, predicate, timeout=timeout)
            except AssertionError:
                raise AssertionError(f"{what}: not in time; alerts {[a.text for a in app.state.alerts]}, toasts "
                                     f"{toasts}, nodes {app.multinode and app.multinode.marks()}") from None

        alert = await until(lambda: next((a for a in app.state.alerts if a.code == "rank_died"), None), "the alert")
        assert alert.text.startswith("rank 1 on box b died at step 140 (failed); ranks on a will hang")
        assert str(app.box_screen.query_one("#curves").border_title) == "training · train: a alive · b down"
        await _node_readings(pilot, app, 2)
        assert [a.code for a in app.state.alerts].count("rank_died") == 1  # raised once

        app.open_box_screen("b")  # the dead node's own screen says it as well
        await until(lambda: app.box_name == "b" and app.state.snapshot is not None, "b's screen")
        again = await until(lambda: next((a for a in app.state.alerts if a.code == "rank_died"), None), "b's alert")
        box = app.box_screen
        assert again.text == alert.text and "b: rank 1 on box b died" in str(box.query_one("#alerts").render())
        curves = app.box_screen.query_one("#curves")
        await pilot.press("x")
        dialog = await until(lambda: isinstance(app.screen, ConfirmDialog) and app.screen, "the dialog")
        assert dialog.plan.subject == "stage train on every node (a, b)" and dialog.plan.action == "stop"
        await confirm_dialog(pilot)
        await until(lambda: all(not a.active for a in app.state.alerts if a.code == "rank_died"), "resolved")
        await until(lambda: str(curves.border_title) == "training · train: a down · b down", "both down")
        await until(lambda: not app.busy, "the stop's result")  # its outcome lines are written as it ends
    assert not psutil.pid_exists(run.nodes[0].pid) or psutil.Process(run.nodes[0].pid).status() == "zombie"
    audit = [json.loads(line) for line in paths.audit_log().read_text().splitlines()]
    assert sorted((e["phase"], e["subject"].split(",")[0]) for e in audit if e["action"] == "stop") == sorted(
        (phase, f"stage train (box {n}") for n in "ab" for phase in ("intent", "outcome"))


TRAINER_LOG = Path(__file__).parent / "data" / "trainer_v5_tiny.log"  # what a real Trainer (transformers 5) printed
TRAINER_LOSSES = [3.485, 3.261, 2.871, 2.125, 1.205, 1.388, 1.643, 0.814, 0.4648, 0.5163, 0.3013, 0.3759]
# The rendezvous made b (node rank 1) rank 0, as torchrun's c10d may: the Trainer's points are in
# b's log, and a's has a point of its own (once its `more` file is there) that no pane may show.
# Each starts once its `go` file is there.
RANK_1_ON_A = ("while [ ! -e go ]; do sleep 0.1; done; echo 'TRAIN_RANK rank=1 world_size=2 local_rank=0'; "
               "while [ ! -e more ]; do sleep 0.1; done; "
               "echo \"{'loss': '9.99', 'grad_norm': '1.0', 'learning_rate': '0', 'epoch': '0.1'}\"; sleep 300")
RANK_0_ON_B = ("while [ ! -e go ]; do sleep 0.1; done; echo 'TRAIN_RANK rank=0 world_size=2 local_rank=0'; "
               "cat trainer.out; sleep 300")


async def _node_readings(pilot, app, n: int) -> None:
    """Wait for n readings of the nodes by the app's multi-node watch, each begun after this call."""
    from tests.helpers import pilot_until

    session, done = app.multinode, []
    real = session.poll

    async def counted(*args, **kw):
        got = await real(*args, **kw)
        done.append(True)
        return got

    session.poll = counted  # a reading already under way called the real one: it does not count
    try:
        await pilot_until(pilot, lambda: len(done) >= n)
    finally:
        del session.poll


def _ranked_fleet(tmp_path: Path, garbage: bytes = b"") -> config.Config:
    cfg = _local_fleet(tmp_path, sshd.free_port())
    (tmp_path / "b" / "trainer.out").write_bytes(garbage + TRAINER_LOG.read_bytes())
    return cfg


def _go(tmp_path: Path) -> None:
    for node in "ab":
        (tmp_path / node / "go").touch()


@pytest.mark.slow
async def test_rank_zeros_curve_comes_from_the_node_whose_log_says_rank_0(tmp_path: Path) -> None:
    from samai.console.core.multinode.curve import RankZeroCurve
    from samai.console.core.multinode.watch import NodeState, node_states

    # Bytes that are no text and a 10 MB line before the Trainer's output: read through, never a crash.
    cfg = _ranked_fleet(tmp_path, garbage=b"\xff\xfe\x00\x1b]0;t\x07 [bold]x\n" + b"y" * 10_000_000 + b"\n")
    nodes, run = await _record_by_hand(cfg, {"a": RANK_1_ON_A, "b": RANK_0_ON_B})
    boxes = {n: a.box for n, a in nodes.items()}
    curve = RankZeroCurve()
    try:
        await curve.read(run, await node_states(run, boxes), boxes)
        assert (curve.node, curve.points) == (None, [])  # no log names rank 0 yet
        _go(tmp_path)
        unreachable = (NodeState("a", 0, None, "unreachable: test"), NodeState("b", 1, None, "unreachable: test"))
        await _until(lambda: _says(tmp_path / "b", b"'loss': '0.3759'"), 60, "b's log")
        await curve.read(run, unreachable, boxes)
        assert curve.node is None  # a box that cannot be read is not asked

        async def whole() -> bool:
            await curve.read(run, await node_states(run, boxes), boxes)
            return len(curve.points) == len(TRAINER_LOSSES)

        await _until(whole, 60, "rank 0's curve")
        assert curve.node == "b" and [p.loss for p in curve.points] == TRAINER_LOSSES
        before = curve.version
        await curve.read(run, await node_states(run, boxes), boxes)
        assert curve.version == before  # nothing new: the pane is not redrawn

        with (tmp_path / "b" / "logs" / "train.log").open("a") as log:  # the log goes on: the curve with it
            log.write("{'loss': '0.25', 'grad_norm': '3.0', 'learning_rate': '0.0001', 'epoch': '3.25'}\n")
        await curve.read(run, await node_states(run, boxes), boxes)
        assert [p.loss for p in curve.points] == [*TRAINER_LOSSES, 0.25] and curve.version != before

        another = replace(run, run_id="train-again")  # a new fire: nothing of the last run's curve stays
        await curve.read(another, (), boxes)
        assert (curve.run_id, curve.node, curve.points) == ("train-again", None, [])
    finally:
        for actions in nodes.values():
            await actions.box.stop("train", grace=2)
        await _close(nodes)


def _says(ws: Path, what: bytes) -> bool:
    return what in _log(ws)


@pytest.mark.slow
async def test_the_training_pane_shows_rank_zeros_curve_on_every_nodes_screen(tmp_path: Path) -> None:
    from samai.console.app import SamaiApp
    from samai.widgets.curves import CurvesPane
    from tests.helpers import pilot_until, polls_after

    cfg = _ranked_fleet(tmp_path)
    nodes, run = await _record_by_hand(cfg, {"a": RANK_1_ON_A, "b": RANK_0_ON_B})
    await _close(nodes)
    _go(tmp_path)
    app = SamaiApp(cfg, box="a")  # rank 1's box: its own log has no curve of the run
    try:
        async with app.run_test(size=(170, 45)) as pilot:
            def losses() -> list[float | None]:
                return [p.loss for p in app.box_screen.query_one(CurvesPane).points]

            await pilot_until(pilot, lambda: losses() == TRAINER_LOSSES, timeout=60)
            (tmp_path / "a" / "more").touch()
            training = app.state.feed(TrainingFeed)
            await pilot_until(pilot, lambda: training.check.parser.points)  # a's own point was read...
            await polls_after(pilot, 2)
            await _node_readings(pilot, app, 2)
            assert losses() == TRAINER_LOSSES  # ...and is not on show
            shown = str(app.box_screen.query_one(CurvesPane).border_title)
            assert shown == "training · train: a alive · b alive · rank 0 on b"

            # Rank 0's loss goes NaN: an alert on a's screen too, whose fix stops every node.
            with (tmp_path / "b" / "logs" / "train.log").open("a") as log:
                log.write("{'loss': 'nan', 'grad_norm': 'nan', 'learning_rate': '0.0001', 'epoch': '3.25'}\n")
            nan = await pilot_until(pilot, lambda: next((a for a in app.state.alerts if a.code == "nan_loss"), None),
                                    timeout=60)
            assert nan.text.startswith("train, rank 0 on box b: ") and nan.severity == "error"
            assert nan.action is not None and (nan.action.kind, nan.action.stage) == ("stop", "train")
            every = len(TRAINER_LOSSES) + 1
            await pilot_until(pilot, lambda: len(losses()) == every)  # the bad point on the curve

            app.open_box_screen("b")  # rank 0's own box: its curve once, not its own reading of it besides
            await pilot_until(pilot, lambda: app.box_name == "b" and app.state.snapshot is not None, timeout=60)
            await pilot_until(pilot, lambda: len(app.state.feed(TrainingFeed).check.parser.points) == every, timeout=60)
            await pilot_until(pilot, lambda: len(losses()) == every)
            await polls_after(pilot, 2)  # a few more polls of b
            await _node_readings(pilot, app, 2)
            assert len(losses()) == every and losses()[:-1] == TRAINER_LOSSES
            # b's screen says the NaN once: its own reading of its log says it, the nodes' watch does not again.
            said = [a.text for a in app.state.alerts if a.code == "nan_loss"]
            assert len(said) == 1 and said[0].startswith("train: "), said
    finally:
        stop_stages_under(tmp_path)


async def test_the_box_hashes_what_the_command_runs(workspace: Path, box: Box) -> None:
    got = await box.call("runhash.py", {"workspace": str(workspace), "python": sys.executable,
                                        "module": "samai_box.stages.train"})
    assert got["tools"] == box.tools.digest  # read back from the installed files
    installed = Path(box.tools_dir, "samai_box", "stages", "train.py")
    assert got["program"] == str(installed) and got["sha256"] == hashlib.sha256(installed.read_bytes()).hexdigest()
    missing = await box.call("runhash.py", {"workspace": str(workspace), "python": sys.executable,
                                            "module": "samai_box.stages.nothing_here"})
    assert "finds no module samai_box.stages.nothing_here" in missing["program_error"]
    no_python = await box.call("runhash.py", {"workspace": str(workspace), "python": "venv/bin/python",
                                              "module": "x"})
    assert "venv/bin/python cannot run" in no_python["program_error"]


async def _listening(port: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        except OSError:
            await asyncio.sleep(0.1)
    raise AssertionError(f"nothing listens on {port}")


# ------------------------------------------------------------------ for real: two SSH boxes, one box venv

needs_sshd = pytest.mark.skipif(not sshd.available() and not os.environ.get("SAMAI_REQUIRE_SSHD"),
                                reason="needs root and openssh-server (.ci/run installs it)")


@pytest.fixture(scope="module")
def two_servers():
    """Two separate sshd on loopback, one client HOME that knows both (their host keys, one key)."""
    a = sshd.SshServer(sshd.new_root()).start()
    b = sshd.SshServer(sshd.new_root()).start()
    try:
        pub = (a.client_home / ".ssh" / "id_ed25519.pub").read_text()
        for user in ("root", sshd.TEST_USER):
            (b.root / "authorized" / user).write_text(pub)
        b_host = (b.root / "keys" / "host.pub").read_text().split()[:2]
        with (a.client_home / ".ssh" / "known_hosts").open("a") as f:
            f.write(f"[127.0.0.1]:{b.port} {b_host[0]} {b_host[1]}\n")
        yield a, b
    finally:
        a.stop()
        b.stop()


@pytest.fixture(scope="module")
def trained_inputs(tmp_path_factory: pytest.TempPathFactory, provisioned: Path, tiny_source: Path) -> Path:
    """What each node's workspace is given: the run's box venv (tests/provisioned.py: provisioned
    through the Box, as the pipeline modules' is) and the tiny base model and data its fetch
    stage pretrained."""
    root = tmp_path_factory.mktemp("multinode-inputs")
    (root / "venv").symlink_to(provisioned)
    shutil.copytree(tiny_source / "tiny-base", root / "models" / "base")
    shutil.copytree(tiny_source / "data", root / "data")
    return root


def _node_workspaces(tmp_path: Path, inputs: Path) -> tuple[Path, Path]:
    wss = (tmp_path / "node-a", tmp_path / "node-b")
    for ws in wss:
        ws.mkdir()
        (ws / "venv").symlink_to(inputs / "venv")
        shutil.copytree(inputs / "models" / "base", ws / "models" / "base")
        shutil.copytree(inputs / "data", ws / "data")
    return wss


async def _confirm(plan: ActionPlan) -> Decision:
    return Decision.confirmed(plan, "test")


def _log(ws: Path) -> bytes:
    path = ws / "logs" / "train.log"
    return path.read_bytes() if path.exists() else b""


async def _until(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = await predicate() if inspect.iscoroutinefunction(predicate) else predicate()
        if value:
            return value
        await asyncio.sleep(0.5)
    raise AssertionError(f"{what}: not within {timeout} s")


def _processes_of(run_id: str, node: str) -> list[psutil.Process]:
    """The launcher's and the worker's Python processes of one node of a run (by the environment
    the fire gave them), not the chain's shell."""
    found = []
    for proc in psutil.process_iter(["name", "cmdline"]):
        try:
            env = proc.environ()
        except (psutil.Error, OSError):
            continue
        argv = proc.info["cmdline"] or [""]
        # By its argv: torch's elastic agent names itself pt_elastic.
        if env.get("SAMAI_RUN") == run_id and env.get("SAMAI_NODE") == node and "python" in argv[0]:
            found.append(proc)
    return found




def _ssh_fleet(two_servers, tmp_path: Path, inputs: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The two SSH boxes as nodes a and b of a torchrun stage that trains long enough to watch: the
    config file's path."""
    server_a, server_b = two_servers
    monkeypatch.setenv("HOME", str(server_a.client_home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    ws_a, ws_b = _node_workspaces(tmp_path, inputs)
    cfg_file = tmp_path / "samai.toml"
    cfg_file.write_text(fleet_toml(ws_a, ws_b, url_a=server_a.url(), url_b=server_b.url(), port=sshd.free_port(),
                                   command=TRAIN.format(epochs=200)))
    return cfg_file


def _kill_node(run_id: str, node: str) -> None:
    """One node's processes die (its launcher and its worker), as the OOM killer or a crash would do it."""
    victims = _processes_of(run_id, node)
    assert len(victims) == 2, [p.info["cmdline"] for p in victims]
    for proc in victims:
        proc.send_signal(signal.SIGKILL)


@needs_sshd
@pytest.mark.timeout(PROVISION_TIMEOUT + TRAIN_TIMEOUT)
async def test_torchrun_across_two_ssh_boxes_from_the_command_line_then_one_rank_dies_and_stop_all(
        two_servers, trained_inputs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    server_a, server_b = two_servers
    cfg_file = _ssh_fleet(two_servers, tmp_path, trained_inputs, monkeypatch)
    cfg = config.load(cfg_file)
    ws_a, ws_b = (Path(cfg.on_box(n).workspace) for n in "ab")
    nodes = _nodes(cfg)
    try:
        fired = await asyncio.to_thread(run_cli, "--config", str(cfg_file), "fire", "train", "--yes")
        assert fired.returncode == 0, fired.stdout + fired.stderr
        run = load_run(cfg, "train")
        assert run is not None and f"run {run.run_id}" in fired.stdout, fired.stdout
        assert [(n.node, n.rank, n.target) for n in run.nodes] == [("a", 0, server_a.url()), ("b", 1, server_b.url())]
        # A real rendezvous: both ranks log their rank in a world of 2, and train.
        for ws in (ws_a, ws_b):
            await _until(lambda ws=ws: re.search(rb"(?m)^train [3-9]\d*/", _log(ws)), TRAIN_TIMEOUT,
                         f"training steps in {ws}")
        ranks = {rank_in_log(_log(ws)) for ws in (ws_a, ws_b)}
        assert ranks == {0, 1} and {world_size_in_log(_log(ws)) for ws in (ws_a, ws_b)} == {2}
        boxes = {n: a.box for n, a in nodes.items()}
        states, alerts = await watch(run, boxes)
        assert [s.alive for s in states] == [True, True] and alerts == []

        _kill_node(run.run_id, "b")

        async def alerted():
            return (await watch(run, boxes))[1]

        (alert,) = await _until(alerted, 120, "the dead-rank alert")
        rank_b, step_b = rank_in_log(_log(ws_b)), last_step_in_log(_log(ws_b))
        assert alert.code == "rank_died" and alert.severity == "error" and step_b is not None
        assert alert.message.startswith(f"rank {rank_b} on box b died at step {step_b} (failed); ranks on a will hang "
                                        "until the collective times out"), alert.message
        assert alert.action is not None and (alert.action.kind, alert.action.stage) == ("stop", "train")

        # Its fix: stop all, on the command line as well, audited per node.
        stopped = await asyncio.to_thread(run_cli, "--config", str(cfg_file), "stop", "train", "--yes")
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        states, alerts = await watch(run, boxes)
        assert [s.alive for s in states] == [False, False] and alerts == []
        assert not _processes_of(run.run_id, "a") and not _processes_of(run.run_id, "b")
        audit = [json.loads(line) for line in paths.audit_log().read_text().splitlines()]
        fires = [(e["phase"], e["target"], e["via"]) for e in audit if e["action"] == "fire"]
        assert fires == [("intent", server_a.url(), "--yes"), ("outcome", server_a.url(), "--yes"),
                         ("intent", server_b.url(), "--yes"), ("outcome", server_b.url(), "--yes")]
        stops = sorted((e["phase"], e["target"]) for e in audit if e["action"] == "stop")
        assert stops == sorted([("intent", server_a.url()), ("outcome", server_a.url()),
                                ("intent", server_b.url()), ("outcome", server_b.url())])
    finally:
        await asyncio.gather(*(a.box.stop("train", grace=2) for a in nodes.values()), return_exceptions=True)
        await _close(nodes)


@needs_sshd
@pytest.mark.timeout(PROVISION_TIMEOUT + TRAIN_TIMEOUT)
async def test_torchrun_across_two_ssh_boxes_from_the_stage_key_with_rank_zeros_curve_then_x_stops_all(
        two_servers, trained_inputs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from samai.console.app import SamaiApp
    from samai.console.screens.dialogs import ConfirmDialog
    from samai.widgets.alerts import AlertsPane
    from samai.widgets.curves import CurvesPane
    from tests.helpers import click_until, collect_toasts, pilot_until

    cfg = config.load(_ssh_fleet(two_servers, tmp_path, trained_inputs, monkeypatch))
    ws_b = Path(cfg.on_box("b").workspace)
    app = SamaiApp(cfg, box="a")
    try:
        async with app.run_test(size=(170, 45)) as pilot:
            toasts = collect_toasts(app)

            async def until(predicate, what: str, timeout: float = TRAIN_TIMEOUT):
                try:
                    return await pilot_until(pilot, predicate, timeout=timeout)
                except AssertionError:
                    raise AssertionError(f"{what}: not in time; toasts {toasts}, alerts "
                                         f"{[a.text for a in app.state.alerts]}, nodes "
                                         f"{app.multinode and app.multinode.marks()}") from None

            await until(lambda: app.state.snapshot is not None, "a's screen", 60)
            await pilot.press("3")  # the train stage's key: one dialog over both nodes
            dialog = await until(lambda: isinstance(app.screen, ConfirmDialog) and app.focused and app.screen,
                                 "the fire dialog", 120)
            assert dialog.plan.action == "fire" and not dialog.plan.blocked, dialog.plan.checks
            assert "[box a] " in dialog.plan.command and "[box b] " in dialog.plan.command
            assert "--rdzv-backend c10d" in dialog.plan.command
            try:  # a click lost under load (the dialog laid out late) is clicked again
                await click_until(pilot, "#confirm", lambda: not isinstance(app.screen, ConfirmDialog), 30)
            except AssertionError:  # said apart from a fire that does not end
                raise AssertionError(f"the dialog closing: not in time; toasts {toasts}") from None
            run = await until(lambda: load_run(cfg, "train"), "the run's record", 120)

            # Rank 0's curve on a's screen, read from whichever node the rendezvous made rank 0.
            curves = app.box_screen.query_one(CurvesPane)
            await until(lambda: len(curves.points) >= 3, "rank 0's points")
            both = "training · train: a alive · b alive · rank 0 on "  # waited for: under load a node may read
            title = await until(lambda: str(curves.border_title).startswith(both) and str(curves.border_title),
                                "the title", 60)  # as unreachable for a poll
            zero = title.rsplit(" ", 1)[1]
            assert rank_in_log(_log(Path(cfg.on_box(zero).workspace))) == 0

            _kill_node(run.run_id, "b")
            alert = await until(lambda: next((a for a in app.state.alerts if a.code == "rank_died" and a.active),
                                             None), "the dead-rank alert", 120)
            assert alert.text.startswith(f"rank {rank_in_log(_log(ws_b))} on box b died at step "), alert.text
            shown = str(app.box_screen.query_one(AlertsPane).render())
            assert "a: rank " in shown  # the alert names the box it is shown on
            await pilot.press("x")
            stop = await until(lambda: isinstance(app.screen, ConfirmDialog) and app.screen, "the stop dialog", 60)
            assert stop.plan.action == "stop" and stop.plan.subject == "stage train on every node (a, b)"
            await confirm_dialog(pilot)
            await until(lambda: all(not a.active for a in app.state.alerts if a.code == "rank_died"), "resolved", 120)
            await until(lambda: "a down · b down" in str(curves.border_title), "both down", 60)
        assert not _processes_of(run.run_id, "a") and not _processes_of(run.run_id, "b")
    finally:
        stop_stages_under(tmp_path)


DS_CONFIG = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
             "zero_optimization": {"stage": 1}, "bf16": {"enabled": False}, "fp16": {"enabled": False}}


@needs_sshd
@pytest.mark.timeout(PROVISION_TIMEOUT + TRAIN_TIMEOUT)
async def test_deepspeeds_launcher_across_two_ssh_boxes(two_servers, trained_inputs: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    server_a, server_b = two_servers
    monkeypatch.setenv("HOME", str(server_a.client_home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    ws_a, ws_b = _node_workspaces(tmp_path, trained_inputs)
    for ws in (ws_a, ws_b):  # the Trainer under DeepSpeed's engine: ZeRO stage 1 on the CPU accelerator
        (ws / "ds.json").write_text(json.dumps(DS_CONFIG))
    cfg = fleet(ws_a, ws_b, url_a=server_a.url(), url_b=server_b.url(), launcher="deepspeed",
                port=sshd.free_port(), command=TRAIN.format(epochs=1) + " --deepspeed ds.json")
    nodes = _nodes(cfg, confirm=_confirm)
    try:
        fired = await MultiNodeActions(cfg, nodes, confirm=_confirm).fire("train")
        assert fired.ok, fired.message
        boxes = {n: a.box for n, a in nodes.items()}

        async def ended():
            states, _ = await watch(fired.run, boxes)
            return all(s.alive is False for s in states)

        await _until(ended, TRAIN_TIMEOUT, "both nodes' chains to end")
    finally:
        await asyncio.gather(*(a.box.stop("train", grace=2) for a in nodes.values()), return_exceptions=True)
        await _close(nodes)
    logs = [_log(ws) for ws in (ws_a, ws_b)]
    accelerator = next((line for log in logs for line in log.decode(errors="replace").splitlines()
                        if "accelerator" in line.lower() and ("Error" in line or "error" in line)), None)
    if accelerator and not all(b"TRAIN_DONE" in log for log in logs):
        unavailable_here(f"DeepSpeed's CPU accelerator does not run here: {accelerator.strip()}")
    for log in logs:
        assert b"TRAIN_DONE" in log and b"CHAIN_DONE rc=0" in log, log[-3000:].decode(errors="replace")
        assert b"deepspeed.launcher.launch" in log or b"launch.py" in log
    assert {rank_in_log(log) for log in logs} == {0, 1} and {world_size_in_log(log) for log in logs} == {2}
    for ws in (ws_a, ws_b):  # DeepSpeed's engine wrote each node's checkpoint (its ZeRO layout)
        assert list((ws / "runs" / "train" / "checkpoints").glob("checkpoint-*/global_step*")), ws


@needs_sshd
@pytest.mark.timeout(PROVISION_TIMEOUT + TRAIN_TIMEOUT)
async def test_a_node_that_does_not_start_stops_the_nodes_already_started(
        two_servers, trained_inputs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    server_a, server_b = two_servers
    monkeypatch.setenv("HOME", str(server_a.client_home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    ws_a, ws_b = _node_workspaces(tmp_path, trained_inputs)
    (ws_b / "logs").write_text("a file where b's log folder goes: b's launch is refused\n")
    cfg = fleet(ws_a, ws_b, url_a=server_a.url(), url_b=server_b.url(), port=sshd.free_port(),
                command=TRAIN.format(epochs=200))
    nodes = _nodes(cfg, confirm=_confirm)
    try:
        fired = await MultiNodeActions(cfg, nodes, confirm=_confirm).fire("train")
        assert not fired.ok and fired.message.startswith("box b: stage train refused: "), fired.message
        assert "box a stopped again: stage train exited after the signal" in fired.message, fired.message
        master = (await nodes["a"].box.snapshot()).state("train")
        assert master is not None and not master.alive and master.status == "stopped"
        assert load_run(cfg, "train") is None  # no run was recorded
    finally:
        await asyncio.gather(*(a.box.stop("train", grace=2) for a in nodes.values()), return_exceptions=True)
        await _close(nodes)
    audit = [json.loads(line) for line in paths.audit_log().read_text().splitlines()]
    assert [(e["action"], e["phase"], e["target"], e["via"]) for e in audit] == [
        ("fire", "intent", server_a.url(), "test"), ("fire", "outcome", server_a.url(), "test"),
        ("fire", "intent", server_b.url(), "test"), ("fire", "outcome", server_b.url(), "test"),
        ("stop", "intent", server_a.url(), "rollback: box b did not start"),
        ("stop", "outcome", server_a.url(), "rollback: box b did not start")]
