"""The tiny pipeline end to end on this machine's CPU, fired through the Box like the console
does: fetch to push, the real llama-server and its serving figures, the fake 0 % and its fix, a
restore instead of a rebuild; a real third-party model restored, served and evaluated; what the
train stage refuses or stops on a real Trainer and gloo. The box venv and the tiny base are the
run's own, made once (tests/provisioned.py); the other pipeline modules run beside this one."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from samai.console.core import config, paths
from samai.console.core.actions import Actions
from samai.console.core.audit import AuditLog
from samai.console.core.detectors import detect
from samai.console.core.evals.check import check_eval
from samai.remote.box.gguf_check import check_file
from samai.remote.boxapi import Box
from samai.remote.local import LocalTransport
from tests.box_tools import stage_argv, stage_env
from tests.pipeline_helpers import (
    LONG,
    anyway,
    confirm,
    free_port,
    own_server_findings,
    run_stage,
    tiny,
    until_async,
    until_listening,
    wait_marker,
    with_command,
)

pytestmark = LONG


async def test_the_tiny_pipeline_end_to_end(tiny_ws: Path, spawn) -> None:
    port = free_port()
    cfg = tiny(tiny_ws, port)
    box = Box(LocalTransport(), str(tiny_ws), python=sys.executable)
    started = time.monotonic()
    try:
        for name, marker in (("fetch", "FETCH_DONE"), ("train", "TRAIN_DONE"), ("merge", "MERGE_DONE"),
                             ("convert", "CONVERT_DONE"), ("quantize", "QUANT_DONE")):
            log = await run_stage(box, cfg, name)
            last = log.rstrip().splitlines()[-1]
            assert marker in log and last.startswith("CHAIN_DONE rc=0 "), f"{name}:\n{log[-4000:]}"
        _the_base_from_a_hub(tiny_ws)
        await _surgery_then_smoke(box, cfg, tiny_ws)
        gguf = tiny_ws / "gguf" / "tiny-q8_0.gguf"
        assert check_file(str(gguf))["ok"]
        assert not (tiny_ws / "models" / "merged").exists()  # intermediates deleted as declared
        assert not (tiny_ws / "gguf" / "tiny-f16.gguf").exists()

        await _the_fake_zero_with_the_real_server(box, cfg, tiny_ws)

        # The fix: the config's own serve (--reasoning-format none) and eval (joined, max_tokens 2048).
        stray = spawn(sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        await until_listening(port)
        serve = cfg.stage("serve")
        # As the console fires it: the action layer's plan stops the stray by pid (audited), then fires.
        outcome = await Actions(box, cfg, AuditLog(paths.audit_log()), readonly=False, confirm=anyway).fire(serve.name)
        fired = outcome.result
        assert fired is not None and fired.state == "running", outcome.message
        log = await wait_marker(box, cfg, "serve", "SMOKE_OK")
        assert "SMOKE_OK" in log and "391" in log and "SERVE_FALLBACK" not in log, log[-3000:]
        # The real build asked for its flags: /metrics off by default, /slots on by default in this one.
        assert "SERVE_MONITORING /metrics (--metrics), /slots (on by default)" in log, log[-3000:]
        assert " --metrics" in next(line for line in log.splitlines() if line.startswith("$ ")), log[-3000:]
        assert stray.wait(10) is not None  # the stray listener was stopped by pid
        snap = await box.snapshot()
        listeners = [s for s in snap.listeners if s.port == port]
        assert len(listeners) == 1
        argv = snap.process(listeners[0].pid).argv
        assert Path(argv[0]).name == "llama-server" and argv[argv.index("--reasoning-format") + 1] == "none", argv
        assert not own_server_findings(cfg, snap, "reasoning_split")

        log = await _serving_while_the_eval_runs(box, cfg, port)
        assert "EVAL_RC=0" in log, log[-3000:]
        await _a_stopped_server_is_hung_then_restarted(box, cfg, port, listeners[0].pid)
        await _a_server_without_metrics_shows_what_it_can(box, cfg, tiny_ws, gguf)
        (summary_path,) = set((tiny_ws / "runs" / "eval").glob("*/summary.json")) - {
            tiny_ws / "runs" / "eval" / "naive" / "summary.json"}
        summary = json.loads(summary_path.read_text())
        assert summary["accuracy"] >= 0.9 and summary["empty_content"] == 0, summary
        assert not check_eval((summary_path.parent / "items.jsonl").read_text().splitlines()).problems
        await _the_diff_of_the_fake_zero_and_the_fix(box, tiny_ws, summary_path.parent)

        log = await run_stage(box, cfg, "push")
        assert "PUSH_DONE" in log, log[-3000:]
        pushed = tiny_ws / "pushed"
        assert subprocess.run(["sha256sum", "-c", "MANIFEST.sha256"], cwd=pushed).returncode == 0
        # §8's milestones, pushed by the stages themselves: the adapter every 10 epochs, each eval's report
        milestones = sorted(m.name for m in pushed.glob("MANIFEST-*.sha256"))
        assert milestones[:2] == ["MANIFEST-epoch-10.sha256", "MANIFEST-epoch-20.sha256"], milestones
        assert len(milestones) == 4 and "MANIFEST-eval-naive.sha256" in milestones, milestones
        for manifest in milestones:
            assert subprocess.run(["sha256sum", "--quiet", "-c", manifest], cwd=pushed).returncode == 0, manifest
        assert (pushed / "runs" / "train" / "milestones" / "epoch-20" / "adapter_model.safetensors").is_file()
        await _the_timeline_of_the_run(box, cfg)
        print(f"tiny pipeline after provisioning: {time.monotonic() - started:.0f} s")
    finally:
        await box.stop("serve", grace=5)
        await box.close()
    await _restore_instead_of_rebuild(cfg, tiny_ws)


async def _serving_while_the_eval_runs(box: Box, cfg: config.Config, port: int) -> str:
    """Issue 33: the real llama-server's figures, read as the console reads them, move while the
    eval stage asks it: requests running, tokens/s between polls, its slots; the eval's log."""
    from samai.console.core.serving.watch import ServingWatch

    watch, views = ServingWatch(cfg), []
    evaluating = asyncio.ensure_future(run_stage(box, cfg, "eval"))
    while not evaluating.done():  # read often: the tiny model answers in milliseconds, idle between the items
        watch.findings(await box.snapshot(serving=[port]))
        views += list(watch.views.values())
        await asyncio.sleep(0.05)
    log = await evaluating
    assert views and all(v.metrics is not None and v.metrics.engine == "llama.cpp" for v in views), views[:1]
    busy = [v for v in views if (v.running or 0) >= 1 or any(s.processing for s in v.slots)]
    assert busy and any((v.generation_tps or 0) > 0 for v in views), views
    assert views[-1].slots and views[-1].props is not None and views[-1].props.n_ctx, views[-1]
    from samai.widgets.serving import serving_block

    busiest = max(views, key=lambda v: (v.running or 0, v.generation_tps or 0))
    print("the serving pane during the eval:\n" + serving_block(busiest).plain)  # for the note (-s)
    return log


async def _a_stopped_server_is_hung_then_restarted(box: Box, cfg: config.Config, port: int, server: int) -> None:
    """SIGSTOP on the server: serve_hung within its window (3 s here), each poll within the probe's
    budget; SIGCONT resolves it; its fix, the serve stage's restart, serves again."""
    from samai.console.core.serving.watch import ServingWatch
    from samai.remote.boxapi import SERVING_BUDGET_S

    cfg = replace(cfg, serve=replace(cfg.serve, hung_after_s=3.0))
    watch = ServingWatch(cfg)
    os.kill(server, signal.SIGSTOP)
    try:
        hung, deadline = [], time.monotonic() + 60
        while not hung and time.monotonic() < deadline:
            started = time.monotonic()
            snap = await box.snapshot(serving=[port])
            assert time.monotonic() - started < SERVING_BUDGET_S + 5, "a stopped server slowed the poll"
            hung = [f for f in watch.findings(snap) if f.code == "serve_hung"]
            await asyncio.sleep(0.5)
        assert hung and "/health has not answered" in hung[0].message, watch.views
    finally:
        os.kill(server, signal.SIGCONT)
    await until_async(lambda: _no_hung(box, watch, port), timeout=60)
    actions = Actions(box, cfg, AuditLog(paths.audit_log()), readonly=False, confirm=anyway)
    assert hung[0].action is not None and (await actions.restart(hung[0].action.stage)).ok
    assert "SMOKE_OK" in await wait_marker(box, cfg, "serve", "SMOKE_OK")


async def _a_server_without_metrics_shows_what_it_can(box: Box, cfg: config.Config, ws: Path, gguf: Path) -> None:
    """Issue 33: the operator's own serve command, the real llama-server without --metrics: the
    pane shows its health, slots and model, and says why the counters are missing."""
    from samai.console.core.serving.watch import ServingWatch

    await box.stop("serve", grace=5)
    port = free_port()
    server = ws / "venv" / "llama.cpp" / "bin" / "llama-server"
    by_hand = with_command(cfg, "serve", f"{server} -m {gguf} --port {port} -c 256")
    by_hand = replace(by_hand, stages=tuple(replace(s, ports=(port,)) if s.name == "serve" else s
                                            for s in by_hand.stages))
    stage = by_hand.stage("serve")
    assert (await box.fire(stage.name, stage.command, stage.log)).state == "running"
    watch, deadline, snap = ServingWatch(by_hand), time.monotonic() + 120, None
    try:
        while not (port in watch.views and watch.views[port].health_ok) and time.monotonic() < deadline:
            snap = await box.snapshot(serving=[port])
            watch.findings(snap)
            await asyncio.sleep(0.5)
        assert port in watch.views and watch.views[port].health_ok, (
            watch.views, snap and snap.states, snap and snap.serving, (ws / stage.log).read_text()[-2000:])
        view = watch.views[port]
        assert view.metrics is None and "no /metrics (HTTP 501) (started without --metrics?" in view.metrics_note, view
        assert view.slots and view.props is not None and view.props.n_ctx == view.slots[0].n_ctx > 0, view
        assert view.to_json()["requests_running"] == 0 and view.kv_use == 0, view.to_json()
    finally:
        await box.stop("serve", grace=5)


async def _the_diff_of_the_fake_zero_and_the_fix(box: Box, ws: Path, fixed: Path) -> None:
    """Issue 34: `eval diff` of the run at llama-server's default reasoning format (the fake 0 %)
    and the run with none, against a count by hand of the two items files."""
    from samai.console.core.evals.diff import diff
    from samai.console.core.evals.runs import read_run_items

    naive = ws / "runs" / "eval" / "naive"
    a = await read_run_items(box, "naive", str(naive / "items.jsonl"))
    b = await read_run_items(box, fixed.name, str(fixed / "items.jsonl"))
    assert a is not None and b is not None
    got = diff(a, b).to_json()
    rows = {name: {r["id"]: r for r in map(json.loads, (folder / "items.jsonl").read_text().splitlines())}
            for name, folder in (("a", naive), ("b", fixed))}
    both = [i for i in rows["a"] if i in rows["b"]]
    assert got["right_to_wrong"] == [str(i) for i in both if rows["a"][i]["correct"] and not rows["b"][i]["correct"]]
    assert got["wrong_to_right"] == [str(i) for i in both if not rows["a"][i]["correct"] and rows["b"][i]["correct"]]
    assert got["became_empty"] == [str(i) for i in both if rows["a"][i]["pred"] and not rows["b"][i]["pred"]]
    assert len(got["wrong_to_right"]) >= len(both) * 0.9 and got["noise"] is False, got  # the fake 0 % fixed
    print(f"eval diff naive -> {fixed.name}: {len(got['wrong_to_right'])} wrong -> right of {got['paired']}, "
          f"delta {got['delta']:+.2f} in [{got['interval'][0]:+.2f}, {got['interval'][1]:+.2f}]")


async def _the_timeline_of_the_run(box: Box, cfg: config.Config) -> None:
    """Issue 34: `timeline` of this run: its stages in the order they ran, the serve fire the
    action layer audited between quantize's end and the eval."""
    from samai.console.core.timeline import read_timeline
    from samai.console.report import describe_timeline

    events = await read_timeline(box, cfg, paths.audit_log())
    said = [(e.source, e.kind, e.stage) for e in events]
    firsts = [said.index(("log", "started", name)) for name in ("fetch", "train", "merge", "convert", "quantize")]
    assert firsts == sorted(firsts), said
    fired = [i for i, e in enumerate(events) if e.source == "audit" and e.kind == "fire" and "serve" in e.text]
    evals = [i for i, s in enumerate(said) if s == ("log", "started", "eval")]  # the fake 0 % first, then the fix
    assert fired and evals and said.index(("log", "ended", "quantize")) < fired[0] < evals[-1], said
    print("the timeline, its last lines:\n" + "\n".join(describe_timeline(events).splitlines()[-12:]))


async def _no_hung(box: Box, watch, port: int) -> bool:
    return not [f for f in watch.findings(await box.snapshot(serving=[port])) if f.code == "serve_hung"]


async def _restore_instead_of_rebuild(cfg: config.Config, ws: Path) -> None:
    """§4.5: the box rebuilt (everything gone but the venv, and the pushed store standing in for the
    Hub): the console suggests restore, which brings the GGUF back verified; serve and eval pass."""
    for entry in ws.iterdir():
        if entry.name not in ("venv", "pushed"):
            subprocess.run(["rm", "-rf", str(entry)], check=True)
    box = Box(LocalTransport(), str(ws), python=sys.executable)  # the console's tools installed anew
    try:
        sized = [(a.name, a.path) for a in cfg.artifacts]  # what doctor and the TUI ask the probe to size
        suggested = [f for f in detect(cfg, await box.snapshot(artifacts=sized)) if f.code == "restore_available"]
        assert suggested and str(suggested[0].action) == "restart restore", suggested
        started = time.monotonic()
        log = await run_stage(box, cfg, "restore")
        assert "RESTORE_DONE 2 files" in log and "satisfies train, merge, convert, quantize" in log, log[-3000:]
        assert check_file(str(ws / "gguf" / "tiny-q8_0.gguf"))["ok"]
        assert not [f for f in detect(cfg, await box.snapshot(artifacts=sized)) if f.code == "restore_available"]
        fired = await box.fire("serve", cfg.stage("serve").command, cfg.stage("serve").log, verify_s=1.0)
        assert fired.state == "running", fired.reason
        assert "SMOKE_OK" in await wait_marker(box, cfg, "serve", "SMOKE_OK")
        log = await run_stage(box, cfg, "eval")
        assert "EVAL_RC=0" in log, log[-3000:]
        print(f"restore, serve and eval on a rebuilt box: {time.monotonic() - started:.0f} s")
    finally:
        await box.stop("serve", grace=5)
        await box.close()


GEMMA_EVAL = Path(__file__).parent / "data" / "eval" / "gemma_sequences.jsonl"


async def test_a_real_third_party_model_is_restored_served_and_evaluated(pipeline_ws: Path) -> None:
    """Gemma 3 270M Q4_K_M (a base model nobody here trained, from its chunk packages) pushed to a
    store, restored from it, served by llama-server, smoke-tested and evaluated: a base model
    continues text, so it is asked with --prompt-format text and scored by the answer's first word."""
    from tests.gguf_artifacts import gemma_q4_k_m

    gemma = gemma_q4_k_m()
    port = free_port()
    built = pipeline_ws / "elsewhere"
    (built / "gguf").mkdir(parents=True)
    (built / "gguf" / gemma.name).symlink_to(gemma)
    store = pipeline_ws / "pushed"
    done = subprocess.run(stage_argv("stages.push", "--to", f"dir:{store}", "--stable", "0.1", f"gguf/{gemma.name}"),
                          env=stage_env(), cwd=built, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    (pipeline_ws / "data").mkdir()
    (pipeline_ws / "data" / GEMMA_EVAL.name).write_bytes(GEMMA_EVAL.read_bytes())
    cfg = tiny(pipeline_ws, port)
    model = f"gguf/{gemma.name}"
    restore = cfg.stage("restore").command.replace("gguf/tiny-q8_0.gguf data/eval.jsonl", model)
    serve = (f"venv/bin/python -m samai_box.stages.serve --model {model} --port {port} --ctx 512 "
             "--llama-server venv/llama.cpp/bin/llama-server --prompt-format text "
             "--smoke-question 'The capital of France is the city of' --smoke-answer Paris --smoke-max-tokens 8")
    evaluate = (f"python3 -m samai_box.stages.eval --url http://127.0.0.1:{port} --data data/{GEMMA_EVAL.name} "
                "--out runs/eval/gemma --prompt-format text --extract first-word --max-tokens 16 --stop , --stop .")
    cfg = with_command(with_command(with_command(cfg, "restore", restore), "serve", serve), "eval", evaluate)
    box = Box(LocalTransport(), str(pipeline_ws), python=sys.executable)
    try:
        log = await run_stage(box, cfg, "restore")
        assert "RESTORE_DONE 1 files" in log, log[-3000:]
        assert (pipeline_ws / model).read_bytes()[:4] == b"GGUF" and check_file(str(pipeline_ws / model))["ok"]
        fired = await box.fire("serve", serve, cfg.stage("serve").log, verify_s=1.0)
        assert fired.state == "running", fired.reason
        log = await wait_marker(box, cfg, "serve", "SMOKE_OK")
        assert "SMOKE_OK The capital of France is the city of -> Paris" in log, log[-3000:]
        log = await run_stage(box, cfg, "eval")
        assert "EVAL_RC=0" in log, log[-3000:]
        summary = json.loads((pipeline_ws / "runs" / "eval" / "gemma" / "summary.json").read_text())
        assert summary["n"] == 14 and summary["accuracy"] >= 0.8, summary
        result = check_eval((pipeline_ws / "runs" / "eval" / "gemma" / "items.jsonl").read_text().splitlines())
        assert not [p for p in result.problems if p.severity == "error"], result.problems
    finally:
        await box.stop("serve", grace=5)
        await box.close()


async def _surgery_then_smoke(box: Box, cfg: config.Config, ws: Path) -> None:
    """§5 on the pipeline's own GGUF (written by llama.cpp's converter and llama-quantize): a KV set
    through the action layer, then the new file served by the pipeline's llama-server on a free
    port and asked the smoke question (`gguf set-kv ... --smoke`)."""
    from samai.console.core.serving.smoke import smoke

    actions = Actions(box, cfg, AuditLog(paths.audit_log()), readonly=False, confirm=confirm)
    source, out = ws / "gguf" / "tiny-q8_0.gguf", ws / "gguf" / "tiny-renamed.gguf"
    before = source.read_bytes()
    done = await actions.gguf({"op": "set_kv", "path": str(source), "out": str(out),
                               "set": {"general.name": "samai tiny, renamed by the console"}})
    assert done.ok, done.message
    assert source.read_bytes() == before  # the input is never modified
    kvs = {kv.key: kv.value for kv in (await box.gguf_show(str(out))).kvs}
    assert "samai tiny, renamed by the console" in kvs["general.name"]
    checked = await smoke(actions, str(out))
    assert checked.ok and "391" in checked.said, checked.log[-3000:]
    assert "stopped: --smoke-only" in checked.log
    out.unlink()


def _the_base_from_a_hub(ws: Path) -> None:
    """The base the tiny pretrain made, as a Hub repo on a local Hub-compatible server, fetched by
    `fetch hf` with the box venv's real huggingface_hub: the same files, checked against the Hub."""
    from tests.hubserver import HubServer
    from tests.test_hub import READ, hub_env

    made = ws / "source" / "tiny-base"
    with HubServer(ws.parent / "hub", tokens={READ: "read"}) as hub:
        hub.add_repo("samai/tiny-base", made, private=True)
        env = hub_env(hub, ws.parent / "hf-home", SAMAI_HF_TOKEN=READ)
        done = subprocess.run([str(ws / "venv" / "bin" / "python"), "-m", "samai_box.stages.fetch", "hf", "--repo",
                               "samai/tiny-base", "--dest", "models/hub-base", "--auth-env", "SAMAI_HF_TOKEN"],
                              env=env, cwd=ws, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "FETCH_DONE" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
    for path in made.iterdir():
        assert (ws / "models" / "hub-base" / path.name).read_bytes() == path.read_bytes(), path.name
    shutil.rmtree(ws / "models" / "hub-base")


async def _the_fake_zero_with_the_real_server(box: Box, cfg: config.Config, ws: Path) -> None:
    """§6 with llama-server itself: at its default reasoning format it moves a thinking model's
    unclosed <think> into reasoning_content; a client that reads content alone, at a max_tokens
    too small for the thinking, scores the working model near zero. check eval and doctor say why."""
    serve = cfg.stage("serve")
    incident = with_command(cfg, "serve", serve.command + " --reasoning-format ''")  # the server's default
    fired = await box.fire("serve", incident.stage("serve").command, serve.log, verify_s=1.0)
    assert fired.state == "running", fired.reason
    log = await wait_marker(box, cfg, "serve", "SMOKE_OK")
    assert "SMOKE_OK" in log and "391" in log, log[-3000:]
    split = own_server_findings(cfg, await box.snapshot(), "reasoning_split")
    assert split and "without --reasoning-format" in split[0].message and "needs --reasoning-format none" in \
        split[0].message
    naive = cfg.stage("eval").command.replace("--max-tokens 2048", "--max-tokens 16 --answer-from content")
    naive = naive.replace('"runs/eval/$(date +%Y%m%d-%H%M%S)"', "runs/eval/naive")
    log = await run_stage(box, with_command(cfg, "eval", naive), "eval")
    assert "EVAL_RC=1" in log, log[-3000:]  # under --min-accuracy
    items = (ws / "runs" / "eval" / "naive" / "items.jsonl").read_text().splitlines()
    result = check_eval(items)
    assert result.n == 64 and (result.accuracy or 0) <= 0.05, result
    assert result.split_reasoning >= 60 and result.truncated >= 60  # the thinking, cut, in reasoning_content
    codes = {p.code: p for p in result.problems}
    assert codes["fake_zero"].severity == codes["truncation"].severity == "error"
    assert "--reasoning-format none" in codes["fake_zero"].message
    await box.stop("serve", grace=5)


async def test_fp16_is_refused_with_the_reason(pipeline_ws: Path) -> None:
    cfg = tiny(pipeline_ws, free_port())
    train = cfg.stage("train")
    box = Box(LocalTransport(), str(pipeline_ws), python=sys.executable)
    try:
        fired = await box.fire("train", train.command + " --fp16", train.log, verify_s=20)
        assert fired.state == "failed" and fired.rc == 2
        assert any("TRAIN_REFUSED" in line and "GradScaler" in line for line in fired.log_tail)
    finally:
        await box.close()


GUARD_SEEDED = """
import json, sys
from transformers import TrainerControl, TrainerState
from samai_box.stages.train import make_guard

history = json.loads(sys.argv[2])
guard = make_guard(sys.argv[1], patience=5)
state, control = TrainerState(), TrainerControl()
state.log_history, state.global_step = history, len(history)
guard.on_train_begin(None, state, control)  # a resume: the Trainer loaded the checkpoint's history first
state.global_step += 1
guard.on_log(None, state, control, logs={"loss": 1.0, "grad_norm": 1.0})
print(json.dumps({"stop": control.should_training_stop, "steps": len(guard.steps)}))
"""


@pytest.mark.parametrize(("history", "stops"), [
    ([{"loss": 0.0, "grad_norm": float("nan"), "step": i} for i in (1, 2, 3)], True),  # 3 of its first 4 bad
    ([{"loss": 2.0, "grad_norm": 1.0, "step": i} for i in (1, 2, 3)], False),
    ([{"loss": 2.0, "grad_norm": 1.0, "step": 1}, {"eval_loss": 2.1, "step": 1}, "garbage"], False),
])
def test_the_nan_guard_of_a_resumed_run_counts_the_steps_it_continues(provisioned: Path, tmp_path: Path,
                                                                     history, stops) -> None:
    """Issue 31: the guard's 'first steps' are the run's, not the first ones after the resume."""
    from tests.box_tools import stage_env

    out = subprocess.run([str(provisioned / "bin" / "python"), "-c", GUARD_SEEDED, str(tmp_path),
                          json.dumps(history)], capture_output=True, text=True, env=stage_env(), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    said = json.loads(out.stdout.strip().splitlines()[-1])
    assert said["stop"] is stops and said["steps"] == sum(isinstance(h, dict) and "loss" in h for h in history) + 1
    assert (tmp_path / "TRAIN_NAN").exists() is stops


TWO_RANKS = """
import datetime, os, signal, subprocess, sys
import torch
import torch.distributed as dist

rank = int(sys.argv[1]) if len(sys.argv) > 1 else 0
if rank == 0:  # rank 1 is this stage's own child, as a launcher starts it
    peer = subprocess.Popen([sys.executable, __file__, "1"])
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%s" % os.environ["PORT"], rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=30))
t = torch.ones(4)
dist.all_reduce(t)
print("rank %d: step 1 all_reduce %s" % (rank, t.tolist()), flush=True)
if rank == 1:
    os.kill(os.getpid(), signal.SIGKILL)  # the peer dies (its node lost, OOM-killed) mid-run
dist.all_reduce(t)  # rank 0 waits on a peer that is gone
"""


async def test_a_peer_rank_that_dies_is_a_collective_timeout_from_a_real_gloo_run(pipeline_ws: Path) -> None:
    """Issue 31: two real ranks over gloo; rank 1 is killed after the first all_reduce; rank 0's
    collective fails on the lost peer and its chain says collective_timeout with gloo's words."""
    from samai.console.core.death import cause_of_death

    (pipeline_ws / "ranks.py").write_text(TWO_RANKS)
    box = Box(LocalTransport(), str(pipeline_ws), python=sys.executable)
    try:
        fired = await box.fire("ddp", "venv/bin/python ranks.py", "logs/ddp.log", env={"PORT": str(free_port())},
                               verify_s=0.5)
        assert fired.state != "refused", fired.reason
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            snap = await box.snapshot(processes=True)
            if snap.state("ddp").rc is not None:
                break
            await asyncio.sleep(0.5)
        log = (pipeline_ws / "logs" / "ddp.log").read_text()
        rec = snap.state("ddp")
        assert rec.rc not in (None, 0) and "rank 0: step 1 all_reduce" in log, log[-3000:]
        found = cause_of_death(rec, snap)
        assert found is not None and found.cause == "collective_timeout", (found, log[-3000:])
        assert "SAMAI_DEATH collective_timeout: " in log
    finally:
        await box.close()
