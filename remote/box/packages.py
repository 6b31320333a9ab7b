"""The distributions installed in one Python environment, read from its site-packages folders.

Runs ON the box, imported by probe.py. Standard library only, Python >= 3.8. The environment's
own Python is never started (a poll starts no process): a venv's site-packages lie under the
folder that holds its pyvenv.cfg, any other Python's under its prefix.

Request entry: {"python": PATH, "names": [NAME, ...], "max": N}
  names: only these distributions (normalised as pip does: peft, Peft and p_e.f-t are one);
  absent: every one, at most max.
Reply entry: {"python", "prefix", "site": [FOLDER], "found": [{"name", "version", "path"}],
              "complete", "error"}
Names and versions are what the box's files say: untrusted text, cut to MAX_TEXT characters.
"""

from __future__ import annotations

import glob
import os
import re
from typing import Any, Mapping, Sequence

from .disk import resolve
from .procfs import read_regular_file

MAX_DISTRIBUTIONS = 2000
MAX_ENVIRONMENTS = 8
MAX_NAMES = 64
MAX_TEXT = 200
HEADER_BYTES = 16 * 1024  # Name and Version come first in METADATA; the description can be megabytes
SEPARATORS = re.compile(r"[-_.]+")
FOLDER = re.compile(r"^(.+?)-([^-]+?)\.(dist-info|egg-info)$")
EGG_PYTHON = re.compile(r"-py[0-9.]+(?=\.egg-info$)")  # setuptools' foo-1.0-py3.11.egg-info


def normalise(name: str) -> str:
    """A distribution name as pip compares them (PEP 503)."""
    return SEPARATORS.sub("-", name).lower()


def header_fields(data: bytes) -> tuple[str | None, str | None]:
    """(name, version) from the headers of METADATA or PKG-INFO bytes; None for a field not there.
    The headers end at the first empty line; a line that is not a header is skipped."""
    name = version = None
    for raw in data.split(b"\n"):
        line = raw.rstrip(b"\r")
        if not line.strip():
            break
        key, sep, value = line.partition(b":")
        if not sep:
            continue
        key = key.strip().lower()
        text = value.strip().decode("utf-8", "replace")[:MAX_TEXT]
        if key == b"name" and name is None:
            name = text
        elif key == b"version" and version is None:
            version = text
    return name, version


def folder_fields(entry: str) -> tuple[str | None, str | None]:
    """(name, version) from a dist-info or egg-info folder name (name-version.dist-info)."""
    match = FOLDER.match(EGG_PYTHON.sub("", entry))
    if not match:
        return None, None
    return match.group(1)[:MAX_TEXT], match.group(2)[:MAX_TEXT]


def read_header(path: str) -> bytes:
    """The first HEADER_BYTES of a regular file; b"" when it cannot be read (a FIFO is refused, not waited on)."""
    try:
        return read_regular_file(path, HEADER_BYTES)
    except OSError:
        return b""


def distribution(site: str, entry: str) -> dict[str, Any] | None:
    """One installed distribution, from its metadata folder (or an egg-info file), or None."""
    name, version = folder_fields(entry)
    if name is None:
        return None
    path = os.path.join(site, entry)
    if entry.endswith(".dist-info"):
        meta = os.path.join(path, "METADATA")
    else:
        meta = path if os.path.isfile(path) else os.path.join(path, "PKG-INFO")
    said_name, said_version = header_fields(read_header(meta))
    return {"name": said_name or name, "version": said_version or version, "path": path}


def site_folders(python: str) -> tuple[str, list[str]]:
    """The site-packages folders of the environment whose interpreter is python (the path as
    given: a venv's bin/python is a link to the base interpreter, which must not be followed)."""
    prefix = os.path.dirname(os.path.dirname(os.path.abspath(python)))
    patterns: tuple[str, ...]
    if os.path.isfile(os.path.join(prefix, "pyvenv.cfg")):
        patterns = ("lib/python3*/site-packages", "lib64/python3*/site-packages")
    else:
        patterns = ("lib/python3*/site-packages", "lib/python3*/dist-packages", "local/lib/python3*/dist-packages",
                    "lib/python3/dist-packages")
    found: list[str] = []
    seen: set[str] = set()
    for pattern in patterns:
        for folder in sorted(glob.glob(os.path.join(glob.escape(prefix), pattern))):
            real = os.path.realpath(folder)
            if os.path.isdir(folder) and real not in seen:  # lib64 is often a link to lib
                seen.add(real)
                found.append(folder)
    return prefix, found


def environment(workspace: str | None, spec: Mapping[str, Any]) -> dict[str, Any]:
    """The reply entry for one request entry (see the module docstring)."""
    python = resolve(workspace, spec["python"])
    wanted = set(normalise(n) for n in spec.get("names") or ())
    limit = min(int(spec.get("max") or MAX_DISTRIBUTIONS), MAX_DISTRIBUTIONS)
    out: dict[str, Any] = {"python": spec["python"], "prefix": "", "site": [], "found": [], "complete": True,
                           "error": None}
    if not os.path.exists(python):
        out["error"] = "%s does not exist" % python
        return out
    out["prefix"], sites = site_folders(python)
    out["site"] = sites
    if not sites:
        out["error"] = "no site-packages folder under %s" % out["prefix"]
    for site in sites:
        try:
            names = sorted(os.listdir(site))
        except OSError as e:
            out["error"] = "%s: %s" % (site, e)
            continue
        for entry in names:
            name, _ = folder_fields(entry)
            if name is None or (wanted and normalise(name) not in wanted):
                continue
            if len(out["found"]) >= limit:
                out["complete"] = False
                return out
            dist = distribution(site, entry)
            if dist is not None:
                out["found"].append(dist)
    return out


def environments(workspace: str | None, specs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [environment(workspace, spec) for spec in specs[:MAX_ENVIRONMENTS]]


def check_request(specs: Any, where: str = "request.packages") -> None:
    """Raise ValueError, naming the key, unless specs is a list of request entries."""
    if not isinstance(specs, list) or not all(isinstance(s, dict) for s in specs):
        raise ValueError("%s must be a list of objects" % where)
    if len(specs) > MAX_ENVIRONMENTS:
        raise ValueError("%s holds more than %d environments" % (where, MAX_ENVIRONMENTS))
    for i, spec in enumerate(specs):
        at = "%s[%d]" % (where, i)
        python = spec.get("python")
        if not isinstance(python, str) or not python or "\0" in python:
            raise ValueError("%s.python must be a path" % at)
        names = spec.get("names")
        if names is not None and not (isinstance(names, list) and len(names) <= MAX_NAMES
                                      and all(isinstance(n, str) for n in names)):
            raise ValueError("%s.names must be a list of at most %d names" % (at, MAX_NAMES))
        limit = spec.get("max")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
            raise ValueError("%s.max must be a count" % at)
