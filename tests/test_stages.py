"""Static promises of the box tools and stage scripts (the end-to-end runs are in test_pipeline)."""

from __future__ import annotations

import ast
import sys
import tomllib
from importlib import resources
from pathlib import Path

import pytest

from samai.remote.box.stages import provision
from samai.remote.boxapi import tool_names
from tests.box_tools import stage_argv, stage_env

ROOT = Path(__file__).resolve().parent.parent


def test_every_tool_and_stage_parses_as_python_3_8() -> None:
    folder = resources.files("samai.remote.box")
    for name in tool_names():
        ast.parse(folder.joinpath(name).read_text(), filename=name, feature_version=(3, 8))


def test_the_stages_run_by_the_system_python_need_only_the_standard_library() -> None:
    """provision, fetch, push and eval run before or without the box venv (with the modules they import)."""
    stdlib_stages = ("provision", "fetch", "push", "eval", "common", "images", "locks", "transfer", "archives")
    allowed = set(sys.stdlib_module_names) | {"procfs", "probe", "kill", "gguf_check", "atomic", "confine",
                                              *stdlib_stages}
    folder = resources.files("samai.remote.box").joinpath("stages")
    for name in (f"{stage}.py" for stage in stdlib_stages):
        tree = ast.parse(folder.joinpath(name).read_text())
        for node in tree.body:  # top-level imports only: the hub client is imported where used
            if isinstance(node, ast.Import):
                roots = {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                roots = {(node.module or "").split(".")[0]}
            else:
                continue
            assert roots <= allowed, f"{name} imports {roots - allowed} at the top"


def test_provision_installs_exactly_the_box_extra() -> None:
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["box"]
    assert sorted(extra) == sorted(provision.BOX_PACKAGES)


def test_the_tools_are_uploaded_with_their_stages() -> None:
    names = tool_names()
    assert {"probe.py", "gguf_check.py", "stages/train.py", "stages/fetch.py", "stages/common.py"} <= set(names)
    assert not any(n.endswith("__init__.py") for n in names)


@pytest.mark.slow
def test_serve_never_signals_a_port_holder_itself(tmp_path: Path, spawn) -> None:
    """Only the console's confirmed, audited fire plan stops a listener: the stage refuses a held port."""
    import socket
    import subprocess

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    holder = spawn(sys.executable, "-c", "import socket,time\ns=socket.socket()\n"
                   f"s.bind(('127.0.0.1',{port}))\ns.listen()\nprint('ready',flush=True)\ntime.sleep(60)",
                   stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "ready\n"
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    for extra in ((), ("--stop-listeners",)):
        run = subprocess.run(stage_argv("stages.serve", "--model", "m.gguf", "--port", port, *extra),
                             cwd=tmp_path, capture_output=True, text=True, timeout=60, env=stage_env())
        assert run.returncode != 0 and holder.poll() is None, run.stdout + run.stderr
    assert "PORT_BUSY" in subprocess.run(stage_argv("stages.serve", "--model", "m.gguf", "--port", port),
                                         cwd=tmp_path, capture_output=True, text=True, timeout=60,
                                         env=stage_env()).stdout


@pytest.mark.parametrize(("value", "threads"), [("3", 3), ("1", 1), ("0", 1), ("", None), ("many", None), (None, None)])
def test_torch_computes_on_omp_num_threads_where_it_is_set(monkeypatch: pytest.MonkeyPatch, value, threads) -> None:
    """A box that shares its cores says so with OMP_NUM_THREADS; unset or not a number: every core."""
    import os

    from samai.remote.box.stages.common import cpu_threads

    if value is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", value)
    assert cpu_threads() == (threads if threads is not None else max(1, os.cpu_count() or 1))
