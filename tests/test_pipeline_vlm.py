"""Playbook §10 on this CPU through the TUI's keys: the tiny VLM pipeline from fetch to serve
with its projector, evaluated with images, then operating web pages in headless Chromium and one
reward-driven round."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from samai.console.core import config
from samai.console.core.evals.check import check_eval
from samai.console.core.evals.cucheck import check_episodes
from samai.console.core.evals.feed import EvalsFeed
from samai.remote.box.gguf_check import check_file
from samai.remote.box.stages.serve import holders
from samai.remote.boxapi import Box
from samai.remote.local import LocalTransport
from tests.box_tools import stage_argv, stage_env
from tests.helpers import confirm_dialog
from tests.pipeline_helpers import (
    LONG,
    bar,
    findings_about,
    fire_confirmed,
    free_port,
    log_of,
    open_dialog,
    own_server_findings,
)

pytestmark = LONG


def vlm_tiny(workspace: Path, port: int) -> config.Config:
    """The built-in vlm-tiny pipeline in this workspace, serving on a free port."""
    cfg = config.load_builtin("vlm-tiny")
    ports = {"18081": str(port), "18082": str(free_port())}  # the server's, and the reward-driven round's

    def moved(s: config.Stage) -> config.Stage:
        command = s.command.replace("18081", ports["18081"]).replace("18082", ports["18082"])
        return replace(s, command=command, ports=tuple(int(ports[str(p)]) for p in s.ports))

    stages = tuple(moved(s) for s in cfg.stages)
    return replace(cfg, workspace=str(workspace), stages=stages, target=replace(cfg.target, poll_interval=0.3))


def _venv_stage(ws: Path, module: str, *args: str) -> subprocess.CompletedProcess:
    """A stage run by hand in the workspace with the box venv, as its command would run it
    (module "-c": the box venv's python on a program, with the box tools importable)."""
    python = str(ws / "venv" / "bin" / "python")
    argv = [python, "-c", *args] if module == "-c" else stage_argv(module, *args, python=python)
    return subprocess.run(argv, cwd=ws, env=dict(stage_env(), SAMAI_WORKSPACE=str(ws)), capture_output=True,
                          text=True, timeout=600)


PREFIX_MASK_PROBE = """
import json
from samai_box.stages import vision
tok, image_processor = vision.load_processor("models/base")
example = vision.load_examples("data/train.jsonl")[:1]
batch = vision.encode(tok, image_processor, example)
answer = tok(example[0][1][-1]["content"] + tok.eos_token, add_special_tokens=False)["input_ids"]
print(json.dumps({"ids": batch["input_ids"][0].tolist(), "labels": batch["labels"][0].tolist(), "answer": answer,
                  "image_pad": tok.convert_tokens_to_ids(vision.IMAGE_PAD)}))
"""


async def test_the_vlm_pipeline_end_to_end_from_the_keys(pipeline_ws: Path, spawn) -> None:
    """Playbook §10 on this CPU, keys and dialogs only: a tiny Qwen2.5-VL fetched, LoRA-trained on
    its language model alone (a text model's target list, which catches the ViT, refused before
    a step), merged whole, converted to the model and its projector, quantized, served by the real
    llama-server with --mmproj (smoke: an image's colour), evaluated with images (the photo-sized
    one capped at 1120 px); a serve without its projector refused, a server without --mmproj found."""
    from samai.console.app import SamaiApp
    from tests.helpers import pilot_until

    port = free_port()
    cfg = vlm_tiny(pipeline_ws, port)
    app = SamaiApp(cfg)
    async with app.run_test(size=(160, 50)) as pilot:
        await pilot_until(pilot, lambda: app.state.snapshot)
        await fire_confirmed(pilot, app, "2", "fetch", timeout=900)

        # The trap: the text pipeline's target names also match the ViT's gate/up/down_proj.
        text_targets = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
        trap = _venv_stage(pipeline_ws, "stages.train", "--base", "models/base", "--data", "data/train.jsonl",
                           "--out", "runs/trap", "--lora-targets", text_targets)
        assert trap.returncode == 2 and "TRAIN_REFUSED" in trap.stdout, trap.stdout[-2000:] + trap.stderr[-2000:]
        assert "LoRA targets matched vision modules" in trap.stdout and "visual.blocks" in trap.stdout
        assert not (pipeline_ws / "runs" / "trap" / "final").exists()
        # The NaN guard and the poison files hold for an image-text run too.
        sick = _venv_stage(pipeline_ws, "stages.train", "--base", "models/base", "--data", "data/train.jsonl",
                           "--out", "runs/sick", "--inject-nan", "--max-steps", "6")
        assert sick.returncode == 3 and "TRAIN_NAN" in sick.stdout, sick.stdout[-2000:] + sick.stderr[-2000:]
        again = _venv_stage(pipeline_ws, "stages.train", "--base", "models/base", "--data", "data/train.jsonl",
                            "--out", "runs/sick")
        assert again.returncode == 2 and "poison files" in again.stdout

        # The prefix mask: the question and the image's tokens labelled -100, the answer learned.
        masked = _venv_stage(pipeline_ws, "-c", PREFIX_MASK_PROBE)
        batch = json.loads(masked.stdout.strip().splitlines()[-1]) if masked.returncode == 0 else masked.stderr
        answer, ids, labels = batch["answer"], batch["ids"], batch["labels"]
        assert ids[-len(answer):] == answer and labels == [-100] * (len(ids) - len(answer)) + answer
        assert ids.count(batch["image_pad"]) >= 8  # the image's merged tokens, all in the masked prefix

        await fire_confirmed(pilot, app, "3", "train")
        train_log = log_of(app, "train")
        by_part = next(line for line in train_log.splitlines() if line.startswith("trainable parameters by part:"))
        assert "vision 0, merger 0," in by_part and int(by_part.split("language ")[1].split(",")[0]) > 0
        for key, stage in (("4", "merge"), ("5", "convert"), ("6", "quantize")):
            await fire_confirmed(pilot, app, key, stage)
        model, mmproj = pipeline_ws / "gguf" / "vlm-q8_0.gguf", pipeline_ws / "gguf" / "vlm-mmproj-f16.gguf"
        assert check_file(str(model))["ok"] and check_file(str(mmproj))["ok"]
        box = Box(LocalTransport(), str(pipeline_ws), python=sys.executable)
        try:
            kvs = {kv.key: kv.value for kv in (await box.gguf_show(str(mmproj))).kvs}
        finally:
            await box.close()
        assert kvs["general.architecture"] == "clip" and "qwen2.5vl" in kvs["clip.projector_type"]
        assert not (pipeline_ws / "models" / "merged").exists()  # the intermediate went

        # Serve without its projector: the dialog refuses it, naming the file.
        await pilot_until(pilot, lambda: not app.busy)
        mmproj.rename(mmproj.with_suffix(".away"))
        refused = await open_dialog(pilot, app, "7")
        assert any(c.severity == "error" and "vlm-mmproj-f16.gguf" in c.text for c in refused.checks), refused.checks
        await pilot.press("escape")
        await pilot_until(pilot, lambda: not app.busy)
        mmproj.with_suffix(".away").rename(mmproj)

        await pilot_until(pilot, lambda: not app.busy)
        serve = await open_dialog(pilot, app, "7")
        assert not [c.text for c in serve.checks if c.severity == "error"], serve.checks
        await confirm_dialog(pilot)
        await pilot_until(pilot, lambda: "serve ● running" in bar(app) and "SMOKE_OK" in bar(app), timeout=300)
        assert "SMOKE_OK colour? -> red" in log_of(app, "serve")

        await fire_confirmed(pilot, app, "8", "eval")
        assert "EVAL_RC=0" in log_of(app, "eval")
        (run,) = (pipeline_ws / "runs" / "eval").iterdir()
        assert json.loads((run / "summary.json").read_text())["accuracy"] >= 0.9
        items = [json.loads(line) for line in (run / "items.jsonl").read_text().splitlines()]
        photo = next(i["image"] for i in items if i["image"]["width"] == 1600)
        assert photo["resized"] and (photo["sent_width"], photo["sent_height"]) == (1120, 840)
        assert all(max(i["image"]["sent_width"], i["image"]["sent_height"]) <= 1120 for i in items)
        assert check_eval((run / "items.jsonl").read_text().splitlines()).problems == ()
        assert not own_server_findings(cfg, app.state.snapshot, "serve_without_mmproj")

        # A server of this pipeline started by hand without --mmproj: doctor's finding.
        blind_port = free_port()
        blind = spawn(str(pipeline_ws / "venv" / "llama.cpp" / "bin" / "llama-server"), "-m", str(model),
                      "--port", str(blind_port), "-c", "256", cwd=pipeline_ws)
        found = await pilot_until(pilot, lambda: next(iter(findings_about(
            cfg, app.state.snapshot, "serve_without_mmproj", {blind.pid})), None), timeout=60)
        assert f"llama-server pid {blind.pid} runs without --mmproj" in found.message
        await pilot_until(pilot, lambda: any(a.active and a.code == "serve_without_mmproj" and a.action
                                             and a.action.pid == blind.pid for a in app.state.alerts))

        # §10's second half: the served model operates web pages in headless Chromium, then one
        # reward-driven round (sample, keep the rewarded, LoRA, merge, convert, serve) from its key.
        await pilot_until(pilot, lambda: not app.busy)
        await fire_confirmed(pilot, app, "0", "cu_eval")
        assert "CU_EVAL_RC=0" in log_of(app, "cu_eval")
        (cu_run,) = (pipeline_ws / "runs" / "cu").iterdir()
        episodes = (cu_run / "episodes.jsonl").read_text().splitlines()
        rows = [json.loads(line) for line in episodes]
        assert len(rows) == 28 and all(r["error"] is None and r["sent"] == [224, 224] for r in rows), rows[:2]
        assert {r["split"] for r in rows} == {"heldout"} and 0 < sum(r["reward"] for r in rows) < len(rows)
        assert check_episodes(episodes).n == 28
        await pilot_until(pilot, lambda: any(
            r.name == cu_run.name and r.kind == "cu" for r in app.state.feed(EvalsFeed).reports[0]))

        await pilot_until(pilot, lambda: not app.busy)
        await fire_confirmed(pilot, app, "p", "rft", timeout=900)
        rft_log = log_of(app, "rft")
        assert "RFT_DONE held-out success" in rft_log and "rft: reward per round:" in rft_log
        assert "vision 0, merger 0," in rft_log  # the same train stage and its guards
        (round_dir,) = (pipeline_ws / "runs" / "rft").iterdir()
        summary = json.loads((round_dir / "summary.json").read_text())
        assert summary["kept"] > 0 and summary["before"]["n"] == summary["after"]["n"] == 28
        assert summary["after"]["errors"] == 0 and check_file(str(pipeline_ws / summary["model"]))["ok"]
        before, after = summary["before"]["success_rate"], summary["after"]["success_rate"]
        print(f"rft round: held-out success {before} -> {after}, kept {summary['kept']} of {summary['sampled']}")
        assert not (round_dir / "merged").exists() and not (round_dir / "vlm-f16.gguf").exists()
        assert not holders(app.config.stage("rft").ports[0])  # the round's server was stopped
