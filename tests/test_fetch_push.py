"""The fetch and push stage scripts, run for real: subprocesses against a loopback HTTP server.

SAMAI_BOX_PYTHON picks the interpreter the scripts run under (the box has Python >= 3.8);
by default it is the one running the tests.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import pytest

from tests.box_tools import stage_argv, stage_env
from tests.helpers import wait_for
from tests.httpfiles import FileServer, write_files

FETCH, PUSH = "stages.fetch", "stages.push"
BOX_PYTHON = os.environ.get("SAMAI_BOX_PYTHON", sys.executable)

pytestmark = pytest.mark.timeout(60)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def run_script(stage: str, *args, cwd=None, timeout: float = 30) -> subprocess.CompletedProcess:
    """The stage as its command runs it (python -m samai_box.stages.NAME): stdout and stderr
    together, like its log."""
    return subprocess.run(stage_argv(stage, *args, python=BOX_PYTHON), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, cwd=cwd, timeout=timeout, env=stage_env())


def fetch(*args, **kw):
    return run_script(FETCH, *args, **kw)


def push(*args, **kw):
    return run_script(PUSH, *args, **kw)


def lines_starting(output: str, marker: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith(marker)]


@pytest.fixture
def served(tmp_path: Path) -> Path:
    folder = tmp_path / "served"
    folder.mkdir()
    return folder


@pytest.fixture
def blob(served: Path) -> bytes:
    data = os.urandom(300_000)
    (served / "model.gguf").write_bytes(data)
    return data


# ------------------------------------------------------------------ fetch file


def test_fetch_checks_sha256_and_reports_done(served, blob, tmp_path):
    out = tmp_path / "dl" / "model.gguf"
    with FileServer(served) as server:
        r = fetch("file", "--url", server.url("model.gguf"), "--out", out, "--sha256", sha(blob), "--size", len(blob))
    assert r.returncode == 0, r.stdout
    assert out.read_bytes() == blob
    assert lines_starting(r.stdout, "FETCH_DONE") == [f"FETCH_DONE {out} size={len(blob)} sha256={sha(blob)}"]
    assert sorted(p.name for p in out.parent.iterdir()) == ["model.gguf"]  # no .part, no .lock left behind


def test_auth_env_sends_a_bearer_token_and_never_prints_it(served, blob, tmp_path):
    out = tmp_path / "model.gguf"
    env = {**stage_env(), "SAMAI_TEST_TOKEN": "hf_s3cr3t"}
    with FileServer(served) as server:
        r = subprocess.run(stage_argv(FETCH, "file", "--url", server.url("model.gguf"), "--out", str(out),
                                      "--auth-env", "SAMAI_TEST_TOKEN", python=BOX_PYTHON),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, timeout=30)
    assert r.returncode == 0, r.stdout
    assert server.authorizations == ["Bearer hf_s3cr3t"]
    assert "hf_s3cr3t" not in r.stdout


def test_present_file_is_not_downloaded_again(served, blob, tmp_path):
    out = tmp_path / "model.gguf"
    with FileServer(served) as server:
        args = ("file", "--url", server.url("model.gguf"), "--out", out, "--sha256", sha(blob))
        assert fetch(*args).returncode == 0
        assert len(server.gets("model.gguf")) == 1
        again = fetch(*args)
        assert len(server.gets("model.gguf")) == 1, "the second run went to the server"
    assert again.returncode == 0, again.stdout
    assert f"FETCH_DONE {out} (already present)" in again.stdout


def test_resume_after_the_server_drops_the_connection(served, blob, tmp_path):
    out = tmp_path / "model.gguf"
    with FileServer(served, drop_after=100_000) as server:
        r = fetch("file", "--url", server.url("model.gguf"), "--out", out, "--sha256", sha(blob), "--backoff", "0.05")
        gets = server.gets("model.gguf")
    assert r.returncode == 0, r.stdout
    assert lines_starting(r.stdout, "FETCH_RETRY 1/5:"), r.stdout
    assert gets == [(None, 200), ("bytes=100000-", 206)]  # resumed where the body stopped
    assert out.read_bytes() == blob


def test_server_ignoring_range_restarts_from_zero(served, blob, tmp_path):
    out = tmp_path / "model.gguf"
    Path(str(out) + ".part").write_bytes(blob[:50_000])  # left by an earlier, interrupted run
    with FileServer(served, ignore_range=True) as server:
        r = fetch("file", "--url", server.url("model.gguf"), "--out", out, "--sha256", sha(blob))
        gets = server.gets("model.gguf")
    assert r.returncode == 0, r.stdout
    assert gets == [("bytes=50000-", 200)]
    assert "restarting" in r.stdout
    assert out.read_bytes() == blob  # not 50 000 bytes of prefix plus a whole file


@pytest.mark.slow
def test_second_fetch_of_the_same_file_is_busy(served, blob, tmp_path):
    out = tmp_path / "model.gguf"
    lock = Path(str(out) + ".lock")
    with FileServer(served, throttle=150_000) as server:  # ~2 s for the whole file
        args = ["file", "--url", server.url("model.gguf"), "--out", out, "--sha256", sha(blob)]
        first = subprocess.Popen(stage_argv(FETCH, *args, python=BOX_PYTHON), stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, env=stage_env())
        try:
            wait_for(lambda: lock.exists() and lock.read_text().strip())
            busy = fetch(*args)
            waited = fetch(*args, "--wait", "20")
        finally:
            first_out, _ = first.communicate(timeout=30)
    assert busy.returncode == 75, busy.stdout
    assert f"FETCH_BUSY another fetch of {out} is running (pid {first.pid})" in busy.stdout
    assert first.returncode == 0, first_out
    assert waited.returncode == 0, waited.stdout
    assert f"FETCH_DONE {out} (already present)" in waited.stdout
    assert out.read_bytes() == blob
    assert not lock.exists() and not Path(str(out) + ".part").exists()


@pytest.mark.parametrize("scheme", ["http", "http-ignoring-range", "file"])
def test_range_fetch_is_exactly_the_slice(served, blob, tmp_path, scheme):
    out = tmp_path / "slice.bin"
    with FileServer(served, ignore_range=scheme == "http-ignoring-range") as server:
        url = (served / "model.gguf").as_uri() if scheme == "file" else server.url("model.gguf")
        r = fetch("file", "--url", url, "--out", out, "--range", "1000-151999")
        too_far = fetch("file", "--url", url, "--out", tmp_path / "far.bin", "--range", f"1000-{len(blob) + 5}")
    assert r.returncode == 0, r.stdout
    assert out.read_bytes() == blob[1000:152000]
    assert f"FETCH_DONE {out} size=151000 " in r.stdout
    assert too_far.returncode == 1, too_far.stdout
    assert str(len(blob)) in lines_starting(too_far.stdout, "FETCH_FAIL")[0]
    assert not (tmp_path / "far.bin").exists()


def test_corrupted_download_fails_its_sha256(served, blob, tmp_path):
    out = tmp_path / "model.gguf"
    with FileServer(served, corrupt=True) as server:
        r = fetch("file", "--url", server.url("model.gguf"), "--out", out, "--sha256", sha(blob))
    assert r.returncode == 1, r.stdout
    bad = Path(str(out) + ".bad")
    assert lines_starting(r.stdout, "SHA_MISMATCH") == [
        f"SHA_MISMATCH {out} expected {sha(blob)} got {sha(bad.read_bytes())}"]
    assert not out.exists() and bad.stat().st_size == len(blob)


# ------------------------------------------------------------------ fetch manifest


def test_manifest_fetches_a_folder(served, tmp_path):
    files = {"weights/a.bin": os.urandom(70_000), "weights/sub dir/b.txt": b"tokenizer\n"}
    write_files(served, files)
    manifest = {"files": [{"path": rel[len("weights/"):], "size": len(data), "sha256": sha(data)}
                          for rel, data in files.items()]}
    (served / "weights" / "manifest.json").write_text(json.dumps(manifest))
    dest = tmp_path / "dest"
    with FileServer(served) as server:
        r = fetch("manifest", "--url", server.url("weights/manifest.json"), "--dest", dest)
    assert r.returncode == 0, r.stdout
    assert (dest / "a.bin").read_bytes() == files["weights/a.bin"]
    assert (dest / "sub dir" / "b.txt").read_bytes() == b"tokenizer\n"
    total = sum(len(d) for d in files.values())
    assert r.stdout.splitlines()[-1] == f"FETCH_DONE {dest} files=2 bytes={total}"


@pytest.mark.parametrize("bad_path", ["../escape.bin", "/etc/escape.bin", "a/../../escape.bin"])
def test_manifest_paths_must_stay_inside_dest(served, tmp_path, bad_path):
    manifest = {"files": [{"path": bad_path, "size": 1, "sha256": "0" * 64}]}
    (served / "manifest.json").write_text(json.dumps(manifest))
    with FileServer(served) as server:
        r = fetch("manifest", "--url", server.url("manifest.json"), "--dest", tmp_path / "dest")
    assert r.returncode == 1, r.stdout
    assert lines_starting(r.stdout, "FETCH_FAIL refusing path"), r.stdout
    assert not (tmp_path / "escape.bin").exists()


# ------------------------------------------------------------------ fetch tar


def make_tar(path: Path, members: list[tuple[str, bytes | str | None, int]]) -> bytes:
    """members: (name, bytes for a file | str for a symlink target | None for a folder, mode)."""
    with tarfile.open(path, "w:gz") as tar:
        for name, content, mode in members:
            info = tarfile.TarInfo(name)
            info.mode = mode
            if content is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif isinstance(content, str):
                info.type, info.linkname = tarfile.SYMTYPE, content
                tar.addfile(info)
            else:
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
    return path.read_bytes()


@pytest.mark.parametrize("scheme", ["http", "file"])
def test_nested_tarball_is_flattened(served, tmp_path, scheme):
    data = make_tar(served / "llama-b1234.tar.gz", [
        ("pkg", None, 0o755),
        ("pkg/bin", None, 0o755),
        ("pkg/bin/bin", None, 0o755),
        ("pkg/bin/bin/llama-server", b"#!/bin/sh\necho serving\n", 0o755),
        ("pkg/bin/bin/libllama.so.1", b"lib", 0o644),
        ("pkg/bin/bin/libllama.so", "libllama.so.1", 0o777),
        ("pkg/LICENSE", b"MIT\n", 0o644),
    ])
    dest = tmp_path / "tools" / "llama"
    with FileServer(served) as server:
        url = server.url("llama-b1234.tar.gz") if scheme == "http" else (served / "llama-b1234.tar.gz").as_uri()
        r = fetch("tar", "--url", url, "--dest", dest, "--expect", "bin/llama-server", "--sha256", sha(data))
    assert r.returncode == 0, r.stdout
    server_bin = dest / "bin" / "llama-server"
    assert os.access(server_bin, os.X_OK)
    assert subprocess.run([str(server_bin)], capture_output=True, text=True).stdout == "serving\n"
    assert os.readlink(dest / "bin" / "libllama.so") == "libllama.so.1"
    assert "FETCH_FLATTENED from pkg/bin" in r.stdout
    assert r.stdout.splitlines()[-1].startswith(f"FETCH_DONE {dest} expect=bin/llama-server")
    assert not (tmp_path / "tools" / "llama-b1234.tar.gz").exists()  # a download is removed once used...
    assert (served / "llama-b1234.tar.gz").read_bytes() == data  # ...a local archive is read in place and kept
    assert not [p for p in dest.iterdir() if p.name.startswith(".")]  # no staging left behind


def test_tar_without_the_expected_binary_names_its_contents(served, tmp_path):
    make_tar(served / "x.tar.gz", [("docs/README", b"hi", 0o644)])
    with FileServer(served) as server:
        r = fetch("tar", "--url", server.url("x.tar.gz"), "--dest", tmp_path / "d", "--expect", "bin/llama-server")
    assert r.returncode == 1, r.stdout
    assert lines_starting(r.stdout, "TAR_LAYOUT bin/llama-server not found; the archive holds: docs/README")


@pytest.mark.parametrize("evil", [
    ("../evil", b"pwned", 0o644),
    ("ABSOLUTE", b"pwned", 0o644),
    ("link", "../../evil", 0o777),
])
def test_unsafe_tar_is_refused(served, tmp_path, evil):
    name, content, mode = evil
    if name == "ABSOLUTE":
        name = str(tmp_path / "evil")
    make_tar(served / "evil.tar", [("bin/llama-server", b"#!/bin/sh\n", 0o755), (name, content, mode)])
    dest = tmp_path / "a" / "dest"
    with FileServer(served) as server:
        r = fetch("tar", "--url", server.url("evil.tar"), "--dest", dest, "--expect", "bin/llama-server")
    assert r.returncode == 1, r.stdout
    assert lines_starting(r.stdout, "TAR_UNSAFE"), r.stdout
    assert not (tmp_path / "evil").exists() and not (tmp_path / "a" / "evil").exists()
    assert not (dest / "bin").exists()  # refused before anything was extracted


# ------------------------------------------------------------------ push


@pytest.mark.slow
def test_push_waits_for_a_growing_file_then_verifies(tmp_path):
    ws, target = tmp_path / "ws", tmp_path / "target"
    write_files(ws, {"adapter/adapter_model.safetensors": os.urandom(50_000),
                     "adapter/sub/adapter_config.json": b"{}\n"})
    growing = ws / "out" / "model.gguf"

    def write_slowly():
        time.sleep(0.3)
        growing.parent.mkdir()
        with open(growing, "ab") as f:
            for _ in range(20):  # ~2 s of appends, closer together than --stable
                f.write(os.urandom(10_000))
                f.flush()
                time.sleep(0.1)

    writer = threading.Thread(target=write_slowly)
    writer.start()
    try:
        r = push("--to", f"dir:{target}", "--stable", "1", "--wait-timeout", "20", "--backoff", "0.1",
                 "out/model.gguf", "adapter", cwd=ws)
    finally:
        writer.join()
    assert r.returncode == 0, r.stdout
    assert "PUSH_WAIT out/model.gguf (missing)" in r.stdout
    assert (target / "out" / "model.gguf").read_bytes() == growing.read_bytes()
    assert growing.stat().st_size == 200_000  # it pushed the finished file, not a prefix
    assert (target / "adapter" / "sub" / "adapter_config.json").read_bytes() == b"{}\n"
    total = 200_000 + 50_000 + 3
    assert r.stdout.splitlines()[-1] == f"PUSH_DONE 3 files {total} bytes manifest={target / 'MANIFEST.sha256'}"
    check = subprocess.run(["sha256sum", "-c", "MANIFEST.sha256"], cwd=target, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.count(": OK") == 3
    assert not [p for p in target.rglob("*push-tmp*")]


def test_push_retries_while_the_target_is_unwritable(tmp_path):
    ws, target = tmp_path / "ws", tmp_path / "target"
    write_files(ws, {"report.json": b'{"score": 1}\n'})
    target.write_text("in the way")  # a file where the folder should be: root ignores chmod, not this
    proc = subprocess.Popen(stage_argv(PUSH, "--to", f"dir:{target}", "--stable", "0.1", "--backoff", "0.3",
                                       "report.json", python=BOX_PYTHON), cwd=ws, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=stage_env())
    seen = []
    for line in proc.stdout:
        seen.append(line.rstrip("\n"))
        if line.startswith("PUSH_RETRY") and target.is_file():
            target.unlink()  # the target comes back
    assert proc.wait(timeout=20) == 0, "\n".join(seen)
    assert lines_starting("\n".join(seen), "PUSH_RETRY 1/5: ")
    assert seen[-1].startswith("PUSH_DONE 1 files 13 bytes")
    assert (target / "report.json").read_bytes() == b'{"score": 1}\n'


def test_push_gives_up_when_the_target_stays_unwritable(tmp_path):
    ws, target = tmp_path / "ws", tmp_path / "target"
    write_files(ws, {"report.json": b"{}\n"})
    target.write_text("in the way")
    r = push("--to", f"dir:{target}", "--stable", "0.1", "--backoff", "0.05", "--retries", "3", "report.json", cwd=ws)
    assert r.returncode == 1, r.stdout
    assert len(lines_starting(r.stdout, "PUSH_RETRY")) == 2
    assert lines_starting(r.stdout, "PUSH_FAIL gave up after 3 attempts")


@pytest.mark.slow
def test_push_times_out_for_an_artifact_that_never_appears(tmp_path):
    r = push("--to", f"dir:{tmp_path / 'target'}", "--wait-timeout", "1", "--stable", "0.1", "never.gguf",
             cwd=tmp_path)
    assert r.returncode == 1, r.stdout
    assert "PUSH_WAIT never.gguf (missing)" in r.stdout
    assert lines_starting(r.stdout, "PUSH_TIMEOUT never.gguf")
    assert not (tmp_path / "target").exists()


@pytest.mark.slow
def test_push_waits_while_part_files_are_inside(tmp_path):
    write_files(tmp_path, {"final/adapter.safetensors": b"x", "final/shard-2.safetensors.part": b"y"})
    r = push("--to", f"dir:{tmp_path / 'target'}", "--wait-timeout", "1", "--stable", "0.1", "final", cwd=tmp_path)
    assert r.returncode == 1, r.stdout
    assert "PUSH_WAIT final (has .part files)" in r.stdout
    assert lines_starting(r.stdout, "PUSH_TIMEOUT final")
