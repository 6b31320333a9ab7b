"""The restore stage: pull back what a push shipped (a GGUF with its sha256 manifest, reports), so
a rebuilt box serves in minutes instead of downloading the base again and retraining (§4.5).

Runs ON the box as a stage (`python3 -m samai_box.stages.restore ...`); stdout is the stage log.
Standard library only, Python >= 3.8.

  restore --from dir:/some/path|hf:owner/repo|URL [--from ...] [--revision REV] [--manifest NAME]
          [--satisfies STAGE,...] [--wait S] [--auth-env NAME] [--backoff S] ARTIFACT...

The store is what push wrote: its files under their relative paths, and the manifest (sha256sum
format, MANIFEST.sha256) beside them. hf:owner/repo reads the Hub's resolve URLs
($HF_ENDPOINT/owner/repo/resolve/REV/PATH). With more than one --from (a push's target and its
--fallback), the first store whose manifest lists every ARTIFACT is the one read. Each ARTIFACT
is a file, or a folder whose files the manifest lists, by the relative path push gave it; it
lands at that path under the current folder (the workspace) with the fetch stage's rules: one
writer per file (PATH.lock), PATH.part renamed only once complete, resumed and retried, and its
sha256 checked against the manifest (a file that fails is moved to PATH.bad).

The manifest is untrusted: a name that leaves the folder (`..`, absolute) or holds a control or
invisible character refuses the restore before anything is written. Every file is written from
the workspace's own descriptor, folder by folder without following a symlink (fetch_inside,
confine.py): a symlinked folder or a symlink at PATH, PATH.part or PATH.lock is refused naming
the path, and one planted while the download runs leads nowhere.

Markers: RESTORE_FILE path (one file), RESTORE_DONE (all of them, and the stages they stand in
for), RESTORE_MISSING (an artifact the manifest does not list), SHA_MISMATCH, FETCH_BUSY,
RESTORE_FAIL. Exit codes: 0 restored, 1 failed, 75 busy.
"""

from __future__ import annotations

import argparse
import io
import os
import re
import sys
import urllib.parse
import urllib.request
from typing import Iterable, Mapping, cast

from ..confine import workspace_root
from .fetch import bearer_token, check_relpath, fetch_inside, read_small, reported
from .transfer import FetchError, human

SHA256_LINE = re.compile(r"^([0-9a-fA-F]{64}) [ *](.+)$")
HF_REPO = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
DEFAULT_HUB = "https://huggingface.co"


def store_base(source: str, revision: str) -> str:
    """The URL the store's relative paths are joined to."""
    kind, _, where = source.partition(":")
    if kind == "dir" and where:
        return "file://" + urllib.request.pathname2url(os.path.abspath(where)).rstrip("/") + "/"
    if kind == "hf" and HF_REPO.match(where):
        hub = os.environ.get("HF_ENDPOINT") or DEFAULT_HUB
        return "%s/%s/resolve/%s/" % (hub.rstrip("/"), where, urllib.parse.quote(revision, safe=""))
    if urllib.parse.urlsplit(source).scheme in ("http", "https", "file"):
        return source.rstrip("/") + "/"
    raise FetchError("--from: expected dir:/some/path, hf:owner/repo or an http(s)/file URL, got %r" % (source,))


def manifest_of(text: str) -> dict[str, str]:
    """{relative path: sha256} from sha256sum lines; every path checked to stay inside the folder."""
    entries = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        found = SHA256_LINE.match(line)
        if not found:
            raise FetchError("manifest line %d is not `SHA256  PATH`: %r" % (number, line[:120]), "RESTORE_FAIL")
        entries[check_relpath(found.group(2))] = found.group(1).lower()
    return entries


def chosen(entries: Mapping[str, str], artifacts: Iterable[str]) -> list[tuple[str, str]]:
    """[(path, sha256)] of the manifest's files that the artifacts name (a file, or a folder's files)."""
    picked: list[tuple[str, str]] = []
    for artifact in artifacts:
        rel = check_relpath(artifact.strip("/"))
        files = sorted(p for p in entries if p == rel or p.startswith(rel + "/"))
        if not files:
            raise FetchError("%s is not in the manifest: push it first (the manifest lists %d files)"
                             % (rel, len(entries)), "RESTORE_MISSING")
        picked.extend((p, entries[p]) for p in files if (p, entries[p]) not in picked)
    return picked


def restore(args: argparse.Namespace) -> None:
    token = bearer_token(args.auth_env)
    source, base, files = pick_store(args, token)
    workspace = workspace_root(os.getcwd())
    total = 0
    for rel, digest in files:
        url = base + urllib.parse.quote(rel)
        total += fetch_inside(workspace, rel, url, digest, None, args.wait, token, args.backoff, "RESTORE_FILE", rel)
    stages = [name for name in args.satisfies.split(",") if name]
    stands_for = "; satisfies %s" % ", ".join(stages) if stages else ""
    print("RESTORE_DONE %d files %s from %s%s" % (len(files), human(total), source, stands_for))


def pick_store(args: argparse.Namespace, token: str | None) -> tuple[str, str, list[tuple[str, str]]]:
    """(store, its base URL, [(path, sha256)]) of the first store whose manifest lists the artifacts."""
    for i, source in enumerate(args.sources):
        try:
            base = store_base(source, args.revision)
            entries = manifest_of(read_small(base + args.manifest, token, args.backoff).decode("utf-8", "replace"))
            return source, base, chosen(entries, args.artifacts)
        except FetchError as e:
            if i + 1 == len(args.sources):
                raise
            print("%s: %s; trying %s" % (source, e, args.sources[i + 1]))
    raise FetchError("--from: no store given", "RESTORE_FAIL")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="restore", description=__doc__.splitlines()[0])
    p.add_argument("--from", dest="sources", required=True, action="append", metavar="STORE",
                   help="dir:/some/path, hf:owner/repo, or an http(s)/file URL of the pushed folder "
                        "(repeatable: the first whose manifest lists the artifacts)")
    p.add_argument("--revision", default="main", help="the Hub revision of an hf: store (default main)")
    p.add_argument("--manifest", default="MANIFEST.sha256", help="the manifest's name in the store")
    p.add_argument("--satisfies", default="", metavar="STAGE,...",
                   help="the stages whose outputs the artifacts stand in for (said in RESTORE_DONE)")
    p.add_argument("--wait", type=float, default=0, metavar="S", help="wait this long for another writer's lock")
    p.add_argument("--auth-env", metavar="NAME", help="the environment variable that holds the token")
    p.add_argument("--backoff", type=float, default=1.0, metavar="S")
    p.add_argument("artifacts", nargs="+", metavar="ARTIFACT", help="a file or folder as push named it")
    return p


def main(argv: list[str] | None = None) -> int:
    # the log is a file: each line must land as it is printed
    cast(io.TextIOWrapper, sys.stdout).reconfigure(line_buffering=True)
    args = build_parser().parse_args(argv)
    if "/" in args.manifest or args.manifest in ("", ".", ".."):
        print("RESTORE_FAIL --manifest is a file name, not a path")
        return 2
    return reported(lambda: restore(args), "RESTORE_FAIL", ("SHA_MISMATCH", "RESTORE_MISSING", "RESTORE_FAIL"))


if __name__ == "__main__":
    sys.exit(main())
