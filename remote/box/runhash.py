"""What a multi-node stage runs on this box, hashed: the box tools and the training program.

Runs ON the box. Request on stdin:
  {"workspace": PATH, "python": PYTHON, "module": "pkg.mod"} or {..., "script": "train.py"}
Reply: {"tools": DIGEST or null, "tools_note": TEXT, "program": PATH, "sha256": HEX, "bytes": N}
       or, for the program, "program_error": TEXT in place of program/sha256/bytes ("error" is the
       tool's own failure, as for every tool). (wire.py: RunhashRequest, RunhashReply.)

Every node of a multi-node run must run the same code: the console compares these across nodes
before it fires. The tools' digest is read back from the files installed here (install.py's
content_digest), never taken from the folder's name. A module is found as the stage command
would find it: by that PYTHON, from the workspace, with the tools folder first on PYTHONPATH;
a relative PYTHON or script is taken in the workspace.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

from .install import content_digest
from .launch import tools_env
from .procfs import serve
from .wire import RunhashReply, RunhashRequest

MAX_BYTES = 64 << 20  # a training program is a few KB: more is not one
FIND_TIMEOUT_S = 30.0
# Prints where the module's code is; importing its parent packages is what `-m` does too.
FIND = "import importlib.util, sys; s = importlib.util.find_spec(sys.argv[1]); print(s.origin if s else '')"


def tools_digest() -> str | None:
    """The installed tools' digest, or None when they run from memory (a read-only console)."""
    folder = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if not os.path.isfile(os.path.join(folder, ".ready")):
        return None
    files = {}
    for root, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in names:
            if name.endswith(".py"):
                path = os.path.join(root, name)
                with open(path, "rb") as f:
                    files[os.path.relpath(path, folder)] = f.read()
    return content_digest(files)


def sha256_of(path: str) -> tuple[str, int]:
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while True:
            chunk = f.read(1 << 20)
            if not chunk:
                break
            size += len(chunk)
            if size > MAX_BYTES:
                raise ValueError("%s is larger than %d bytes: not a training program" % (path, MAX_BYTES))
            h.update(chunk)
    return h.hexdigest(), size


def module_file(workspace: str, python: str, module: str) -> tuple[str | None, str | None]:
    """Where PYTHON finds module, run from the workspace as a stage runs; (path, error)."""
    exe = python if os.path.isabs(python) or os.sep not in python else os.path.join(workspace, python)
    env = dict(os.environ)
    env.update(tools_env(env))
    try:
        done = subprocess.run([exe, "-c", FIND, module], cwd=workspace, env=env, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=FIND_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, "%s cannot run: %s" % (python, e)
    origin = done.stdout.decode("utf-8", "replace").strip()
    if done.returncode != 0 or not origin or not os.path.isabs(origin):
        why = done.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or ["not found"]
        return None, "%s finds no module %s: %s" % (python, module, why[0][:300])
    return origin, None


def runhash(req: RunhashRequest) -> RunhashReply:
    workspace = os.path.abspath(os.path.expanduser(req["workspace"]))
    digest = tools_digest()
    reply: RunhashReply = {"tools": digest,
                             "tools_note": "" if digest else "the tools run from memory here (not installed)"}
    if req.get("module"):
        path, error = module_file(workspace, str(req.get("python") or "python3"), str(req["module"]))
    else:
        script = str(req["script"])
        path, error = (script if os.path.isabs(script) else os.path.join(workspace, script)), None
    if error is not None or path is None:  # module_file gives one of the two
        reply["program_error"] = error
        return reply
    try:
        reply["sha256"], reply["bytes"] = sha256_of(path)
    except (OSError, ValueError) as e:
        reply["program_error"] = "%s: %s" % (path, e)
        return reply
    reply["program"] = path
    return reply


if __name__ == "__main__":
    sys.exit(serve("runhash", runhash))
