"""The box tools as they travel to the box and run there: the package samai_box.

The tools are the package samai.remote.box (relative imports only, standard library, Python
>= 3.8). On the box they are the package PACKAGE in a tools folder, WORKSPACE/.samai/tools/
<digest>/, laid out as:

  samai_box/...     the package (samai_box.probe, samai_box.stages.fetch, ...)
  __main__.py       RUNNER: `python3 -S FOLDER TOOL ARGS` runs samai_box.TOOL (the folder is
                    on sys.path because Python runs it, and nothing else is added)
  stages/NAME.py    the old way to run a stage (`python3 "$SAMAI_TOOLS/stages/NAME.py"`): it
                    still works, and says on stderr what to write instead

A stage command runs `python3 -m samai_box.stages.NAME`: the launcher puts the folder on
PYTHONPATH and in SAMAI_TOOLS. A read-only console installs nothing: LOADER runs a tool whose
code comes on stdin.
"""

from __future__ import annotations

import ast
import functools
import json
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from samai.remote.box.install import content_digest

PACKAGE = "samai_box"
SOURCE = "samai.remote.box"
MAIN_GUARD = b'if __name__ == "__main__":'

RUNNER = """# samai-console: runs one box tool: python3 -S FOLDER TOOL [ARGS], where FOLDER holds samai_box/
import re
import runpy
import sys

if len(sys.argv) < 2 or not re.match(r"^[A-Za-z0-9_]+(\\.[A-Za-z0-9_]+)?$", sys.argv[1]):
    sys.exit("usage: python3 -S FOLDER TOOL [ARGS] (TOOL: probe, stages.fetch, ...)")
runpy.run_module("samai_box." + sys.argv.pop(1), run_name="__main__", alter_sys=True)
"""

OLD_STAGE_PATH = """# samai-console: `python3 "$SAMAI_TOOLS/stages/%(name)s.py"` is the old way to run this stage.
import os
import runpy
import sys

sys.stderr.write("note: $SAMAI_TOOLS/stages/%(name)s.py is the old way to run this stage; write "
                 "`python3 -m samai_box.stages.%(name)s ...` in the stage's command instead\\n")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
runpy.run_module("samai_box.stages.%(name)s", run_name="__main__", alter_sys=True)
"""

# The finder both programs below use: it serves the package's modules from SOURCES
# ({path in the tools folder: source}) held in memory, relative imports included.
FINDER = """import importlib.abc, importlib.util, json, runpy, sys, zlib
def unpack(stream):
    size = int(stream.readline())
    return json.loads(zlib.decompress(stream.read(size)).decode("utf-8"))
class SamaiTools(importlib.abc.MetaPathFinder, importlib.abc.InspectLoader):
    def __init__(self, sources):
        self.sources = sources
    def path(self, name):
        stem = name.replace(".", "/")
        for path in (stem + "/__init__.py", stem + ".py"):
            if path in self.sources:
                return path
        return None
    def find_spec(self, name, path=None, target=None):
        found = self.path(name)
        if found is None:
            return None
        return importlib.util.spec_from_loader(name, self, origin="<samai>/" + found,
                                               is_package=found.endswith("/__init__.py"))
    def is_package(self, name):
        return self.path(name).endswith("/__init__.py")
    def get_source(self, name):
        return self.sources[self.path(name)]
    def get_code(self, name):
        return compile(self.get_source(name), "<samai>/" + self.path(name), "exec")
"""

# Runs a box tool whose code comes on stdin (an archive: see ToolSet.archive) and writes
# nothing on the box; argv: the tool (probe, ...) and its arguments.
LOADER = "# samai-console: a box tool run from stdin (nothing written on the box)\n" + FINDER + """
sys.meta_path.insert(0, SamaiTools(unpack(sys.stdin.buffer)))
runpy.run_module("samai_box." + sys.argv.pop(1), run_name="__main__", alter_sys=True)
"""

# Starts a tool (the probe) from its tools folder in one round trip, installing the tools on
# the way when the folder is not ready. argv: FOLDER TOOL ARGS. Before the tool sees its
# stdin, whatever comes first is looked at: an archive (a line of digits) is installed from
# memory (install.install_archive checks it against the folder's digest); a request while
# the folder is not ready is answered, as the tool would frame it, with an error that names
# the missing tools, so that the console sends the archive ahead of its next request.
STARTER = "# samai-console: starts a box tool from its folder, installing the tools when missing\n" + FINDER + """
import os
folder, stdin, out = sys.argv.pop(1), sys.stdin.buffer, sys.stdout.buffer
ready = os.path.isfile(os.path.join(folder, ".ready"))
def say(reply):
    data = json.dumps(reply).encode("utf-8")
    out.write(b"%d\\n" % len(data) + data)
    out.flush()
while True:
    head = stdin.peek(1)[:1]
    if not head:
        sys.exit(0)
    if head.isdigit():
        sources = unpack(stdin)
        if not ready:
            sys.meta_path.insert(0, SamaiTools(sources))
            from samai_box.install import install_archive
            reply = install_archive(folder, sources)
            sys.meta_path.pop(0)
            for name in [m for m in sys.modules if m.split(".")[0] == "samai_box"]:
                del sys.modules[name]  # the tool runs from the folder, as it will from now on
            if "error" in reply:
                say(reply)
                sys.exit(1)
            ready = True
        continue
    if ready:
        break
    stdin.readline()
    say({"error": "the box tools are not installed in " + folder, "tools_missing": True})
sys.path.insert(0, folder)
runpy.run_module("samai_box." + sys.argv.pop(1), run_name="__main__", alter_sys=True)
"""


def module_of(tool: str) -> str:
    """The module a tool file runs as, below the package: "stages/fetch.py" -> "stages.fetch"."""
    return tool.removesuffix(".py").replace("/", ".")


@dataclass(frozen=True)
class ToolSet:
    digest: str
    files: Mapping[str, bytes]  # path in the tools folder -> content
    # What is sent of it, packed once: a fleet's boxes share one ToolSet and send the same bytes.
    _packed: dict[str, bytes] = field(default_factory=dict, init=False, compare=False, repr=False)

    @classmethod
    @functools.cache
    def bundled(cls) -> ToolSet:
        """The package (every .py of samai.remote.box, __init__ files included), its runner and
        the old stage paths, by their path in the tools folder: read once per process (the
        installed package does not change under it), shared by every Box."""
        folder = resources.files(SOURCE)
        files = {f"{PACKAGE}/{name}": folder.joinpath(name).read_bytes() for name in package_files()}
        files["__main__.py"] = RUNNER.encode()
        for name in tool_names():
            if name.startswith("stages/") and MAIN_GUARD in files[f"{PACKAGE}/{name}"]:
                files[name] = (OLD_STAGE_PATH % {"name": module_of(name).split(".")[-1]}).encode()
        return cls(content_digest(files), files)

    def archive(self) -> bytes:
        """Every file as one stream: what install.py (or the starter) reads."""
        if "" not in self._packed:
            self._packed[""] = loader_input(self.files)
        return self._packed[""]

    def loader_for(self, tool: str) -> bytes:
        """What LOADER reads ahead of tool's input: the modules it needs (needed_by), packed."""
        if tool not in self._packed:
            self._packed[tool] = loader_input(self.needed_by(tool))
        return self._packed[tool]

    def needed_by(self, tool: str) -> dict[str, bytes]:
        """tool's module and every module of the package it imports, directly or not, with the
        __init__ of every package on the way."""
        out: dict[str, bytes] = {}
        todo = [f"{PACKAGE}/{tool}"]
        while todo:
            path = todo.pop()
            if path in out or path not in self.files:
                continue
            out[path] = self.files[path]
            todo.extend(_packages_of(path))
            todo.extend(_relative_imports(path, self.files[path]))
        return out


def _packages_of(path: str) -> list[str]:
    parts = path.split("/")[:-1]
    return ["/".join(parts[:i]) + "/__init__.py" for i in range(1, len(parts) + 1)]


def _relative_imports(path: str, source: bytes) -> list[str]:
    """The files a module's relative imports may name (a module, or a package's __init__)."""
    package = path.split("/")[:-1]
    found = []
    for node in ast.walk(ast.parse(source, path)):
        if not isinstance(node, ast.ImportFrom) or node.level == 0:
            continue
        base = package[:len(package) - node.level + 1]
        targets = [base + node.module.split(".")] if node.module else [base + [a.name] for a in node.names]
        for target in targets:
            found += ["/".join(target) + ".py", "/".join(target) + "/__init__.py"]
    return found


def loader_input(sources: Mapping[str, bytes]) -> bytes:
    """What LOADER reads from stdin before the tool's own input."""
    return framed({name: data.decode("utf-8") for name, data in sources.items()})


def framed(obj: Any) -> bytes:
    packed = zlib.compress(json.dumps(obj).encode("utf-8"), 9)
    return b"%d\n" % len(packed) + packed


def package_files() -> list[str]:
    """Every .py of the package, __init__ files included, by its path in the package."""
    folder = resources.files(SOURCE)
    top = [e.name for e in folder.iterdir() if e.name.endswith(".py")]
    stages = [f"stages/{e.name}" for e in folder.joinpath("stages").iterdir() if e.name.endswith(".py")]
    return sorted(top) + sorted(stages)


def tool_names() -> list[str]:
    """The tools and stage modules (no __init__), by their path in the package."""
    return [name for name in package_files() if not name.endswith("__init__.py")]
