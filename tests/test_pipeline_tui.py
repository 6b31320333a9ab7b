"""The incidents as an operator meets them in the TUI, keys and dialogs only (and the watcher
with nobody at the keys): the drill from a diverging run to a replaced server, and a killed
training run resumed from its last good checkpoint."""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import sys
from dataclasses import replace
from pathlib import Path

from samai.console.core import paths
from samai.console.core.actions import Actions
from samai.console.core.audit import AuditLog
from samai.console.core.evals.feed import EvalsFeed
from samai.console.core.fixes import FixAction
from samai.remote.box.gguf_check import check_file
from samai.remote.boxapi import Box
from samai.remote.local import LocalTransport
from tests.helpers import confirm_dialog
from tests.pipeline_helpers import (
    LONG,
    anyway,
    bar,
    ended,
    fire_confirmed,
    free_port,
    log_of,
    open_dialog,
    run_stage,
    tiny,
    with_command,
)

pytestmark = LONG


async def test_the_incident_drill_through_the_tui(tiny_ws: Path) -> None:
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
    cfg = tiny(tiny_ws, port)
    # What the operator edits between the runs: train's extra flags (the diverging learning rate).
    flags = tiny_ws / "train.flags"
    flags.write_text("--max-steps 16 --diverge-after 4\n")
    cfg = with_command(cfg, "train", cfg.stage("train").command + ' $(cat "$SAMAI_WORKSPACE/train.flags")')
    cfg = replace(cfg, target=replace(cfg.target, poll_interval=0.3))
    app = SamaiApp(cfg)
    async with app.run_test(size=(160, 50)) as pilot:
        await pilot_until(pilot, lambda: app.state.snapshot)
        await fire_confirmed(pilot, app, "2", "fetch")

        # 1. The run diverges: not done, an alert that names it, merge marked blocked.
        dialog = await open_dialog(pilot, app, "3")
        await confirm_dialog(pilot)
        rec = await pilot_until(pilot, lambda: ended(app, "train"), timeout=600)
        assert rec.rc == 3 and rec.status == "failed", log_of(app, "train")[-3000:]
        await pilot_until(pilot, lambda: "train ✗ failed rc=3" in bar(app) and "merge ■ blocked" in bar(app))
        alert = await pilot_until(pilot, lambda: next((a for a in app.state.alerts if a.active
                                                        and a.code == "hidden_nan"), None))
        assert alert.action == FixAction.restart("train") and "l log" in alert.hint
        assert "TRAIN_NAN" in str(app.box_screen.query_one("#alerts").render())
        assert not (tiny_ws / "runs" / "train" / "final").exists()

        # 2. Merge is refused: the dialog names the training log's finding; the operator cancels.
        dialog = await open_dialog(pilot, app, "4")
        assert any(c.severity == "error" and "train's log, last run: hidden_nan" in c.text for c in dialog.checks)
        assert "anyway" in str(dialog.query_one("#confirm").label)
        await pilot.press("escape")
        await pilot_until(pilot, lambda: not app.busy)
        assert not (tiny_ws / cfg.stage("merge").log).exists()

        # 3. The fix: the learning rate back to normal, then the alert's log (l) and a restart (r)
        # that clears the diverged run's TRAIN_NAN before it fires again.
        flags.write_text("\n")
        await pilot.press("l")
        log_title = str(app.box_screen.query_one(LogView).border_title)
        assert app.box_screen.shown_stage == "train" and "log · train" in log_title
        restart = await open_dialog(pilot, app, "r")
        assert restart.plan.action == "restart" and "runs/train/TRAIN_NAN" in restart.plan.paths
        diverged = app.state.stages.runs["train"]
        await confirm_dialog(pilot)
        await pilot_until(pilot, lambda: app.state.stages.runs.get("train") != diverged)
        # The new run starts clean: no marker, curve or log line of the diverged run on screen.
        await pilot_until(pilot, lambda: "train ● running" in bar(app))
        log = app.box_screen.query_one(LogView)
        assert "TRAIN_NAN" not in bar(app), bar(app)
        assert not any("TRAIN_NAN" in line for line in log.lines), list(log.lines)[-20:]
        rec = await pilot_until(pilot, lambda: ended(app, "train"), timeout=600)
        assert rec.rc == 0, log_of(app, "train")[-3000:]
        curve = app.box_screen.query_one(CurvesPane).points  # the healthy run's steps alone, none of the diverged one's
        assert curve and not any(p.hidden_nan or not math.isfinite(p.grad_norm or 0.0) for p in curve)
        assert [p.step for p in curve] == sorted({p.step for p in curve})
        assert (tiny_ws / "runs" / "train" / "TRAIN_DONE").exists()
        await pilot_until(pilot, lambda: "train ✓ done" in bar(app) and "merge ■" not in bar(app))
        assert not [a.text for a in app.state.alerts if a.active and a.severity == "error"]
        assert alert.code in {a.code for a in app.state.alerts if not a.active}  # resolved, kept as history
        assert app.state.stages.previous["train"].status == "failed"

        # 4. Healthy: merge (its preflight now finds the run clean), convert, quantize.
        merge = await open_dialog(pilot, app, "4")
        assert any(c.severity == "ok" and "train's log, last run:" in c.text for c in merge.checks)
        await pilot.press("escape")
        for key, stage in (("4", "merge"), ("5", "convert"), ("6", "quantize")):
            await fire_confirmed(pilot, app, key, stage)
        assert check_file(str(tiny_ws / "gguf" / "tiny-q8_0.gguf"))["ok"]

        # 5. Serve, then replace the running server with its own key (a restart, not a block).
        await pilot_until(pilot, lambda: not app.busy)
        serve = await open_dialog(pilot, app, "7")
        await confirm_dialog(pilot)
        await pilot_until(pilot, lambda: "serve ● running" in bar(app) and "SMOKE_OK" in bar(app), timeout=180)
        old = app.state.snapshot.state("serve")
        serve = await open_dialog(pilot, app, "7")
        assert serve.plan.action == "restart" and "its key restarts it" in serve.plan.details[0]
        assert not [c.text for c in serve.checks if c.severity == "error"], serve.checks
        await confirm_dialog(pilot)
        await pilot_until(pilot, lambda: app.state.snapshot.state("serve").fired_at != old.fired_at, timeout=60)
        await pilot_until(pilot, lambda: "serve ● running" in bar(app) and "SMOKE_OK" in bar(app), timeout=180)
        snap = app.state.snapshot
        gone = snap.process(old.pid)  # exited (a zombie until this machine's init reaps it, if it does)
        assert gone is None or gone.state == "Z", gone
        (listener,) = [s for s in snap.listeners if s.port == port]  # one server: the new run's
        assert snap.process(listener.pid).pgid == snap.state("serve").pgid != old.pgid

        # 6. Eval against the new server.
        await fire_confirmed(pilot, app, "8", "eval")
        assert "EVAL_RC=0" in log_of(app, "eval")
        (summary,) = (tiny_ws / "runs" / "eval").glob("*/summary.json")
        assert json.loads(summary.read_text())["accuracy"] >= 0.9
        evals = app.state.feed(EvalsFeed)
        await pilot_until(pilot, lambda: evals.checked and evals.checked[1] is not None)
        assert evals.checked[1].problems == ()  # check eval on its items, as the console did
        evals = app.box_screen.query_one(EvalTable)  # the eval pane shows the run
        await pilot_until(pilot, lambda: evals.row_count == 1)
        assert not [a.text for a in app.state.alerts if a.active and a.severity == "error"]

        # 7. The server dies (the OOM killer's way): an alert in its own words; eval is then held back.
        os.kill(listener.pid, signal.SIGKILL)
        died = await pilot_until(pilot, lambda: next((a for a in app.state.alerts if a.active and "died" in a.text),
                                                     None), timeout=60)
        assert died.stage == "serve" and died.text.startswith("stage serve: pid ") and "died (rc=137)" in died.text
        said = f"SERVER_DIED llama-server pid {listener.pid} killed by SIGKILL; its last words (logs/server.log)"
        assert said in died.text and said in log_of(app, "serve")  # in its own log, and quoted by the alert
        assert "l log" in died.hint and died.action == FixAction.restart("serve")
        await pilot_until(pilot, lambda: not [s for s in app.state.snapshot.listeners if s.port == port])
        held = await open_dialog(pilot, app, "8")
        assert any(c.severity == "error" and f"nothing listens on port {port}: fire serve (key 7) first" in c.text
                   for c in held.checks), held.checks
        await pilot.press("escape")
        await pilot_until(pilot, lambda: not app.busy)


async def test_a_killed_training_run_resumes_from_its_last_good_checkpoint_from_the_keys(tiny_ws: Path) -> None:
    """Issue 31: the train run is killed from outside after its second checkpoint; its alert
    says why and offers the resume; `x` and the dialog continue it from a checkpoint, and it
    ends done at the full step count, having run fewer steps than a restart would."""
    from samai.console.app import SamaiApp
    from tests.helpers import pilot_until

    cfg = tiny(tiny_ws, free_port())
    cfg = replace(cfg, target=replace(cfg.target, poll_interval=0.3))
    folder = tiny_ws / "runs" / "train" / "checkpoints"
    app = SamaiApp(cfg)
    async with app.run_test(size=(160, 50)) as pilot:
        await pilot_until(pilot, lambda: app.state.snapshot)
        await fire_confirmed(pilot, app, "2", "fetch")
        await open_dialog(pilot, app, "3")
        await confirm_dialog(pilot)
        await pilot_until(pilot, lambda: len(list(folder.glob("checkpoint-*/trainer_state.json"))) >= 2, timeout=600)
        first = app.state.stages.runs["train"]
        snap = app.state.snapshot
        rec = snap.state("train")
        trainer = next(p for p in snap.processes if p.pid in rec.group and "samai_box.stages.train" in p.command)
        os.kill(trainer.pid, signal.SIGKILL)  # the OOM killer's way, as far as the console can tell
        died = await pilot_until(pilot, lambda: next((a for a in app.state.alerts if a.active
                                                      and a.action == FixAction.resume("train")), None), timeout=60)
        assert "stage train failed rc=137: signal: killed by SIGKILL" in died.text, died.text
        killed_at = max(int(p.name.split("-")[1]) for p in folder.glob("checkpoint-*"))
        (folder / f"checkpoint-{killed_at}" / "optimizer.pt").unlink()  # the newest made incomplete

        dialog = await open_dialog(pilot, app, "x")
        assert dialog.plan.action == "resume"
        assert dialog.plan.checkpoint.startswith("runs/train/checkpoints/checkpoint-")
        step = int(dialog.plan.checkpoint.rsplit("-", 1)[1])
        assert 0 < step < killed_at and "--resume-from" in dialog.plan.chain  # the one before it
        assert f"passed over checkpoint-{killed_at}: missing optimizer.pt or optimizer.bin or global_step*" \
            in dialog.plan.details
        await confirm_dialog(pilot)
        await pilot_until(pilot, lambda: app.state.stages.runs.get("train") not in (None, first), timeout=60)
        rec = await pilot_until(pilot, lambda: ended(app, "train"), timeout=600)
        log = log_of(app, "train")
        assert rec.rc == 0, log[-3000:]
        assert "TRAIN_RESUMED" in log and f"/{dialog.plan.checkpoint} (step {step})" in log
        done = (tiny_ws / "runs" / "train" / "TRAIN_DONE").read_text()
        total = int(done.split()[0])
        resumed_steps = sum(1 for line in log.splitlines() if line.startswith("{'loss'"))
        assert total > step and resumed_steps <= total - step + 1, (total, step, resumed_steps)
        await pilot_until(pilot, lambda: "train ✓ done" in bar(app))
        from samai.widgets.curves import CurvesPane

        pane = app.box_screen.query_one(CurvesPane)  # one curve: the dead run's steps to the checkpoint, then on
        steps = await pilot_until(pilot, lambda: pane.resumed_at == step and [p.step for p in pane.points])
        assert steps == sorted(set(steps)) and steps[0] == 1 and steps[-1] == total, steps


async def test_a_killed_training_run_is_resumed_by_the_watcher_with_nobody_at_the_keys(
        tiny_ws: Path, json_receiver) -> None:
    """Issue 32: the headless watcher with `recover = ["resume_train"]` sees the train run killed
    from outside, tells the receiver why, resumes it from its newest good checkpoint through the
    action layer (audited "by the watcher"), says so, and the run ends done."""
    from samai.console.core.connect import open_box
    from samai.console.core.watch.sender import Sender, receivers
    from samai.console.core.watch.watcher import BoxWatcher, Identity, watch
    from tests.helpers import until

    cfg = tiny(tiny_ws, free_port())
    cfg = replace(cfg, target=replace(cfg.target, poll_interval=0.3),
                  watch=replace(cfg.watch, interval=0.3, recover=("resume_train",)))
    sender = Sender(receivers([json_receiver.url]), print, retry_s=(0.2, 0.2))
    watcher = BoxWatcher("", cfg, open_box, sender, Identity("w1", "op@watchhost", "watchhost"), say=print)
    folder = tiny_ws / "runs" / "train" / "checkpoints"
    box = Box(LocalTransport(), str(tiny_ws), python=sys.executable)
    task = asyncio.ensure_future(watch([watcher]))
    try:
        actions = Actions(box, cfg, AuditLog(paths.audit_log()), readonly=False, confirm=anyway)
        assert "FETCH_DONE" in await run_stage(box, cfg, "fetch")
        assert (await actions.fire("train")).ok
        await until(lambda: len(list(folder.glob("checkpoint-*/trainer_state.json"))) >= 2, timeout=600)
        snap = await box.snapshot(processes=True)
        trainer = next(p for p in snap.processes
                       if p.pid in snap.state("train").group and "samai_box.stages.train" in p.command)
        os.kill(trainer.pid, signal.SIGKILL)
        await until(lambda: any(t.startswith("samai: resumed train from checkpoint-") for t in json_receiver.titles()),
                    timeout=120)
        train_log = tiny_ws / cfg.stage("train").log
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
