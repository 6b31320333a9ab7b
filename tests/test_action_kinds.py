"""Action kinds are types, not strings: each ActionKind has one registered plan type that runs
itself (Actions.run dispatches on it), the fix an alert offers names a kind and the app method
that runs it, a kind not registered cannot be planned or offered, and every kind's shown fields
are redacted. The smoke check's stop of an unanswered stage goes through the action layer too,
decided as part of the smoke and audited."""

from __future__ import annotations

import inspect
import json
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import ClassVar

import psutil
import pytest

from samai.console.core import config
from samai.console.core.actions import (
    PLANS,
    ActionPlan,
    Actions,
    Decision,
    FirePlan,
    KillPlan,
    PortHolder,
    StopPlan,
)
from samai.console.core.audit import AuditLog
from samai.console.core.fixes import CLEAN, FIXES, FixAction
from samai.console.core.kinds import ActionKind
from samai.console.core.preflight import Check
from samai.console.core.serving.smoke import SMOKE_DECISION, SMOKE_STAGE, smoke
from samai.remote.model import Process

SECRET = "hf_" + "a1B2c3D4e5F6g7H8i9J0kLmNoPqRsTuV"  # a token known by its prefix: redacted wherever it stands
NEEDED = {"pid": 4242, "start_time": 1700000000.25}  # what a kill plan cannot be built without


def _plan(cls: type[ActionPlan], text: str = "x", **kw) -> ActionPlan:
    """A plan of that type with text in every shown field."""
    own = {f.name for f in fields(cls)}
    return cls(f"local {text}", f"subject {text}", f"command {text}", (f"detail {text}",),
               (Check("error", f"check {text}"),), **{k: v for k, v in NEEDED.items() if k in own}, **kw)


def _process() -> Process:
    return Process(4242, 1, 4242, 4242, "me", 1700000000.25, "S", 0.0, 0.0, 0, "python", ("python", "train.py"))


def test_every_kind_has_one_plan_type_that_runs_itself_and_a_planner() -> None:
    assert set(PLANS) == set(ActionKind)
    for kind, cls in PLANS.items():
        assert cls.kind is kind and issubclass(cls, ActionPlan) and not inspect.isabstract(cls), cls
        assert cls.execute is not ActionPlan.execute and inspect.iscoroutinefunction(cls.execute), cls
        assert callable(getattr(Actions, f"plan_{kind}")), kind
        plan = _plan(cls)
        assert plan.action == kind.value and type(plan.action) is str  # as the audit log and the dialogs say it
        assert plan.blocked and plan.intent_fields()["blocked_by"] == ["check x"]


def test_a_kind_that_is_not_registered_cannot_be_planned_or_offered() -> None:
    with pytest.raises(TypeError):
        ActionPlan("local", "s", "c")  # no kind: the shared part of every plan, never a plan itself

    @dataclass(frozen=True, kw_only=True)
    class Renamed(StopPlan):  # its parent's kind, but not the type registered for it
        pass

    with pytest.raises(TypeError, match="not the plan of a registered kind"):
        Renamed("local", "s", "c")
    with pytest.raises(TypeError, match="has its plan already"):
        @dataclass(frozen=True, kw_only=True)
        class SecondStop(StopPlan):
            kind: ClassVar[ActionKind] = ActionKind.STOP
    with pytest.raises(TypeError, match="not an ActionKind"):
        @dataclass(frozen=True, kw_only=True)
        class Reboot(StopPlan):
            kind: ClassVar[str] = "reboot"  # type: ignore[assignment]
    assert PLANS[ActionKind.STOP] is StopPlan and set(PLANS) == set(ActionKind)
    with pytest.raises(ValueError):
        ActionKind("reboot")
    for name in ("reboot", "fire", "gguf", ""):  # no such kind, or one no alert offers
        with pytest.raises(ValueError):
            FixAction(name)  # type: ignore[arg-type]


def test_each_fix_names_a_registered_kind_and_an_app_method_that_takes_it() -> None:
    from samai.console.screens.box import BoxScreen

    proc = _process()
    made = {FixAction.kill(proc), FixAction.stop("train"), FixAction.restart("train"), FixAction.resume("train"),
            FixAction.prune("train"), CLEAN, FixAction.uninstall("/venv/bin/python", "torchao")}
    assert {f.kind for f in made} == set(FIXES) and set(FIXES) <= set(PLANS)
    for fix in made:
        method, args = fix.call
        assert method.startswith("action_") and callable(getattr(BoxScreen, method, None)), method
        inspect.signature(getattr(BoxScreen, method)).bind(None, *args)  # it takes exactly these
    assert FixAction("stop", stage="train") == FixAction.stop("train")  # a kind's name names it too
    assert FixAction.kill(proc).call == ("action_kill_pid", (4242, 1700000000.25))
    assert FixAction.uninstall("/venv/bin/python", "torchao").call == ("action_uninstall",
                                                                       ("/venv/bin/python", "torchao"))


def test_doctor_prints_each_fix_as_before() -> None:
    proc = _process()
    assert [str(f) for f in (FixAction.kill(proc), FixAction.stop("train"), FixAction.restart("serve"), CLEAN,
                             FixAction.uninstall("/venv/bin/python", "torchao"))] == [
        "kill 4242 1700000000.25", "stop train", "restart serve", "clean", "uninstall torchao /venv/bin/python"]


@pytest.mark.parametrize("kind", list(ActionKind))
def test_every_kind_shows_and_audits_no_secret(kind: ActionKind) -> None:
    plan = _plan(PLANS[kind], f"--token {SECRET}")
    shown = [plan.target, plan.subject, plan.command, *plan.details, *(c.text for c in plan.checks)]
    assert all("--token" in text and SECRET not in text for text in shown), shown
    assert SECRET not in json.dumps(plan.intent_fields())


def test_each_kind_keeps_the_intent_line_in_its_order() -> None:
    """The audit log's lines are byte for byte as before: each kind adds its fields where it did."""
    holder = PortHolder(8080, 77, 1700000000.5, "python -m http.server 8080")
    kill = _plan(KillPlan, signal="KILL", group=True, grace=2.0)
    assert list(kill.intent_fields().items()) == [("details", ["detail x"]), ("signal", "KILL"), ("group", True),
                                                  ("grace", 2.0), ("blocked_by", ["check x"])]
    assert kill.audited_process() == (4242, 1700000000.25)
    fire = _plan(FirePlan, holders=(holder,))
    assert list(fire.intent_fields()) == ["details", "blocked_by", "holders"] and fire.audited_process() == (None, None)
    assert fire.intent_fields()["holders"] == [{"pid": 77, "start_time": 1700000000.5, "port": 8080,
                                                "command": "python -m http.server 8080"}]
    assert list(FirePlan("local", "s", "c").intent_fields()) == ["details"]


SERVE = """\
import sys, time
print("SERVING", sys.argv[1:], flush=True)
time.sleep(60)  # never answers: the smoke check stops it
"""


async def test_an_unanswered_smoke_is_stopped_through_the_action_layer_and_audited(tmp_path: Path, box,
                                                                                  workspace: Path) -> None:
    serve = tmp_path / "serve.py"
    serve.write_text(SERVE)
    toml = tmp_path / "smoke.toml"
    toml.write_text(f'[target]\npython = "{sys.executable}"\n[workspace]\npath = "{workspace}"\n'
                    f'[stages.serve]\nkey = "v"\ncommand = "{sys.executable} {serve} --model m.gguf --port 1"\n')
    audit = AuditLog(tmp_path / "audit.jsonl")
    asked: list[ActionPlan] = []

    async def confirm(plan: ActionPlan) -> Decision:
        asked.append(plan)
        return Decision.confirmed(plan, "test")

    result = await smoke(Actions(box, config.load(toml), audit, readonly=False, confirm=confirm), "new.gguf",
                         timeout=1.0)
    assert not result.ok and result.said == "no answer within 1 s: stopped", result.said
    assert [p.action for p in asked] == ["fire"]  # the operator confirmed the smoke once: its stop is part of it
    lines = [json.loads(line) for line in audit.path.read_text().splitlines()]
    assert [(e["action"], e["phase"]) for e in lines] == [("fire", "intent"), ("fire", "outcome"),
                                                          ("stop", "intent"), ("stop", "outcome")]
    fired, stop = lines[1], lines[3]
    assert lines[2]["id"] == stop["id"] and stop["subject"] == f"stage {SMOKE_STAGE}"
    assert (stop["confirmation"], stop["via"], stop["result"]) == (SMOKE_DECISION, "smoke check", "done")
    assert stop["message"].startswith(f"stage {SMOKE_STAGE} ") and "SIGTERM" in stop["command"]
    assert not psutil.pid_exists(fired["pid"]) or psutil.Process(fired["pid"]).status() == psutil.STATUS_ZOMBIE
