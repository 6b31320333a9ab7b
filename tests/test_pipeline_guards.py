"""Runs that go wrong on a real Trainer: the NaN guard, a raised learning rate against the last
good run, runs that die after step 4 and pass nowhere downstream (merge, convert and quantize
refuse what they made)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from samai.console.core import config, paths
from samai.console.core.actions import Actions
from samai.console.core.audit import AuditLog
from samai.console.core.checks import check_trainlog
from samai.console.core.training.resume import resume_choice
from samai.remote.boxapi import Box
from samai.remote.local import LocalTransport
from tests.pipeline_helpers import (
    LONG,
    confirm,
    free_port,
    run_stage,
    tiny,
    with_command,
)

pytestmark = LONG


async def test_the_nan_guard_stops_training_and_merge_refuses(tiny_ws: Path) -> None:
    cfg = tiny(tiny_ws, free_port())
    box = Box(LocalTransport(), str(tiny_ws), python=sys.executable)
    try:
        assert "FETCH_DONE" in await run_stage(box, cfg, "fetch")
        train = cfg.stage("train")
        poisoned = replace(cfg, stages=tuple(replace(s, command=s.command + " --inject-nan") if s is train else s
                                             for s in cfg.stages))
        log = await run_stage(box, poisoned, "train")
        assert "TRAIN_NAN" in log and "CHAIN_DONE rc=3" in log, log[-3000:]
        assert (tiny_ws / "runs" / "train" / "TRAIN_NAN").exists()
        assert not (tiny_ws / "runs" / "train" / "final").exists()
        log = await run_stage(box, cfg, "merge")
        assert "MERGE_REFUSED" in log and "TRAIN_NAN" in log and "CHAIN_DONE rc=2" in log
        log = await run_stage(box, cfg, "train")  # a restart that does not clear the poison is refused
        assert "TRAIN_REFUSED" in log and "poison" in log
        assert (await box.remove(list(train.poison))).ok  # what restart does before firing again
    finally:
        await box.close()


async def test_a_run_with_a_raised_learning_rate_is_worse_than_the_last_good_one(tiny_ws: Path,
                                                                                   tmp_path: Path) -> None:
    """Issue 34: three real Trainer runs of the tiny train stage, 40 steps each: a healthy one,
    another (another seed: not flagged against the first), one at lr 0.5 (flagged against the
    last good run); then `check trainlog --against` on the same two real logs."""
    from samai.console.core.checks import check_trainlog
    from samai.console.core.training.trainref import compare, last_good_run
    from tests.helpers import run_cli

    cfg = tiny(tiny_ws, free_port())
    box = Box(LocalTransport(), str(tiny_ws), python=sys.executable)
    train = cfg.stage("train")
    log, verdicts = str(tiny_ws / train.log), []
    try:
        assert "FETCH_DONE" in await run_stage(box, cfg, "fetch")
        for extra in ("--max-steps 40 --seed 1", "--max-steps 40 --seed 2", "--max-steps 40 --seed 3 --lr 0.5"):
            assert (await box.remove(list(train.poison))).ok
            out = await run_stage(box, with_command(cfg, "train", f"{train.command} {extra}"), "train")
            assert "CHAIN_DONE rc=0" in out, out[-3000:]
            reference = await last_good_run(box, log, cfg.train)
            worse = compare((await check_trainlog(box, log)).points, reference, cfg.train) if reference else None
            verdicts.append((reference.label if reference else None, worse))
    finally:
        await box.close()
    assert verdicts[0] == (None, None) and verdicts[1] == ("train.log.1", None), verdicts
    assert verdicts[2][0] == "train.log.1" and verdicts[2][1] is not None, verdicts  # seed 2's run, the last good
    print(f"lr 0.5 against the last good run: {verdicts[2][1].problem().message}")
    f = tmp_path / "against.toml"
    f.write_text(f'[workspace]\npath = "{tiny_ws}"\n')
    r = run_cli("--config", str(f), "check", "trainlog", "logs/train.log", "--against", "logs/train.log.1", "--json")
    assert r.returncode == 1 and any(a["code"] == "worse_than_reference" for a in json.loads(r.stdout)["anomalies"])
    r = run_cli("--config", str(f), "check", "trainlog", "logs/train.log.1", "--against", "logs/train.log.2", "--json")
    assert r.returncode == 0, r.stdout[-2000:]


POISON_SAFETENSORS = """import sys
from safetensors.torch import load_file, save_file
tensors = load_file(sys.argv[1])
name = sorted(tensors)[0]
tensors[name].view(-1)[0] = float("inf")
save_file(tensors, sys.argv[1], metadata={"format": "pt"})
print(name)
"""


POISON_GGUF = """import sys
sys.path.insert(0, sys.prefix + "/llama.cpp/gguf-py")
from gguf import GGUFReader
reader = GGUFReader(sys.argv[1], "r+")
tensor = next(t for t in reader.tensors if t.tensor_type.name == "F32")
tensor.data.reshape(-1)[0] = float("nan")
reader.data.flush()
print(tensor.name)
"""


def poison(ws: Path, script: str, path: Path) -> str:
    """One weight of a real model file set to nan/inf with the box venv's own libraries; its tensor's name."""
    done = subprocess.run([str(ws / "venv" / "bin" / "python"), "-c", script, str(path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


DIVERGENCES = {"diverged": ("--diverge-after 4", {"nan_grad_norm", "hidden_nan", "nan_guard_fired"}),
               "dead-gradients": ("--kill-gradients-after 4", {"dead_gradients", "nan_guard_fired"})}


async def test_runs_that_die_after_step_4_pass_nowhere_downstream(tiny_ws: Path) -> None:
    cfg = tiny(tiny_ws, free_port())
    train = cfg.stage("train")
    run_dir = tiny_ws / "runs" / "train"
    box = Box(LocalTransport(), str(tiny_ws), python=sys.executable)
    actions = Actions(box, cfg, AuditLog(paths.audit_log()), readonly=False, confirm=confirm)
    try:
        assert "FETCH_DONE" in await run_stage(box, cfg, "fetch")
        for kind, (flags, expected) in DIVERGENCES.items():
            log = await run_stage(box, with_command(cfg, "train", f"{train.command} --max-steps 16 {flags}"), "train")
            assert "TRAIN_NAN" in log and "logged steps in a row from step" in log, f"{kind}:\n{log[-3000:]}"
            assert "CHAIN_DONE rc=3" in log and "TRAIN_DONE" not in log, kind
            assert (run_dir / "TRAIN_NAN").exists(), kind
            assert not (run_dir / "final").exists() and not (run_dir / "TRAIN_DONE").exists(), kind

            found = await check_trainlog(box, str(tiny_ws / train.log))  # what `check trainlog` prints
            codes = {a.code: a for a in found.problems}
            assert expected <= set(codes), (kind, list(codes))
            late = codes["hidden_nan" if kind == "diverged" else "dead_gradients"]
            assert late.step > 4 and late.severity == "error", late
            first = min(p.step for p in found.problems if p.step is not None and p.severity == "error")
            choice = await resume_choice(box, cfg, train)  # never a checkpoint written after the first anomaly
            assert choice.chosen is None or choice.chosen.step < first, (kind, choice, first)

            plan = await actions.plan_fire("merge")  # the console's own merge preflight
            finding = f"train's log, last run: {late.code}: {late.message}"
            assert plan.blocked and finding in [c.text for c in plan.checks], plan.checks
            outcome = await actions.fire("merge")
            assert outcome.status == "refused" and not (tiny_ws / cfg.stage("merge").log).exists(), kind

            log = await run_stage(box, cfg, "merge")  # the merge script, fired anyway
            assert "MERGE_REFUSED" in log and "TRAIN_NAN" in log and "CHAIN_DONE rc=2" in log, log[-3000:]
            if kind == "diverged":
                await _downstream_refuses_the_poison(box, cfg, tiny_ws)
            # what restart clears, and the logs: the next run's findings are its own
            assert (await box.remove([*train.poison, "runs/train/checkpoints", train.log, cfg.stage("merge").log])).ok
    finally:
        await box.close()


async def _downstream_refuses_the_poison(box: Box, cfg: config.Config, ws: Path) -> None:
    """Past the file gate by hand (the diverged run's newest checkpoint put in place as final/, its
    TRAIN_NAN deleted), merge still refuses the nan adapter; convert and quantize refuse nan input."""
    run_dir = ws / "runs" / "train"
    *_, checkpoint = sorted((run_dir / "checkpoints").glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    checkpoint.rename(run_dir / "final")  # the newest: the Trainer keeps the last --save-total-limit
    (run_dir / "TRAIN_NAN").unlink()
    (run_dir / "TRAIN_DONE").write_text("forged\n")
    log = await run_stage(box, cfg, "merge")
    assert "MERGE_REFUSED the adapter:" in log and "tensors in runs/train/final are not finite" in log, log[-3000:]
    assert ".lora_A.weight" in log and "CHAIN_DONE rc=2" in log and not (ws / "models" / "merged").exists()

    merged = ws / "models" / "merged"  # a merged model with one inf weight: convert refuses it
    subprocess.run(["cp", "-r", str(ws / "models" / "base"), str(merged)], check=True)
    bad = poison(ws, POISON_SAFETENSORS, merged / "model.safetensors")
    log = await run_stage(box, cfg, "convert")
    assert "CONVERT_REFUSED" in log and "1 of " in log and bad in log and "CHAIN_DONE rc=2" in log, log[-3000:]
    assert not (ws / "gguf" / "tiny-f16.gguf").exists()

    f16 = cfg.stage("convert").command.replace("models/merged", "models/base").replace(" --delete-input", "")
    log = await run_stage(box, with_command(cfg, "convert", f16), "convert")  # a healthy f16 of the base
    assert "CONVERT_DONE" in log and "all 21 F32/F16 tensors finite" in log, log[-3000:]
    bad = poison(ws, POISON_GGUF, ws / "gguf" / "tiny-f16.gguf")
    log = await run_stage(box, cfg, "quantize")
    assert "QUANT_REFUSED the input: 1 of" in log and bad in log and "CHAIN_DONE rc=2" in log, log[-3000:]
    assert not (ws / "gguf" / "tiny-q8_0.gguf").exists()
    assert (await box.remove(["models/merged", "gguf/tiny-f16.gguf"])).ok
