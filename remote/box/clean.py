"""Delete files or folders, only ever inside the workspace.

Runs ON the box. Request on stdin: {"workspace": PATH, "paths": [PATH, ...]}
Reply: {"removed": [{"path", "bytes"}], "refused": [{"path", "reason"}], "missing": [PATH]}
(wire.py: CleanRequest, CleanReply.)

A path is relative to the workspace or absolute under it; one that leaves it (`..`, `~`,
another absolute path) is refused by its text. Every folder on the way is then opened
without following symlinks (see confine.py), and the deletion walks the tree by descriptors:
neither a link that points outside nor one swapped in while it runs can make it delete
anything but the workspace's own contents. A symlink is removed as a link.
"""

from __future__ import annotations

import os
import sys

from .confine import Escape, open_folder, open_root, parts_inside, remove_tree, workspace_root
from .procfs import serve
from .wire import CleanReply, CleanRequest


def clean(req: CleanRequest) -> CleanReply:
    reply: CleanReply = {"removed": [], "refused": [], "missing": []}
    try:
        workspace = workspace_root(req["workspace"])
    except Escape as e:
        reply["refused"] = [{"path": given, "reason": str(e)} for given in req["paths"]]
        return reply
    for given in req["paths"]:
        try:
            names = parts_inside(workspace, given)
            root = open_root(workspace)
            try:
                folder = open_folder(root, names[:-1])
            finally:
                os.close(root)
            try:
                size = remove_tree(folder, names[-1])
            finally:
                os.close(folder)
            reply["removed"].append({"path": given, "bytes": size})
        except FileNotFoundError:
            reply["missing"].append(given)
        except Escape as e:
            reply["refused"].append({"path": given, "reason": str(e)})
        except OSError as e:
            reply["refused"].append({"path": given, "reason": "%s: %s" % (given, e.strerror or e)})
        except RecursionError:
            reply["refused"].append({"path": given, "reason": "%s: folders nested too deep to delete" % given})
    return reply


if __name__ == "__main__":
    sys.exit(serve("clean", clean))
