"""Every front end sees the same box: the box screen, `watch --once` and `doctor --json`, on one
recorded box (tests/replay_transport.py) that triggers the detectors of every feed that reads
beside the poll (a running training run whose next checkpoint will not fit, an eval run with the
fake-0 % signature, torchao beside peft, a reference run the current one is worse than) beside the
recording's own traps (a stale server splitting reasoning, a hidden NaN in the training log),
raise the same codes. They run on the same session (console/core/session.py) and its feeds."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from samai.console import cli_box
from samai.console.app import SamaiApp
from samai.console.core import config
from samai.console.core.alertbook import FIRE_FAILED, RUN_ENDED
from samai.console.core.config import SEVERITIES, Train
from samai.console.core.training.feed import RESUME_AVAILABLE
from samai.console.core.watch.policy import Message
from samai.console.core.watch.sender import Sender
from samai.console.core.watch.trust import Trust
from samai.console.core.watch.watcher import BoxWatcher, Identity, watch
from samai.remote.boxapi import Box
from tests import chainlog
from tests.helpers import pilot_until
from tests.replay_transport import ReplayTransport
from tests.test_detector_registry import SPLIT

MB = 1 << 20
# The codes every front end must raise on this box: one of each kind the feeds bring.
EXPECTED = {"checkpoint_wont_fit", "fake_zero", "torchao_beside_peft", "worse_than_reference", "stale_server",
            "reasoning_split", "hidden_nan"}
# What only one front end says its own way: a run's end (doctor's `deaths`), a fire's failure, the resume choice.
OWN_WAYS = {"", RUN_ENDED, FIRE_FAILED, RESUME_AVAILABLE}


def _trainer_log(losses: list[float]) -> str:
    rows = [f"{{'loss': {loss}, 'grad_norm': 1.0, 'learning_rate': 0.0002, 'epoch': {i / 10}}}"
            for i, loss in enumerate(losses, 1)]
    return chainlog.run_log("train", 1, rows, 0, started="2026-12-03T00:00:00Z")


def _checkpoint(step: int, size: int) -> dict:
    return {"name": f"checkpoint-{step}", "step": step, "mtime": 1795999000.0 + step, "bytes": size, "files": 4,
            "complete": True, "missing": [], "temporary": [], "settling": False, "finite": None, "nonfinite": [],
            "weights": "adapter_model.safetensors", "problems": []}


def trapped_box(workspace: Path) -> ReplayTransport:
    box = ReplayTransport.recorded(workspace)
    # the reference: a kept run of the stage that went well, far below the running one's losses
    box.write_log("logs/train.log.1", _trainer_log([1.0, 0.9, 0.8, 0.7, 0.6, 0.5]))
    # the running training run's checkpoints: 400 MB each, on a disk with 300 MB free
    box.tools["checkpoints"] = lambda req: {"folder": req["folder"], "checkpoints": [
        _checkpoint(30, 400 * MB), _checkpoint(20, 390 * MB), _checkpoint(10, 380 * MB)]}
    disk = box.probe["disks"][0]
    disk.update(free=300 * MB, used=disk["total"] - 300 * MB)
    # torchao beside peft in the training environment
    site = workspace / "venv" / "lib" / "python3.11" / "site-packages"
    for name, version in (("peft", "0.19.1"), ("torchao", "0.10.0")):
        (site / f"{name}-{version}.dist-info").mkdir(parents=True)
        (site / f"{name}-{version}.dist-info" / "METADATA").write_text(f"Name: {name}\nVersion: {version}\n")
    (workspace / "venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (workspace / "venv" / "bin").mkdir()
    (workspace / "venv" / "bin" / "python").symlink_to(sys.executable)
    # the newest eval run: the fake 0 % (every answer empty, its thinking cut off)
    run = workspace / "runs" / "eval" / "split"
    run.mkdir(parents=True)
    (run / "items.jsonl").write_text("".join(line + "\n" for line in SPLIT))
    box.probe["reports"].append({"glob": "runs/eval/*/summary.json", "path": str(run / "summary.json"),
                                 "mtime": 1795999000.0,
                                 "text": json.dumps({"n": 8, "accuracy": 0.0, "empty_content": 8, "truncated": 8})})
    return box


def box_config(box: ReplayTransport) -> config.Config:
    tiny = config.load_builtin("tiny")
    return replace(tiny, workspace=box.workspace, target=replace(tiny.target, poll_interval=0.1),
                   train=Train(compare_factor=1.5, compare_steps=3, compare_smooth=1),
                   budget=replace(tiny.budget, reserve_gb=0.1),
                   notify=replace(tiny.notify, min_severity="warning"))  # the watcher sends the warnings too


def _shared(codes: set[str]) -> set[str]:
    return codes - OWN_WAYS


class Kept(Sender):
    """The watcher's sender, keeping what it would send (the real policy decided it)."""

    def __init__(self) -> None:
        super().__init__([], lambda line: None)
        self.messages: list[Message] = []

    async def send(self, messages, now: float, told=None) -> None:
        self.messages += messages


async def tui_codes(box: ReplayTransport, cfg: config.Config) -> set[str]:
    app = SamaiApp(cfg, open_box=lambda _cfg: Box(box, box.workspace))
    async with app.run_test(size=(150, 48)) as pilot:
        def raised() -> set[str]:
            return {a.code for a in app.state.active_alerts()
                    if SEVERITIES.index(a.severity) >= SEVERITIES.index(cfg.notify.min_severity)}

        try:
            await pilot_until(pilot, lambda: EXPECTED <= raised(), timeout=60)
        except AssertionError:
            raise AssertionError(f"the box screen raised {sorted(raised())}") from None
        return _shared(raised())


async def watch_codes(box: ReplayTransport, cfg: config.Config, tmp_path: Path) -> set[str]:
    sender = Kept()
    watcher = BoxWatcher("", cfg, lambda _cfg: Box(box, box.workspace), sender, Identity("parity", "op@h", "h"),
                         say=lambda line: None, trust=Trust.load(tmp_path / "watch.key"))
    await watch([watcher], once=True)
    return _shared({m.key.split("|", 1)[0] for m in sender.messages if m.kind == "alert"})


async def doctor_codes(box: ReplayTransport, cfg: config.Config, capsys) -> set[str]:
    await cli_box._doctor(argparse.Namespace(json=True), cfg, Box(box, box.workspace))
    found = json.loads(capsys.readouterr().out)["findings"]
    return _shared({f["code"] for f in found
                    if SEVERITIES.index(f["severity"]) >= SEVERITIES.index(cfg.notify.min_severity)})


@pytest.mark.slow  # the TUI runs
async def test_the_box_screen_the_watcher_and_doctor_raise_the_same_codes(tmp_path: Path, capsys) -> None:
    box = trapped_box(tmp_path / "ws")
    cfg = box_config(box)
    doctor = await doctor_codes(box, cfg, capsys)
    watched = await watch_codes(box, cfg, tmp_path)
    shown = await tui_codes(box, cfg)
    assert EXPECTED <= doctor, doctor
    assert watched == doctor, (watched ^ doctor)
    assert shown == doctor, (shown ^ doctor)
