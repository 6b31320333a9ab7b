"""Delete files or folders, only ever inside the workspace.

Runs ON the box. Request on stdin: {"workspace": PATH, "paths": [PATH, ...]}
Reply: {"removed": [{"path", "bytes"}], "refused": [{"path", "reason"}], "missing": [PATH]}

Each path is resolved (symlinks included) before the check, so neither `..` nor a link
that points outside can make it delete anything but the workspace's own contents.
"""

import os
import shutil
import sys

from procfs import serve


def size_of(path):
    if not os.path.isdir(path) or os.path.islink(path):
        return os.lstat(path).st_size
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def inside(path, workspace):
    return os.path.commonpath([path, workspace]) == workspace and path != workspace


def clean(req):
    workspace = os.path.realpath(os.path.expanduser(req["workspace"]))
    reply = {"removed": [], "refused": [], "missing": []}
    for given in req["paths"]:
        path = given if os.path.isabs(given) else os.path.join(workspace, given)
        # Resolve the parent only: deleting a symlink removes the link, not what it points to.
        real = os.path.join(os.path.realpath(os.path.dirname(os.path.abspath(path))), os.path.basename(path))
        if not inside(real, workspace) or os.path.basename(path) in ("", ".", ".."):
            reply["refused"].append({"path": given, "reason": "outside the workspace %s" % workspace})
            continue
        if not os.path.lexists(real):
            reply["missing"].append(given)
            continue
        try:
            size = size_of(real)
            if os.path.isdir(real) and not os.path.islink(real):
                shutil.rmtree(real)
            else:
                os.unlink(real)
            reply["removed"].append({"path": given, "bytes": size})
        except OSError as e:
            reply["refused"].append({"path": given, "reason": str(e)})
    return reply


if __name__ == "__main__":
    sys.exit(serve("clean", clean))
