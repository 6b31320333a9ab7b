"""`gguf ... --smoke`: the pipeline's serve stage pointed at the new GGUF on a free port, ending
after its smoke answer (the run with the real llama-server is in test_pipeline.py)."""

from __future__ import annotations

import shlex
from dataclasses import replace

import pytest

from samai.console.core import config
from samai.console.core.serving.smoke import SMOKE_STAGE, smoke_config


@pytest.mark.parametrize("pipeline", ["tiny", "samai-8b"])
def test_the_smoke_stage_is_the_serve_stage_on_the_new_file(pipeline: str) -> None:
    cfg = config.load_builtin(pipeline)
    stage = smoke_config(cfg, "gguf/it's new.gguf").stage(SMOKE_STAGE)
    argv = shlex.split(stage.command)
    serve = shlex.split(cfg.stage("serve").command)
    assert argv[argv.index("--model") + 1] == "gguf/it's new.gguf" and argv[argv.index("--port") + 1] == "0"
    assert argv[-1] == "--smoke-only" and argv[:3] == serve[:3]
    assert "--reasoning-format" not in serve or argv[argv.index("--reasoning-format") + 1] == \
        serve[serve.index("--reasoning-format") + 1]
    assert stage.ports == () and stage.markers == cfg.stage("serve").markers


def test_a_pipeline_without_a_serve_stage_cannot_smoke() -> None:
    cfg = config.load_builtin("tiny")
    with pytest.raises(ValueError, match="no serve stage"):
        smoke_config(replace(cfg, stages=tuple(s for s in cfg.stages if s.name != "serve")), "x.gguf")
    bare = replace(cfg, stages=tuple(replace(s, command="llama-server -m x") if s.name == "serve" else s
                                     for s in cfg.stages))
    with pytest.raises(ValueError, match="no --model"):
        smoke_config(bare, "x.gguf")
