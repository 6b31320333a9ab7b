"""Install the box tools into WORKSPACE/.samai/tools/DIGEST/, and nowhere else.

Runs ON the box, started by the console's loader (samai.remote.boxtools.LOADER) with its own
code and the modules it imports on stdin, followed by the tools: a length line, then that many bytes of
zlib-compressed JSON {relative path: base64 content} (the layout: samai.remote.boxtools).
argv: WORKSPACE DIGEST.
Reply: {"ok": true, "tools": FOLDER} or {"error": REASON}.

The workspace is made if it is missing (it is the operator's folder: its own path may hold
symlinks); below it every folder is opened without following a symlink (confine.py), so a
`.samai` swapped for a link out of the workspace makes the install fail, not write there.
The ready marker is written last: a half-finished install is installed again.
"""

import base64
import json
import os
import re
import sys
import zlib

from .confine import Escape, open_folder, open_root, workspace_root, write_file

DIGEST = re.compile(r"^[0-9a-f]{8,64}$")
TOOL_PATH = re.compile(r"^(samai_box/)?(stages/)?[A-Za-z0-9_]+\.py$")
READY = ".ready"


def read_tools(stream):
    size = int(stream.readline())
    files = json.loads(zlib.decompress(stream.read(size)).decode("utf-8"))
    return dict((name, base64.b64decode(data)) for name, data in files.items())


def install(given_workspace, digest, files):
    if not DIGEST.match(digest):
        raise Escape("bad tool digest %r" % digest)
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


def main():
    try:
        reply = install(sys.argv[1], sys.argv[2], read_tools(sys.stdin.buffer))
    except (Escape, OSError, ValueError, IndexError, zlib.error) as e:
        reply = {"error": "install: %s" % e}
    sys.stdout.write(json.dumps(reply) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
