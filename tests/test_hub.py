"""`fetch hf` and push's hf: targets, run for real: the stage processes with the real huggingface_hub
client, against a local Hub-compatible server (tests/hubserver.py) through HF_ENDPOINT.

The repos hold files nobody here wrote: llama.cpp's own vocab GGUFs (LFS, like every *.gguf on the
Hub) and text files from the llama-cpp-python sdist (regular git blobs), both cached by
tests/gguf_artifacts.py.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from samai.remote.box.stages import provision
from samai.remote.box.stages.locks import exclusive
from tests.box_tools import stage_argv, stage_env
from tests.gguf_artifacts import cache, llama_vocab_files, write_whole
from tests.helpers import unavailable_here, wait_for
from tests.hubserver import HubServer

pytestmark = pytest.mark.timeout(180)

WRITE, READ = "hf_testWriteToken1234567890", "hf_testReadToken0987654321"
SDIST_TEXTS = {"LICENSE": "vendor/llama.cpp/LICENSE",
               "config.json": "examples/server/configs/qwen3.5-0.8b.json"}
VOCABS = {"ggml-vocab-phi-3.gguf": "ggml-vocab-phi-3.gguf",
          "tokenizer/ggml-vocab-llama-spm.gguf": "ggml-vocab-llama-spm.gguf"}
BIG_VOCAB = "ggml-vocab-gemma-4.gguf"  # over the client's 10 MiB read chunk: a cut after it resumes by Range


# ------------------------------------------------------------------ real files


@functools.cache
def sdist_texts() -> dict[str, Path]:
    """A few text files of the cached llama-cpp-python sdist, extracted once."""
    folder = cache() / f"hub-texts-{provision.LLAMA_CPP_VERSION}"
    done = folder / ".complete"
    if not done.exists():
        try:
            sdist = provision.llama_cpp_sdist([sys.executable, "-m", "pip"])
            with tarfile.open(sdist) as tar:
                prefix = tar.getnames()[0].split("/")[0]
                for name, member in SDIST_TEXTS.items():
                    source = tar.extractfile(f"{prefix}/{member}")
                    assert source is not None
                    (folder / name).parent.mkdir(parents=True, exist_ok=True)
                    write_whole(folder / name, source.read())
        except (OSError, SystemExit, tarfile.TarError, KeyError) as e:
            unavailable_here(f"the llama-cpp-python {provision.LLAMA_CPP_VERSION} sdist: {e!r}")
        done.write_text("")
    return {name: folder / name for name in SDIST_TEXTS}


def vocab(name: str) -> Path:
    found = {p.name: p for p in llama_vocab_files()}
    if name not in found:
        unavailable_here(f"{name} is not among the vendored vocab files")
    return found[name]


def make_repo_folder(folder: Path, big: bool = False) -> dict[str, bytes]:
    """The test repo's files, written under folder; {path in repo: content}."""
    files = {name: path.read_bytes() for name, path in sdist_texts().items()}
    files.update({rel: vocab(name).read_bytes() for rel, name in VOCABS.items()})
    if big:
        files[BIG_VOCAB] = vocab(BIG_VOCAB).read_bytes()
    for rel, data in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    return files


# ------------------------------------------------------------------ running the stages


def hub_env(hub: HubServer, home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in stage_env().items() if not k.startswith(("HF_", "HUGGING"))}  # not the machine's token
    return {**env, **hub.client_env(home), **extra}


def run_stage(stage: str, *args, env: dict[str, str], cwd=None, timeout: float = 120) -> subprocess.CompletedProcess:
    """The stage as its command runs it; stdout and stderr together, like its log. No token may show."""
    r = subprocess.run(stage_argv(stage, *args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       env=env, cwd=cwd, timeout=timeout)
    for token in (WRITE, READ, "hf_wrongToken"):
        assert token not in r.stdout, r.stdout
    return r


def lines_starting(output: str, marker: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith(marker)]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tree(folder: Path) -> dict[str, bytes]:
    """Every file under folder but the client's own metadata."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*")
            if p.is_file() and ".cache" not in p.relative_to(folder).parts}


@pytest.fixture
def hub(tmp_path: Path):
    with HubServer(tmp_path / "hub", tokens={WRITE: "write", READ: "read"}) as server:
        yield server


@pytest.fixture
def env(hub: HubServer, tmp_path: Path) -> dict[str, str]:
    return hub_env(hub, tmp_path / "hf-home", SAMAI_HF_TOKEN=READ)


@pytest.fixture
def repo(hub: HubServer, tmp_path: Path) -> dict[str, bytes]:
    files = make_repo_folder(tmp_path / "made")
    hub.add_repo("samai/tiny", tmp_path / "made", private=True)
    return files


def fetch(dest: Path, *args, env: dict[str, str], repo_id: str = "samai/tiny") -> subprocess.CompletedProcess:
    return run_stage("stages.fetch", "hf", "--repo", repo_id, "--dest", dest, "--auth-env", "SAMAI_HF_TOKEN",
                     "--backoff", "0.05", *args, env=env)


def body_gets(hub: HubServer) -> list[tuple[str, str | None, int]]:
    """(path, Range, status) of every GET that fetched a file's bytes (resolve or the CDN)."""
    return [(p, r, s) for m, p, r, s in hub.requests if m == "GET" and ("/resolve/" in p or p.startswith("/lfs/"))]


# ------------------------------------------------------------------ fetch


@pytest.mark.slow
def test_fetch_lands_every_file_checked_against_the_hub(hub, env, repo, tmp_path):
    dest = tmp_path / "models" / "base"
    r = fetch(dest, env=env)
    assert r.returncode == 0, r.stdout
    assert tree(dest) == repo
    commit = hub.repo("samai/tiny").refs["main"]
    total = sum(len(d) for d in repo.values())
    assert r.stdout.splitlines()[-1] == f"FETCH_DONE {dest} repo=samai/tiny revision={commit} files=4 bytes={total}"
    checked = lines_starting(r.stdout, "FETCH_FILE")
    assert f"FETCH_FILE {dest}/ggml-vocab-phi-3.gguf size={len(repo['ggml-vocab-phi-3.gguf'])} " \
           f"sha256={sha(repo['ggml-vocab-phi-3.gguf'])}" in checked  # LFS: its sha256
    blob = hashlib.sha1(b"blob %d\0" % len(repo["LICENSE"]) + repo["LICENSE"]).hexdigest()
    assert f"FETCH_FILE {dest}/LICENSE size={len(repo['LICENSE'])} git-blob={blob}" in checked  # regular: git's id
    assert any(p.startswith("/lfs/") for p, _r, _s in body_gets(hub)), "the LFS files did not come from the CDN"
    assert not Path(f"{dest}.lock").exists()

    again = fetch(dest, env=env)
    assert again.returncode == 0, again.stdout
    assert len(body_gets(hub)) == 4, "a second run downloaded again"
    assert again.stdout.splitlines()[-1] == r.stdout.splitlines()[-1]


@pytest.mark.slow
def test_include_and_revision_pick_what_is_fetched(hub, env, repo, tmp_path):
    first = hub.repo("samai/tiny").refs["main"]
    hub.tag("samai/tiny", "v1", first)
    hub.commit("samai/tiny", {"config.json": b'{"changed": true}\n', "tokenizer/extra.gguf": b"GGUF"}, "v2")
    dest = tmp_path / "v1"
    r = fetch(dest, "--revision", "v1", "--include", "*.json", "tokenizer/", env=env)
    assert r.returncode == 0, r.stdout
    assert tree(dest) == {k: repo[k] for k in ("config.json", "tokenizer/ggml-vocab-llama-spm.gguf")}
    assert f"revision={first} files=2 " in r.stdout.splitlines()[-1]

    latest = fetch(tmp_path / "latest", "--include", "*.json", env=env)
    assert latest.returncode == 0, latest.stdout
    assert tree(tmp_path / "latest") == {"config.json": b'{"changed": true}\n'}


@pytest.mark.slow
def test_a_dataset_repo(hub, env, tmp_path):
    data = sdist_texts()["config.json"].read_bytes()
    hub.add_repo("samai/sft-data", files={"train.jsonl": data, "eval/items.parquet": data}, repo_type="dataset")
    r = fetch(tmp_path / "data", "--repo-type", "dataset", env=env, repo_id="samai/sft-data")
    assert r.returncode == 0, r.stdout
    assert tree(tmp_path / "data") == {"train.jsonl": data, "eval/items.parquet": data}
    assert any(p.startswith("/datasets/samai/sft-data/resolve/") for p, _r, _s in body_gets(hub))
    model = fetch(tmp_path / "model", env=env, repo_id="samai/sft-data")  # the same id as a model: not there
    assert model.returncode == 1 and "no such repo" in model.stdout, model.stdout


@pytest.mark.slow
def test_a_hub_that_fails_for_a_while_is_retried(hub, env, repo, tmp_path):
    hub.fail_next = [503, 502]
    r = fetch(tmp_path / "dest", env=env)
    assert r.returncode == 0, r.stdout
    assert [line.split(":")[0] for line in lines_starting(r.stdout, "FETCH_RETRY")] == ["FETCH_RETRY 1/5",
                                                                                        "FETCH_RETRY 2/5"]
    assert "HTTP 503" in r.stdout and tree(tmp_path / "dest") == repo


@pytest.mark.slow
def test_a_long_download_reports_progress(hub, env, tmp_path):
    files = make_repo_folder(tmp_path / "made", big=True)
    hub.add_repo("samai/big", tmp_path / "made")
    hub.throttle = 3 * 1024 * 1024  # ~5 s for the big vocab: long enough for the watcher to see it grow
    r = fetch(tmp_path / "dest", env=env, repo_id="samai/big")
    assert r.returncode == 0, r.stdout
    progress = [line for line in r.stdout.splitlines() if line.startswith("fetch samai/big: ")]
    assert progress, r.stdout
    assert f"/ {sum(map(len, files.values())) / 1024 / 1024:.1f} MiB (" in progress[0]


@pytest.mark.slow
def test_a_download_that_falls_between_two_measures_still_says_how_much_landed(tmp_path, monkeypatch, capsys):
    """The client writes in 10 MiB pieces: a download of a few seconds can start and end between
    two of the watcher's measures. Its last measure, at the end, still reports it."""
    from samai.remote.box.stages import hub

    monkeypatch.setattr(hub, "WATCH_S", 3600.0)  # no measure while it downloads
    files = [hub.RemoteFile("model.safetensors", 9 * 1024 * 1024, None, None)]
    with hub.Watcher("fetch samai/big", str(tmp_path), files):
        (tmp_path / "model.safetensors").write_bytes(b"\0" * files[0].size)
        time.sleep(1.2)  # a download that took over a second (shorter ones say nothing)
    assert capsys.readouterr().out.startswith("fetch samai/big: 9.0 MiB / 9.0 MiB (100%) ")


@pytest.mark.slow
def test_a_body_cut_mid_way_resumes_with_a_range(hub, env, tmp_path):
    files = make_repo_folder(tmp_path / "made", big=True)
    hub.add_repo("samai/big", tmp_path / "made")
    hub.cut_once = 11 * 1024 * 1024  # past the client's first 10 MiB chunk of the big vocab
    dest = tmp_path / "dest"
    r = fetch(dest, "--include", BIG_VOCAB, env=env, repo_id="samai/big")
    assert r.returncode == 0, r.stdout
    assert tree(dest) == {BIG_VOCAB: files[BIG_VOCAB]}
    gets = body_gets(hub)
    assert [s for _p, _r, s in gets] == [200, 206], gets
    assert gets[1][1] == f"bytes={10 * 1024 * 1024}-", gets  # resumed where the kept bytes end


@pytest.mark.slow
def test_a_second_run_after_a_killed_fetch_finishes_it(hub, env, tmp_path):
    files = make_repo_folder(tmp_path / "made", big=True)
    small = [rel for rel in files if rel != BIG_VOCAB]
    hub.add_repo("samai/big", tmp_path / "made")
    dest = tmp_path / "dest"
    hub.throttle = 1024 * 1024  # the big vocab takes ~15 s: the small files land well before
    first = subprocess.Popen(stage_argv("stages.fetch", "hf", "--repo", "samai/big", "--dest", str(dest)),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        wait_for(lambda: all((dest / rel).exists() for rel in small), timeout=60)
    finally:
        first.kill()
        first.communicate(timeout=30)
    assert not (dest / BIG_VOCAB).exists(), "the first run was not cut"
    assert list(dest.rglob("*.incomplete")), "the killed run left no partial download"
    hub.throttle = None
    done_before = len(body_gets(hub))
    r = fetch(dest, env=env, repo_id="samai/big")
    assert r.returncode == 0, r.stdout
    assert tree(dest) == files
    again = [p for p, _r, _s in body_gets(hub)[done_before:]]
    kept = [rel for rel in small if any(p.endswith("/" + rel) or sha(files[rel]) in p for p in again)]
    assert kept == [], f"files the first run finished were fetched again: {kept}"
    assert list(dest.rglob("*.incomplete")) == [], "the killed run's partial download is still there"
    assert "removed 1 partial download(s) an interrupted run left" in r.stdout


def test_a_corrupted_file_on_the_hub_is_a_sha_mismatch(hub, env, repo, tmp_path):
    hub.corrupt("samai/tiny", "ggml-vocab-phi-3.gguf")  # LFS: its sha256 is checked
    hub.corrupt("samai/tiny", "LICENSE")  # regular: its git blob id is checked
    dest = tmp_path / "dest"
    r = fetch(dest, env=env)
    assert r.returncode == 1, r.stdout
    bad = sorted(line.split()[1] for line in lines_starting(r.stdout, "SHA_MISMATCH"))
    assert bad == [f"{dest}/LICENSE", f"{dest}/ggml-vocab-phi-3.gguf"], r.stdout
    for name in ("LICENSE", "ggml-vocab-phi-3.gguf"):
        assert not (dest / name).exists()
        assert (dest / f"{name}.bad").stat().st_size == len(repo[name])
    assert (dest / "config.json").read_bytes() == repo["config.json"]
    assert lines_starting(r.stdout, "FETCH_FAIL") and not lines_starting(r.stdout, "FETCH_DONE")


def test_private_is_not_a_repo_type(hub, env, repo, tmp_path):
    r = fetch(tmp_path / "dest", "--repo-type", "private", env=env)
    assert r.returncode == 2, r.stdout
    assert "'private' is not a repo type" in r.stdout
    assert "the token" in r.stdout  # privacy is the repo's, access is the token's
    assert not (tmp_path / "dest").exists() and hub.requests == []


def test_a_held_lock_is_busy(hub, env, repo, tmp_path):
    dest = tmp_path / "dest"
    with exclusive(f"{dest}.lock", 0, str(dest)):
        r = fetch(dest, env=env)
    assert r.returncode == 75, r.stdout
    busy = f"FETCH_BUSY another fetch of {dest} is running (pid {os.getpid()})"
    assert lines_starting(r.stdout, "FETCH_BUSY") == [busy]
    assert hub.requests == [] and not dest.exists()


@pytest.mark.parametrize("token", [None, "hf_wrongToken"])
def test_no_token_or_a_wrong_one_is_a_clear_failure(hub, env, repo, tmp_path, token):
    env = {k: v for k, v in env.items() if k != "SAMAI_HF_TOKEN"}
    if token:
        env["SAMAI_HF_TOKEN"] = token
        r = fetch(tmp_path / "dest", env=env)
        assert "FETCH_FAIL the hub refused the token (HTTP 401" in r.stdout
    else:
        r = run_stage("stages.fetch", "hf", "--repo", "samai/tiny", "--dest", tmp_path / "dest", env=env)
        assert "FETCH_FAIL no such repo, or it is private and no token was given (--auth-env)" in r.stdout
    assert r.returncode == 1, r.stdout
    assert "Traceback" not in r.stdout and tree(tmp_path / "dest") == {}


@pytest.mark.parametrize("name", ["../x", "/etc/passwd", "a/../../x", ".cache/huggingface/download/LICENSE.metadata"])
def test_a_hostile_name_in_the_listing_refuses_the_repo_before_any_download(hub, env, repo, tmp_path, name):
    hub.commit("samai/tiny", {name: b"planted\n"}, "hostile")
    dest = tmp_path / "a" / "dest"
    r = fetch(dest, env=env)
    assert r.returncode == 1, r.stdout
    assert lines_starting(r.stdout, "FETCH_FAIL") == [
        f"FETCH_FAIL refusing the repo: the hub lists a file named {name!r} ({reason(name)})"]
    assert body_gets(hub) == [] and tree(tmp_path / "a") == {}


def reason(name: str) -> str:
    if name.startswith("/"):
        return "absolute"
    return "inside the client's own metadata folder" if name.startswith(".cache") else "empty, '.' or '..' segment"


# ------------------------------------------------------------------ push


@pytest.fixture
def artifacts(tmp_path: Path) -> Path:
    """A workspace holding a folder artifact and a file artifact, made of real files."""
    work = tmp_path / "work"
    (work / "final").mkdir(parents=True)
    shutil.copy(vocab("ggml-vocab-phi-3.gguf"), work / "model.gguf")
    shutil.copy(sdist_texts()["config.json"], work / "final" / "config.json")
    shutil.copy(vocab("ggml-vocab-llama-spm.gguf"), work / "final" / "tokenizer.gguf")
    return work


def push(work: Path, *args, env: dict[str, str]) -> subprocess.CompletedProcess:
    return run_stage("stages.push", *args, "--stable", "0.1", "--backoff", "0.05", "final", "model.gguf",
                     env=env, cwd=work)


def pushed(work: Path) -> dict[str, bytes]:
    return {rel: (work / rel).read_bytes() for rel in ("final/config.json", "final/tokenizer.gguf", "model.gguf")}


def manifest_of(files: dict[str, bytes]) -> bytes:
    return "".join(f"{sha(files[rel])}  {rel}\n" for rel in sorted(files)).encode()


@pytest.mark.slow
def test_push_uploads_and_verifies(hub, tmp_path, artifacts):
    hub.add_repo("samai/reports", files={"README.md": b"# reports\n"})
    env = hub_env(hub, tmp_path / "hf-home", HF_TOKEN=WRITE)
    r = push(artifacts, "--to", "hf:samai/reports", env=env)
    assert r.returncode == 0, r.stdout
    assert r.stdout.splitlines()[-1] == f"PUSH_DONE 3 files {sum(map(len, pushed(artifacts).values()))} bytes " \
                                        "manifest=hf:samai/reports/MANIFEST.sha256"
    files = hub.files("samai/reports")
    manifest = manifest_of(pushed(artifacts))
    assert files == {"README.md": b"# reports\n", **pushed(artifacts), "MANIFEST.sha256": manifest}


@pytest.mark.slow
@pytest.mark.parametrize("refusal", ["quota", "insufficient", "readonly"])
def test_a_full_repo_falls_back_to_the_second_repo(hub, tmp_path, artifacts, refusal):
    hub.add_repo("samai/private-scripts", files={"train.sh": b"#!/bin/sh\n"}, private=True)
    hub.add_repo("samai/public-weights")
    hub.refuse("samai/private-scripts", refusal)
    env = hub_env(hub, tmp_path / "hf-home", HF_TOKEN=WRITE)
    r = push(artifacts, "--to", "hf:samai/private-scripts", "--fallback", "hf:samai/public-weights", env=env)
    assert r.returncode == 0, r.stdout
    fallback = lines_starting(r.stdout, "PUSH_FALLBACK")
    assert len(fallback) == 1
    assert fallback[0].startswith("PUSH_FALLBACK hf:samai/private-scripts refused the upload (HTTP ")
    assert fallback[0].endswith("): pushing to hf:samai/public-weights instead")
    assert not lines_starting(r.stdout, "PUSH_RETRY"), "a refusal was retried"
    assert r.stdout.splitlines()[-1].endswith("manifest=hf:samai/public-weights/MANIFEST.sha256")
    assert hub.files("samai/public-weights") == {**pushed(artifacts), "MANIFEST.sha256": manifest_of(pushed(artifacts))}
    assert hub.files("samai/private-scripts") == {"train.sh": b"#!/bin/sh\n"}


@pytest.mark.slow
def test_a_full_repo_without_a_fallback_fails_at_once(hub, tmp_path, artifacts):
    hub.add_repo("samai/full")
    hub.refuse("samai/full", "quota")
    env = hub_env(hub, tmp_path / "hf-home", HF_TOKEN=WRITE)
    r = push(artifacts, "--to", "hf:samai/full", env=env)
    assert r.returncode == 1, r.stdout
    assert lines_starting(r.stdout, "PUSH_FAIL hf:samai/full refused the upload (HTTP 403")
    assert "storage limit reached" in r.stdout and not lines_starting(r.stdout, "PUSH_RETRY")


@pytest.mark.slow
def test_push_with_a_wrong_token_fails_clearly(hub, tmp_path, artifacts):
    hub.add_repo("samai/reports")
    env = hub_env(hub, tmp_path / "hf-home", HF_TOKEN="hf_wrongToken")
    r = push(artifacts, "--to", "hf:samai/reports", "--fallback", "hf:samai/other", env=env)
    assert r.returncode == 1, r.stdout
    assert lines_starting(r.stdout, "PUSH_FAIL the hub refused the token (HTTP 401")
    assert not lines_starting(r.stdout, "PUSH_RETRY") and not lines_starting(r.stdout, "PUSH_FALLBACK")


@pytest.mark.slow
def test_push_to_a_repo_that_does_not_exist_fails_without_retrying(hub, tmp_path, artifacts):
    env = hub_env(hub, tmp_path / "hf-home", HF_TOKEN=WRITE)
    r = push(artifacts, "--to", "hf:samai/nowhere", env=env)
    assert r.returncode == 1, r.stdout
    assert lines_starting(r.stdout, "PUSH_FAIL the hub refused the request (HTTP 404")
    assert not lines_starting(r.stdout, "PUSH_RETRY")


# ------------------------------------------------------------------ untrusted listings


HOSTILE = ["../x", "../../x", "a/../../x", "./x", "a//b", "..", ".", "", "\\..\\x", "C:x", "x\n", "a\x00b",
           ".cache/huggingface/download/config.json.metadata", "{root}/outside/x", "{root}/etc/passwd"]
SEGMENT = st.text(st.characters(codec="utf-8", exclude_characters="/"), min_size=1, max_size=6)
NAMES = st.lists(st.one_of(st.sampled_from(HOSTILE), st.lists(SEGMENT, min_size=1, max_size=3).map("/".join),
                           st.sampled_from(["config.json", "w/model.safetensors", "tok.model"])),
                 min_size=1, max_size=4, unique=True)
BROKEN = st.sampled_from([None, "size", "blobId", "lfs", "lfs-sha", "type"])


def broken(sibling: dict, how: str | None) -> dict:
    """A sibling with one field made unusable, as a faulty or hostile hub might send it."""
    sibling = dict(sibling)
    if how == "size":
        sibling["size"] = "12"
    elif how == "blobId":
        sibling["blobId"] = None
    elif how == "lfs":
        sibling["lfs"] = {"sha256": "0" * 64}
    elif how == "lfs-sha":
        sibling["lfs"] = {"sha256": "zz", "size": sibling.get("size"), "pointerSize": 1}
    elif how == "type":
        sibling["rfilename"] = 7
    return sibling


def plainly_safe(name: str) -> bool:
    parts = name.split("/")
    return all(p and p not in (".", "..") and p.isprintable() and "\\" not in p for p in parts) \
        and not name.startswith((".cache/", "/")) and ":" not in parts[0]


def outside(root: Path, inside: tuple[Path, ...]) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in root.rglob("*")
            if p.is_file() and not any(p == f or f in p.parents for f in inside)}


@pytest.fixture(scope="module")
def fuzz_hub(tmp_path_factory):
    with HubServer(tmp_path_factory.mktemp("fuzz-hub"), tokens={WRITE: "write", READ: "read"}) as server:
        yield server


@pytest.mark.slow
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(names=NAMES, how=BROKEN, data=st.binary(max_size=64))
def test_names_from_the_listing_never_leave_dest(fuzz_hub, tmp_path, names, how, data):
    root = Path(tempfile.mkdtemp(dir=tmp_path))
    (root / "outside").mkdir()
    (root / "outside" / "keep").write_bytes(b"untouched")
    names = [n.replace("{root}", str(root)) for n in names]
    repo_id = f"fuzz/r{len(fuzz_hub.repos)}"
    fuzz_hub.add_repo(repo_id, files={name: data + name.encode("utf-8", "replace") for name in names})
    fuzz_hub.siblings_hook = lambda siblings: [broken(s, how) for s in siblings]
    dest = root / "a" / "b" / "dest"
    env = hub_env(fuzz_hub, root / "hf-home", SAMAI_HF_TOKEN=READ)
    before = outside(root, (dest, root / "hf-home"))
    try:
        r = fetch(dest, env=env, repo_id=repo_id)
    finally:
        fuzz_hub.siblings_hook = None
    assert r.returncode in (0, 1), r.stdout
    assert "Traceback" not in r.stdout, r.stdout
    assert outside(root, (dest, root / "hf-home")) == before  # nothing written outside DEST
    if r.returncode == 0:
        assert how is None and all(plainly_safe(n) for n in names), r.stdout
        assert tree(dest) == {n: data + n.encode() for n in names}
    elif how is None and all(plainly_safe(n) for n in names) and not any(
            m.startswith(n + "/") for n in names for m in names):
        pytest.fail(f"a plainly safe listing was refused: {names!r}\n{r.stdout}")


# ------------------------------------------------------------------ what the stage itself changes stays in DEST


def test_leftovers_are_looked_for_only_inside_dest(tmp_path, capsys):
    from samai.remote.box.stages import hub

    outside = tmp_path / "outside"
    orphan = outside / "huggingface" / "download" / "abc.0123abcd.0123abcd.incomplete"
    orphan.parent.mkdir(parents=True)
    orphan.write_bytes(b"not ours")
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / ".cache").symlink_to(outside)  # planted: os.walk would follow it
    hub.remove_orphans(str(dest))
    assert orphan.read_bytes() == b"not ours"
    assert "reached through a symlink" in capsys.readouterr().out


def test_a_mismatching_file_behind_a_symlinked_folder_is_not_moved_outside(tmp_path, capsys):
    from samai.remote.box.stages import hub

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "vocab.gguf").write_bytes(b"someone else's")
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "models").symlink_to(outside)
    (dest / "LICENSE").write_bytes(b"wrong")
    files = [hub.RemoteFile("models/vocab.gguf", 3, "0" * 64, None), hub.RemoteFile("LICENSE", 5, "0" * 64, None)]
    with pytest.raises(hub.FetchError):
        hub.check_files(str(dest), files)
    said = capsys.readouterr().out
    assert (outside / "vocab.gguf").read_bytes() == b"someone else's" and not (outside / "vocab.gguf.bad").exists()
    assert "not moved" in said and "symlink" in said
    assert (dest / "LICENSE.bad").read_bytes() == b"wrong"  # inside DEST, as before


def test_a_symlinked_folder_on_the_way_to_a_listed_file_refuses_the_fetch(hub, env, repo, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "LICENSE").symlink_to(outside / "LICENSE")  # planted where the listing's file would go
    r = fetch(dest, env=env)
    assert r.returncode == 1, r.stdout
    assert f"{dest}/LICENSE is a symlink: refused" in r.stdout and lines_starting(r.stdout, "FETCH_FAIL")
    assert list(outside.iterdir()) == [] and not lines_starting(r.stdout, "FETCH_DONE")
