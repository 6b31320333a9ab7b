"""Install the box tools into WORKSPACE/.samai/tools/DIGEST/, and nowhere else.

Runs ON the box, started by the console's loader (samai.remote.boxtools.LOADER) with its own
code and the modules it imports on stdin, followed by the tools' archive: a length line, then that
many bytes of zlib-compressed JSON {relative path: source} (the layout: samai.remote.boxtools).
argv: WORKSPACE DIGEST. Or by the console's starter, through install_archive, before the probe.
Reply: {"ok": true, "tools": FOLDER} or {"error": REASON}.

The archive is checked against DIGEST (content_digest) before anything is written: a cut or
mangled stream installs nothing.

The workspace is made if it is missing (it is the operator's folder: its own path may hold
symlinks); below it every folder is opened without following a symlink (confine.py), so a
`.samai` swapped for a link out of the workspace makes the install fail, not write there.
The ready marker is written last: a half-finished install is installed again.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import zlib
from typing import Any, BinaryIO, Mapping

from .confine import Escape, open_folder, open_root, workspace_root, write_file

DIGEST = re.compile(r"^[0-9a-f]{8,64}$")
TOOL_PATH = re.compile(r"^(samai_box/)?(stages/)?[A-Za-z0-9_]+\.py$")
READY = ".ready"


def content_digest(files: Mapping[str, bytes]) -> str:
    """The digest that names a tools folder: of every path and content, in path order."""
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(name.encode("utf-8") + b"\0" + files[name] + b"\0")
    return h.hexdigest()[:16]


def read_tools(stream: BinaryIO) -> dict[str, bytes]:
    size = int(stream.readline())
    return from_sources(json.loads(zlib.decompress(stream.read(size)).decode("utf-8")))


def from_sources(sources: Any) -> dict[str, bytes]:
    if not isinstance(sources, dict) or not all(isinstance(v, str) for v in sources.values()):
        raise ValueError("the tools archive is not a {path: source} object")
    return dict((name, text.encode("utf-8")) for name, text in sources.items())


def install_archive(folder: str, sources: Any) -> dict[str, Any]:
    """Install an archive the starter unpacked into folder (WORKSPACE/.samai/tools/DIGEST)."""
    workspace, digest = os.path.dirname(os.path.dirname(os.path.dirname(folder))), os.path.basename(folder)
    if folder != os.path.join(workspace, ".samai", "tools", digest):
        return {"error": "install: %r is not a tools folder (WORKSPACE/.samai/tools/DIGEST)" % folder}
    try:
        return install(workspace, digest, from_sources(sources))
    except (Escape, OSError, ValueError) as e:
        return {"error": "install: %s" % e}


def install(given_workspace: str, digest: str, files: Mapping[str, bytes]) -> dict[str, Any]:
    if not DIGEST.match(digest):
        raise Escape("bad tool digest %r" % digest)
    if content_digest(files) != digest:
        raise ValueError("the tools archive does not match its digest %s (cut or changed on the way): "
                         "nothing installed" % digest)
    workspace = workspace_root(given_workspace)
    try:
        os.makedirs(workspace)
    except FileExistsError:
        pass
    root = open_root(workspace)
    try:
        folder = open_folder(root, [".samai", "tools", digest], create=True)
    finally:
        os.close(root)
    try:
        for name in sorted(files):
            if not TOOL_PATH.match(name):
                raise Escape("bad tool name %r" % name)
            parts = name.split("/")
            sub = open_folder(folder, parts[:-1], create=True)
            try:
                write_file(sub, parts[-1], files[name])
            finally:
                os.close(sub)
        write_file(folder, READY, digest.encode("ascii"))
    finally:
        os.close(folder)
    return {"ok": True, "tools": os.path.join(workspace, ".samai", "tools", digest)}


def main() -> int:
    try:
        reply = install(sys.argv[1], sys.argv[2], read_tools(sys.stdin.buffer))
    except (Escape, OSError, ValueError, IndexError, zlib.error) as e:
        reply = {"error": "install: %s" % e}
    sys.stdout.write(json.dumps(reply) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
