"""Writes stay in the workspace: config that points elsewhere is refused at load, and on the box
every log, rotation, chain, state record, tool and deletion is held inside the workspace after
symlinks, at the moment of use. Real files, real symlinks, real fires."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from samai.console.core import config, paths
from samai.remote.box import confine
from samai.remote.boxapi import Box, BoxError
from samai.remote.local import LocalTransport
from tests.box_tools import tool_argv
from tests.helpers import run_cli, wait_for

STAGE = '[stages.s]\nkey = "z"\ncommand = "echo fired-by-test"\n'


def _config_file(tmp_path: Path, workspace: Path | str, extra: str = "") -> Path:
    f = tmp_path / "samai.toml"
    f.write_text(f'[target]\npython = "{sys.executable}"\n[workspace]\npath = "{workspace}"\n{extra}')
    return f


def _tree(folder: Path) -> dict[str, bytes]:
    """Everything under folder, by relative path (links as their target): to see that nothing changed."""
    out = {}
    for p in sorted(folder.rglob("*")):
        rel = str(p.relative_to(folder))
        out[rel] = ("-> " + os.readlink(p)).encode() if p.is_symlink() else p.read_bytes() if p.is_file() else b"/"
    return out


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder beside the workspace holding a file nobody may touch."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "precious.log").write_text("precious\n")
    return folder


# ------------------------------------------------------------------ refused at load, exit 2


@pytest.mark.slow
@pytest.mark.parametrize("extra, key", [
    (STAGE + 'log = "{outside}/precious.log"\n', "stages.s.log"),
    (STAGE + 'log = "../outside/precious.log"\n', "stages.s.log"),
    (STAGE + 'log = "logs/../../outside/precious.log"\n', "stages.s.log"),
    (STAGE + 'log = "~/x.log"\n', "stages.s.log"),
    (STAGE + 'poison = ["ok", "../outside/precious.log"]\n', "stages.s.poison[1]"),
    ('[artifacts.a]\npath = "{outside}"\n', "artifacts.a.path"),
    ('[artifacts.a]\npath = "../outside"\n', "artifacts.a.path"),
    ('[artifacts.a]\npath = "."\n', "artifacts.a.path"),
    ('[ui]\neval_reports = "../outside/*.log"\n', "ui.eval_reports"),
])
def test_a_path_that_leaves_the_workspace_is_refused_at_load_and_nothing_runs(tmp_path, workspace, outside,
                                                                               extra, key):
    f = _config_file(tmp_path, workspace, extra.format(outside=outside))
    before = _tree(outside)
    r = run_cli("--config", str(f), "fire", "s", "--yes")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and r.stderr.startswith(f"samai-console: {f}: {key}: expected a path inside "
                                                              "the workspace"), r.stderr
    assert _tree(outside) == before and not (workspace / ".samai").exists()


@pytest.mark.slow
@pytest.mark.parametrize("where", ["/", "/home", "/usr", "/usr/local/samai", "/etc", "/etc/samai", "/var", "/tmp",
                                   "/proc", "/root", "~", "/home/someone"])
def test_a_system_or_home_folder_is_no_workspace(tmp_path, where):
    f = _config_file(tmp_path, where)
    with pytest.raises(config.ConfigError) as err:
        config.load(f)
    assert str(err.value).startswith(f"{f}: workspace.path: expected a folder of its own for the pipeline, not ")
    r = run_cli("--config", str(f), "snapshot")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "workspace.path" in r.stderr


@pytest.mark.parametrize("where", ["/", "~", ".", "..", "../other", "~other/ws", "/etc/samai", "/home"])
def test_a_box_workspace_that_is_a_system_or_home_folder_is_refused(tmp_path, where):
    f = tmp_path / "remote.toml"
    f.write_text(f'[target]\nurl = "ssh://op@gpu-box"\n[workspace]\npath = "{where}"\n')
    with pytest.raises(config.ConfigError, match=r"workspace\.path: expected a folder of its own"):
        config.load(f)


def test_the_console_s_own_folders_are_no_workspace(tmp_path):
    own = paths.state_dir()
    own.mkdir(parents=True, exist_ok=True)
    for where in (own, own / "ws", paths.config_dir(), paths.data_dir(), paths.data_dir().parent,
                  paths.workspaces_dir(), tmp_path):
        with pytest.raises(config.ConfigError, match="the console's own files"):
            config.load(_config_file(tmp_path, where))
    assert config.load(_config_file(tmp_path, paths.default_workspace("mine"))).workspace.endswith("workspaces/mine")


def test_a_symlink_to_the_console_s_state_is_no_workspace(tmp_path):
    paths.state_dir().mkdir(parents=True)
    (tmp_path / "innocent").symlink_to(paths.state_dir().parent)
    with pytest.raises(config.ConfigError, match="holds the console's own files"):
        config.load(_config_file(tmp_path, tmp_path / "innocent"))


# ------------------------------------------------------------------ held on the box, at the moment of use


async def test_a_log_outside_the_workspace_is_refused_by_the_box_itself(box: Box, workspace, outside):
    """The second line: a Box asked directly (config bypassed) rotates and writes nothing outside."""
    before = _tree(outside)
    for log in (str(outside / "precious.log"), "../outside/precious.log", "~/samai-test-x.log"):
        fired = await box.fire("s", "echo fired-by-test", log, verify_s=0.5)
        assert not fired.ok and fired.state == "refused", fired.reason
        assert "outside the workspace" in fired.reason or "not a path inside" in fired.reason, fired.reason
    assert _tree(outside) == before
    assert not (Path.home() / "samai-test-x.log").exists()


async def test_a_log_folder_that_is_a_symlink_out_is_refused(box: Box, workspace, outside):
    (workspace / "logs").symlink_to(outside)
    before = _tree(outside)
    fired = await box.fire("s", "echo fired-by-test", "logs/precious.log", verify_s=0.5)
    assert fired.state == "refused" and "logs is a symlink or not a folder" in fired.reason, fired.reason
    fired = await box.fire("s", "echo fired-by-test", "logs/new.log", verify_s=0.5)
    assert fired.state == "refused"
    assert _tree(outside) == before


async def test_a_log_that_is_a_symlink_out_is_neither_rotated_nor_written(box: Box, workspace, outside):
    (workspace / "logs").mkdir()
    (workspace / "logs" / "s.log").symlink_to(outside / "precious.log")
    (workspace / "logs" / "s.log.1").symlink_to(outside / "old.log")
    before = _tree(outside)
    fired = await box.fire("s", "echo fired-by-test", "logs/s.log", verify_s=0.5)
    assert fired.state == "refused" and "s.log is a symlink" in fired.reason, fired.reason
    assert _tree(outside) == before


async def test_a_log_that_is_a_fifo_is_refused_at_once(box: Box, workspace):
    (workspace / "logs").mkdir()
    os.mkfifo(workspace / "logs" / "s.log")
    fired = await box.fire("s", "echo fired-by-test", "logs/s.log", verify_s=0.5)  # an open() would block
    assert fired.state == "refused" and "s.log" in fired.reason


async def test_a_samai_folder_that_is_a_symlink_out_takes_neither_tools_nor_state(tmp_path, workspace, outside):
    (workspace / ".samai").symlink_to(outside)
    before = _tree(outside)
    box = Box(LocalTransport(), str(workspace), python=sys.executable)
    try:
        with pytest.raises(BoxError, match=r"\.samai is a symlink or not a folder"):
            await box.snapshot()  # the tools' install is refused
    finally:
        await box.close()
    assert _tree(outside) == before


@pytest.mark.slow
def test_the_cli_fire_through_a_swapped_log_folder_is_refused_in_one_line(tmp_path, workspace, outside):
    f = _config_file(tmp_path, workspace, STAGE + 'log = "logs/s.log"\n')
    (workspace / "logs").symlink_to(outside)
    before = _tree(outside)
    r = run_cli("--config", str(f), "fire", "s", "--yes")
    assert r.returncode == 1 and "logs is a symlink or not a folder: refused" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert _tree(outside) == before
    (workspace / "logs").unlink()  # the same fire, once the link is gone, runs and logs in the workspace
    r = run_cli("--config", str(f), "fire", "s", "--yes")
    assert r.returncode == 0, r.stderr
    assert _tree(outside) == before


def test_a_folder_swapped_for_a_symlink_after_the_check_still_gets_the_write(tmp_path, workspace, outside):
    """Check, swap, use: the folder held by its descriptor is written, never the link's target."""
    (workspace / "logs").mkdir()
    folder, name = confine.open_parent(str(workspace), "logs/s.log")
    try:
        (workspace / "logs").rename(workspace / "logs-moved")
        (workspace / "logs").symlink_to(outside)  # the swap an attacker makes between check and use
        confine.rotate(folder, name)
        fd = confine.open_append(folder, name)
        os.write(fd, b"line\n")
        os.close(fd)
        confine.write_file(folder, "record.json", b"{}")
    finally:
        os.close(folder)
    assert (workspace / "logs-moved" / "s.log").read_bytes() == b"line\n"
    assert (workspace / "logs-moved" / "record.json").exists()
    assert sorted(p.name for p in outside.iterdir()) == ["precious.log"]


@pytest.mark.slow
async def test_a_state_folder_swapped_while_the_stage_runs_keeps_its_pid_and_rc(box: Box, workspace, outside):
    fired = await box.fire("s", "sleep 1.5", "logs/s.log", verify_s=0.3)
    assert fired.state == "running", fired.reason
    state = workspace / ".samai" / "state"
    state.rename(workspace / ".samai" / "state-moved")
    state.symlink_to(outside)  # the chain writes its rc when it ends: after this swap
    moved = workspace / ".samai" / "state-moved"
    wait_for(lambda: (moved / "s.rc").exists() and (moved / "s.rc").read_text().strip() == "0", timeout=20)
    assert (moved / "s.pid").read_text().strip() == str(fired.pid)
    assert sorted(p.name for p in outside.iterdir()) == ["precious.log"]


async def test_clean_in_a_system_folder_is_refused_by_the_box(tmp_path):
    box = Box(LocalTransport(), "/", python=sys.executable)
    try:
        with pytest.raises(BoxError, match="workspace / is a system or shared folder: refused"):
            await box.remove(["samai-test-no-such-entry"])  # not even its tools are installed there
    finally:
        await box.close()
    for workspace in ("/", "/etc", "~"):  # and the clean tool on its own, as a second line
        request = json.dumps({"workspace": workspace, "paths": ["samai-test-no-such-entry"]})
        done = subprocess.run(tool_argv("clean"), input=request, capture_output=True, text=True,
                              timeout=30)
        reply = json.loads(done.stdout)
        assert not reply["missing"] and not reply["removed"], reply
        assert "folder: refused" in reply["refused"][0]["reason"]
