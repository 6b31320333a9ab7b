"""The Hugging Face Hub side of the fetch and push stages: huggingface_hub's client, checked.

Runs ON the box, imported only by `fetch hf` and push's hf: targets (both import it where they use
it); huggingface_hub itself is imported lazily, from the box venv. Python >= 3.8.

fetch hf: the repo's listing is read first (repo info with its files' metadata) and every name in
it is checked before anything is written: the names come from the hub and are untrusted, so one
that could leave DEST ('../x', '/etc/passwd', a backslash, a control or invisible character, the client's own
.cache/huggingface folder) refuses the whole fetch. snapshot_download then runs pinned to the
commit the listing named, for exactly the listed names (escaped, so a '[' in a name is not a
glob), into DEST; every file is then checked against the listing: its size, and its sha256
where the hub has one (LFS files), else its git blob id (sha1 of "blob SIZE\\0" + content, what
the hub reports as a regular file's oid). The client resumes a cut body itself (Range); a
second run keeps the files already complete and removes what a killed run left half-written.
A symlink already on the way to a listed file refuses the fetch (the client writes by path), and
what the stage itself deletes or renames is reached without following one.
The client's progress bars are off (they redraw with \r); progress lines are measured on disk.

Errors are sorted the same way for both stages (classify): "auth" (HTTP 401: the token is
wrong), "refused" (HTTP 403 or 507, or the hub's storage-quota / read-only wording: the repo will
not take the upload), "transient" (network errors, 408, 429, 5xx) and "fatal" (anything else).
The token never appears in what is printed (redacted).
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
import stat
import threading
from typing import Any, Callable, Iterable, Sequence, TypeVar

from ..confine import Escape, open_parent
from .transfer import CHUNK, FetchError, Progress, Transient, human, one_line, retrying

TRANSIENT_STATUS = (408, 429, 500, 502, 503, 504)
REFUSED_STATUS = (403, 507)
REFUSAL_WORDS = ("storage limit", "quota", "read-only", "read only", "insufficient storage")
# Exception class names (anywhere in the MRO) of network failures in httpx, requests and the hub client.
NETWORK_ERRORS = ("ConnectError", "ConnectTimeout", "ReadTimeout", "TimeoutException", "NetworkError",
                  "RemoteProtocolError", "ProtocolError", "ChunkedEncodingError", "ConnectionError",
                  "LocalEntryNotFoundError", "ReadError", "WriteError")
CLIENT_DIR = ".cache/huggingface"  # where snapshot_download keeps its own metadata inside DEST
COMMIT = re.compile(r"^[0-9a-f]{40}$")
MESSAGE_LIMIT = 400
WATCH_S = 2.0  # how often the download's progress is measured on disk
T = TypeVar("T")  # what a hub call returns


def import_hub() -> Any:
    """huggingface_hub, with its progress bars off: they redraw with \\r, noise in a log file."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        import huggingface_hub
    except ImportError:
        raise FetchError("huggingface_hub is not installed for this python: run the stage with the box "
                         "venv's python (venv/bin/python -m samai_box.stages.fetch hf ...)") from None
    return huggingface_hub


# ------------------------------------------------------------------ errors


def redact(text: str, token: str | None) -> str:
    return text.replace(token, "***") if token else text


def message(error: BaseException, token: str | None) -> str:
    """One line, the token taken out, not too long."""
    text = redact(one_line(error), token)
    return text if len(text) <= MESSAGE_LIMIT else text[:MESSAGE_LIMIT] + "..."


def status_of(error: BaseException) -> int | None:
    status = getattr(getattr(error, "response", None), "status_code", None)
    return status if isinstance(status, int) else None


def classify(error: BaseException) -> str:
    """'auth', 'refused', 'transient' or 'fatal' for an exception out of huggingface_hub."""
    status = status_of(error)
    if status == 401:
        return "auth"
    if status in REFUSED_STATUS:
        return "refused"
    if status in TRANSIENT_STATUS:
        return "transient"
    text = str(error).lower()
    if any(word in text for word in REFUSAL_WORDS):
        return "refused"  # e.g. an LFS batch answering per object, inside a 200
    names = set(c.__name__ for c in type(error).__mro__)
    if status is None and (names & set(NETWORK_ERRORS) or "Consistency check failed" in str(error)):
        return "transient"
    return "fatal"


def described(error: BaseException, token: str | None) -> str:
    status = status_of(error)
    head = "HTTP %d: " % status if status else "%s: " % type(error).__name__
    return head + message(error, token)


def fetch_error(error: BaseException, token: str | None) -> Exception:
    """The FetchError (or Transient) for an exception out of huggingface_hub."""
    kind = classify(error)
    names = set(c.__name__ for c in type(error).__mro__)
    if kind == "transient":
        return Transient(described(error, token))
    if "RepositoryNotFoundError" in names:
        who = "the token may not read it" if token else "it is private and no token was given (--auth-env)"
        return FetchError("no such repo, or %s (%s)" % (who, described(error, token)))
    if kind == "auth":
        return FetchError("the hub refused the token (%s)" % described(error, token))
    if "RevisionNotFoundError" in names:
        return FetchError("no such revision (%s)" % described(error, token))
    return FetchError(described(error, token))


def hub_call(call: Callable[[], T], token: str | None, backoff: float) -> T:
    """call(), transient failures retried (FETCH_RETRY), every failure a FetchError."""
    def attempt() -> T:
        try:
            return call()
        except (FetchError, Transient):
            raise
        except Exception as e:  # the client raises many types; none may become a traceback
            raise fetch_error(e, token) from None
    return retrying(attempt, backoff)


# ------------------------------------------------------------------ names and the listing


def unsafe_reason(name: Any) -> str | None:
    """Why a file name from the hub must not be written under DEST, or None."""
    if not isinstance(name, str) or not name:
        return "not a name"
    if name.startswith("/") or "\\" in name or re.match(r"^[A-Za-z]:", name):
        return "absolute"
    if not name.isprintable():  # control characters, and the invisible ones (soft hyphen, bidi overrides)
        return "control or invisible character"
    if any(part in ("", ".", "..") for part in name.split("/")):
        return "empty, '.' or '..' segment"
    if name == CLIENT_DIR or name.startswith(CLIENT_DIR + "/"):
        return "inside the client's own metadata folder"
    return None


class RemoteFile:
    """One file of the listing: what the hub says it is."""

    def __init__(self, path: str, size: int, sha256: str | None, blob_id: str) -> None:
        self.path, self.size, self.sha256, self.blob_id = path, size, sha256, blob_id


def remote_file(sibling: Any) -> RemoteFile:
    """A RemoteFile from a sibling of repo info, or FetchError when the hub's answer is unusable."""
    name: Any = getattr(sibling, "rfilename", None)  # a str once unsafe_reason passes it
    reason = unsafe_reason(name)
    if reason:
        raise FetchError("refusing the repo: the hub lists a file named %r (%s)" % (name, reason))
    lfs = getattr(sibling, "lfs", None)
    size = getattr(sibling, "size", None)
    sha256 = getattr(lfs, "sha256", None) if lfs is not None else None
    blob_id = getattr(sibling, "blob_id", None)
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise FetchError("the hub gives no usable size for %r" % name)
    if lfs is not None and getattr(lfs, "size", None) != size:
        raise FetchError("the hub gives two sizes for the LFS file %r" % name)
    if lfs is not None and not (isinstance(sha256, str) and re.match(r"^[0-9a-f]{64}$", sha256)):
        raise FetchError("the hub gives no usable sha256 for the LFS file %r" % name)
    if not (isinstance(blob_id, str) and re.match(r"^[0-9a-f]{40}$", blob_id)):  # the hub gives every file one
        raise FetchError("the hub gives no usable blob id for %r" % name)
    return RemoteFile(name, size, sha256, blob_id)


def listing(api: Any, repo: str, repo_type: str, revision: str | None, token: str | None,
            backoff: float) -> tuple[str, list[RemoteFile]]:
    """(commit, [RemoteFile]) of repo at revision, every name checked."""
    info = hub_call(lambda: api.repo_info(repo, repo_type=repo_type, revision=revision, files_metadata=True),
                    token, backoff)
    commit = getattr(info, "sha", None)
    if not (isinstance(commit, str) and COMMIT.match(commit)):
        raise FetchError("the hub gives no commit id for %s at %s" % (repo, revision or "main"))
    siblings = getattr(info, "siblings", None) or []
    files = [remote_file(s) for s in siblings]
    if len(set(f.path for f in files)) != len(files):
        raise FetchError("the hub lists a file name twice")
    return commit, files


def matches(path: str, patterns: Sequence[str] | None) -> bool:
    """As the client filters: fnmatch, a pattern ending in '/' meaning everything below it."""
    if not patterns:
        return True
    return any(fnmatch.fnmatch(path, p + "*" if p.endswith("/") else p) for p in patterns)


def literal(name: str) -> str:
    """A glob that matches exactly name (its [, ], * and ? bracketed)."""
    return "".join("[%s]" % c if c in "[]*?" else c for c in name)


# ------------------------------------------------------------------ checking what landed


def git_blob_id_of(path: str, size: int) -> str:
    digest = hashlib.sha1(b"blob %d\0" % size)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def sha256_of(path: str, label: str) -> str:
    digest = hashlib.sha256()
    progress = Progress(label, os.path.getsize(path))
    done = 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            digest.update(block)
            done += len(block)
            progress.update(done)
    return digest.hexdigest()


def mismatch(path: str, remote: RemoteFile) -> tuple[str | None, str | None]:
    """Why the downloaded file differs from the listing, or None; and the line describing it."""
    if os.path.islink(path) or not os.path.isfile(path):
        return "missing", None
    size = os.path.getsize(path)
    if size != remote.size:
        return "expected size=%d got size=%d" % (remote.size, size), None
    if remote.sha256:
        digest = sha256_of(path, "verify " + remote.path)
        if digest != remote.sha256:
            return "expected sha256=%s got sha256=%s" % (remote.sha256, digest), None
        return None, "size=%d sha256=%s" % (size, digest)
    blob = git_blob_id_of(path, size)
    if blob != remote.blob_id:
        return "expected git-blob=%s got git-blob=%s" % (remote.blob_id, blob), None
    return None, "size=%d git-blob=%s" % (size, blob)


def check_files(dest: str, files: list[RemoteFile]) -> None:
    """FETCH_FILE for each file that matches the listing, SHA_MISMATCH (and PATH.bad) for each
    that does not; FetchError when any failed."""
    bad = 0
    for remote in files:
        path = os.path.join(dest, *remote.path.split("/"))
        why, line = mismatch(path, remote)
        if why is None:
            print("FETCH_FILE %s %s" % (path, line))
            continue
        bad += 1
        try:
            if moved_aside(dest, remote.path):
                why += ", moved to %s.bad" % path
        except (Escape, OSError) as e:
            why += ", not moved: %s" % one_line(e)
        print("SHA_MISMATCH %s %s" % (path, why))
    if bad:
        raise FetchError("%d of %d files do not match the hub's listing" % (bad, len(files)), "FETCH_FAIL")


def refuse_symlinked_folders(dest: str, files: Iterable[RemoteFile]) -> None:
    """FetchError when a folder on the way to a listed file (or the file itself) is a symlink
    already there: the client writes by path, and would write wherever it points."""
    for remote in files:
        parts = remote.path.split("/")
        for n in range(1, len(parts) + 1):
            on_the_way = os.path.join(dest, *parts[:n])
            if os.path.islink(on_the_way):
                raise FetchError("%s is a symlink: refused, files are written only inside %s" % (on_the_way, dest),
                                 "FETCH_FAIL")


def moved_aside(dest: str, relpath: str) -> bool:
    """Rename DEST/RELPATH to RELPATH.bad inside its own folder, reached from DEST folder by folder
    without following a symlink (Escape for a symlinked folder on the way: the rename would land
    outside DEST); False when it is no regular file."""
    folder, name = open_parent(dest, relpath)
    try:
        if not stat.S_ISREG(os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode):
            return False
        os.replace(name, name + ".bad", src_dir_fd=folder, dst_dir_fd=folder)
        return True
    finally:
        os.close(folder)


# ------------------------------------------------------------------ leftovers of a killed run

# huggingface_hub >= 1.x downloads into SHORTHASH.ETAG.UNIQUE.incomplete, unique per process and
# removed on failure, but a killed run leaves it behind and no later run reads it again: a
# multi-GB orphan on a disk with no room for one (playbook section 4). Older clients resume from
# SHORTHASH.ETAG.incomplete: those are kept.
ORPHAN = re.compile(r"^[^.]+\.[0-9a-f]+\.[0-9a-f]{8}\.incomplete$")


def remove_orphans(dest: str) -> None:
    """Remove the partial downloads a killed run left; the caller holds DEST.lock, so no live
    fetch of ours is writing them."""
    count, size = 0, 0
    top = os.path.join(dest, *CLIENT_DIR.split("/"))
    parts = CLIENT_DIR.split("/")
    if any(os.path.islink(os.path.join(dest, *parts[:n])) for n in range(1, len(parts) + 1)):
        # os.walk would follow it, and delete what lies wherever it points
        print("partial downloads not looked for: %s is reached through a symlink" % top)
        return
    for folder, _dirs, names in os.walk(top):
        for name in names:
            if ORPHAN.match(name):
                path = os.path.join(folder, name)
                try:
                    size += os.path.getsize(path)
                    os.unlink(path)
                    count += 1
                except OSError:
                    pass
    if count:
        print("removed %d partial download(s) an interrupted run left (%s)" % (count, human(size)))


# ------------------------------------------------------------------ progress


def landed_bytes(dest: str, files: Iterable[RemoteFile]) -> int:
    """Bytes on disk so far: the files already in place and the client's partial downloads."""
    done = 0
    for remote in files:
        path = os.path.join(dest, *remote.path.split("/"))
        try:
            done += min(os.path.getsize(path), remote.size)
        except OSError:
            pass
    for folder, _dirs, names in os.walk(os.path.join(dest, *CLIENT_DIR.split("/"))):
        for name in names:
            if name.endswith(".incomplete"):
                try:
                    done += os.path.getsize(os.path.join(folder, name))
                except OSError:
                    pass  # renamed into place between the listing and the stat
    return done


class Watcher(threading.Thread):
    """Progress lines for the log while the client downloads (its own bars are off: see
    import_hub), measured on disk, so it works with any version of the client."""

    def __init__(self, label: str, dest: str, files: list[RemoteFile]) -> None:
        threading.Thread.__init__(self, daemon=True)
        self.dest, self.files = dest, files
        self.progress = Progress(label, sum(f.size for f in files), landed_bytes(dest, files))
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(WATCH_S):
            self.progress.update(landed_bytes(self.dest, self.files))

    def __enter__(self) -> Watcher:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.join()
        # Measured once more at the end: the client writes in 10 MiB pieces, and a download of a
        # few seconds could fall between two measures and leave no line at all.
        self.progress.update(landed_bytes(self.dest, self.files))


# ------------------------------------------------------------------ fetch hf


def fetch_hf(repo: str, dest: str, repo_type: str, revision: str | None, include: Sequence[str] | None,
             token: str | None, backoff: float) -> None:
    """Every listed file of repo at revision (those matching include) into dest, checked.
    The caller holds dest's lock."""
    hub = import_hub()
    auth = token or False  # no --auth-env: anonymous, never a token found lying around
    api = hub.HfApi(token=auth)
    commit, files = listing(api, repo, repo_type, revision, token, backoff)
    chosen = [f for f in files if matches(f.path, include)]
    if not chosen:
        raise FetchError("no file of %s at %s matches --include %s" % (repo, commit, " ".join(include or [])))
    total = sum(f.size for f in chosen)
    print("hub %s (%s) at %s: %d of %d files, %s" % (repo, repo_type, commit, len(chosen), len(files), human(total)))
    refuse_symlinked_folders(dest, chosen)
    remove_orphans(dest)
    with Watcher("fetch " + repo, dest, chosen):
        hub_call(lambda: hub.snapshot_download(repo, repo_type=repo_type, revision=commit, local_dir=dest,
                                               allow_patterns=[literal(f.path) for f in chosen], token=auth),
                 token, backoff)
    check_files(dest, chosen)
    print("FETCH_DONE %s repo=%s revision=%s files=%d bytes=%d" % (dest, repo, commit, len(chosen), total))
