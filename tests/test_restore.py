"""The restore stage (§4.5): what push shipped comes back verified against push's own manifest,
and nothing the store says can put a file outside the workspace."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from samai.remote.box.stages import restore
from samai.remote.box.stages.transfer import FetchError
from tests.box_tools import stage_argv, stage_env
from tests.helpers import run_cli


def _run(module: str, cwd: Path, *args: object) -> subprocess.CompletedProcess:
    return subprocess.run(stage_argv(module, *args), env=stage_env(), cwd=cwd, capture_output=True, text=True,
                          timeout=120)


@pytest.fixture
def pushed(tmp_path: Path) -> Path:
    """A store written by the real push stage: a GGUF-sized file and a report folder, with the manifest."""
    built = tmp_path / "built"
    (built / "gguf").mkdir(parents=True)
    (built / "gguf" / "m.gguf").write_bytes(os.urandom(300_000))
    (built / "runs" / "eval" / "r1").mkdir(parents=True)
    (built / "runs" / "eval" / "r1" / "summary.json").write_text('{"n": 1, "accuracy": 1.0}')
    store = tmp_path / "store"
    done = _run("stages.push", built, "--to", f"dir:{store}", "--stable", "0.1", "gguf/m.gguf", "runs/eval/r1")
    assert done.returncode == 0 and "PUSH_DONE" in done.stdout, done.stdout + done.stderr
    return store


@pytest.mark.slow
def test_pushed_artifacts_come_back_verified_into_a_wiped_workspace(tmp_path, pushed) -> None:
    ws = tmp_path / "rebuilt"
    ws.mkdir()
    done = _run("stages.restore", ws, "--from", f"dir:{pushed}", "--satisfies", "train,quantize",
                "gguf/m.gguf", "runs/eval/r1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (ws / "gguf" / "m.gguf").read_bytes() == (tmp_path / "built" / "gguf" / "m.gguf").read_bytes()
    assert (ws / "runs" / "eval" / "r1" / "summary.json").is_file()
    last = done.stdout.splitlines()[-1]
    assert last.startswith("RESTORE_DONE 2 files") and last.endswith("satisfies train, quantize")
    again = _run("stages.restore", ws, "--from", f"dir:{pushed}", "gguf/m.gguf")
    assert again.returncode == 0 and "(already present)" in again.stdout


def test_a_file_that_differs_from_the_manifest_is_refused_and_kept_aside(tmp_path, pushed) -> None:
    (pushed / "gguf" / "m.gguf").write_bytes(b"x" * 300_000)  # changed in the store after the push
    ws = tmp_path / "rebuilt"
    ws.mkdir()
    done = _run("stages.restore", ws, "--from", f"dir:{pushed}", "gguf/m.gguf")
    assert done.returncode == 1 and done.stdout.splitlines()[-1].startswith("SHA_MISMATCH gguf/m.gguf expected")
    assert not (ws / "gguf" / "m.gguf").exists() and (ws / "gguf" / "m.gguf.bad").exists()


def test_an_artifact_never_pushed_is_said_and_nothing_is_written(tmp_path, pushed) -> None:
    ws = tmp_path / "rebuilt"
    ws.mkdir()
    done = _run("stages.restore", ws, "--from", f"dir:{pushed}", "gguf/other.gguf")
    assert done.returncode == 1 and done.stdout.startswith("RESTORE_MISSING gguf/other.gguf is not in the manifest")
    assert list(ws.iterdir()) == []


def test_a_manifest_naming_a_path_outside_is_refused(tmp_path, pushed) -> None:
    digest = hashlib.sha256(b"evil").hexdigest()
    (pushed / "MANIFEST.sha256").write_text(f"{digest}  ../escaped\n")
    ws = tmp_path / "rebuilt"
    ws.mkdir()
    done = _run("stages.restore", ws, "--from", f"dir:{pushed}", "..")
    assert done.returncode == 1 and done.stdout.startswith("RESTORE_FAIL refusing path '../escaped'")
    assert not (tmp_path / "escaped").exists() and list(ws.iterdir()) == []


def test_an_hf_store_reads_the_hubs_resolve_urls(monkeypatch) -> None:
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9/")
    assert restore.store_base("hf:samai/samai-8b-gguf", "main") == "http://127.0.0.1:9/samai/samai-8b-gguf/resolve/main/"
    with pytest.raises(FetchError, match="expected dir:/some/path, hf:owner/repo"):
        restore.store_base("hf:not a repo", "main")


@settings(max_examples=300, deadline=None, database=None)
@given(st.text(max_size=400))
def test_any_manifest_text_is_read_or_refused_and_never_leaves_the_folder(text: str) -> None:
    try:
        entries = restore.manifest_of(text)
    except FetchError:
        return
    for path, digest in entries.items():
        assert not path.startswith("/") and ".." not in path.split("/") and len(digest) == 64


RESTORABLE = """
[workspace]
path = "{ws}"
[artifacts.base]
path = "models/base"
size_gb = 0.01
[artifacts.adapter]
path = "runs/train/final"
size_gb = 0.01
[artifacts.gguf_q]
path = "gguf/m.gguf"
size_gb = 0.01
[artifacts.pushed_gguf]
path = "pushed/gguf/m.gguf"
size_gb = 0.01
[stages.serve]
key = "7"
command = "sleep 1"
needs = ["gguf_q"]
[stages.restore]
key = "0"
command = 'python3 -m samai_box.stages.restore --from "dir:$SAMAI_WORKSPACE/pushed" gguf/m.gguf'
needs = ["pushed_gguf"]
makes = ["gguf_q"]
"""


def _restore_findings(cfg: Path) -> list[dict]:
    done = run_cli("--config", str(cfg), "doctor", "--json", timeout=120)
    return [f for f in json.loads(done.stdout)["findings"] if f["code"] == "restore_available"]


@pytest.mark.slow
def test_doctor_suggests_restore_only_for_a_rebuilt_box_with_a_pushed_gguf(tmp_path, workspace) -> None:
    cfg = tmp_path / "restorable.toml"
    cfg.write_text(RESTORABLE.format(ws=workspace))
    assert _restore_findings(cfg) == []  # nothing pushed: nothing to restore from
    (workspace / "pushed" / "gguf").mkdir(parents=True)
    (workspace / "pushed" / "gguf" / "m.gguf").write_bytes(b"GGUF")
    (suggested,) = _restore_findings(cfg)
    assert suggested["action"] == "restart restore" and "(key 0)" in suggested["message"]
    assert suggested["message"].startswith("base and adapter are gone but pushed_gguf was pushed")
    (workspace / "models" / "base").mkdir(parents=True)  # the box still has its base: rebuilding is cheap
    assert _restore_findings(cfg) == []
    (workspace / "models" / "base").rmdir()
    (workspace / "gguf").mkdir()
    (workspace / "gguf" / "m.gguf").write_bytes(b"GGUF")  # restored already
    assert _restore_findings(cfg) == []


@pytest.mark.slow
def test_what_push_shipped_to_the_hub_comes_back_from_it(tmp_path) -> None:
    """push --to hf: with the real huggingface_hub client, then restore --from hf: over the Hub's
    resolve URLs (the LFS file redirected to the hub's CDN), against the local hub."""
    from tests.hubserver import HubServer
    from tests.test_hub import WRITE, hub_env

    built = tmp_path / "built"
    (built / "gguf").mkdir(parents=True)
    (built / "gguf" / "m.gguf").write_bytes(b"GGUF" + os.urandom(200_000))  # LFS by its extension
    (built / "report.json").write_text('{"accuracy": 1.0}')
    with HubServer(tmp_path / "hub", tokens={WRITE: "write"}) as hub:
        hub.add_repo("samai/weights", private=True)
        env = hub_env(hub, tmp_path / "hf-home", HF_TOKEN=WRITE)
        done = subprocess.run(stage_argv("stages.push", "--to", "hf:samai/weights", "--stable", "0.1", "gguf/m.gguf",
                                         "report.json"), env=env, cwd=built, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        ws = tmp_path / "rebuilt"
        ws.mkdir()
        done = subprocess.run(stage_argv("stages.restore", "--from", "hf:samai/weights", "--auth-env", "HF_TOKEN",
                                         "gguf/m.gguf", "report.json"), env=env, cwd=ws, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.splitlines()[-1].startswith("RESTORE_DONE 2 files") and WRITE not in done.stdout
        assert (ws / "gguf" / "m.gguf").read_bytes() == (built / "gguf" / "m.gguf").read_bytes()
        redirected = [r for r in hub.requests if r[1].endswith("/resolve/main/gguf/m.gguf") and r[3] in (301, 302, 307)]
        assert redirected, hub.requests  # the LFS file came by way of the CDN
        missing = subprocess.run(stage_argv("stages.restore", "--from", "hf:samai/weights", "--auth-env", "HF_TOKEN",
                                            "gguf/other.gguf"), env=env, cwd=ws, capture_output=True, text=True,
                                 timeout=120)
        assert missing.returncode == 1 and missing.stdout.startswith("RESTORE_MISSING gguf/other.gguf")


def test_the_first_store_that_holds_the_artifacts_is_read(tmp_path, pushed) -> None:
    """A push's target and its fallback: the artifacts are in whichever took the push."""
    ws = tmp_path / "rebuilt"
    ws.mkdir()
    done = _run("stages.restore", ws, "--from", f"dir:{tmp_path / 'never-pushed'}", "--from", f"dir:{pushed}",
                "gguf/m.gguf")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[0].startswith(f"dir:{tmp_path / 'never-pushed'}: ")
    assert done.stdout.splitlines()[-1].endswith(f"from dir:{pushed}") and (ws / "gguf" / "m.gguf").is_file()
