"""The detectors (console/core/detectors.py) over the recorded box and over built snapshots: each
trap as a finding with its action, and the look-alikes that are none, with no process started
(tests/test_doctor.py finds the same traps in real processes, files and sockets)."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest

from samai.console.core import config
from samai.console.core.detectors import declared_binaries, detect
from samai.console.core.fixes import CLEAN, FixAction
from samai.console.core.preflight import poison_artifacts, poison_key
from samai.remote.boxapi import Box
from samai.remote.model import Snapshot
from tests import factories
from tests.replay_transport import ReplayTransport

STALE_START = 1795992800.0  # the recorded llama-server's start time


@pytest.fixture
def tiny(recorded_box: ReplayTransport) -> config.Config:
    return replace(config.load_builtin("tiny"), workspace=recorded_box.workspace)


async def _snapshot(transport: ReplayTransport, cfg: config.Config) -> Snapshot:
    """What a poll of the replay box returns, asked for what the console asks for."""
    box = Box(transport, transport.workspace)
    try:
        return await box.snapshot(artifacts=[(a.name, a.path) for a in cfg.artifacts] + poison_artifacts(cfg),
                                  writers=True, binaries=declared_binaries(cfg))
    finally:
        await box.close()


def _by_code(findings) -> dict[str, list]:
    out: dict[str, list] = {}
    for f in findings:
        out.setdefault(f.code, []).append(f)
    return out


async def test_the_recorded_box_has_one_stale_server_that_splits_reasoning_and_nothing_else(
        recorded_box: ReplayTransport, tiny: config.Config) -> None:
    found = _by_code(detect(tiny, await _snapshot(recorded_box, tiny)))
    assert sorted(found) == ["reasoning_split", "stale_server"]
    kill = FixAction("kill", pid=5100, start_time=STALE_START)
    [stale] = found["stale_server"]
    assert stale.severity == "warning" and stale.action == kill
    assert stale.message.startswith("port 18080 (stage serve) is held by pid 5100 which the console did not start")
    [split] = found["reasoning_split"]
    assert split.action == kill and "without --reasoning-format" in split.message


async def test_a_second_listener_on_the_serve_port_contends_for_it(recorded_box: ReplayTransport,
                                                                    tiny: config.Config) -> None:
    recorded_box.add("processes", factories.process(5200, argv=("llama-server", "--port", "18080"),
                                                    start_time=STALE_START + 60))
    recorded_box.add("listeners", factories.listener(18080, 5200, inode=201))
    found = _by_code(detect(tiny, await _snapshot(recorded_box, tiny)))
    [contended] = found["port_contended"]
    assert contended.severity == "error" and "2 listeners (pids 5100, 5200)" in contended.message
    assert contended.action == FixAction("kill", pid=5200, start_time=STALE_START + 60)  # the newer listener
    assert len(found["stale_server"]) == 2  # and neither was started by the console


async def test_a_server_in_the_serve_stages_group_list_is_its_own_even_in_another_session(
        recorded_box: ReplayTransport, tiny: config.Config) -> None:
    recorded_box.add("processes", factories.process(7000, argv=("sh", "serve.sh")))
    recorded_box.add("states", factories.stage_record("serve", 7000, alive=True, group=(7000, 5100)))
    assert "stale_server" not in _by_code(detect(tiny, await _snapshot(recorded_box, tiny)))
    recorded_box.set_state("serve", group=(7000,))  # the chain alone: the server is someone else's again
    assert "stale_server" in _by_code(detect(tiny, await _snapshot(recorded_box, tiny)))


async def test_two_groups_writing_one_file_is_an_error_one_group_is_not(recorded_box: ReplayTransport,
                                                                         tiny: config.Config) -> None:
    part = str(recorded_box.path("models/base/model.safetensors.part"))
    recorded_box.add("processes", factories.process(6100, start_time=STALE_START),
                     factories.process(6200, start_time=STALE_START + 5),
                     factories.process(6201, pgid=6200, start_time=STALE_START + 6))
    recorded_box.probe["writers"] = {part: [6200, 6201]}  # a shell and its child sharing an output
    assert "shared_writer" not in _by_code(detect(tiny, await _snapshot(recorded_box, tiny)))
    recorded_box.probe["writers"] = {part: [6100, 6200]}
    [shared] = _by_code(detect(tiny, await _snapshot(recorded_box, tiny)))["shared_writer"]
    assert shared.severity == "error" and part in shared.message and "2 processes in 2 groups" in shared.message
    assert shared.action == FixAction("kill", pid=6200, start_time=STALE_START + 5)  # the newer download


async def test_a_declared_binary_is_looked_for_in_the_workspace(recorded_box: ReplayTransport,
                                                                tiny: config.Config) -> None:
    assert "binaries" not in recorded_box.probe  # none recorded: read in the workspace folder, as the probe does
    cfg = replace(tiny, model=(*tiny.model, ("llama_server", "bin/llama-server")))

    async def said() -> list[str]:
        return [f.message for f in detect(cfg, await _snapshot(recorded_box, cfg)) if f.code == "binary_missing"]

    assert await said() == ["bin/llama-server does not exist (a tarball with a nested prefix?)"]
    binary = recorded_box.path("bin/llama-server")
    binary.parent.mkdir()
    binary.write_text("#!/bin/sh\n")
    assert await said() == ["bin/llama-server is not executable (a tarball with a nested prefix?)"]
    os.chmod(binary, 0o755)
    assert await said() == []


async def test_the_next_stages_peak_above_the_free_space(recorded_box: ReplayTransport, tiny: config.Config) -> None:
    disk = recorded_box.probe["disks"][0]

    async def peak() -> list:
        return [f for f in detect(tiny, await _snapshot(recorded_box, tiny)) if f.code == "disk_peak"]

    disk.update(free=505_000_000)  # merge adds 10 MB: 495 MB left at its peak, under the 500 MB reserve
    [full] = await peak()
    assert full.severity == "error" and full.action is None and full.message.startswith("stage merge needs 0.0 GB")
    quantized = next(a for a in recorded_box.probe["artifacts"] if a["name"] == "gguf_q")
    quantized.update(exists=True, bytes=5_000_000, allocated=5_000_000, files=1)  # the checkpoints are spent
    disk.update(free=508_500_000)
    [cleanable] = await peak()
    assert cleanable.severity == "warning" and cleanable.action == CLEAN
    assert cleanable.message.endswith("(clean intermediates first)")
    disk.update(free=20_000_000_000)
    assert await peak() == []


async def test_poison_after_a_failed_run_is_a_restart_a_good_runs_outputs_are_not(
        recorded_box: ReplayTransport, tiny: config.Config) -> None:
    for path in ("runs/train/TRAIN_NAN", "runs/train/TRAIN_DONE"):
        recorded_box.add("artifacts", factories.artifact(poison_key("train", path), path))

    async def poison() -> list:
        return [f for f in detect(tiny, await _snapshot(recorded_box, tiny)) if f.code == "poison_files"]

    assert await poison() == []  # running: what it leaves is the preflight's matter at the next fire
    recorded_box.set_state("train", alive=False, rc=1, group=())
    [left] = await poison()
    assert left.action == FixAction.restart("train") and left.severity == "warning"
    assert left.message == "stage train: runs/train/TRAIN_NAN left by its failed run; restarting clears them"
    recorded_box.set_state("train", rc=0)
    assert await poison() == []


def test_a_chain_gone_without_its_rc_is_lost_or_orphaned_by_what_it_left() -> None:
    cfg = config.load_builtin("tiny")
    lost = factories.stage_record("train", 4242, alive=False, rc=None, group=())
    orphaned = replace(lost, stage="merge", pid=4300, group=(4301,))
    found = _by_code(detect(cfg, factories.snapshot(states=(lost, orphaned))))
    assert [(f.message, f.action) for f in found["stage_lost"]] == [
        ("stage train (pid 4242) died without CHAIN_DONE", FixAction.restart("train")),
        ("stage merge (pid 4300) died without CHAIN_DONE; its group still runs", FixAction.stop("merge")),
    ]
    done = replace(lost, rc=0)
    assert "stage_lost" not in _by_code(detect(cfg, factories.snapshot(states=(done,))))


def test_a_rebuilt_box_with_the_push_in_place_is_told_to_restore() -> None:
    cfg = config.load_builtin("tiny")
    pushed = factories.artifact("pushed_gguf", "pushed/gguf/tiny-q8_0.gguf")
    gone = [factories.artifact(name, exists=False) for name in ("base", "adapter", "gguf_q")]
    [restore] = detect(cfg, factories.snapshot(artifacts=(pushed, *gone)))
    assert restore.code == "restore_available" and restore.action == FixAction.restart("restore")
    assert restore.message.startswith("base and adapter are gone but pushed_gguf was pushed")
    restored = factories.artifact("gguf_q", "gguf/tiny-q8_0.gguf")
    assert detect(cfg, factories.snapshot(artifacts=(pushed, *gone[:2], restored))) == []


@pytest.mark.parametrize(("argv", "split"), [
    (("llama-server", "-m", "m.gguf"), True),
    (("/opt/llama/bin/llama-server", "--reasoning-format", "deepseek"), True),
    (("llama-server", "--reasoning-format", "none"), False),
    (("python3", "llama-server", "--reasoning-format=none"), False),
    (("python3", "serve.py", "--port", "18080"), False),  # not a llama-server at all
])
def test_only_a_llama_server_that_splits_reasoning_is_flagged(argv: tuple[str, ...], split: bool) -> None:
    cfg = config.load_builtin("tiny")
    snap = factories.snapshot(processes=(factories.process(5100, argv=argv),))
    assert [f.code for f in detect(cfg, snap)] == (["reasoning_split"] if split else [])
