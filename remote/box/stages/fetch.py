"""Fetch files onto the box: one fetch per file at a time, resumable, checked, never half-written.

Runs ON the box as a stage (`python3 -m samai_box.stages.fetch ...`); stdout is the stage log.
Standard library only, Python >= 3.8. Its parts: locks.py (one writer per output), transfer.py
(ranges, retries, sha256, progress; shared with push), archives.py (safe extraction, layout).

  fetch file     --url URL --out PATH [--sha256 HEX] [--size N] [--range START-END]
  fetch manifest --url MANIFEST_URL --dest DIR
  fetch tar      --url URL --dest DIR --expect REL_PATH [--sha256 HEX] [--size N]
                 [--archive PATH] [--keep-archive]
  fetch hf       --repo ORG/NAME --dest DIR [--revision REV] [--include GLOB ...]
                 [--repo-type model|dataset|space]
  common options: [--wait SECONDS] [--auth-env NAME] [--backoff SECONDS]

Markers (the first word of a line): FETCH_DONE (the command's result), FETCH_FILE (one file of a
manifest or the tar's archive), FETCH_BUSY, FETCH_RETRY n/5, SHA_MISMATCH, FETCH_FLATTENED,
TAR_LAYOUT, TAR_UNSAFE, FETCH_FAIL.
Exit codes: 0 done, 1 failed, 2 bad usage, 75 busy (another fetch holds the output's lock).

Why each rule (playbook §3):
- Two `curl -C -` on one file interleaved it into garbage: every output file has an flock, and
  the download goes to PATH.part, renamed to PATH only once it is complete and checked.
- Only a slice of a big file is sometimes needed: --range fetches exactly START..END (inclusive,
  like `curl -r`) and asserts its length.
- Release tarballs nest their tree (bin/bin/llama-server): after extracting, the expected
  executable must exist, else the nested tree is flattened into place.
- Every download is checked: size and sha256 when given; a file that fails is moved to PATH.bad
  so nothing downstream picks it up.
- A manifest's names are untrusted: one that leaves DIR or holds a control character is refused
  before anything is written, and each file is written from DIR's descriptor, folder by folder
  without following a symlink (fetch_inside): a symlink in DIR cannot lead a write out of it.

Locks: PATH.lock for each output file (a manifest locks file by file, so it also keeps out of
the way of a single-file fetch of one of its files); `tar` also holds DIR.lock while it
extracts. A lock file holds its holder's pid and is removed on release.
`hf` downloads a Hugging Face Hub repo through huggingface_hub.snapshot_download (from the box
venv: `venv/bin/python -m samai_box.stages.fetch hf ...`; see hub.py): it holds DIR.lock, checks
every name the hub lists before writing anything, and checks every file against the hub's
metadata (size; sha256 for LFS files, the git blob id for the others). Its token comes from
--auth-env only (without it the fetch is anonymous). 'private' is not a repo type: privacy is a
property of the repo, and the token decides access.
Retries: transient failures (connection refused or reset, a stalled read, HTTP 5xx/408/429) are
retried 5 times in a row with backoff, resuming each time; a retry after progress starts the
count again. The archive of `tar` is downloaded beside DIR and removed once extracted (unless
--keep-archive); a file:// archive is read where it is and never removed.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import posixpath
import re
import shutil
import sys
import tempfile
import urllib.parse
import urllib.request
from typing import Any, Callable, Container, cast

from ..confine import Escape, regular_or_absent, working_in
from .archives import ensure_layout, extract_safely, is_executable, move_into, remove_stale_staging
from .locks import Busy, exclusive
from .transfer import (
    FetchError,
    Transient,
    Unsatisfiable,
    download,
    human,
    one_line,
    open_source,
    retrying,
    sha256_file,
    shown,
)

EXIT_BUSY = 75  # EX_TEMPFAIL: try again later
MANIFEST_LIMIT = 16 * 1024 * 1024
SCHEMES = ("http", "https", "file")
REPO_TYPES = ("model", "dataset", "space")
HF_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


def quarantine(path: str, out: str) -> str:
    bad = out + ".bad"
    os.replace(path, bad)
    return bad


def check_content(path: str, name: str, sha256: str | None, want: int | None) -> tuple[int, str]:
    """(size, sha256) of path; SHA_MISMATCH (naming `name`) when either is not what we expect."""
    size = os.path.getsize(path)
    if want is not None and size != want:
        raise FetchError("%s expected size=%d got size=%d" % (name, want, size), "SHA_MISMATCH")
    digest = sha256_file(path, "sha256 " + os.path.basename(name))
    if sha256 and digest != sha256:
        raise FetchError("%s expected %s got %s" % (name, sha256, digest), "SHA_MISMATCH")
    return size, digest


def verify(path: str, out: str, sha256: str | None, want: int | None, name: str) -> tuple[int, str]:
    """check_content of a finished download (`name`: out as printed); one that fails is moved to OUT.bad."""
    try:
        return check_content(path, name, sha256, want)
    except FetchError:
        quarantine(path, out)
        raise


def already_present(out: str, sha256: str | None, want: int | None, name: str) -> bool:
    """True when out is there and passes the checks we have; a failing one is moved aside."""
    if not os.path.isfile(out):
        return False
    if want is not None and os.path.getsize(out) != want:
        held = os.path.getsize(out)
        quarantine(out, out)
        print("%s is there but holds %d bytes, not %d: moved to %s.bad" % (name, held, want, name))
        return False
    if sha256 and sha256_file(out, "sha256 " + os.path.basename(out)) != sha256:
        quarantine(out, out)
        print("%s is there but its sha256 differs: moved to %s.bad" % (name, name))
        return False
    return True


def expected_length(size: int | None, span: tuple[int, int] | None) -> int | None:
    if span is None:
        return size
    length = span[1] - span[0] + 1
    if size is not None and size != length:
        raise FetchError("--size %d disagrees with --range %d-%d (%d bytes)" % (size, span[0], span[1], length))
    return length


def local_source(url: str) -> str | None:
    """The path a file:// URL names, else None."""
    parts = urllib.parse.urlsplit(url)
    return urllib.request.url2pathname(parts.path) if parts.scheme == "file" else None


def same_path(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def fetch_file(url: str, out: str, sha256: str | None = None, size: int | None = None,
               span: tuple[int, int] | None = None, wait_s: float = 0, token: str | None = None, backoff: float = 1.0,
               marker: str = "FETCH_DONE", name: str | None = None) -> int:
    """Fetch url (or its span) into out, under out's lock. Returns the size of out. What is
    printed calls out `name` (default: out itself; see fetch_inside)."""
    name = name or out
    if os.path.isdir(out):
        raise FetchError("%s is a folder" % name)
    source = local_source(url)
    if source and same_path(source, out):
        raise FetchError("%s is the source file itself" % name)  # a failed check would move the source away
    parent = os.path.dirname(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    want = expected_length(size, span)
    with exclusive(out + ".lock", wait_s, name):
        if already_present(out, sha256, want, name):
            print("%s %s (already present)" % (marker, name))
            return os.path.getsize(out)
        what = shown(url) + ("" if span is None else " bytes %d-%d" % span)
        print("fetch %s -> %s" % (what, name))
        part = out + ".part"
        download(url, part, span, want, token, backoff, "fetch " + os.path.basename(out))
        got, digest = verify(part, out, sha256, want, name)
        os.replace(part, out)
    print("%s %s size=%d sha256=%s" % (marker, name, got, digest))
    return got


def fetch_inside(folder: str, rel: str, url: str, sha256: str | None, size: int | None, wait_s: float,
                 token: str | None, backoff: float, marker: str, name: str) -> int:
    """fetch_file into folder/rel, where rel comes from an untrusted list (a manifest): its
    folders are reached (and made) from folder's descriptor without following a symlink, and
    the fetch runs from inside the last one on bare names (confine.working_in), so no symlink
    on the way, there before or planted while it runs, leads a write out of folder. A refusal
    names `name`, the path as the log shows it."""
    try:
        with working_in(folder, rel, create=True) as own:
            for beside in (own, own + ".part", own + ".lock"):  # a link there before: refused, said clearly
                regular_or_absent(None, beside)
            return fetch_file(url, own, sha256, size, None, wait_s, token, backoff, marker, name)
    except (Escape, OSError) as e:
        raise FetchError("%s: %s" % (name, one_line(e))) from None


# ------------------------------------------------------------------ manifests


def check_relpath(rel: Any) -> str:
    """A relative POSIX path that stays inside its folder, or FetchError."""
    parts = rel.split("/") if isinstance(rel, str) else []
    if not rel or rel.startswith("/") or "\\" in rel or any(p in ("", ".", "..") for p in parts):
        raise FetchError("refusing path %r: it must be relative and stay inside the folder" % (rel,))
    if not rel.isprintable():  # a newline would forge a log line, an ESC rewrite a terminal, a NUL cut the name
        raise FetchError("refusing path %r: a name with a control or invisible character" % (rel,))
    return rel


def read_small(url: str, token: str | None, backoff: float) -> bytes:
    def attempt() -> bytes:
        source = open_source(url, 0, None, token)
        try:
            data = source.read(MANIFEST_LIMIT + 1)
        finally:
            source.close()
        if len(data) > MANIFEST_LIMIT:
            raise FetchError("%s is larger than %s" % (shown(url), human(MANIFEST_LIMIT)))
        if source.length is not None and len(data) < source.length:
            raise Transient("connection closed %d bytes short" % (source.length - len(data)))
        return data
    try:
        return retrying(attempt, backoff)
    except Unsatisfiable:
        raise FetchError("%s: server answered 416" % shown(url)) from None


def manifest_entries(data: bytes, url: str) -> list[tuple[str, int, str]]:
    """[(path, size, sha256)] from {"files": [{"path", "size", "sha256"}]}, all checked first."""
    try:
        files = json.loads(data.decode("utf-8"))["files"]
        entries = [(f["path"], f["size"], f["sha256"]) for f in files]
    except (ValueError, KeyError, TypeError) as e:
        raise FetchError("%s is not a manifest ({\"files\": [{\"path\", \"size\", \"sha256\"}]}): %s"
                         % (shown(url), one_line(e))) from None
    for rel, size, sha256 in entries:
        check_relpath(rel)
        if not isinstance(size, int) or size < 0 or not re.match(r"^[0-9a-fA-F]{64}$", str(sha256)):
            raise FetchError("manifest entry %r needs an integer size and a 64-hex sha256" % (rel,))
    return [(rel, size, sha256.lower()) for rel, size, sha256 in entries]


def fetch_manifest(url: str, dest: str, wait_s: float, token: str | None, backoff: float) -> None:
    """Every file of the manifest into dest. Locks are per file (FILE.lock), so a manifest run
    and a single-file fetch of one of its files also keep out of each other's way."""
    entries = manifest_entries(read_small(url, token, backoff), url)
    print("manifest %s: %d files, %s" % (shown(url), len(entries), human(sum(e[1] for e in entries))))
    os.makedirs(dest, exist_ok=True)
    total = 0
    for rel, size, sha256 in entries:
        file_url = urllib.parse.urljoin(url, urllib.parse.quote(rel))
        total += fetch_inside(dest, rel, file_url, sha256, size, wait_s, token, backoff, "FETCH_FILE",
                              os.path.join(dest, *rel.split("/")))
    print("FETCH_DONE %s files=%d bytes=%d" % (dest, len(entries), total))


# ------------------------------------------------------------------ tarballs


def default_archive(url: str, dest: str) -> str:
    name = posixpath.basename(urllib.parse.urlsplit(url).path) or "download.tar"
    return os.path.join(os.path.dirname(os.path.abspath(dest)), name)


def check_local_archive(path: str, sha256: str | None, size: int | None) -> None:
    """A file:// archive is read where it lies (never copied, never removed), checked all the same."""
    if not os.path.isfile(path):
        raise FetchError("no such archive: %s" % path)
    got, digest = check_content(path, path, sha256, size)
    print("FETCH_FILE %s size=%d sha256=%s (local)" % (path, got, digest))


def fetch_tar(url: str, dest: str, expect: str, sha256: str | None, size: int | None, wait_s: float, token: str | None,
              backoff: float, archive: str | None = None, keep_archive: bool = False) -> None:
    """Download the archive (next to dest unless --archive; a file:// archive is read in place),
    extract it safely into a staging folder inside dest, fix its layout there, then move its
    entries into dest."""
    check_relpath(expect)
    dest = dest.rstrip("/") or "/"
    local = local_source(url) if archive is None else None
    archive = local or archive or default_archive(url, dest)
    if same_path(archive, dest):
        raise FetchError("the archive would overwrite %s: pass --archive" % dest)
    os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
    with exclusive(dest + ".lock", wait_s, dest):
        if is_executable(os.path.join(dest, expect)):
            print("FETCH_DONE %s expect=%s (already present)" % (dest, expect))
            return
        if local:
            check_local_archive(local, sha256, size)
        else:
            fetch_file(url, archive, sha256, size, None, wait_s, token, backoff, marker="FETCH_FILE")
        os.makedirs(dest, exist_ok=True)
        remove_stale_staging(dest)
        staging = tempfile.mkdtemp(prefix=".extract-", dir=dest)
        try:
            names = extract_safely(archive, staging)
            ensure_layout(staging, expect, names)
            move_into(staging, dest)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        if not (keep_archive or local):
            os.unlink(archive)  # playbook §4: intermediate files go as soon as they are used
    print("FETCH_DONE %s expect=%s files=%d" % (dest, expect, len(names)))


# ------------------------------------------------------------------ command line


def sha256_arg(text: str) -> str:
    if not re.match(r"^[0-9a-fA-F]{64}$", text):
        raise argparse.ArgumentTypeError("expected 64 hex digits")
    return text.lower()


def size_arg(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError("expected a byte count")
    return int(text)


def range_arg(text: str) -> tuple[int, int]:
    m = re.match(r"^(\d+)-(\d+)$", text)
    if not m or int(m.group(2)) < int(m.group(1)):
        raise argparse.ArgumentTypeError("expected START-END with END >= START (inclusive, like curl -r)")
    return int(m.group(1)), int(m.group(2))


def url_arg(text: str) -> str:
    if urllib.parse.urlsplit(text).scheme not in SCHEMES:
        raise argparse.ArgumentTypeError("expected an http://, https:// or file:// URL")
    return text


def repo_arg(text: str) -> str:
    if not HF_REPO.match(text) or ".." in text:
        raise argparse.ArgumentTypeError("expected ORG/NAME")
    return text


def repo_type_arg(text: str) -> str:
    if text in REPO_TYPES:
        return text
    if text.lower() == "private":
        raise argparse.ArgumentTypeError(
            "'private' is not a repo type: privacy is a property of the repo on the hub, and the token "
            "(--auth-env) decides what may be read; the type is model, dataset or space")
    raise argparse.ArgumentTypeError("%r is not a repo type: expected model, dataset or space" % text)


def fetch_repo(args: argparse.Namespace, token: str | None) -> None:
    """`fetch hf`, under DIR.lock like the other modes (hub.py does the rest)."""
    from .hub import fetch_hf  # only this mode needs huggingface_hub, from the box venv
    dest = args.dest.rstrip("/") or "/"
    os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
    with exclusive(dest + ".lock", args.wait, dest):
        os.makedirs(dest, exist_ok=True)
        fetch_hf(args.repo, dest, args.repo_type, args.revision, args.include, token, args.backoff)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fetch.py", description="Fetch files onto the box: locked per file, resumable, size/sha256 checked.",
        epilog="Exit codes: 0 done, 1 failed, 2 bad usage, 75 busy (another fetch holds the lock).")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--wait", type=float, default=0, metavar="SECONDS",
                        help="when another fetch holds the lock, wait this long for it (default: give up at once)")
    common.add_argument("--auth-env", metavar="NAME",
                        help="send 'Authorization: Bearer $NAME' (the value is never printed)")
    common.add_argument("--backoff", type=float, default=1.0, metavar="SECONDS",
                        help="first retry delay, doubled on each retry (default 1)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    one = sub.add_parser("file", parents=[common], help="one file (or a byte range of it)")
    one.add_argument("--url", required=True, type=url_arg)
    one.add_argument("--out", required=True, metavar="PATH", help="where the file goes (PATH.part while downloading)")
    one.add_argument("--sha256", type=sha256_arg, metavar="HEX", help="expected sha256 of the output")
    one.add_argument("--size", type=size_arg, metavar="N", help="expected size of the output in bytes")
    one.add_argument("--range", type=range_arg, metavar="START-END",
                     help="only bytes START..END inclusive (like curl -r); the output is just that slice")

    many = sub.add_parser("manifest", parents=[common], help="every file a JSON manifest lists")
    many.add_argument("--url", required=True, type=url_arg,
                      help='URL of {"files": [{"path", "size", "sha256"}]}; paths are relative to its folder')
    many.add_argument("--dest", required=True, metavar="DIR")

    tar = sub.add_parser("tar", parents=[common], help="a tarball, extracted safely, with its layout checked")
    tar.add_argument("--url", required=True, type=url_arg)
    tar.add_argument("--dest", required=True, metavar="DIR")
    tar.add_argument("--expect", required=True, metavar="REL_PATH",
                     help="executable that must end up at DIR/REL_PATH (a nested tree is flattened to get it)")
    tar.add_argument("--sha256", type=sha256_arg, metavar="HEX", help="expected sha256 of the archive")
    tar.add_argument("--size", type=size_arg, metavar="N", help="expected size of the archive")
    tar.add_argument("--archive", metavar="PATH", help="where the archive is downloaded (default: beside DIR)")
    tar.add_argument("--keep-archive", action="store_true", help="keep the archive after extracting it")

    hf = sub.add_parser("hf", parents=[common], help="a Hugging Face Hub repo (huggingface_hub, from the box venv)")
    hf.add_argument("--repo", required=True, type=repo_arg, metavar="ORG/NAME")
    hf.add_argument("--dest", required=True, metavar="DIR", help="the repo's files land here, under their paths")
    hf.add_argument("--revision", metavar="REV", help="branch, tag or commit (default: main)")
    hf.add_argument("--include", nargs="+", metavar="GLOB", help="only the files matching one of these globs")
    hf.add_argument("--repo-type", type=repo_type_arg, default="model", metavar="TYPE",
                    help="model (default), dataset or space")
    return parser


def bearer_token(name: str | None) -> str | None:
    if not name:
        return None
    value = os.environ.get(name)
    if not value:
        raise FetchError("environment variable %s is not set" % name)
    return value


def run(args: argparse.Namespace) -> None:
    token = bearer_token(args.auth_env)
    if args.command == "file":
        fetch_file(args.url, args.out, args.sha256, args.size, args.range, args.wait, token, args.backoff)
    elif args.command == "hf":
        fetch_repo(args, token)
    elif args.command == "manifest":
        fetch_manifest(args.url, args.dest, args.wait, token, args.backoff)
    else:
        fetch_tar(args.url, args.dest, args.expect, args.sha256, args.size, args.wait, token, args.backoff,
                  args.archive, args.keep_archive)


def reported(work: Callable[[], object], fail_marker: str = "FETCH_FAIL", markers: Container[str] | None = None) -> int:
    """work() run as a stage: a failure printed as one marker line (FetchError's own marker, when
    `markers` is None or lists it, else fail_marker) and returned as the exit code."""
    try:
        work()
    except Busy as e:
        print("FETCH_BUSY another fetch of %s is running (pid %s)" % (e.what, e.pid))
        return EXIT_BUSY
    except FetchError as e:
        print("%s %s" % (e.marker if markers is None or e.marker in markers else fail_marker, e))
        return 1
    except (Escape, OSError) as e:
        print("%s %s" % (fail_marker, one_line(e)))
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    # the log is a file: each line must land as it is printed
    cast(io.TextIOWrapper, sys.stdout).reconfigure(line_buffering=True)
    args = build_parser().parse_args(argv)
    return reported(lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
