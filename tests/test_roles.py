"""Stage roles (issue 30, item 5): what the console does for a stage follows its `role`, never its
name. The tiny pipeline with its train stage renamed `sft` (role train) keeps the training
curve, the NaN alerts, the GPU-stall finding and merge's evidence gate; a stage named `train`
of role other gets none of what the role gives. Snapshots come from a replay box or the factories, the
training logs and GPU readings are written or replayed: no process starts."""

from __future__ import annotations

import re
import sys
from dataclasses import replace
from importlib import resources
from pathlib import Path

import pytest

from samai.console.core import config, paths
from samai.console.core.actions import ActionPlan, Actions, Decision
from samai.console.core.audit import AuditLog
from samai.console.core.detectors import detect, peft_pythons
from samai.console.core.gpus.findings import GpuWatch
from samai.console.core.preflight.evidence import training_sources
from samai.console.core.serving.smoke import SMOKE_STAGE, smoke_config
from samai.console.core.state import ConsoleState
from samai.console.core.training.feed import TrainingFeed, TrainingView
from samai.remote.model import Snapshot, StageRecord
from tests import factories
from tests.replay_transport import new_points
from tests.test_gpu_view import A5000_PID, reading, recorded
from tests.test_poisoned_runs import dead_gradients_log, healthy_log

TINY = resources.files("samai.console").joinpath("pipelines", "tiny.toml").read_text("utf-8")


def step(loss: object, grad_norm: object, at: int) -> str:
    return f"{{'loss': '{loss}', 'grad_norm': '{grad_norm}', 'learning_rate': '0.001', 'epoch': '{at / 4}'}}\n"


def tiny(ws: Path, edits: dict[str, str] | None = None, **roles: str) -> config.Config:
    """The built-in tiny pipeline's text with stages renamed (old = new) and roles given (stage = role),
    read as a samai.toml whose workspace is ws."""
    text = TINY
    for old, new in (edits or {}).items():
        text = text.replace(f"[stages.{old}]\n", f"[stages.{new}]\n")
    for name, role in roles.items():
        text = text.replace(f"[stages.{name}]\n", f'[stages.{name}]\nrole = "{role}"\n')
        if role != "train":  # only a training stage keeps checkpoints (the config refuses them elsewhere)
            text = re.sub(rf'(\[stages\.{re.escape(name)}\]\n(?:[^\[].*\n)*?)checkpoints = .*\n', r"\1", text)
    text = text.replace('[target]\n', f'[workspace]\npath = "{ws}"\n\n[target]\npython = "{sys.executable}"\n')
    return config.parse(text, "renamed.toml")


def sft(ws: Path) -> config.Config:
    return tiny(ws, {"train": "sft"}, sft="train")


def write_log(ws: Path, cfg: config.Config, stage: str, text: str) -> None:
    path = ws / cfg.stage(stage).log
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def running(snap: Snapshot, stage: str, fired_at: float, pid: int = 4242) -> Snapshot:
    rec = StageRecord(stage, pid, pid, 1.0, f"logs/{stage}.log", "x", fired_at, alive=True, group=(pid,))
    return replace(snap, states=(rec,))


async def _confirm(plan: ActionPlan) -> Decision:
    return Decision.confirmed(plan, "test")


# ---------------------------------------------------------------- the key


def test_a_stage_s_role_is_its_name_when_that_is_a_role_else_other() -> None:
    cfg = config.load_builtin("tiny")
    assert [s.role for s in cfg.stages] == [s.name for s in cfg.stages]  # the shipped pipelines need no role key
    for name in ("samai-8b", "vlm-tiny", "samai-vl"):
        # cu_eval and rft name no role: the console treats them as the other stages they are
        assert all(s.role == (s.name if s.name in config.ROLES else "other") for s in config.load_builtin(name).stages)
    own = config.parse('[stages.sft]\nkey = "t"\ncommand = "x"\n[stages.pull]\nkey = "p"\ncommand = "y"\n'
                       'role = "restore"\n', "own.toml")
    assert [(s.name, s.role) for s in own.stages] == [("sft", "other"), ("pull", "restore")]
    assert own.stage_by_role("restore") is own.stage("pull") and own.stages_with_role("other") == (own.stage("sft"),)
    assert own.stage_by_role("train") is None and own.role_name("train") == "" and own.role_name("restore") == "pull"


@pytest.mark.parametrize("role", ['"training"', '"Train"', "3", '["train"]', '""'])
def test_a_bad_role_is_a_config_error_naming_the_file_the_key_and_the_roles(role: str) -> None:
    with pytest.raises(config.ConfigError) as e:
        config.parse(f'[stages.sft]\nkey = "t"\ncommand = "x"\nrole = {role}\n', "bad.toml")
    said = str(e.value)
    assert said.startswith("bad.toml: stages.sft.role: expected one of provision, fetch, train, merge, convert, "
                           "quantize, serve, eval, push, restore, other, got "), said


# ---------------------------------------------------------------- a train stage named sft


async def test_the_renamed_train_stage_keeps_its_curve_and_its_nan_alerts(workspace: Path, replay_box) -> None:
    cfg = sft(workspace)
    assert cfg.stage("train") is None and cfg.stage("sft").log == "logs/sft.log"
    write_log(workspace, cfg, "sft", step(3.0, 1.0, 1) + step(2.5, 1.0, 2) + step("nan", "nan", 3))
    state = ConsoleState(cfg)
    followers = state.followers()
    snap = running(await replay_box.snapshot(**state.request(followers)), "sft", 1000.0)
    update = state.apply(snap, followers, 2000.0)
    assert [p.loss for p in new_points(update)][:2] == [3.0, 2.5] and len(new_points(update)) == 3
    nan = [a for a in update.new_alerts if a.code == "nan_loss"]
    assert nan and nan[0].stage == "sft" and nan[0].text.startswith("sft: ") and nan[0].severity == "error"
    assert state.unproven(cfg.stage("merge"))  # the bar marks merge blocked by the followed run's finding
    followers = state.followers()  # a new run of sft: its curve starts again
    snap = running(await replay_box.snapshot(**state.request(followers)), "sft", 1100.0)
    update = state.apply(snap, followers, 2001.0)
    assert update.view(TrainingView).reset


def test_the_renamed_train_stage_gets_the_gpu_stall_finding(workspace: Path) -> None:
    cfg = sft(workspace)
    base = running(factories.snapshot(), "sft", 1000.0)
    watch = GpuWatch(cfg, stall_s=60, startup_stall_s=60)
    idle = reading(recorded("dual_a5000", {A5000_PID: 4242}))  # as recorded: 0 % on both, held by sft's chain
    assert [f for f in watch.findings(replace(base, time=base.time, gpus=idle)) if f.code == "gpu_stall"] == []
    [stall] = [f for f in watch.findings(replace(base, time=base.time + 60, gpus=idle)) if f.code == "gpu_stall"]
    assert stall.message.startswith("stage sft is running")


async def test_merge_is_gated_on_the_renamed_stage_s_training_log(workspace: Path, replay_box) -> None:
    cfg = sft(workspace)
    replay_box.transport.add("artifacts", *(factories.artifact(name, str(workspace / cfg.artifact(name).path))
                                            for name in ("base", "adapter")))
    write_log(workspace, cfg, "sft", dead_gradients_log())
    actions = Actions(replay_box, cfg, AuditLog(paths.audit_log()), readonly=False, confirm=_confirm)
    plan = await actions.plan_fire("merge")
    errors = [c.text for c in plan.checks if c.severity == "error"]
    assert plan.blocked and errors and all(t.startswith("sft's log, last run: ") for t in errors), plan.checks
    assert any(c.severity == "error" and "sft's log, last run: dead_gradients" in c.text
                                for c in plan.checks), plan.checks
    write_log(workspace, cfg, "sft", healthy_log())
    plan = await actions.plan_fire("merge")
    assert any(c.severity == "ok" and "sft's log, last run: 40 steps" in c.text for c in plan.checks)


# ---------------------------------------------------------------- the role, not the command or the markers


def own_trainer(ws: Path, role: str) -> config.Config:
    """A stage of the given role that runs its own script (not the box's train module) and has none
    of a training run's markers, feeding an adapter to a merge."""
    return config.parse(f'''
[workspace]
path = "{ws}"
[artifacts.adapter]
path = "out/adapter"
[stages.train]
key = "t"
role = "{role}"
command = "venv/bin/python my_trainer.py"
makes = ["adapter"]
markers = [{{ name = "MINE_DONE" }}]
[stages.fold]
key = "m"
role = "merge"
command = "venv/bin/python my_merge.py"
needs = ["adapter"]
''', "own.toml")


def test_the_role_alone_decides_what_a_stage_gets(workspace: Path) -> None:
    trains, other = own_trainer(workspace, "train"), own_trainer(workspace, "other")
    assert training_sources(trains, trains.stage("fold")) == [trains.stage("train")]
    assert training_sources(other, other.stage("fold")) == []
    assert peft_pythons(trains) == {"venv/bin/python": ("train", "fold")}
    assert peft_pythons(other) == {"venv/bin/python": ("fold",)}
    base = running(factories.snapshot(), "train", 1000.0)
    idle = reading(recorded("dual_a5000", {A5000_PID: 4242}))
    for cfg, stalls in ((trains, 1), (other, 0)):
        watch = GpuWatch(cfg, stall_s=60, startup_stall_s=60)
        watch.findings(replace(base, gpus=idle))
        found = watch.findings(replace(base, time=base.time + 60, gpus=idle))
        assert len([f for f in found if f.code == "gpu_stall"]) == stalls, cfg.stage("train").role


async def test_a_stage_named_train_of_role_other_has_no_curve_and_no_nan_alerts(workspace: Path, replay_box) -> None:
    cfg = tiny(workspace, train="other")
    assert cfg.stage("train").role == "other" and cfg.stage_by_role("train") is None
    write_log(workspace, cfg, "train", step(3.0, 1.0, 1) + step("nan", "nan", 2))
    state = ConsoleState(cfg)
    assert state.feed(TrainingFeed).log is None
    followers = state.followers()
    snap = running(await replay_box.snapshot(**state.request(followers)), "train", 1000.0)
    update = state.apply(snap, followers, 2.0)
    assert new_points(update) == [] and not [a for a in update.new_alerts if a.code.startswith("nan_")]
    assert not state.unproven(cfg.stage("merge"))


# ---------------------------------------------------------------- serve, restore and the multi-node curve


def test_the_smoke_test_uses_the_stage_of_role_serve_whatever_its_name(workspace: Path) -> None:
    cfg = tiny(workspace, {"serve": "llama"}, llama="serve")
    stage = smoke_config(cfg, "gguf/new.gguf").stage(SMOKE_STAGE)
    assert stage.markers == cfg.stage("llama").markers and "--smoke-only" in stage.command
    named = tiny(workspace, serve="other")
    with pytest.raises(ValueError, match="no serve stage"):
        smoke_config(named, "gguf/new.gguf")


def test_restore_is_suggested_for_the_stage_of_role_restore(workspace: Path) -> None:
    cfg = tiny(workspace, {"restore": "pull"}, pull="restore")
    pushed = factories.artifact("pushed_gguf", str(workspace / cfg.artifact("pushed_gguf").path), bytes=1028)
    snap = factories.snapshot(artifacts=[pushed])
    [found] = [f for f in detect(cfg, snap) if f.code == "restore_available"]
    assert str(found.action) == "restart pull" and "(key 0)" in found.message
    named = tiny(workspace, restore="other")
    assert not [f for f in detect(named, snap) if f.code == "restore_available"]


def test_the_multi_node_curve_follows_the_stage_of_role_train() -> None:
    from samai.console.core.multinode.session import MultiNodeSession
    from samai.console.core.multinode.watch import NodeState

    fleet = re.sub(r"\[stages\.train\]", '[stages.sft]\nrole = "train"', '''
[boxes.a]
url = "local"
workspace = "/tmp/samai-roles-a"
[boxes.b]
url = "local"
workspace = "/tmp/samai-roles-b"
[stages.train]
key = "3"
command = "python -m train"
nodes = ["a", "b"]
launcher = "torchrun"
''')
    session = MultiNodeSession(config.parse(fleet, "fleet.toml"), AuditLog(paths.audit_log()), readonly=True,
                               confirm=_confirm)
    session.states = {"sft": (NodeState("a", 0, True, "running"), NodeState("b", 1, True, "running"))}
    session.curve.node = "b"
    assert session.marks() == "sft: a alive · b alive · rank 0 on b"


def test_a_role_is_a_type_that_says_what_it_means() -> None:
    """A stage's role is a Role, not a string: each property answers for the roles it is true of,
    so a call site asks what a role means (no `role == "train"` left in the console's code)."""
    from samai.console.core.roles import ROLES, Role

    assert ROLES == tuple(r.value for r in Role) and "other" in ROLES
    meaning = {r: (r.trains, r.resumable, r.serves, r.runs_peft) for r in Role}
    assert meaning[Role.TRAIN] == (True, True, False, True) and meaning[Role.SERVE] == (False, False, True, False)
    assert meaning[Role.MERGE] == (False, False, False, True)
    assert all(m == (False, False, False, False) for r, m in meaning.items() if r not in (Role.TRAIN, Role.SERVE,
                                                                                          Role.MERGE))
    cfg = config.parse('[stages.sft]\nkey = "t"\ncommand = "true"\nrole = "train"\n', "(test)")
    assert isinstance(cfg.stage("sft").role, Role) and cfg.stage("sft").role.trains
    root = Path(__file__).resolve().parent.parent
    compared = [f"{p.relative_to(root)}:{i}" for folder in ("console", "widgets") for p in (root / folder).rglob("*.py")
                for i, line in enumerate(p.read_text().splitlines(), 1)
                if re.search(r"""(?<!self)\.role\s*[!=]=\s*["']|role_name\(["']|stage_by_role\(["']""", line)]
    assert compared == []
