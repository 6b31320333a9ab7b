"""Push artifacts off the box as soon as they are complete: wait, hash, copy with retries, verify.

Runs ON the box as a stage (`python3 -m samai_box.stages.push ...`); stdout is the stage log.
Standard library only (plus huggingface_hub for hf: targets), Python >= 3.8.

  push --to dir:/some/path|hf:owner/repo [--fallback hf:owner/other] [--auth-env NAME]
       [--wait-timeout S] [--stable S] [--retries N] [--backoff S] [--manifest NAME] ARTIFACT...

ARTIFACT is a file or folder; it lands in the target under its path relative to the current
folder (its basename when it lies outside), e.g. `final/adapter.safetensors`.

Markers (the first word of a line): PUSH_WAIT artifact (why), PUSH_TIMEOUT artifact (why),
PUSH_RETRY n/N: reason, PUSH_FALLBACK (the first repo refused: pushing to the fallback),
PUSH_BAD path, PUSH_FAIL reason, PUSH_DONE N files M bytes manifest=PATH.
Exit codes: 0 pushed and verified, 1 failed (timeout, retries used up, verification), 2 bad usage.

Why (playbook §8): artifacts that were pushed early survived the box; the push must wait for an
artifact still being written (its size and mtimes unchanged over --stable seconds, no *.part
file inside or beside it), retry a flaky target, and ship a sha256 manifest (`sha256sum -c`
format) that the copies are verified against. A hub repo that is full, read-only or over its
LFS quota refuses the upload (HTTP 403 or 507, see hub.classify): that is not retried; with
--fallback the whole push goes to the second repo instead (the playbook keeps scripts and docs in a
private repo, weights and reports in a public one), is verified there, and PUSH_FALLBACK says so.
A wrong token (HTTP 401) fails at once. The token comes from $HF_TOKEN (or --auth-env NAME) and is
never printed.
"""

from __future__ import annotations

import argparse
import io
import os
import re
import sys
import time
from typing import Any, Callable, Iterable, Iterator, Tuple, TypeVar, cast

from ..atomic import write_atomic
from .transfer import CHUNK, Progress, human, one_line, sha256_file

WAIT_POLL_S = 0.25
WAIT_REPORT_S = 30.0  # while waiting, say so again this often (and whenever the reason changes)
HF_REPO = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
Entry = Tuple[str, str, int, str]  # a file pushed: (source path, path in the target, size, sha256)
T = TypeVar("T")  # what an attempt returns


class Refused(Exception):
    """The hub repo will not take the upload (full, read-only, over quota): not worth a retry."""


class PushError(Exception):
    """A failure printed as one line: MARKER text, exit 1."""

    def __init__(self, text: str, marker: str = "PUSH_FAIL") -> None:
        Exception.__init__(self, text)
        self.marker = marker


# ------------------------------------------------------------------ waiting for complete artifacts


def target_name(path: str) -> str:
    """Where an artifact lands in the target: its path relative to cwd, else its basename."""
    rel = os.path.relpath(os.path.abspath(path))
    if rel == os.curdir:
        raise PushError("push the folder's contents, not the current folder itself")
    if rel == os.pardir or rel.startswith(os.pardir + os.sep):
        rel = os.path.basename(os.path.abspath(path))
    return rel.replace(os.sep, "/")


def snapshot(path: str) -> list[tuple[str, int, int]] | None:
    """[(relative path, size, mtime_ns)] of every file of the artifact, or None when it is missing."""
    if os.path.isfile(path):
        st = os.stat(path)
        return [("", st.st_size, st.st_mtime_ns)]
    if not os.path.isdir(path):
        return None
    files: list[tuple[str, int, int]] = []
    for folder, _dirs, names in os.walk(path):
        for name in names:
            full = os.path.join(folder, name)
            try:
                st = os.stat(full)
            except OSError:
                continue  # removed between listing and stat: the next snapshot will differ anyway
            files.append((os.path.relpath(full, path), st.st_size, st.st_mtime_ns))
    return sorted(files)


def not_ready(path: str, snap: list[tuple[str, int, int]] | None) -> str | None:
    """Why the artifact cannot be pushed yet, or None when it looks complete."""
    if snap is None:
        return "missing"
    if not snap:
        return "empty folder"
    if os.path.exists(path + ".part") or any(rel.endswith(".part") for rel, _, _ in snap):
        return "has .part files"
    return None


def settled(path: str, stable_s: float) -> str | None:
    """None when the artifact looks complete and did not change over stable_s seconds, else why not."""
    snap = snapshot(path)
    reason = not_ready(path, snap)
    if reason:
        return reason
    time.sleep(stable_s)
    if snapshot(path) != snap:
        return "still being written"
    return None


def wait_until_complete(path: str, deadline: float, stable_s: float, timeout_s: float) -> None:
    last_reason: str | None = None
    last_report = 0.0
    while True:
        reason = settled(path, stable_s)
        if reason is None:
            return
        now = time.monotonic()
        if now >= deadline:
            raise PushError("%s (%s after %g s)" % (path, reason, timeout_s), "PUSH_TIMEOUT")
        if reason != last_reason or now - last_report >= WAIT_REPORT_S:
            print("PUSH_WAIT %s (%s)" % (path, reason))
            last_reason, last_report = reason, now
        time.sleep(min(WAIT_POLL_S, max(0.0, deadline - now)))


# ------------------------------------------------------------------ manifest


def artifact_files(path: str, name: str) -> list[tuple[str, str]]:
    """[(source path, path in target)] of one artifact."""
    if os.path.isfile(path):
        return [(path, name)]
    files = []
    for folder, _dirs, names in os.walk(path):
        for file_name in names:
            full = os.path.join(folder, file_name)
            files.append((full, name + "/" + os.path.relpath(full, path).replace(os.sep, "/")))
    return sorted(files, key=lambda f: f[1])


def hashed(files: Iterable[tuple[str, str]]) -> list[Entry]:
    """[(source, rel, size, sha256)]; names sha256sum would have to escape are refused."""
    entries = []
    for source, rel in files:
        if "\n" in rel or "\\" in rel:
            raise PushError("cannot list %r in a sha256sum manifest (newline or backslash in the name)" % rel)
        entries.append((source, rel, os.path.getsize(source), sha256_file(source, "sha256 " + rel)))
    return entries


def manifest_text(entries: Iterable[Entry]) -> str:
    return "".join("%s  %s\n" % (digest, rel) for _src, rel, _size, digest in entries)


# ------------------------------------------------------------------ retries


def with_retries(attempt: Callable[[], T], retries: int, backoff: float) -> T:
    """attempt() up to `retries` times, waiting backoff, 2*backoff, ... between tries."""
    for n in range(1, retries + 1):
        try:
            return attempt()
        except (PushError, Refused):
            raise  # decided already: a retry would get the same answer
        except Exception as e:  # a flaky disk, mount or hub: anything else is worth another try
            reason = getattr(e, "reason", None) or "%s: %s" % (type(e).__name__, one_line(e))
            if n == retries:
                raise PushError("gave up after %d attempts: %s" % (retries, reason)) from None
            print("PUSH_RETRY %d/%d: %s" % (n, retries, reason))
            time.sleep(backoff * 2 ** (n - 1))
    raise PushError("--retries must be at least 1")  # as run() checks first: no attempt, no result


# ------------------------------------------------------------------ dir: targets


def copy_atomic(source: str, target: str, label: str) -> None:
    """Copy beside target, fsync, then rename: a reader never sees half a file."""
    os.makedirs(os.path.dirname(target), exist_ok=True)
    progress = Progress(label, os.path.getsize(source))

    def blocks() -> Iterator[bytes]:
        done = 0
        with open(source, "rb") as src:
            for block in iter(lambda: src.read(CHUNK), b""):
                done += len(block)
                progress.update(done)
                yield block

    write_atomic(target, blocks(), os.stat(source).st_mode & 0o777, sync=True, tag="push-tmp")


def verify_dir(root: str, entries: Iterable[Entry], manifest_path: str, text: str) -> bool:
    """Re-hash every copy against the manifest; PUSH_BAD for each that differs."""
    bad = []
    for _src, rel, size, digest in entries:
        path = os.path.join(root, *rel.split("/"))
        if not os.path.isfile(path) or os.path.getsize(path) != size or sha256_file(path, "verify " + rel) != digest:
            bad.append(path)
    try:
        with open(manifest_path) as f:
            if f.read() != text:
                bad.append(manifest_path)
    except OSError:
        bad.append(manifest_path)
    for path in bad:
        print("PUSH_BAD %s" % path)
    return not bad


def push_dir(root: str, entries: list[Entry], manifest_name: str, retries: int, backoff: float) -> str | None:
    """Copy every file into root (a retry skips those already copied), then the manifest."""
    pending = list(entries)
    text = manifest_text(entries)
    manifest_path = os.path.join(root, manifest_name)

    def attempt() -> None:
        os.makedirs(root, exist_ok=True)
        while pending:
            source, rel = pending[0][0], pending[0][1]
            copy_atomic(source, os.path.join(root, *rel.split("/")), "copy " + rel)
            pending.pop(0)
        write_atomic(manifest_path, text, sync=True, tag="push-tmp")

    with_retries(attempt, retries, backoff)
    if not verify_dir(root, entries, manifest_path, text):
        return None
    return manifest_path


# ------------------------------------------------------------------ hf: targets


class HubRetry(Exception):
    """A hub failure worth another try, its text already free of the token."""

    def __init__(self, reason: str) -> None:
        Exception.__init__(self, reason)
        self.reason = reason


def hub_attempt(call: Callable[[], T], token: str) -> Callable[[], T]:
    """call() with the hub's answers sorted: refused -> Refused, a bad token or another 4xx (no
    such repo, a bad request) -> PushError, anything else -> HubRetry (retried by with_retries)."""
    from . import hub  # only hf: targets need it

    def attempt() -> T:
        try:
            return call()
        except Exception as e:  # the client raises many types; none may become a traceback
            kind = hub.classify(e)
            if kind == "refused":
                raise Refused(hub.described(e, token)) from None
            if kind == "auth":
                raise PushError("the hub refused the token (%s)" % hub.described(e, token)) from None
            if kind == "fatal" and 400 <= (hub.status_of(e) or 0) < 500:
                raise PushError("the hub refused the request (%s)" % hub.described(e, token)) from None
            raise HubRetry("%s: %s" % (type(e).__name__, hub.message(e, token))) from None
    return attempt


def remote_matches(info: Any, size: int, digest: str, source: str) -> bool:
    """Whether the hub's entry is our file: its size, and its sha256 (LFS) or git blob id."""
    from . import hub

    if info is None or getattr(info, "size", None) != size:
        return False
    lfs = getattr(info, "lfs", None)
    if lfs is not None:
        return getattr(lfs, "sha256", None) == digest
    return getattr(info, "blob_id", None) == hub.git_blob_id_of(source, size)


def hf_verify(api: Any, repo: str, entries: list[Entry], token: str, retries: int, backoff: float) -> bool:
    """Every uploaded file as the hub lists it: size, and sha256 or git blob id."""
    paths = [rel for _s, rel, _z, _d in entries]
    infos = with_retries(hub_attempt(lambda: api.get_paths_info(repo, paths, repo_type="model", token=token),
                                     token), retries, backoff)
    by_path = dict((getattr(info, "path", None), info) for info in infos)
    ok = True
    for source, rel, size, digest in entries:
        if not remote_matches(by_path.get(rel), size, digest, source):
            print("PUSH_BAD hf:%s/%s" % (repo, rel))
            ok = False
    return ok


def hf_client(auth_env: str) -> tuple[Any, str]:
    """(HfApi(), token), checked before any waiting: a push that cannot happen fails at once."""
    token = os.environ.get(auth_env)
    if not token:
        raise PushError("%s is not set" % auth_env)
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # bars redraw with \r: noise in a log file
    try:
        from huggingface_hub import HfApi  # only hf: targets need it
    except ImportError:
        raise PushError("huggingface_hub is not installed on the box (pip install huggingface_hub)") from None
    return HfApi(), token


def upload_all(api: Any, token: str, repo: str, artifacts: Iterable[tuple[str, str]], entries: list[Entry],
               manifest_name: str, retries: int, backoff: float) -> None:
    """Every artifact, then the manifest, into repo; Refused when the repo will not take them."""
    for path, name in artifacts:
        if os.path.isdir(path):
            call = lambda p=path, n=name: api.upload_folder(
                folder_path=p, path_in_repo=n, repo_id=repo, repo_type="model", token=token,
                commit_message="push %s" % n)
        else:
            call = lambda p=path, n=name: api.upload_file(
                path_or_fileobj=p, path_in_repo=n, repo_id=repo, repo_type="model", token=token,
                commit_message="push %s" % n)
        with_retries(hub_attempt(call, token), retries, backoff)
        print("uploaded %s to hf:%s" % (name, repo))
    text = manifest_text(entries).encode()
    with_retries(hub_attempt(lambda: api.upload_file(
        path_or_fileobj=text, path_in_repo=manifest_name, repo_id=repo, repo_type="model", token=token,
        commit_message="push " + manifest_name), token), retries, backoff)


def push_hf(api: Any, token: str, repo: str, fallback: str | None, artifacts: Iterable[tuple[str, str]],
            entries: list[Entry], manifest_name: str, retries: int, backoff: float) -> str | None:
    """Upload to repo, or to fallback when repo refuses; verified where it landed."""
    try:
        upload_all(api, token, repo, artifacts, entries, manifest_name, retries, backoff)
    except Refused as e:
        if not fallback:
            raise PushError("hf:%s refused the upload (%s) and there is no --fallback" % (repo, e)) from None
        print("PUSH_FALLBACK hf:%s refused the upload (%s): pushing to hf:%s instead" % (repo, e, fallback))
        repo = fallback
        try:
            upload_all(api, token, repo, artifacts, entries, manifest_name, retries, backoff)
        except Refused as again:
            raise PushError("the fallback hf:%s refused the upload too (%s)" % (repo, again)) from None
    if not hf_verify(api, repo, entries, token, retries, backoff):
        return None
    return "hf:%s/%s" % (repo, manifest_name)


# ------------------------------------------------------------------ command line


def target_arg(text: str) -> tuple[str, str]:
    kind, _, where = text.partition(":")
    if kind == "dir" and where:
        return kind, where
    if kind == "hf" and HF_REPO.match(where):
        return kind, where
    raise argparse.ArgumentTypeError("expected dir:/some/path or hf:owner/repo")


def fallback_repo(to: tuple[str, str], fallback: tuple[str, str] | None) -> str | None:
    """The fallback's repo (or None), which only an hf: target to another repo can have."""
    if fallback is None:
        return None
    if to[0] != "hf" or fallback[0] != "hf":
        raise PushError("--fallback is for hf: targets, and is one itself (hf:owner/repo)")
    if fallback[1] == to[1]:
        raise PushError("--fallback names the same repo as --to")
    return fallback[1]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="push.py", description="Wait for artifacts to be complete, then push them with a sha256 manifest.",
        epilog="Exit codes: 0 pushed and verified, 1 failed, 2 bad usage.")
    parser.add_argument("--to", required=True, type=target_arg, metavar="TARGET",
                        help="dir:/some/path (copied into that folder) or hf:owner/repo (uploaded; needs HF_TOKEN)")
    parser.add_argument("--fallback", type=target_arg, metavar="hf:OWNER/REPO",
                        help="for an hf: target: where to push instead when the first repo refuses the upload "
                             "(full, read-only, over its LFS quota)")
    parser.add_argument("--auth-env", default="HF_TOKEN", metavar="NAME",
                        help="the environment variable holding the hub token (default HF_TOKEN; never printed)")
    parser.add_argument("--wait-timeout", type=float, default=600.0, metavar="S",
                        help="how long, in all, to wait for the artifacts to be complete (default 600)")
    parser.add_argument("--stable", type=float, default=2.0, metavar="S",
                        help="an artifact is complete once unchanged for this long (default 2)")
    parser.add_argument("--retries", type=int, default=5, metavar="N", help="attempts at the copy (default 5)")
    parser.add_argument("--backoff", type=float, default=2.0, metavar="S",
                        help="delay after the first failed attempt, doubled after each (default 2)")
    parser.add_argument("--manifest", default="MANIFEST.sha256", metavar="NAME",
                        help="name of the manifest written into the target (default MANIFEST.sha256)")
    parser.add_argument("artifacts", nargs="+", metavar="ARTIFACT",
                        help="file or folder, relative to the current folder")
    return parser


def run(args: argparse.Namespace) -> int:
    kind, where = args.to
    if args.retries < 1:
        raise PushError("--retries must be at least 1")
    if "/" in args.manifest or args.manifest in ("", ".", ".."):
        raise PushError("--manifest is a file name, not a path")
    fallback = fallback_repo(args.to, args.fallback)
    artifacts = [(path, target_name(path)) for path in args.artifacts]
    api, token = hf_client(args.auth_env) if kind == "hf" else (None, "")
    deadline = time.monotonic() + args.wait_timeout
    for path, _name in artifacts:
        wait_until_complete(path, deadline, args.stable, args.wait_timeout)
    files: list[tuple[str, str]] = []
    for path, name in artifacts:
        files.extend(artifact_files(path, name))
    entries = hashed(files)
    print("pushing %d files, %s, to %s:%s" % (len(entries), human(sum(e[2] for e in entries)), kind, where))
    if kind == "dir":
        manifest = push_dir(where, entries, args.manifest, args.retries, args.backoff)
    else:
        manifest = push_hf(api, token, where, fallback, artifacts, entries, args.manifest, args.retries,
                           args.backoff)
    if manifest is None:
        return 1
    print("PUSH_DONE %d files %d bytes manifest=%s" % (len(entries), sum(e[2] for e in entries), manifest))
    return 0


def main(argv: list[str] | None = None) -> int:
    # the log is a file: each line must land as it is printed
    cast(io.TextIOWrapper, sys.stdout).reconfigure(line_buffering=True)
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except PushError as e:
        print("%s %s" % (e.marker, e))
        return 1
    except OSError as e:
        print("PUSH_FAIL %s" % one_line(e))
        return 1


if __name__ == "__main__":
    sys.exit(main())
