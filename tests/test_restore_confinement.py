"""The restore stage writes only inside the workspace, whatever the store's manifest names and
whatever the workspace holds: a folder or a file beside the output that is a symlink pointing
out (there before the stage, or planted while it downloads), `..`, absolute names, and names
with control characters are refused naming the path, and nothing lands outside."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from samai.remote.box.stages import restore
from samai.remote.box.stages.transfer import FetchError
from tests.box_tools import stage_argv, stage_env
from tests.httpfiles import FileServer

PUSHED = b"GGUF" + bytes(range(256)) * 400


def _run(cwd: Path, *args: object) -> subprocess.CompletedProcess:
    return subprocess.run(stage_argv("stages.restore", *args), env=stage_env(), cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def _store(folder: Path, files: dict[str, bytes]) -> Path:
    """A store as push writes one: the files under their paths, and MANIFEST.sha256 beside them."""
    lines = []
    for rel, data in files.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        lines.append(f"{hashlib.sha256(data).hexdigest()}  {rel}\n")
    (folder / "MANIFEST.sha256").write_text("".join(lines))
    return folder


@pytest.fixture
def places(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(store, workspace, a folder outside the workspace that must stay as it is)."""
    store = _store(tmp_path / "store", {"gguf/m.gguf": PUSHED, "runs/eval/r1/summary.json": b'{"n": 1}'})
    ws, outside = tmp_path / "ws", tmp_path / "outside"
    ws.mkdir()
    outside.mkdir()
    return store, ws, outside


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _refused(done: subprocess.CompletedProcess, path: str) -> None:
    """Exit 1, one marker line naming the path last, no traceback."""
    assert done.returncode == 1, done.stdout + done.stderr
    last = done.stdout.splitlines()[-1]
    assert last.startswith("RESTORE_FAIL ") and path in last, done.stdout
    assert "Traceback" not in done.stderr, done.stderr


@pytest.mark.parametrize(("linked", "artifact", "landed"), [
    ("gguf", "gguf/m.gguf", "gguf/m.gguf"),
    ("runs/eval", "runs/eval/r1", "runs/eval/r1/summary.json"),
])
def test_a_symlinked_folder_of_the_workspace_is_refused(places, linked, artifact, landed) -> None:
    store, ws, outside = places
    (ws / linked).parent.mkdir(parents=True, exist_ok=True)
    (ws / linked).symlink_to(outside)
    done = _run(ws, "--from", f"dir:{store}", artifact)
    _refused(done, landed)
    assert "symlink" in done.stdout.splitlines()[-1]
    assert _tree(outside) == {}


@pytest.mark.parametrize("suffix", ["", ".part", ".lock"])
def test_a_symlink_beside_the_output_is_refused_and_never_written_through(places, suffix) -> None:
    """The output itself (pointing at a file with the very bytes pushed: 'already present' would
    make the restored file a link out), its .part (the download would append there) and its
    .lock (the lock would be created there, and the pid written into it)."""
    store, ws, outside = places
    victim = outside / "victim"
    kept = PUSHED if suffix == "" else b"precious"
    victim.write_bytes(kept)
    (ws / "gguf").mkdir()
    (ws / "gguf" / f"m.gguf{suffix}").symlink_to(victim)
    done = _run(ws, "--from", f"dir:{store}", "gguf/m.gguf")
    _refused(done, "gguf/m.gguf")
    assert _tree(outside) == {"victim": kept}


class SwappingServer(FileServer):
    """A store over HTTP that, when the body of `rel` is asked for (every check before the
    download has passed by then), runs `swap`: what an attacker does between check and write."""

    def __init__(self, root: Path, rel: str, swap) -> None:
        super().__init__(root)
        self.rel, self.swap = rel, swap

    def record(self, path: str, range_header: str | None, status: int) -> None:
        if path.endswith("/" + self.rel) and status in (200, 206) and self.swap:
            swap, self.swap = self.swap, None
            swap()
        super().record(path, range_header, status)


def test_a_folder_swapped_for_a_symlink_during_the_download_changes_nothing(places) -> None:
    store, ws, outside = places
    (ws / "gguf").mkdir()

    def swap() -> None:
        (ws / "gguf").rename(ws / "gguf.moved")
        (ws / "gguf").symlink_to(outside)

    with SwappingServer(store, "gguf/m.gguf", swap) as server:
        done = _run(ws, "--from", server.url(""), "gguf/m.gguf")
    assert server.swap is None  # the swap happened
    assert _tree(outside) == {}, done.stdout
    # The download went on in the folder the stage had opened, wherever it was moved to inside.
    assert done.returncode == 0, done.stdout + done.stderr
    assert (ws / "gguf.moved" / "m.gguf").read_bytes() == PUSHED


def test_a_part_file_planted_as_a_symlink_during_the_download_is_not_written_through(places) -> None:
    store, ws, outside = places
    victim = outside / "victim"
    victim.write_bytes(b"precious")
    (ws / "gguf").mkdir()
    with SwappingServer(store, "gguf/m.gguf", lambda: (ws / "gguf" / "m.gguf.part").symlink_to(victim)) as server:
        done = _run(ws, "--from", server.url(""), "gguf/m.gguf")
    assert server.swap is None
    _refused(done, "gguf/m.gguf")
    assert _tree(outside) == {"victim": b"precious"}


UNSAFE_NAMES = [
    "gguf/../../outside/m.gguf",
    "/gguf/m.gguf",
    "gguf/a\x1b[2Jb.gguf",  # ESC: would clear the screen of whoever reads the log
    "gguf/a\x00b.gguf",  # NUL: cuts the name short (and the stdlib raises)
    "gguf/a\x7fb.gguf",
    "gguf/a\x9bb.gguf",  # C1 CSI
    "gguf/a\u202eb.gguf",  # right-to-left override: the name would read as another
    "gguf/a\u200bb.gguf",  # zero-width space
]


@pytest.mark.parametrize("name", UNSAFE_NAMES)
def test_an_unsafe_name_in_the_manifest_refuses_the_restore_before_anything_is_written(places, name) -> None:
    store, ws, outside = places
    digest = hashlib.sha256(PUSHED).hexdigest()
    (store / "MANIFEST.sha256").write_text(f"{digest}  gguf/m.gguf\n{digest}  {name}\n")
    done = _run(ws, "--from", f"dir:{store}", "gguf")
    assert done.returncode == 1 and done.stdout.startswith("RESTORE_FAIL refusing path "), done.stdout + done.stderr
    assert done.stdout.count("\n") == 1 and done.stdout.rstrip("\n").isprintable(), done.stdout
    assert done.stderr == ""
    assert list(ws.iterdir()) == [] and _tree(outside) == {}


@settings(max_examples=300, deadline=None, database=None)
@given(st.text(max_size=60))
def test_any_name_in_a_manifest_is_refused_or_confined_and_printable(name: str) -> None:
    line = f"{'a' * 64}  {name}"
    try:
        entries = restore.manifest_of(line)
    except FetchError as e:
        assert str(e).isprintable()
        return
    for path in entries:
        assert path.isprintable() and not path.startswith("/") and ".." not in path.split("/")


def _fetch_manifest(store: Path, files: dict[str, bytes]) -> Path:
    """The JSON manifest `fetch manifest` reads, with the files beside it."""
    entries = []
    for rel, data in files.items():
        (store / rel).write_bytes(data)
        entries.append({"path": rel, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    manifest = store / "files.json"
    manifest.write_text(json.dumps({"files": entries}))
    return manifest


@pytest.mark.parametrize("name", ["gguf/m.gguf", "gguf/a\x1b]0;pwned\x07.gguf"])
def test_fetch_manifest_names_are_held_by_the_same_rule(places, name) -> None:
    """`fetch manifest` writes names from an untrusted list too: the same confinement."""
    store, ws, outside = places
    manifest = _fetch_manifest(store, {name: PUSHED})
    if name == "gguf/m.gguf":
        (ws / "gguf").symlink_to(outside)
    done = subprocess.run(stage_argv("stages.fetch", "manifest", "--url", manifest.as_uri(), "--dest", ws),
                          env=stage_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and done.stdout.splitlines()[-1].startswith("FETCH_FAIL "), done.stdout
    assert "\x1b" not in done.stdout and "\x07" not in done.stdout, done.stdout
    assert "Traceback" not in done.stderr and _tree(outside) == {} and _tree(ws) == {}
