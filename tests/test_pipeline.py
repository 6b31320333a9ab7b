"""The tiny pipeline end to end on this machine's CPU, fired through the Box like the console does.

Every run provisions a fresh workspace, as a new user's first `make run` would: only what a
real user also keeps survives between runs (pip's download cache and the provision stage's
llama-cpp-python wheel in ~/.cache/samai). The first run on a fresh machine compiles that wheel
(12-17 minutes on 2 cores); later ones provision in about two. So that a broken first run
cannot hide behind a cached venv, nothing provisioned is reused between runs.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from samai.console.core import config, paths
from samai.console.core.actions import ActionPlan, Actions, Decision
from samai.console.core.audit import AuditLog
from samai.console.core.checks import check_trainlog
from samai.console.core.cucheck import check_episodes
from samai.console.core.detectors import detect
from samai.console.core.evalcheck import check_eval
from samai.console.core.fixes import FixAction
from samai.console.core.resume import resume_choice
from samai.remote.box.gguf_check import check_file
from samai.remote.box.stages.serve import holders
from samai.remote.boxapi import Box
from samai.remote.local import LocalTransport
from tests.box_tools import stage_argv, stage_env
from tests.helpers import stop_stages_under

PROVISION_TIMEOUT = 45 * 60
STAGES_TIMEOUT = 20 * 60
# The suite-wide limit would cut provisioning, which runs in the first test's setup. Each wait
# below has its own deadline; this only bounds the whole.
pytestmark = pytest.mark.timeout(PROVISION_TIMEOUT + STAGES_TIMEOUT)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tiny(workspace: Path, port: int) -> config.Config:
    """The built-in tiny pipeline in this workspace, serving on a free port."""
    cfg = config.load_builtin("tiny")
    stages = tuple(replace(s, command=s.command.replace("18080", str(port)), ports=(port,) if s.ports else ())
                   for s in cfg.stages)
    return replace(cfg, workspace=str(workspace), stages=stages)


async def run_stage(box: Box, cfg: config.Config, name: str, timeout: float = 600) -> str:
    """Fire a stage and wait for its chain to end; its log as text."""
    stage = cfg.stage(name)
    fired = await box.fire(stage.name, stage.command, stage.log, env=dict(stage.env), verify_s=1.0)
    assert fired.state != "refused", f"{name}: {fired.reason}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rec = (await box.snapshot(processes=True)).state(name)
        if rec and rec.rc is not None:
            break
        await asyncio.sleep(1)
    log = (await box.tail(str(Path(cfg.workspace, stage.log)), offset=0, max_bytes=4 << 20)).data.decode()
    if not (rec and rec.rc is not None):
        await box.stop(name, grace=5)
        raise AssertionError(f"{name} still running after {timeout} s, stopped:\n{log[-3000:]}")
    return log


async def wait_marker(box: Box, cfg: config.Config, name: str, marker: str, timeout: float = 180) -> str:
    path = str(Path(cfg.workspace, cfg.stage(name).log))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = (await box.tail(path, offset=0, max_bytes=4 << 20)).data.decode()
        if marker in text or "CHAIN_DONE" in text:
            return text
        await asyncio.sleep(0.5)
    raise AssertionError(f"no {marker} in {path} after {timeout} s")


@pytest.fixture(scope="module")
def provisioned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A freshly provisioned venv, provisioned through the Box once for this module."""
    ws = tmp_path_factory.mktemp("provisioned")
    cfg = tiny(ws, free_port())

    async def provision() -> str:
        box = Box(LocalTransport(), str(ws), python=sys.executable)
        try:
            return await run_stage(box, cfg, "provision", PROVISION_TIMEOUT)
        finally:
            await box.close()

    try:
        log = asyncio.run(provision())
    finally:  # a failed or timed-out provision keeps compiling in its own session otherwise
        stop_stages_under(ws)
    assert "PROVISION_DONE" in log and "CHAIN_DONE rc=0" in log, log[-3000:]
    return ws / "venv"


@pytest.fixture
def pipeline_ws(tmp_path: Path, provisioned: Path) -> Path:
    ws = tmp_path / "tiny"
    ws.mkdir()
    (ws / "venv").symlink_to(provisioned)
    return ws


async def _anyway(plan: ActionPlan) -> Decision:
    """The operator's override: the stray listener holds the serve port, which blocks the plan."""
    return Decision.override(plan, "test") if plan.blocked else Decision.confirmed(plan, "test")


async def test_the_tiny_pipeline_end_to_end(pipeline_ws: Path, spawn) -> None:
    port = free_port()
    cfg = tiny(pipeline_ws, port)
    box = Box(LocalTransport(), str(pipeline_ws), python=sys.executable)
    started = time.monotonic()
    try:
        for name, marker in (("fetch", "FETCH_DONE"), ("train", "TRAIN_DONE"), ("merge", "MERGE_DONE"),
                             ("convert", "CONVERT_DONE"), ("quantize", "QUANT_DONE")):
            log = await run_stage(box, cfg, name)
            assert marker in log and log.rstrip().endswith("CHAIN_DONE rc=0"), f"{name}:\n{log[-4000:]}"
        _the_base_from_a_hub(pipeline_ws)
        await _surgery_then_smoke(box, cfg, pipeline_ws)
        gguf = pipeline_ws / "gguf" / "tiny-q8_0.gguf"
        assert check_file(str(gguf))["ok"]
        assert not (pipeline_ws / "models" / "merged").exists()  # intermediates deleted as declared
        assert not (pipeline_ws / "gguf" / "tiny-f16.gguf").exists()

        await _the_fake_zero_with_the_real_server(box, cfg, pipeline_ws)

        # The fix: the config's own serve (--reasoning-format none) and eval (joined, max_tokens 2048).
        stray = spawn(sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        await _until_listening(port)
        serve = cfg.stage("serve")
        # As the console fires it: the action layer's plan stops the stray by pid (audited), then fires.
        outcome = await Actions(box, cfg, AuditLog(paths.audit_log()), readonly=False, confirm=_anyway).fire(serve.name)
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
        assert "reasoning_split" not in {f.code for f in detect(cfg, snap)}

        log = await _serving_while_the_eval_runs(box, cfg, port)
        assert "EVAL_RC=0" in log, log[-3000:]
        await _a_stopped_server_is_hung_then_restarted(box, cfg, port, listeners[0].pid)
        await _a_server_without_metrics_shows_what_it_can(box, cfg, pipeline_ws, gguf)
        (summary_path,) = set((pipeline_ws / "runs" / "eval").glob("*/summary.json")) - {
            pipeline_ws / "runs" / "eval" / "naive" / "summary.json"}
        summary = json.loads(summary_path.read_text())
        assert summary["accuracy"] >= 0.9 and summary["empty_content"] == 0, summary
        assert not check_eval((summary_path.parent / "items.jsonl").read_text().splitlines()).problems
        await _the_diff_of_the_fake_zero_and_the_fix(box, pipeline_ws, summary_path.parent)

        log = await run_stage(box, cfg, "push")
        assert "PUSH_DONE" in log, log[-3000:]
        pushed = pipeline_ws / "pushed"
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
    await _restore_instead_of_rebuild(cfg, pipeline_ws)


async def _serving_while_the_eval_runs(box: Box, cfg: config.Config, port: int) -> str:
    """Issue 33: the real llama-server's figures, read as the console reads them, move while the
    eval stage asks it: requests running, tokens/s between polls, its slots; the eval's log."""
    from samai.console.core.serving_watch import ServingWatch

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
    from samai.console.core.serving_watch import ServingWatch
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
    actions = Actions(box, cfg, AuditLog(paths.audit_log()), readonly=False, confirm=_anyway)
    assert hung[0].action is not None and (await actions.restart(hung[0].action.stage)).ok
    assert "SMOKE_OK" in await wait_marker(box, cfg, "serve", "SMOKE_OK")


async def _a_server_without_metrics_shows_what_it_can(box: Box, cfg: config.Config, ws: Path, gguf: Path) -> None:
    """Issue 33: the operator's own serve command, the real llama-server without --metrics: the
    pane shows its health, slots and model, and says why the counters are missing."""
    from samai.console.core.serving_watch import ServingWatch

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
    from samai.console.core.evaldiff import diff
    from samai.console.core.evalruns import read_run_items

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


async def until_async(predicate, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await predicate():
            return
        await asyncio.sleep(0.5)
    raise AssertionError(f"condition not met within {timeout} s")


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
    from samai.console.core.smoke import smoke

    actions = Actions(box, cfg, AuditLog(paths.audit_log()), readonly=False, confirm=_confirm)
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
    split = [f for f in detect(cfg, await box.snapshot()) if f.code == "reasoning_split"]
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


async def test_the_nan_guard_stops_training_and_merge_refuses(pipeline_ws: Path) -> None:
    cfg = tiny(pipeline_ws, free_port())
    box = Box(LocalTransport(), str(pipeline_ws), python=sys.executable)
    try:
        assert "FETCH_DONE" in await run_stage(box, cfg, "fetch")
        train = cfg.stage("train")
        poisoned = replace(cfg, stages=tuple(replace(s, command=s.command + " --inject-nan") if s is train else s
                                             for s in cfg.stages))
        log = await run_stage(box, poisoned, "train")
        assert "TRAIN_NAN" in log and "CHAIN_DONE rc=3" in log, log[-3000:]
        assert (pipeline_ws / "runs" / "train" / "TRAIN_NAN").exists()
        assert not (pipeline_ws / "runs" / "train" / "final").exists()
        log = await run_stage(box, cfg, "merge")
        assert "MERGE_REFUSED" in log and "TRAIN_NAN" in log and "CHAIN_DONE rc=2" in log
        log = await run_stage(box, cfg, "train")  # a restart that does not clear the poison is refused
        assert "TRAIN_REFUSED" in log and "poison" in log
        assert (await box.remove(list(train.poison))).ok  # what restart does before firing again
    finally:
        await box.close()


async def test_a_run_with_a_raised_learning_rate_is_worse_than_the_last_good_one(pipeline_ws: Path,
                                                                                   tmp_path: Path) -> None:
    """Issue 34: three real Trainer runs of the tiny train stage, 40 steps each: a healthy one,
    another (another seed: not flagged against the first), one at lr 0.5 (flagged against the
    last good run); then `check trainlog --against` on the same two real logs."""
    from samai.console.core.checks import check_trainlog
    from samai.console.core.trainref import compare, last_good_run
    from tests.helpers import run_cli

    cfg = tiny(pipeline_ws, free_port())
    box = Box(LocalTransport(), str(pipeline_ws), python=sys.executable)
    train = cfg.stage("train")
    log, verdicts = str(pipeline_ws / train.log), []
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
    f.write_text(f'[workspace]\npath = "{pipeline_ws}"\n')
    r = run_cli("--config", str(f), "check", "trainlog", "logs/train.log", "--against", "logs/train.log.1", "--json")
    assert r.returncode == 1 and any(a["code"] == "worse_than_reference" for a in json.loads(r.stdout)["anomalies"])
    r = run_cli("--config", str(f), "check", "trainlog", "logs/train.log.1", "--against", "logs/train.log.2", "--json")
    assert r.returncode == 0, r.stdout[-2000:]


def with_command(cfg: config.Config, name: str, command: str) -> config.Config:
    return replace(cfg, stages=tuple(replace(s, command=command) if s.name == name else s for s in cfg.stages))


async def _confirm(plan: ActionPlan) -> Decision:
    return Decision.confirmed(plan, "test")


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


# Both late deaths of the issue, with real Trainer steps: a huge learning rate from step 5 on
# (grad_norm nan, then loss 0: a hidden NaN), and the adapter cut off from step 5 on (grad_norm 0).
DIVERGENCES = {"diverged": ("--diverge-after 4", {"nan_grad_norm", "hidden_nan", "nan_guard_fired"}),
               "dead-gradients": ("--kill-gradients-after 4", {"dead_gradients", "nan_guard_fired"})}


async def test_runs_that_die_after_step_4_pass_nowhere_downstream(pipeline_ws: Path) -> None:
    cfg = tiny(pipeline_ws, free_port())
    train = cfg.stage("train")
    run_dir = pipeline_ws / "runs" / "train"
    box = Box(LocalTransport(), str(pipeline_ws), python=sys.executable)
    actions = Actions(box, cfg, AuditLog(paths.audit_log()), readonly=False, confirm=_confirm)
    try:
        assert "FETCH_DONE" in await run_stage(box, cfg, "fetch")
        for kind, (flags, expected) in DIVERGENCES.items():
            log = await run_stage(box, with_command(cfg, "train", f"{train.command} --max-steps 16 {flags}"), "train")
            assert "TRAIN_NAN" in log and "logged steps in a row from step" in log, f"{kind}:\n{log[-3000:]}"
            assert "CHAIN_DONE rc=3" in log and "TRAIN_DONE" not in log, kind
            assert (run_dir / "TRAIN_NAN").exists(), kind
            assert not (run_dir / "final").exists() and not (run_dir / "TRAIN_DONE").exists(), kind

            found = await check_trainlog(box, str(pipeline_ws / train.log))  # what `check trainlog` prints
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
            assert outcome.status == "refused" and not (pipeline_ws / cfg.stage("merge").log).exists(), kind

            log = await run_stage(box, cfg, "merge")  # the merge script, fired anyway
            assert "MERGE_REFUSED" in log and "TRAIN_NAN" in log and "CHAIN_DONE rc=2" in log, log[-3000:]
            if kind == "diverged":
                await _downstream_refuses_the_poison(box, cfg, pipeline_ws)
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


async def _until_listening(port: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            await asyncio.sleep(0.1)
    raise AssertionError(f"nothing listens on {port}")


# ---------------------------------------------------------------- the incident drill, through the TUI


def _bar(app) -> str:
    return str(app.box_screen.query_one("#stages").render())


def _ended(app, stage: str):
    """The stage's current run once it has ended (its record has an rc), else None."""
    rec = app.state.snapshot.state(stage) if app.state.snapshot else None
    return rec if rec and rec.rc is not None else None


async def _dialog(pilot, app, key: str):
    """Press a key and wait for the confirmation dialog it opens (Cancel focused)."""
    from samai.console.screens.dialogs import ConfirmDialog
    from tests.helpers import pilot_until

    await pilot_until(pilot, lambda: not app.busy and not isinstance(app.screen, ConfirmDialog))
    await pilot.press(key)
    return await pilot_until(pilot, lambda: isinstance(app.screen, ConfirmDialog) and app.focused and app.screen)


async def _confirmed(pilot, app, key: str, stage: str, timeout: float = 600):
    """Fire (or restart) through the dialog, not blocked, and wait for the new run to end well."""
    from tests.helpers import pilot_until

    before = app.state.runs.get(stage)
    dialog = await _dialog(pilot, app, key)
    assert not [c.text for c in dialog.checks if c.severity == "error"], dialog.checks
    await pilot.click("#confirm")
    await pilot_until(pilot, lambda: app.state.runs.get(stage) not in (None, before), timeout=60)
    rec = await pilot_until(pilot, lambda: _ended(app, stage), timeout=timeout)
    assert rec.rc == 0, f"{stage} rc={rec.rc}:\n{_log_of(app, stage)[-3000:]}"
    return rec


def _log_of(app, stage: str) -> str:
    return (Path(app.config.workspace) / app.config.stage(stage).log).read_text(errors="replace")


async def test_the_incident_drill_through_the_tui(pipeline_ws: Path) -> None:
    """The issue's drills as an operator runs them, keys and dialogs only: a run that diverges
    raises an alert and is not done; merge is refused with the finding; the operator fixes the
    learning rate and restarts train from the alert; the healthy run goes down the pipeline;
    the running server is replaced by its own key; eval passes against the new one."""
    from samai.console.app import SamaiApp
    from samai.widgets.curves import CurvesPane
    from samai.widgets.evals import EvalTable
    from samai.widgets.logview import LogView
    from tests.helpers import pilot_until

    port = free_port()
    cfg = tiny(pipeline_ws, port)
    # What the operator edits between the runs: train's extra flags (the diverging learning rate).
    flags = pipeline_ws / "train.flags"
    flags.write_text("--max-steps 16 --diverge-after 4\n")
    cfg = with_command(cfg, "train", cfg.stage("train").command + ' $(cat "$SAMAI_WORKSPACE/train.flags")')
    cfg = replace(cfg, target=replace(cfg.target, poll_interval=0.3))
    app = SamaiApp(cfg)
    async with app.run_test(size=(160, 50)) as pilot:
        await pilot_until(pilot, lambda: app.state.snapshot)
        await _confirmed(pilot, app, "2", "fetch")

        # 1. The run diverges: not done, an alert that names it, merge marked blocked.
        dialog = await _dialog(pilot, app, "3")
        await pilot.click("#confirm")
        rec = await pilot_until(pilot, lambda: _ended(app, "train"), timeout=600)
        assert rec.rc == 3 and rec.status == "failed", _log_of(app, "train")[-3000:]
        await pilot_until(pilot, lambda: "train ✗ failed rc=3" in _bar(app) and "merge ■ blocked" in _bar(app))
        alert = await pilot_until(pilot, lambda: next((a for a in app.state.alerts if a.active
                                                        and a.code == "hidden_nan"), None))
        assert alert.action == FixAction.restart("train") and "l log" in alert.hint
        assert "TRAIN_NAN" in str(app.box_screen.query_one("#alerts").render())
        assert not (pipeline_ws / "runs" / "train" / "final").exists()

        # 2. Merge is refused: the dialog names the training log's finding; the operator cancels.
        dialog = await _dialog(pilot, app, "4")
        assert any(c.severity == "error" and "train's log, last run: hidden_nan" in c.text for c in dialog.checks)
        assert "anyway" in str(dialog.query_one("#confirm").label)
        await pilot.press("escape")
        await pilot_until(pilot, lambda: not app.busy)
        assert not (pipeline_ws / cfg.stage("merge").log).exists()

        # 3. The fix: the learning rate back to normal, then the alert's log (l) and a restart (r)
        # that clears the diverged run's TRAIN_NAN before it fires again.
        flags.write_text("\n")
        await pilot.press("l")
        assert app.state.shown_stage == "train" and "log · train" in str(app.box_screen.query_one(LogView).border_title)
        restart = await _dialog(pilot, app, "r")
        assert restart.plan.action == "restart" and "runs/train/TRAIN_NAN" in restart.plan.paths
        diverged = app.state.runs["train"]
        await pilot.click("#confirm")
        await pilot_until(pilot, lambda: app.state.runs.get("train") != diverged)
        # The new run starts clean: no marker, curve or log line of the diverged run on screen.
        await pilot_until(pilot, lambda: "train ● running" in _bar(app))
        log = app.box_screen.query_one(LogView)
        assert "TRAIN_NAN" not in _bar(app), _bar(app)
        assert not any("TRAIN_NAN" in line for line in log.lines), list(log.lines)[-20:]
        rec = await pilot_until(pilot, lambda: _ended(app, "train"), timeout=600)
        assert rec.rc == 0, _log_of(app, "train")[-3000:]
        curve = app.box_screen.query_one(CurvesPane).points  # the healthy run's steps alone, none of the diverged one's
        assert curve and not any(p.hidden_nan or not math.isfinite(p.grad_norm or 0.0) for p in curve)
        assert [p.step for p in curve] == sorted({p.step for p in curve})
        assert (pipeline_ws / "runs" / "train" / "TRAIN_DONE").exists()
        await pilot_until(pilot, lambda: "train ✓ done" in _bar(app) and "merge ■" not in _bar(app))
        assert not [a.text for a in app.state.alerts if a.active and a.severity == "error"]
        assert alert.code in {a.code for a in app.state.alerts if not a.active}  # resolved, kept as history
        assert app.state.previous["train"].status == "failed"

        # 4. Healthy: merge (its preflight now finds the run clean), convert, quantize.
        merge = await _dialog(pilot, app, "4")
        assert any(c.severity == "ok" and "train's log, last run:" in c.text for c in merge.checks)
        await pilot.press("escape")
        for key, stage in (("4", "merge"), ("5", "convert"), ("6", "quantize")):
            await _confirmed(pilot, app, key, stage)
        assert check_file(str(pipeline_ws / "gguf" / "tiny-q8_0.gguf"))["ok"]

        # 5. Serve, then replace the running server with its own key (a restart, not a block).
        await pilot_until(pilot, lambda: not app.busy)
        serve = await _dialog(pilot, app, "7")
        await pilot.click("#confirm")
        await pilot_until(pilot, lambda: "serve ● running" in _bar(app) and "SMOKE_OK" in _bar(app), timeout=180)
        old = app.state.snapshot.state("serve")
        serve = await _dialog(pilot, app, "7")
        assert serve.plan.action == "restart" and "its key restarts it" in serve.plan.details[0]
        assert not [c.text for c in serve.checks if c.severity == "error"], serve.checks
        await pilot.click("#confirm")
        await pilot_until(pilot, lambda: app.state.snapshot.state("serve").fired_at != old.fired_at, timeout=60)
        await pilot_until(pilot, lambda: "serve ● running" in _bar(app) and "SMOKE_OK" in _bar(app), timeout=180)
        snap = app.state.snapshot
        gone = snap.process(old.pid)  # exited (a zombie until this machine's init reaps it, if it does)
        assert gone is None or gone.state == "Z", gone
        (listener,) = [s for s in snap.listeners if s.port == port]  # one server: the new run's
        assert snap.process(listener.pid).pgid == snap.state("serve").pgid != old.pgid

        # 6. Eval against the new server.
        await _confirmed(pilot, app, "8", "eval")
        assert "EVAL_RC=0" in _log_of(app, "eval")
        (summary,) = (pipeline_ws / "runs" / "eval").glob("*/summary.json")
        assert json.loads(summary.read_text())["accuracy"] >= 0.9
        await pilot_until(pilot, lambda: app.state.eval_checked and app.state.eval_checked[1] is not None)
        assert app.state.eval_checked[1].problems == ()  # check eval on its items, as the console did
        evals = app.box_screen.query_one(EvalTable)  # the eval pane shows the run
        await pilot_until(pilot, lambda: evals.row_count == 1)
        assert not [a.text for a in app.state.alerts if a.active and a.severity == "error"]

        # 7. The server dies (the OOM killer's way): an alert in its own words; eval is then held back.
        os.kill(listener.pid, signal.SIGKILL)
        died = await pilot_until(pilot, lambda: next((a for a in app.state.alerts if a.active and "died" in a.text),
                                                     None), timeout=60)
        assert died.stage == "serve" and died.text.startswith("stage serve: pid ") and "died (rc=137)" in died.text
        said = f"SERVER_DIED llama-server pid {listener.pid} killed by SIGKILL; its last words (logs/server.log)"
        assert said in died.text and said in _log_of(app, "serve")  # in its own log, and quoted by the alert
        assert "l log" in died.hint and died.action == FixAction.restart("serve")
        await pilot_until(pilot, lambda: not [s for s in app.state.snapshot.listeners if s.port == port])
        held = await _dialog(pilot, app, "8")
        assert any(c.severity == "error" and f"nothing listens on port {port}: fire serve (key 7) first" in c.text
                   for c in held.checks), held.checks
        await pilot.press("escape")
        await pilot_until(pilot, lambda: not app.busy)


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


# One training example of the fetched data as the train stage batches it.
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
        await _confirmed(pilot, app, "2", "fetch", timeout=900)

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

        await _confirmed(pilot, app, "3", "train")
        train_log = _log_of(app, "train")
        by_part = next(line for line in train_log.splitlines() if line.startswith("trainable parameters by part:"))
        assert "vision 0, merger 0," in by_part and int(by_part.split("language ")[1].split(",")[0]) > 0
        for key, stage in (("4", "merge"), ("5", "convert"), ("6", "quantize")):
            await _confirmed(pilot, app, key, stage)
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
        refused = await _dialog(pilot, app, "7")
        assert any(c.severity == "error" and "vlm-mmproj-f16.gguf" in c.text for c in refused.checks), refused.checks
        await pilot.press("escape")
        await pilot_until(pilot, lambda: not app.busy)
        mmproj.with_suffix(".away").rename(mmproj)

        await pilot_until(pilot, lambda: not app.busy)
        serve = await _dialog(pilot, app, "7")
        assert not [c.text for c in serve.checks if c.severity == "error"], serve.checks
        await pilot.click("#confirm")
        await pilot_until(pilot, lambda: "serve ● running" in _bar(app) and "SMOKE_OK" in _bar(app), timeout=300)
        assert "SMOKE_OK colour? -> red" in _log_of(app, "serve")

        await _confirmed(pilot, app, "8", "eval")
        assert "EVAL_RC=0" in _log_of(app, "eval")
        (run,) = (pipeline_ws / "runs" / "eval").iterdir()
        assert json.loads((run / "summary.json").read_text())["accuracy"] >= 0.9
        items = [json.loads(line) for line in (run / "items.jsonl").read_text().splitlines()]
        photo = next(i["image"] for i in items if i["image"]["width"] == 1600)
        assert photo["resized"] and (photo["sent_width"], photo["sent_height"]) == (1120, 840)
        assert all(max(i["image"]["sent_width"], i["image"]["sent_height"]) <= 1120 for i in items)
        assert check_eval((run / "items.jsonl").read_text().splitlines()).problems == ()
        assert not [f for f in detect(cfg, app.state.snapshot) if f.code == "serve_without_mmproj"]

        # A server of this pipeline started by hand without --mmproj: doctor's finding.
        blind_port = free_port()
        blind = spawn(str(pipeline_ws / "venv" / "llama.cpp" / "bin" / "llama-server"), "-m", str(model),
                      "--port", str(blind_port), "-c", "256", cwd=pipeline_ws)
        found = await pilot_until(pilot, lambda: next((f for f in detect(cfg, app.state.snapshot)
                                                       if f.code == "serve_without_mmproj"), None), timeout=60)
        assert f"llama-server pid {blind.pid} runs without --mmproj" in found.message
        await pilot_until(pilot, lambda: any(a.active and a.code == "serve_without_mmproj" for a in app.state.alerts))

        # §10's second half: the served model operates web pages in headless Chromium, then one
        # reward-driven round (sample, keep the rewarded, LoRA, merge, convert, serve) from its key.
        await pilot_until(pilot, lambda: not app.busy)
        await _confirmed(pilot, app, "0", "cu_eval")
        assert "CU_EVAL_RC=0" in _log_of(app, "cu_eval")
        (cu_run,) = (pipeline_ws / "runs" / "cu").iterdir()
        episodes = (cu_run / "episodes.jsonl").read_text().splitlines()
        rows = [json.loads(line) for line in episodes]
        assert len(rows) == 28 and all(r["error"] is None and r["sent"] == [224, 224] for r in rows), rows[:2]
        assert {r["split"] for r in rows} == {"heldout"} and 0 < sum(r["reward"] for r in rows) < len(rows)
        assert check_episodes(episodes).n == 28
        await pilot_until(pilot, lambda: any(
            r.name == cu_run.name and r.kind == "cu" for r in app.state.last_update.evals))

        await pilot_until(pilot, lambda: not app.busy)
        await _confirmed(pilot, app, "p", "rft", timeout=900)
        rft_log = _log_of(app, "rft")
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


async def test_a_killed_training_run_resumes_from_its_last_good_checkpoint_from_the_keys(pipeline_ws: Path) -> None:
    """Issue 31: the train run is killed from outside after its second checkpoint; its alert
    says why and offers the resume; `x` and the dialog continue it from a checkpoint, and it
    ends done at the full step count, having run fewer steps than a restart would."""
    from samai.console.app import SamaiApp
    from tests.helpers import pilot_until

    cfg = tiny(pipeline_ws, free_port())
    cfg = replace(cfg, target=replace(cfg.target, poll_interval=0.3))
    folder = pipeline_ws / "runs" / "train" / "checkpoints"
    app = SamaiApp(cfg)
    async with app.run_test(size=(160, 50)) as pilot:
        await pilot_until(pilot, lambda: app.state.snapshot)
        await _confirmed(pilot, app, "2", "fetch")
        await _dialog(pilot, app, "3")
        await pilot.click("#confirm")
        await pilot_until(pilot, lambda: len(list(folder.glob("checkpoint-*/trainer_state.json"))) >= 2, timeout=600)
        first = app.state.runs["train"]
        snap = app.state.snapshot
        rec = snap.state("train")
        trainer = next(p for p in snap.processes if p.pid in rec.group and "samai_box.stages.train" in p.command)
        os.kill(trainer.pid, signal.SIGKILL)  # the OOM killer's way, as far as the console can tell
        died = await pilot_until(pilot, lambda: next((a for a in app.state.alerts if a.active
                                                      and a.action == FixAction.resume("train")), None), timeout=60)
        assert "stage train failed rc=137: signal: killed by SIGKILL" in died.text, died.text
        killed_at = max(int(p.name.split("-")[1]) for p in folder.glob("checkpoint-*"))
        (folder / f"checkpoint-{killed_at}" / "optimizer.pt").unlink()  # the newest made incomplete

        dialog = await _dialog(pilot, app, "x")
        assert dialog.plan.action == "resume"
        assert dialog.plan.checkpoint.startswith("runs/train/checkpoints/checkpoint-")
        step = int(dialog.plan.checkpoint.rsplit("-", 1)[1])
        assert 0 < step < killed_at and "--resume-from" in dialog.plan.chain  # the one before it
        assert f"passed over checkpoint-{killed_at}: missing optimizer.pt or optimizer.bin or global_step*" \
            in dialog.plan.details
        await pilot.click("#confirm")
        await pilot_until(pilot, lambda: app.state.runs.get("train") not in (None, first), timeout=60)
        rec = await pilot_until(pilot, lambda: _ended(app, "train"), timeout=600)
        log = _log_of(app, "train")
        assert rec.rc == 0, log[-3000:]
        assert "TRAIN_RESUMED" in log and f"/{dialog.plan.checkpoint} (step {step})" in log
        done = (pipeline_ws / "runs" / "train" / "TRAIN_DONE").read_text()
        total = int(done.split()[0])
        resumed_steps = sum(1 for line in log.splitlines() if line.startswith("{'loss'"))
        assert total > step and resumed_steps <= total - step + 1, (total, step, resumed_steps)
        await pilot_until(pilot, lambda: "train ✓ done" in _bar(app))
        from samai.widgets.curves import CurvesPane

        pane = app.box_screen.query_one(CurvesPane)  # one curve: the dead run's steps to the checkpoint, then on
        steps = await pilot_until(pilot, lambda: pane.resumed_at == step and [p.step for p in pane.points])
        assert steps == sorted(set(steps)) and steps[0] == 1 and steps[-1] == total, steps



async def test_a_killed_training_run_is_resumed_by_the_watcher_with_nobody_at_the_keys(
        pipeline_ws: Path, json_receiver) -> None:
    """Issue 32: the headless watcher with `recover = ["resume_train"]` sees the train run killed
    from outside, tells the receiver why, resumes it from its newest good checkpoint through the
    action layer (audited "by the watcher"), says so, and the run ends done."""
    from samai.console.core.connect import open_box
    from samai.console.core.watch.sender import Sender, receivers
    from samai.console.core.watch.watcher import BoxWatcher, Identity, watch
    from tests.helpers import until

    cfg = tiny(pipeline_ws, free_port())
    cfg = replace(cfg, target=replace(cfg.target, poll_interval=0.3),
                  watch=replace(cfg.watch, interval=0.3, recover=("resume_train",)))
    sender = Sender(receivers([json_receiver.url]), print, retry_s=(0.2, 0.2))
    watcher = BoxWatcher("", cfg, open_box, sender, Identity("w1", "op@watchhost", "watchhost"), say=print)
    folder = pipeline_ws / "runs" / "train" / "checkpoints"
    box = Box(LocalTransport(), str(pipeline_ws), python=sys.executable)
    task = asyncio.ensure_future(watch([watcher]))
    try:
        actions = Actions(box, cfg, AuditLog(paths.audit_log()), readonly=False, confirm=_anyway)
        assert "FETCH_DONE" in await run_stage(box, cfg, "fetch")
        assert (await actions.fire("train")).ok
        await until(lambda: len(list(folder.glob("checkpoint-*/trainer_state.json"))) >= 2, timeout=600)
        snap = await box.snapshot(processes=True)
        trainer = next(p for p in snap.processes
                       if p.pid in snap.state("train").group and "samai_box.stages.train" in p.command)
        os.kill(trainer.pid, signal.SIGKILL)
        await until(lambda: any(t.startswith("samai: resumed train from checkpoint-") for t in json_receiver.titles()),
                    timeout=120)
        train_log = pipeline_ws / cfg.stage("train").log
        await until(lambda: "CHAIN_DONE" in train_log.read_text(errors="replace"), timeout=600)
        await until(lambda: any("train" in t and "resolved" in t for t in json_receiver.titles()), timeout=60)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await box.close()
    titles = json_receiver.titles()
    [died] = [r for r in json_receiver.got if r.title.startswith("samai: stage train failed rc=137")]
    assert "signal: killed by SIGKILL" in died.title and "resume train" in died.body, died.body
    [resumed] = [t for t in titles if t.startswith("samai: resumed train from checkpoint-")]
    step = int(resumed.rsplit("-", 1)[1])
    log = train_log.read_text(errors="replace")
    assert "TRAIN_RESUMED" in log and f"checkpoint-{step} (step {step})" in log, log[-2000:]
    assert "CHAIN_DONE rc=0" in log and "TRAIN_DONE" in log, log[-2000:]
    audit = [json.loads(line) for line in paths.audit_log().read_text().splitlines()]
    by_watcher = [e for e in audit if e.get("via") == "by the watcher" and e.get("phase") == "intent"]
    assert [e["action"] for e in by_watcher] == ["resume"], by_watcher

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
