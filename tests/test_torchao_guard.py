"""§9: torchao installed beside peft in the training environment (peft's LoRA dispatch imports
torchao when it is installed and raises ImportError on a version it does not support).

A real venv on this machine with real wheels installed by pip (offline, --no-index): `doctor`
finds the pair, the fix through the action layer really uninstalls torchao with that venv's
pip, and a read-only console refuses it. The site-packages reader is fuzzed."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from samai.console.core import config
from samai.console.core.actions import Actions, Decision
from samai.console.core.audit import AuditLog
from samai.console.core.detectors import peft_pythons
from samai.remote import model
from samai.remote.box import packages
from samai.remote.boxapi import Box, BoxError
from samai.remote.local import LocalTransport
from tests.helpers import confirm_dialog, run_cli, wait_for

FUZZ = settings(max_examples=150, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])

PIPELINE = """
[workspace]
path = "{ws}"
[stages.train]
key = "3"
command = 'venv/bin/python -m samai_box.stages.train --base models/base --out runs/train'
[stages.merge]
key = "4"
command = 'venv/bin/python -m samai_box.stages.merge --base models/base --train-dir runs/train'
[stages.eval]
key = "8"
command = 'python3 -m samai_box.stages.eval --url http://127.0.0.1:1 --data data/eval.jsonl'
"""


def _wheel(folder: Path, name: str, version: str) -> Path:
    """A tiny real wheel: one module and its dist-info (METADATA, WHEEL, RECORD with hashes)."""
    files = {f"{name}/__init__.py": f"__version__ = {version!r}\n".encode(),
             f"{name}-{version}.dist-info/METADATA":
                 f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\nA stand-in.\n".encode(),
             f"{name}-{version}.dist-info/WHEEL":
                 b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{path},sha256={_digest(data)},{len(data)}\n" for path, data in files.items())
    files[f"{name}-{version}.dist-info/RECORD"] = (record + f"{name}-{version}.dist-info/RECORD,,\n").encode()
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as whl:
        for member, data in files.items():
            whl.writestr(member, data)
    return path


def _digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _venv(ws: Path, *, pip: bool) -> Path:
    args = [] if pip else ["--without-pip"]
    subprocess.run([sys.executable, "-m", "venv", *args, str(ws / "venv")], check=True, timeout=120)
    return ws / "venv"


def _site(venv: Path) -> Path:
    return next(venv.glob("lib/python3*/site-packages"))


def _fake_dist(site: Path, folder: str, metadata: str | None) -> None:
    """A dist-info folder as an installer writes it (METADATA only: all the reader looks at)."""
    (site / folder).mkdir()
    if metadata is not None:
        (site / folder / "METADATA").write_text(metadata)


def _config(tmp_path: Path, ws: Path) -> Path:
    f = tmp_path / "guard.toml"
    f.write_text(PIPELINE.format(ws=ws))
    return f


def _doctor(cfg: Path, *extra: str) -> tuple[int, list[dict]]:
    r = run_cli("--config", str(cfg), *extra, "doctor", "--json", timeout=120)
    assert r.stdout, r.stderr
    return r.returncode, json.loads(r.stdout)["findings"]


def _guard(findings: list[dict]) -> list[dict]:
    return [f for f in findings if f["code"] == "torchao_beside_peft"]


@pytest.mark.slow
async def test_doctor_finds_torchao_beside_peft_and_the_fix_uninstalls_it(tmp_path, workspace) -> None:
    venv = _venv(workspace, pip=True)
    wheels = [_wheel(tmp_path, "peft", "0.19.1"), _wheel(tmp_path, "torchao", "0.10.0")]
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--no-index", "--no-deps",
                    "--disable-pip-version-check", *map(str, wheels)], check=True, timeout=300,
                   capture_output=True)
    cfg_file = _config(tmp_path, workspace)

    rc, findings = _doctor(cfg_file)
    [found] = _guard(findings)
    assert rc == 1 and found["severity"] == "error"
    assert "torchao 0.10.0 is installed beside peft 0.19.1 in venv/bin/python (stage train, merge)" \
        in found["message"] and "ImportError" in found["message"]
    assert found["action"] == "uninstall torchao venv/bin/python"
    assert _guard(_doctor(cfg_file, "--readonly")[1]) == [found]  # reading changes nothing: read-only sees it

    cfg = config.load(cfg_file)
    audit = AuditLog(tmp_path / "audit.jsonl")
    shown = []

    async def operator(plan):
        shown.append(plan)
        return Decision.confirmed(plan, "test")

    readonly_box = Box(LocalTransport(), str(workspace), python=sys.executable, readonly=True)
    try:
        refused = await Actions(readonly_box, cfg, audit, readonly=True, confirm=operator).uninstall(
            "venv/bin/python", "torchao")
    finally:
        await readonly_box.close()
    assert (refused.ok, refused.status, shown) == (False, "refused", [])
    assert "read-only" in refused.message and (_site(venv) / "torchao").is_dir()

    box = Box(LocalTransport(), str(workspace), python=sys.executable)
    try:
        outcome = await Actions(box, cfg, audit, readonly=False, confirm=operator).uninstall(
            "venv/bin/python", "torchao")
    finally:
        await box.close()
    assert outcome.ok, outcome.message
    [plan] = shown  # the operator was shown the exact command and where it runs
    assert plan.command == "venv/bin/python -m pip uninstall -y torchao" and plan.target == "local"
    assert "used by stage train, merge" in plan.details and not plan.blocked
    rc_file = workspace / ".samai" / "state" / "uninstall-torchao.rc"
    wait_for(rc_file.exists, timeout=120)
    assert rc_file.read_text().strip() == "0", (workspace / "logs" / "uninstall-torchao.log").read_text()
    assert not list(_site(venv).glob("torchao*")) and (_site(venv) / "peft").is_dir()
    imported = subprocess.run([str(venv / "bin" / "python"), "-c", "import torchao"], capture_output=True)
    assert imported.returncode != 0
    lines = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert [(e["phase"], e["action"], e.get("result")) for e in lines] == [("intent", "uninstall", None),
                                                                           ("outcome", "uninstall", "done")]
    assert lines[0]["command"] == plan.command
    assert _guard(_doctor(cfg_file)[1]) == []


@pytest.mark.slow
async def test_a_running_stage_of_that_environment_blocks_the_uninstall(tmp_path, workspace) -> None:
    _venv(workspace, pip=False)
    cfg_file = tmp_path / "running.toml"
    cfg_file.write_text(f'[workspace]\npath = "{workspace}"\n[stages.train]\nkey = "3"\n'
                        "command = 'venv/bin/python -c \"import time; time.sleep(60)\"'\n")
    cfg = config.load(cfg_file)
    assert peft_pythons(cfg) == {"venv/bin/python": ("train",)}  # a train stage's python, whatever it runs
    shown = []

    async def operator(plan):
        shown.append(plan)
        return Decision.confirmed(plan, "test")

    box = Box(LocalTransport(), str(workspace), python=sys.executable)
    try:
        actions = Actions(box, cfg, AuditLog(tmp_path / "audit.jsonl"), readonly=False, confirm=operator)
        assert (await actions.fire("train")).ok
        outcome = await actions.uninstall("venv/bin/python", "torchao")
    finally:
        await box.close()
    assert outcome.status == "refused" and "preflight blocks it" in outcome.message
    assert [c.text for c in shown[-1].checks] == ["stage train is running from venv/bin/python: stop it first"]
    assert not (workspace / ".samai" / "state" / "uninstall-torchao.json").exists()
    with pytest.raises(ValueError):
        await actions.plan_uninstall("venv/bin/python", "torchao; rm -rf /")


async def test_what_the_reader_takes_from_site_packages(tmp_path, workspace, box) -> None:
    """Names compared as pip compares them, METADATA before the folder name, egg-info too;
    unreadable metadata and a FIFO in its place cost nothing but the folder name's version."""
    venv = _venv(workspace, pip=False)
    site = _site(venv)
    _fake_dist(site, "peft-0.19.1.dist-info", "Metadata-Version: 2.1\nName: PEFT\nVersion: 0.19.1\n\nName: x\n")
    _fake_dist(site, "torchao-0.10.0.dist-info", None)  # no METADATA: the folder name says it
    os.mkfifo(site / "torchao-0.10.0.dist-info" / "METADATA")
    _fake_dist(site, "typing_extensions-4.12.2.dist-info", "Name: typing_extensions\nVersion: 4.12.2\n")
    (site / "other-1.0-py3.11.egg-info").write_text("Metadata-Version: 1.1\nName: other\nVersion: 1.0\n")
    cfg = config.load(_config(tmp_path, workspace))

    [env] = await box.python_packages(["venv/bin/python"], ("peft", "torchao", "Typing.Extensions", "other"))
    assert {(d.name, d.version) for d in env.found} == {("PEFT", "0.19.1"), ("torchao", "0.10.0"),
                                                         ("typing_extensions", "4.12.2"), ("other", "1.0")}
    assert env.get("Peft").version == "0.19.1" and env.get("typing-extensions") is not None and env.complete
    [everything] = await box.python_packages(["venv/bin/python"])
    assert len(everything.found) == 4
    [missing] = await box.python_packages(["nowhere/bin/python"], ("peft",))
    assert missing.found == () and "does not exist" in (missing.error or "")
    from samai.console.core.detectors import torchao_beside_peft

    assert [f.code for f in torchao_beside_peft(cfg, [env, missing])] == ["torchao_beside_peft"]
    (site / "peft-0.19.1.dist-info" / "METADATA").unlink()
    (site / "peft-0.19.1.dist-info").rmdir()
    [env] = await box.python_packages(["venv/bin/python"], ("peft", "torchao"))
    assert torchao_beside_peft(cfg, [env]) == []  # torchao alone is no trap


def test_the_stage_pythons_that_run_peft(tmp_path, workspace) -> None:
    cfg_file = tmp_path / "p.toml"
    cfg_file.write_text(f'[workspace]\npath = "{workspace}"\n'
                        "[stages.tune]\nkey = \"1\"\ncommand = 'echo go && /opt/env/bin/python3.11 "
                        "\"$SAMAI_TOOLS/stages/train.py\" --x 1'\n"
                        "[stages.fetch]\nkey = \"2\"\ncommand = 'venv/bin/python -m samai_box.stages.pretrain "
                        "&& python3 -m samai_box.stages.fetch x'\n"
                        "[stages.broken]\nkey = \"3\"\ncommand = 'venv/bin/python -m samai_box.stages.merge \"'\n")
    assert peft_pythons(config.load(cfg_file)) == {"/opt/env/bin/python3.11": ("tune",)}
    root = Path(__file__).resolve().parent.parent / "console" / "pipelines"
    for name in ("tiny.toml", "samai-8b.toml"):
        assert peft_pythons(config.load(root / name)) == {"venv/bin/python": ("train", "merge")}


# ---------------------------------------------------------------- fuzzed


@FUZZ
@given(st.binary(max_size=3000))
def test_any_metadata_bytes_give_text_or_none(data: bytes) -> None:
    for value in packages.header_fields(data):
        assert value is None or (isinstance(value, str) and len(value) <= packages.MAX_TEXT)


NAME = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,30}", fullmatch=True)
VERSION = st.from_regex(r"[0-9][0-9a-z.+!]{0,20}", fullmatch=True)


@pytest.mark.slow
@FUZZ
@given(NAME, VERSION, st.lists(st.sampled_from(["Summary: x", "Author: a:b", "no colon", "License: MIT"])),
       st.sampled_from(["\n", "\r\n"]), st.binary(max_size=200))
def test_a_metadata_header_gives_its_name_and_version(name, version, others, eol, body) -> None:
    head = eol.join(["Metadata-Version: 2.1", *others, f"Name: {name}", f"Version:  {version} ", "Name: not-this"])
    assert packages.header_fields(head.encode() + eol.encode() * 2 + body) == (name, version)
    assert packages.folder_fields(f"{name.replace('-', '_')}-{version.replace('-', '_')}.dist-info")[0] is not None


@FUZZ
@given(st.text(max_size=80))
def test_any_folder_name_gives_text_or_none(entry: str) -> None:
    name, version = packages.folder_fields(entry)
    assert (name is None) == (version is None)
    if name is not None:
        assert entry.endswith("-info") and name and version and "-" not in version


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                    max_leaves=12)
ENV = st.fixed_dictionaries({}, optional={"python": JSON | st.text(max_size=10), "prefix": JSON, "site": JSON,
                                          "complete": JSON, "error": JSON,
                                          "found": st.lists(st.fixed_dictionaries(
                                              {}, optional={"name": JSON, "version": JSON, "path": JSON}))
                                          | JSON})


@pytest.mark.slow
@FUZZ
@given(st.fixed_dictionaries({}, optional={"packages": st.lists(ENV | JSON, max_size=3) | JSON}))
def test_any_packages_reply_converts_or_is_a_box_error(raw: dict) -> None:
    try:
        envs = model.python_packages(raw)
    except BoxError:
        return
    for env in envs:
        assert isinstance(env.python, str) and all(isinstance(d.name, str) for d in env.found)
        env.get("peft")


@FUZZ
@given(JSON)
def test_any_packages_request_is_checked_or_a_value_error(specs) -> None:
    try:
        packages.check_request(specs)
    except ValueError:
        return
    assert isinstance(specs, list)


def test_a_malformed_packages_request_is_an_error_reply_naming_it(workspace) -> None:
    from samai.remote.box import probe

    def answer(request: dict) -> dict:
        return json.loads(probe.answer(json.dumps({**request, "processes": False, "states": False})))

    assert "request.packages[0].python must be a path" in answer({"packages": [{"python": 3}]})["error"]
    assert "request.packages must be a list" in answer({"packages": {"python": "x"}})["error"]
    too_many = [{"python": "venv/bin/python"}] * (packages.MAX_ENVIRONMENTS + 1)
    assert "more than" in answer({"packages": too_many})["error"]
    names = answer({"workspace": str(workspace), "packages": [{"python": "venv/bin/python", "names": ["peft"]}]})
    assert names["packages"][0]["error"].endswith("venv/bin/python does not exist")


@pytest.mark.slow
@pytest.mark.timeout(300)  # a venv with pip, two wheels installed, then the TUI
async def test_the_tui_raises_it_and_x_uninstalls_through_the_confirmation(tmp_path, workspace) -> None:
    """At connect the console reads the training environments; torchao beside peft is an alert whose
    fix (x) shows the exact pip command, removes torchao once confirmed, and the alert resolves."""
    from samai.console.app import SamaiApp
    from samai.console.screens.dialogs import ConfirmDialog
    from tests.helpers import pilot_until

    venv = _venv(workspace, pip=True)
    wheels = [_wheel(tmp_path, "peft", "0.19.1"), _wheel(tmp_path, "torchao", "0.10.0")]
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--no-index", "--no-deps",
                    "--disable-pip-version-check", *map(str, wheels)], check=True, timeout=300,
                   capture_output=True)
    app = SamaiApp(config.load(_config(tmp_path, workspace)))
    async with app.run_test(size=(140, 45)) as pilot:
        alert = await pilot_until(pilot, lambda: next((a for a in app.state.alerts
                                                      if a.code == "torchao_beside_peft"), None), 60)
        assert alert.active and "x fix" in alert.hint
        await pilot.press("x")
        dialog = await pilot_until(pilot, lambda: isinstance(app.screen, ConfirmDialog) and app.focused and app.screen)
        shown = " ".join(str(w.render()) for w in dialog.query("Static"))
        assert "venv/bin/python -m pip uninstall -y torchao" in shown and app.focused.id == "cancel"
        await confirm_dialog(pilot)
        await pilot_until(pilot, lambda: not any(a.active for a in app.state.alerts if a.code == "torchao_beside_peft"),
                          120)  # resolved: the environment read again after the uninstall
    assert not list(_site(venv).glob("torchao*")) and list(_site(venv).glob("peft*"))
