"""The preflight refuses a training run that could not be resumed, or warns where that is the
operator's choice (issue 48, item 3): no checkpoints kept, only the model saved, a save_total_limit
the NaN guard's window uses up (an error: no whole checkpoint from before the trouble would be
left), a save interval that loses more than [train] max_loss_minutes of work at the measured step
rate. The same reasons are doctor's `not_resumable` finding; the built-in pipelines have none."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from samai.console.core import config
from samai.console.core.preflight import preflight
from samai.console.core.preflight.resumable import CODE, resumable_checks
from tests import factories
from tests.helpers import run_cli

TRAIN = 'venv/bin/python -m samai_box.stages.train --base b --data d --out runs/train'


def _cfg(command: str, checkpoints: bool = True, extra: str = "") -> config.Config:
    kept = '\ncheckpoints = "runs/train/checkpoints"' if checkpoints else ""
    return config.parse(f"[stages.sft]\nkey = \"t\"\nrole = \"train\"\ncommand = '''{command}'''{kept}\n{extra}",
                        "(test)")


def _said(cfg: config.Config, rate: float | None = None) -> list[tuple[str, str]]:
    stage = cfg.stage("sft")
    assert stage is not None
    return resumable_checks(cfg, stage, rate)


@pytest.mark.parametrize("pipeline", config.BUILTIN_PIPELINES)
def test_the_built_in_pipelines_train_resumably(pipeline: str) -> None:
    cfg = config.load_builtin(pipeline)
    assert [said for s in cfg.stages for said in resumable_checks(cfg, s)] == []


def test_a_training_stage_without_checkpoints_or_saving_only_the_model_is_warned_of() -> None:
    [(severity, text)] = _said(_cfg(TRAIN, checkpoints=False))
    assert severity == "warning" and "keeps no checkpoints" in text and "step 0" in text
    for flag in ("--save-only-model", "save_only_model=True"):
        [(severity, text)] = _said(_cfg(f"{TRAIN} {flag}"))
        assert severity == "warning" and "no optimizer, scheduler or RNG state" in text


@given(st.integers(1, 50), st.integers(1, 10), st.integers(1, 30))
@settings(max_examples=200, deadline=None)
def test_a_save_total_limit_the_nan_guards_window_uses_up_is_an_error(steps: int, limit: int, patience: int) -> None:
    said = _said(_cfg(f"{TRAIN} --save-steps {steps} --save-total-limit {limit} --nan-patience {patience}"))
    errors = [text for severity, text in said if severity == "error"]
    assert bool(errors) == (limit * steps <= patience), said
    if errors:
        keep = int(errors[0].split("keep at least ")[1])
        assert keep * steps > patience and (keep - 1) * steps <= patience  # the least that keeps one before it


def test_a_save_interval_that_loses_more_than_max_loss_minutes_is_warned_of_at_the_measured_rate() -> None:
    cfg = _cfg(f"{TRAIN} --save-steps 5000", extra="[train]\nmax_loss_minutes = 20\n")
    assert _said(cfg) == []  # no step rate measured yet: nothing to weigh it by
    [(severity, text)] = _said(cfg, rate=2.0)  # 5000 steps at 2 steps/s: 42 min
    assert severity == "warning" and "more than [train] max_loss_minutes (20 min)" in text
    assert _said(cfg, rate=5.0) == []  # 17 min


def test_the_fire_preflight_blocks_on_the_error_and_shows_the_warnings() -> None:
    cfg = _cfg(f"{TRAIN} --save-steps 1 --save-total-limit 2 --save-only-model")
    stage = cfg.stage("sft")
    assert stage is not None
    checks = preflight(cfg, factories.snapshot(), stage).checks
    said = [(c.severity, c.text) for c in checks if c.text.startswith(CODE)]
    assert [s for s, _ in said] == ["warning", "error"]
    assert preflight(cfg, factories.snapshot(), stage).blocked


@pytest.mark.slow  # the command line
def test_doctor_says_it(tmp_path: Path, workspace: Path) -> None:
    path = tmp_path / "samai.toml"
    path.write_text(f'[workspace]\npath = "{workspace}"\n[stages.sft]\nkey = "t"\nrole = "train"\n'
                    f"command = '''{TRAIN} --save-steps 1 --save-total-limit 1'''\n"
                    'checkpoints = "runs/train/checkpoints"\n')
    done = run_cli("--config", str(path), "doctor", "--json")
    found = [f for f in json.loads(done.stdout)["findings"] if f["code"] == CODE]
    assert done.returncode == 1 and [f["severity"] for f in found] == ["error"], done.stdout
    assert "keep at least 6" in found[0]["message"]
