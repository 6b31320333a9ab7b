"""A stalled rank of a multi-node run is rank_stalled (issue 48, item 5): a rank whose step stops
advancing while another's goes on, or a run none of whose ranks advances for [train]
stall_after_s while every node's processes live, names the rank and box that stopped first, its
last step and since when, with stop-all as its fix; resolved once it steps again or the run is
stopped. For real: a two-node torchrun (gloo, on the CPU) over the two test sshd boxes, one
rank's worker SIGSTOPped; and real chains of a stand-in that prints the train stage's progress
lines, read through the nodes' real session and the nodes feed's fold."""

from __future__ import annotations

import asyncio
import re
import signal
import sys
from pathlib import Path

import psutil
import pytest

from samai.console.core import config, paths
from samai.console.core.audit import AuditLog
from samai.console.core.config import ConfigError
from samai.console.core.feeds import Surroundings
from samai.console.core.feeds.nodes import NodesFeed
from samai.console.core.multinode import MultiRun, last_step_in_log, load_run, rank_in_log
from samai.console.core.multinode.actions import MultiNodeActions
from samai.console.core.multinode.session import MultiNodeSession
from samai.console.core.multinode.watch import watch
from samai.console.core.problems import Finding
from samai.console.core.state import ConsoleState
from tests import sshd
from tests.helpers import stop_stages_under
from tests.pipeline_helpers import PROVISION_TIMEOUT
from tests.test_multinode import (  # noqa: F401  (two_servers, trained_inputs: the fixtures)
    TRAIN,
    TRAIN_TIMEOUT,
    _close,
    _confirm,
    _log,
    _node_workspaces,
    _nodes,
    _processes_of,
    _record_by_hand,
    _until,
    fleet,
    fleet_toml,
    needs_sshd,
    trained_inputs,
    two_servers,
)

STALL = "[train]\nstall_after_s = {}\n"

# The train stage's progress line on every rank, one step every 0.2 s while no `hold` file is in
# its workspace; it says its rank first, as the train stage does under a launcher.
STEPS = """import os, sys, time
print("TRAIN_RANK rank=%s world_size=2 local_rank=0" % sys.argv[1], flush=True)
step = 0
while True:
    if not os.path.exists("hold"):
        step += 1
        print("train %d/100000 [00:01<00:10, 1.00it/s]" % step, flush=True)
        print("{'loss': '0.5', 'grad_norm': '1.0', 'learning_rate': '0.0001', 'epoch': '0.1'}", flush=True)
    time.sleep(0.2)
"""


def test_stall_after_s_is_read_with_its_default_and_its_range(tmp_path: Path) -> None:
    assert fleet(tmp_path / "a", tmp_path / "b").train.stall_after_s == 120.0
    cfg = fleet(tmp_path / "a", tmp_path / "b", extra=STALL.format(30) + "resume_tolerance = 0.01\n")
    assert (cfg.train.stall_after_s, cfg.train.resume_tolerance) == (30.0, 0.01)
    with pytest.raises(ConfigError, match=r"train\.stall_after_s: expected"):
        fleet(tmp_path / "a", tmp_path / "b", extra=STALL.format(0))


def _stepping_fleet(tmp_path: Path, stall_after_s: float) -> config.Config:
    for node in "ab":
        (tmp_path / node).mkdir()
        (tmp_path / node / "steps.py").write_text(STEPS)
    return fleet(tmp_path / "a", tmp_path / "b", command=f"{sys.executable} steps.py", port=sshd.free_port(),
                 extra=STALL.format(stall_after_s))


def _stepper(ws: Path) -> psutil.Process:
    """The stand-in's process in that workspace."""
    for proc in psutil.process_iter(["cmdline", "cwd"]):
        if proc.info["cmdline"] and "steps.py" in proc.info["cmdline"] and proc.info["cwd"] == str(ws):
            return proc
    raise AssertionError(f"no steps.py runs in {ws}")


def _steps(ws: Path) -> list[int]:
    return [int(s) for s in re.findall(rb"(?m)^train (\d+)/", _log(ws))]


class Watched:
    """The nodes' real session and a console's state whose nodes feed reads it, as a box screen's."""

    def __init__(self, cfg: config.Config) -> None:
        self.session = MultiNodeSession(cfg, AuditLog(paths.audit_log()), readonly=False, confirm=_confirm)
        self.state = ConsoleState(cfg.on_box("a"), around=Surroundings("a", lambda: self.session))
        self.now = 0.0

    async def read(self) -> list[Finding]:
        """One reading of the nodes, folded in by the feed as the session folds it: its findings."""
        feed = self.state.feed(NodesFeed)
        assert feed is not None and feed.enabled
        self.now += 3600.0  # each read is due
        (read,) = feed.reads(self.now)
        reading = await read.fetch(None)  # type: ignore[arg-type]  # the feed reads the nodes, not this box
        self.state.fold_read(feed, read, reading, self.now)
        return [f for f in reading[0] if f.code == "rank_stalled"]

    def alerts(self) -> list:
        return [a for a in self.state.book.active() if a.code == "rank_stalled"]

    async def until_stalled(self, timeout: float = 120) -> Finding:
        async def found():
            return (await self.read() or [None])[0]

        return await _until(found, timeout, "rank_stalled")


@pytest.mark.slow
async def test_a_rank_that_stops_while_another_goes_on_is_named_and_resolved_when_it_steps_again(
        tmp_path: Path) -> None:
    cfg = _stepping_fleet(tmp_path, stall_after_s=2)
    ws_a, ws_b = tmp_path / "a", tmp_path / "b"
    command = f"{sys.executable} -u steps.py"
    nodes, run = await _record_by_hand(cfg, {"a": f"{command} 0", "b": f"{command} 1"})
    watched = Watched(cfg)
    try:
        await _until(lambda: len(_steps(ws_a)) >= 3 and len(_steps(ws_b)) >= 3, 60, "both stepping")
        assert await watched.read() == [] and watched.alerts() == []  # both advance: no stall

        # b's rank is stopped (SIGSTOP); a's goes on. b is named, its process stopped (state T).
        stepper = _stepper(ws_b)
        stepper.send_signal(signal.SIGSTOP)
        stalled = await watched.until_stalled()
        step = _steps(ws_b)[-1]
        assert _steps(ws_a)[-1] > step  # a went on meanwhile
        assert stalled.message.startswith(f"rank 1 on box b stopped first: no step since step {step} (logged at "), \
            stalled.message
        assert stalled.message.endswith(f" for [train] stall_after_s (2 s) while every node's processes live; its "
                                        f"process pid {stepper.pid} is stopped (state T): stop all, then resume "
                                        "from the newest whole checkpoint"), stalled.message
        assert (stalled.severity, stalled.step, stalled.action.kind, stalled.action.stage) == (
            "error", step, "stop", "train")
        (alert,) = watched.alerts()
        assert alert.text == stalled.message and alert.hint == "x stop all"
        await watched.read()
        assert watched.alerts() == [alert]  # raised once

        # Continued: it steps again, and the alert is resolved.
        stepper.send_signal(signal.SIGCONT)
        await _until(lambda: _steps(ws_b)[-1] > step, 60, "b stepping again")
        assert await watched.read() == [] and watched.alerts() == []

        # b stops logging steps without being stopped (a hang of its own): named by its step.
        (ws_b / "hold").touch()
        held = await watched.until_stalled()
        assert re.match(r"rank 1 on box b stopped first: no step since step \d+ \(logged at ", held.message), \
            held.message
        assert "state T" not in held.message
        # a stops too, later and further on: no rank advances; b, at the lower step, stopped first.
        await _until(lambda: _steps(ws_a)[-1] > _steps(ws_b)[-1], 60, "a past b")
        (ws_a / "hold").touch()
        both = await watched.until_stalled()
        assert both.message.startswith(f"rank 1 on box b stopped first: no step since step {_steps(ws_b)[-1]} ")

        # Its fix: stop all. Nothing is judged stalled once the run has ended; the alert resolved.
        stopped = await MultiNodeActions(cfg, nodes, confirm=_confirm).stop_all("train", grace=2)
        assert stopped.ok, stopped.message
        assert await watched.read() == [] and watched.alerts() == []
    finally:
        stop_stages_under(tmp_path)
        await watched.session.close()
        await _close(nodes)


@pytest.mark.slow
async def test_a_node_that_logs_no_step_is_not_the_one_named_and_a_run_at_its_last_step_is_not_stalled(
        tmp_path: Path) -> None:
    cfg = _stepping_fleet(tmp_path, stall_after_s=1)
    stuck = "echo 'TRAIN_RANK rank=0 world_size=2 local_rank=0'; echo 'train 39/40 [00:39<00:01, 1.00it/s]'; sleep 300"
    silent = "echo 'TRAIN_RANK rank=1 world_size=2 local_rank=0'; sleep 300"  # a program that logs no step
    nodes, run = await _record_by_hand(cfg, {"a": stuck, "b": silent})
    watched = Watched(cfg)
    try:
        await _until(lambda: b"train 39/40" in _log(tmp_path / "a"), 30, "a's step")
        stalled = await watched.until_stalled(60)
        assert stalled.message.startswith("rank 0 on box a stopped first: no step since step 39 (logged at "), \
            stalled.message
        with (tmp_path / "a" / "logs" / "train.log").open("a") as log:  # its last step: saving, not stalled
            log.write("train 40/40 [00:40<00:00, 1.00it/s]\n")
        await asyncio.sleep(1.5)  # longer than stall_after_s since it was written
        states, _ = await watch(run, {n: a.box for n, a in nodes.items()})
        assert [s.progress and (s.progress.step, s.progress.total) for s in states] == [(40, 40), (None, None)]
        assert await watched.read() == [] and watched.alerts() == []
    finally:
        stop_stages_under(tmp_path)
        await watched.session.close()
        await _close(nodes)


# ------------------------------------------------------------------ for real: torchrun over two SSH boxes


def _worker(run: MultiRun, node: str) -> psutil.Process:
    """The node's rank: the train stage's process under torch's elastic agent (not the agent)."""
    (worker,) = [p for p in _processes_of(run.run_id, node)
                 if "samai_box.stages.train" in p.cmdline() and "torch.distributed.run" not in p.cmdline()]
    return worker


@needs_sshd
@pytest.mark.slow
@pytest.mark.timeout(PROVISION_TIMEOUT + TRAIN_TIMEOUT)
async def test_torchrun_across_two_ssh_boxes_one_rank_sigstopped_is_rank_stalled_naming_it(
        two_servers, trained_inputs: Path,  # noqa: F811  (the fixtures imported above)
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    server_a, server_b = two_servers
    monkeypatch.setenv("HOME", str(server_a.client_home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    ws_a, ws_b = _node_workspaces(tmp_path, trained_inputs)
    cfg_file = tmp_path / "samai.toml"
    cfg_file.write_text(fleet_toml(ws_a, ws_b, url_a=server_a.url(), url_b=server_b.url(), port=sshd.free_port(),
                                   command=TRAIN.format(epochs=200), extra=STALL.format(10)))
    cfg = config.load(cfg_file)
    nodes = _nodes(cfg, confirm=_confirm)
    watched = Watched(cfg)
    worker: psutil.Process | None = None
    try:
        fired = await MultiNodeActions(cfg, nodes, confirm=_confirm).fire("train")
        assert fired.ok, fired.message
        run = load_run(cfg, "train")
        assert run is not None
        for ws in (ws_a, ws_b):  # a real rendezvous, both ranks training
            await _until(lambda ws=ws: re.search(rb"(?m)^train [3-9]\d*/", _log(ws)), TRAIN_TIMEOUT,
                         f"training steps in {ws}")
        assert await watched.read() == []

        worker = _worker(run, "b")
        worker.send_signal(signal.SIGSTOP)  # b's rank stops; a's blocks in its next gloo collective
        stalled = await watched.until_stalled(240)
        rank, step = rank_in_log(_log(ws_b)), last_step_in_log(_log(ws_b))
        assert rank in (0, 1) and step is not None
        assert stalled.message.startswith(f"rank {rank} on box b stopped first: no step since step {step} "
                                          "(logged at "), stalled.message
        assert f"its process pid {worker.pid} is stopped (state T): stop all" in stalled.message, stalled.message
        assert (stalled.action.kind, stalled.action.stage) == ("stop", "train")
        states, died = await watch(run, {n: a.box for n, a in nodes.items()})
        assert [s.alive for s in states] == [True, True] and died == []  # every process lives: no death
        assert [a.text for a in watched.alerts()] == [stalled.message]

        worker.send_signal(signal.SIGCONT)
        stopped = await MultiNodeActions(cfg, nodes, confirm=_confirm).stop_all("train", grace=5)
        assert stopped.ok, stopped.message
        assert await watched.read() == [] and watched.alerts() == []
        assert not _processes_of(run.run_id, "a") and not _processes_of(run.run_id, "b")
    finally:
        if worker is not None and worker.is_running():
            worker.send_signal(signal.SIGCONT)
        await asyncio.gather(*(a.box.stop("train", grace=2) for a in nodes.values()), return_exceptions=True)
        stop_stages_under(tmp_path)
        await watched.session.close()
        await _close(nodes)
