"""The serve stage asks llama-server's own --help which monitoring flags it takes (builds differ)
and says in its log what it enabled. The real build's answer is checked in the tiny pipeline's
test; these are the other builds' --help shapes, as executables that print them."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from samai.remote.box.stages.serve import monitoring

NEWER = """\
--metrics                               enable prometheus compatible metrics endpoint (default: disabled)
                                        (env: LLAMA_ARG_ENDPOINT_METRICS)
--slots, --no-slots                     expose slots monitoring endpoint (default: enabled)
"""
OLDER = """\
  --metrics                enable prometheus compatible metrics endpoint (default: disabled)
  --slots                  enable slots monitoring endpoint (default: disabled)
"""
OLDEST = """\
  --metrics                 enable prometheus compatible metrics endpoint (default: disabled)
  --slots-endpoint-disable  disables slots monitoring endpoint.
"""
NONE = """\
  -m,    --model FNAME       model path
  --no-metrics-here          an option whose name only starts like one
  --slots-dir DIR            not the slots flag either
"""


def _server(tmp_path: Path, help_text: str, rc: int = 0) -> str:
    path = tmp_path / "llama-server"
    (tmp_path / "help.txt").write_text(help_text)
    path.write_text(f"#!/bin/sh\ncat '{tmp_path / 'help.txt'}' >&2\nexit {rc}\n")  # some builds print to stderr
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


@pytest.mark.parametrize(("help_text", "flags", "said"), [
    (NEWER, ["--metrics"], "/metrics (--metrics), /slots (on by default)"),
    (OLDER, ["--metrics", "--slots"], "/metrics (--metrics), /slots (--slots)"),
    (OLDEST, ["--metrics"], "/metrics (--metrics), /slots (on by default)"),
    (NONE, [], "no /metrics in this build's --help, no /slots in this build's --help"),
])
def test_the_flags_come_from_the_build_s_own_help(tmp_path: Path, help_text: str, flags: list[str],
                                                   said: str) -> None:
    assert monitoring(_server(tmp_path, help_text)) == (flags, said)


def test_a_help_that_fails_still_names_what_it_offers(tmp_path: Path) -> None:
    assert monitoring(_server(tmp_path, OLDER, rc=1))[0] == ["--metrics", "--slots"]


def test_a_server_that_cannot_be_asked_serves_without_them(tmp_path: Path) -> None:
    flags, said = monitoring(str(tmp_path / "missing"))
    assert flags == [] and "did not answer" in said and "/metrics stays off" in said
    assert monitoring(None) == ([], "none: llama_cpp.server has no /metrics or /slots")
    assert not os.path.exists(tmp_path / "missing")


def test_vllm_is_served_by_its_own_server_or_refused_where_it_is_not_installed(tmp_path: Path) -> None:
    """`--engine vllm`: vLLM's OpenAI server with the stage's port and context; where vLLM is not
    installed (this machine, a CPU box) the stage refuses and says how to get it."""
    import argparse
    import subprocess

    from samai.remote.box.stages.serve import server_command
    from tests.box_tools import stage_argv, stage_env

    args = argparse.Namespace(engine="vllm", model="models/merged", host="127.0.0.1", port=18080, ctx=4096,
                              llama_server=None)
    assert server_command(args) == [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", "models/merged",
        "--host", "127.0.0.1", "--port", "18080", "--max-model-len", "4096"]
    done = subprocess.run(stage_argv("stages.serve", "--engine", "vllm", "--model", "models/merged", "--port", 18080),
                          env=stage_env(), cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "SERVE_REFUSED --engine vllm: vLLM is not installed" in done.stdout, done
    assert "pip install vllm" in done.stdout
