"""The box tools as one package (samai_box on the box): relative imports only, stages run as
modules by whatever Python a stage command names, the old stage paths still run, one
atomic-write helper."""

from __future__ import annotations

import ast
import hashlib
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest

from samai.remote.box.atomic import write_atomic
from samai.remote.boxapi import Box
from samai.remote.boxtools import PACKAGE, ToolSet, package_files
from tests.box_tools import stage_argv, stage_env, tools_folder

BOX = resources.files("samai.remote.box")


def _imports(name: str) -> list[ast.ImportFrom | ast.Import]:
    tree = ast.parse(BOX.joinpath(name).read_text())
    return [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]


def test_the_tools_import_each_other_only_relatively() -> None:
    """A flat `from procfs import ...` works only with the tools' folder on sys.path: none is left."""
    siblings = {Path(n).stem for n in package_files()}
    for name in package_files():
        for node in _imports(name):
            flat = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if isinstance(node, ast.ImportFrom) and node.level:
                continue
            assert not {m.split(".")[0] for m in flat} & siblings, f"{name}:{node.lineno} imports {flat} flat"
        assert "sys.path.insert(0, os.path.dirname(" not in BOX.joinpath(name).read_text(), name  # its own folder


def test_the_readonly_loader_gets_each_module_a_tool_imports() -> None:
    needed = ToolSet.bundled().needed_by("stages/push.py")
    assert {f"{PACKAGE}/__init__.py", f"{PACKAGE}/stages/__init__.py", f"{PACKAGE}/stages/push.py",
            f"{PACKAGE}/stages/transfer.py", f"{PACKAGE}/atomic.py"} <= set(needed)
    assert f"{PACKAGE}/stages/fetch.py" not in needed  # push shares transfer with fetch, not fetch itself


def test_a_stage_runs_as_a_module_with_any_python(tmp_path: Path) -> None:
    source = tmp_path / "src.bin"
    source.write_bytes(b"x" * 1000)
    out = tmp_path / "dl" / "copy.bin"
    done = subprocess.run(stage_argv("stages.fetch", "file", "--url", source.as_uri(), "--out", out,
                                     "--sha256", hashlib.sha256(source.read_bytes()).hexdigest()),
                          env=stage_env(), cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert out.read_bytes() == source.read_bytes()


def test_a_config_written_the_old_way_still_runs_and_says_what_to_write(tmp_path: Path) -> None:
    source = tmp_path / "src.bin"
    source.write_bytes(b"y" * 10)
    out = tmp_path / "copy.bin"
    old = tools_folder() / "stages" / "fetch.py"  # "$SAMAI_TOOLS/stages/fetch.py"
    done = subprocess.run([sys.executable, str(old), "file", "--url", source.as_uri(), "--out", str(out)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert out.read_bytes() == b"y" * 10
    assert "write `python3 -m samai_box.stages.fetch ...`" in done.stderr


async def test_a_fired_stage_command_finds_the_tools_package(box: Box) -> None:
    command = (f'{sys.executable} -m samai_box.stages.fetch --help > /dev/null'
               ' && test -f "$SAMAI_TOOLS/samai_box/stages/fetch.py"')
    result = await box.fire("pkg", command, "logs/pkg.log", verify_s=30.0)
    assert result.ok and result.state == "done", (result.reason, result.log_tail)


def test_an_atomic_write_that_fails_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    target = tmp_path / "state" / "state.json"
    write_atomic(str(target), "old")

    def broken():
        yield b"half of the new"
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomic(str(target), broken())
    assert target.read_text() == "old"
    assert sorted(p.name for p in target.parent.iterdir()) == ["state.json"]
    write_atomic(str(target), b"new", mode=0o600)
    assert target.read_bytes() == b"new" and target.stat().st_mode & 0o777 == 0o600
