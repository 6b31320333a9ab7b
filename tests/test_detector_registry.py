"""One detector registry over one context (issue 30, item 7): each detector isolated, and `doctor`
and the TUI's state finding the same for the same box, the eval's and the GPUs' findings included.

Fast: the box is a Snapshot built here, and doctor runs in-process against a stand-in box that
answers with it."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

import pytest

from samai.console import cli_box as cli
from samai.console.core import config
from samai.console.core.detectors import (
    DETECTORS,
    INTERNAL_ERROR,
    SNAPSHOT_TRAPS,
    DetectorContext,
    DetectorRegistry,
    detect,
)
from samai.console.core.evals.feed import EvalRuns
from samai.console.core.problems import Finding, Problem
from samai.console.core.session import BoxSession
from samai.console.core.state import ConsoleState
from samai.remote.errors import BoxError
from samai.remote.model import (
    BinaryCheck,
    Distribution,
    Gpu,
    GpuReading,
    Listener,
    LogChunk,
    Process,
    PythonPackages,
    Report,
    SharedFile,
    Snapshot,
)

WS = "/ws"
PORT = 18080
CONFIG = f"""
[workspace]
path = "{WS}"
[model]
llama_server = "{WS}/bin/llama-server"
[stages.train]
key = "t"
command = 'venv/bin/python -m samai_box.stages.train --out runs/train'
[stages.serve]
key = "v"
command = "sleep 30"
ports = [{PORT}]
"""
# An eval run whose items are the reasoning split (§6): a fake 0 %, truncated, empty content.
SPLIT = [json.dumps({"id": i, "prompt": "17*23=", "gold": "391", "pred": None, "correct": False,
                     "finish_reason": "length", "content": "", "reasoning_content": "<think>17*20 = 340"})
         for i in range(8)]


def process(pid: int, pgid: int, *argv: str, start: float = 1.0) -> Process:
    return Process(pid, 1, pgid, pgid, "me", start, "S", 0.0, 0.0, 0, argv[0].rsplit("/", 1)[-1], argv)


def box_snapshot() -> Snapshot:
    """A box with a trap of each kind: two writers of one file, a stale llama-server that splits
    reasoning on the serve port, a missing binary, an eval summary that cannot be read beside a
    readable run, and a GPU with uncorrectable ECC errors."""
    procs = (process(101, 101, "curl", "-o", "model.part"), process(202, 202, "curl", "-o", "model.part", start=2.0),
             process(303, 303, f"{WS}/bin/llama-server", "-m", "old.gguf"))
    reports = (Report("runs/eval/*/summary.json", f"{WS}/runs/eval/split/summary.json", 50.0,
                      '{"n": 8, "accuracy": 0.0, "empty_content": 8, "truncated": 8}'),
               Report("runs/eval/*/summary.json", f"{WS}/runs/eval/bad/summary.json", 10.0, '{"n": 1e400}'))
    gpus = GpuReading(gpus=(Gpu(0, "A100", util_gpu=0, ecc_uncorrected=2),))
    return Snapshot(100.0, "box", 0, 0.0, (), (), procs, (Listener("tcp", "0.0.0.0", PORT, 1, 303),), (), (),
                    reports=reports, writers=(SharedFile(f"{WS}/model.part", (101, 202)),),
                    binaries=(BinaryCheck(f"{WS}/bin/llama-server", True, False),), gpus=gpus)


ENVS = (PythonPackages("venv/bin/python", found=(Distribution("peft", "0.19.1", "p"),
                                                  Distribution("torchao", "0.10.0", "t"))),)


class StandInBox:
    """What `doctor` asks of a box, answered with the snapshot above."""

    def __init__(self, snap: Snapshot, items: list[str]) -> None:
        self.snap, self.items = snap, items
        self.asked: dict = {}

    async def snapshot(self, **asked) -> Snapshot:
        """The snapshot, with an empty chunk of each log asked for (as a probe answers for logs not written)."""
        self.asked = asked
        logs = tuple(LogChunk(c.path, b"", 0, 0, size=0) for c in asked.get("logs", ()))
        return replace(self.snap, logs=logs)

    async def checkpoints(self, folder: str, *, weights: bool = True):
        raise BoxError("no checkpoints here")

    async def watchers(self):
        raise BoxError("nobody watches here")

    async def python_packages(self, pythons, names=()) -> tuple[PythonPackages, ...]:
        return ENVS

    async def read_log(self, cursor) -> LogChunk:
        if cursor.path != f"{WS}/runs/eval/split/items.jsonl":  # the newest run's items; no other file here
            return LogChunk(cursor.path, missing=True, error="no such file")
        whole = "".join(line + "\n" for line in self.items).encode()
        data = whole[cursor.offset or 0:]
        return LogChunk(cursor.path, data, cursor.offset or 0, len(whole), line_end=len(whole), size=len(whole),
                        inode=1, dev=1)


@pytest.fixture
def cfg() -> config.Config:
    return config.parse(CONFIG, "(test)")


async def doctor(cfg: config.Config, box: StandInBox, capsys) -> tuple[int, list[dict]]:
    rc = await cli._doctor(argparse.Namespace(json=True), cfg, box)  # type: ignore[arg-type]
    return rc, json.loads(capsys.readouterr().out)["findings"]


async def tui_alerts(cfg: config.Config, snap: Snapshot, items: list[str]) -> list[str]:
    """The codes of the alerts the box screen's session raises from its detectors on its first poll
    of snap and the reads beside it (its environments, the newest eval run's items)."""
    session = BoxSession(cfg, lambda _: StandInBox(snap, items), log=True)  # type: ignore[arg-type,return-value]
    try:
        await session.look_once()
    finally:
        session.box = None
    return [a.code for a in session.state.active_alerts() if a.finding is not None]


# ---------------------------------------------------------------- doctor == the TUI


async def test_doctor_and_the_tui_find_the_same_for_the_same_box(cfg, capsys) -> None:
    snap = box_snapshot()
    rc, found = await doctor(cfg, StandInBox(snap, SPLIT), capsys)
    codes = [f["code"] for f in found]
    assert sorted(codes) == sorted(await tui_alerts(cfg, snap, SPLIT))  # the same session, the same reads
    assert {"shared_writer", "stale_server", "reasoning_split", "binary_missing", "torchao_beside_peft",
            "gpu_ecc", "unreadable_summary", "fake_zero", "truncation", "empty_content"} <= set(codes)
    assert rc == 1


async def test_doctor_reports_the_newest_eval_runs_findings_and_unreadable_summaries(cfg, capsys) -> None:
    box = StandInBox(box_snapshot(), SPLIT)
    _, found = await doctor(cfg, box, capsys)
    assert box.asked["reports"] == cfg.ui.reports == [cfg.ui.eval_reports, cfg.ui.cu_reports]  # as the poll does
    by_code = {f["code"]: f for f in found}
    assert by_code["fake_zero"]["severity"] == "error" and by_code["fake_zero"]["message"].startswith("eval split: ")
    assert "runs/eval/bad/summary.json cannot be read" in by_code["unreadable_summary"]["message"]
    # and a healthy newest run adds nothing
    healthy = [json.dumps({"id": i, "gold": "391", "pred": "391", "correct": True, "finish_reason": "stop",
                           "content": "391"}) for i in range(8)]
    _, found = await doctor(cfg, StandInBox(box_snapshot(), healthy), capsys)
    assert not {"fake_zero", "truncation", "empty_content"} & {f["code"] for f in found}


async def test_doctors_json_for_a_finding_keeps_its_four_keys(cfg, capsys) -> None:
    _, found = await doctor(cfg, StandInBox(box_snapshot(), SPLIT), capsys)
    assert {tuple(f) for f in found} == {("code", "severity", "message", "action")}
    writer = next(f for f in found if f["code"] == "shared_writer")
    assert writer["action"] == "kill 202 2.0"


async def test_doctors_gpu_watch_sees_one_reading_no_stall(cfg, capsys) -> None:
    """A training run whose GPU is idle: the TUI's watch raises the stall after STALL_S of
    polls; doctor sees one reading, which shows no stall (and the same as the TUI's first poll)."""
    from samai.console.core.gpus.findings import STALL_S
    from samai.remote.model import GpuProcess, StageRecord

    train = process(404, 404, "venv/bin/python", "-m", "samai_box.stages.train")
    snap = replace(box_snapshot(), processes=(train,), listeners=(), writers=(), binaries=(), reports=(),
                   states=(StageRecord("train", 404, 404, 1.0, "logs/train.log", "x", 1.0, alive=True),),
                   gpus=GpuReading(gpus=(Gpu(0, "A100", util_gpu=0, processes=(GpuProcess(404, 1 << 30),)),)))
    _, found = await doctor(cfg, StandInBox(snap, []), capsys)
    assert "gpu_stall" not in {f["code"] for f in found}
    state = ConsoleState(cfg)
    state.apply(snap, [], 100.0)
    later = state.apply(replace(snap, time=snap.time + STALL_S + 600), [], 800.0)
    assert "gpu_stall" in {a.code for a in later.new_alerts}


# ---------------------------------------------------------------- the registry


def boom(ctx: DetectorContext) -> list[Finding]:
    raise ZeroDivisionError("division by zero")


def half_then_boom(ctx: DetectorContext):
    yield Finding("half", "warning", "found before the detector broke")
    raise KeyError("gone")


def fine(ctx: DetectorContext) -> list[Finding]:
    return [Finding("fine", "info", "a finding")]


def test_a_detector_that_raises_is_one_internal_error_finding_and_the_others_run(cfg) -> None:
    registry = DetectorRegistry()
    for name, detector in (("boom", boom), ("fine", fine), ("generator", half_then_boom)):
        registry.register(name, detector)
    found = registry.run(DetectorContext.of(cfg, box_snapshot()))
    assert [f.code for f in found] == [INTERNAL_ERROR, "fine", INTERNAL_ERROR]
    assert found[0].severity == "error" and "boom detector: ZeroDivisionError: division by zero" in found[0].message
    assert "generator detector: KeyError" in found[2].message
    assert registry.names == ("boom", "fine", "generator")
    with pytest.raises(ValueError, match="registered already"):
        registry.register("fine", fine)


def test_a_raising_detector_costs_the_poll_nothing_and_is_one_standing_alert(cfg) -> None:
    registry = DetectorRegistry()
    registry.register("boom", boom)
    registry.register("fine", fine)
    state = ConsoleState(cfg, registry)
    snap = box_snapshot()
    update = state.apply(snap, [], 100.0)
    assert [a.code for a in update.new_alerts] == [INTERNAL_ERROR, "fine"]
    assert len(update.stages) == len(cfg.stages) and update.view(EvalRuns)  # the rest of the poll is there
    again = state.apply(replace(snap, time=101.0), [], 101.0)
    assert again.new_alerts == []  # the same failure is the same alert, not one a poll
    assert [a.code for a in state.active_alerts()] == ["fine", INTERNAL_ERROR]


def test_the_registry_runs_the_snapshot_traps_first_then_the_read_and_kept_ones() -> None:
    assert DETECTORS.names == (*SNAPSHOT_TRAPS, "torchao_beside_peft", "gpus", "serving", "disk_filling",
                               "memory_filling", "checkpoint_space", "unreadable_summaries", "eval")


def test_detect_is_the_snapshot_traps_alone(cfg) -> None:
    codes = {f.code for f in detect(cfg, box_snapshot())}
    assert {"shared_writer", "stale_server", "reasoning_split", "binary_missing"} <= codes
    assert not codes & {"gpu_ecc", "unreadable_summary", "torchao_beside_peft"}


# ---------------------------------------------------------------- one finding type


def test_a_checkers_problem_is_a_finding_with_where_it_is() -> None:
    assert Problem is Finding
    p = Problem("nan_loss", "error", "loss is nan at step 7", step=7)
    assert (p.action, p.step, p.lines, p.count) == (None, 7, (), None)
    assert Finding("x", "warning", "HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz0123").message == "HF_TOKEN=***"
