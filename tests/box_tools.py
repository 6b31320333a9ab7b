"""The box tools laid out as the console installs them (samai.remote.boxtools), for tests that
start a tool or a stage as a process the way the box does."""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import sys
import tempfile
from pathlib import Path

from samai.remote.boxtools import PACKAGE, ToolSet


@functools.cache
def tools_folder() -> Path:
    """One tools folder per test process, with exactly the files an install writes."""
    folder = Path(tempfile.mkdtemp(prefix="samai-tools-"))
    atexit.register(shutil.rmtree, folder, True)
    for name, data in ToolSet.bundled().files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return folder


def tool_argv(module: str, *args: object, python: str = sys.executable) -> list[str]:
    """A box tool as the console starts it: `python -S FOLDER probe ...`."""
    return [python, "-S", str(tools_folder()), module, *map(str, args)]


def stage_argv(module: str, *args: object, python: str = sys.executable) -> list[str]:
    """A stage as a stage command runs it: `python -m samai_box.stages.fetch ...` (see stage_env)."""
    return [python, "-m", f"{PACKAGE}.{module}", *map(str, args)]


def stage_env() -> dict[str, str]:
    """The environment the launcher gives a stage command: the tools folder on PYTHONPATH."""
    return dict(os.environ, PYTHONPATH=str(tools_folder()), SAMAI_TOOLS=str(tools_folder()))
