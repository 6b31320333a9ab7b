"""The provision stage: the box's own venv, with the box extra and llama.cpp's binaries and converter.

Idempotent: a stamp in the venv records what was installed; a second run with the same list
and a working venv does nothing. pip's and the compiler's own output is the progress in the log
(one line per build step).

llama.cpp is compiled once per box from the sources vendored in the llama-cpp-python sdist, into
~/.cache/samai (or $SAMAI_CACHE) under the sdist's hash: only llama-server and llama-quantize and
the shared libraries they link (no tests, examples or other tools), for a portable CPU
(GGML_NATIVE=OFF): a build for the build machine's every instruction set dies of SIGILL where the
CPU advertises more than the VM lets it run (AMX, seen here). llama-cpp-python itself is then
installed without compiling anything (LLAMA_BUILD=OFF) and given those same libraries, so the
library is compiled once, not twice. The converter (convert_hf_to_gguf.py with gguf-py and
conversion/) comes from the same sdist, so converter, binaries and library all match.

Runs ON the box with any python3 >= 3.8:  python3 -m samai_box.stages.provision --venv venv
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from typing import Any, Callable, Iterable, Iterator

from .common import fail, marker, say

LLAMA_CPP = "llama-cpp-python"
LLAMA_CPP_VERSION = "0.3.36"
# llama.cpp's own build, standalone: shared libraries (llama-cpp-python loads them too), nothing
# fetched at build time (no prebuilt web UI, no curl/openssl), binaries that find their libraries
# beside them wherever the folder is copied.
LLAMA_CPP_CMAKE_ARGS = (
    "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=ON", "-DGGML_NATIVE=OFF", "-DCMAKE_BUILD_RPATH=$ORIGIN",
    "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_CURL=OFF",
)
LLAMA_CPP_TARGETS = ("llama-server", "llama-quantize")
# The Python package alone: the library comes from the build above.
PYTHON_PACKAGE_CMAKE_ARGS = "-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF"
# The `box` extra of samai-console's pyproject.toml (a test keeps the two equal).
BOX_PACKAGES = [
    "torch==2.13.0",
    "transformers>=4.46",
    "peft>=0.13",
    "deepspeed>=0.15",
    "llama-cpp-python[server]==" + LLAMA_CPP_VERSION,
    "sentencepiece>=0.2",
    "protobuf>=4",
    "huggingface_hub>=0.26",
    "pillow>=10",
    "playwright>=1.50",
]
# cu_eval and rft drive a system browser (Playwright's own download cannot run here): provision
# says when the box has none, and how to get one; the other stages do not need it.
CONVERTER_PARTS = ("convert_hf_to_gguf.py", "gguf-py", "conversion")
STAMP = ".samai-provisioned"


def run(cmd: list[str], **kw: Any) -> None:
    say("$ " + " ".join(cmd))
    rc = subprocess.call(cmd, **kw)
    if rc != 0:
        fail("PROVISION_FAILED", "%s exited with rc=%d" % (" ".join(cmd[:4]), rc), rc=rc)


def stamp_of(packages: Iterable[str]) -> str:
    settings = sorted(packages) + list(LLAMA_CPP_CMAKE_ARGS + LLAMA_CPP_TARGETS) + [PYTHON_PACKAGE_CMAKE_ARGS]
    return hashlib.sha256(json.dumps(settings).encode()).hexdigest()[:16]


def already_done(venv: str, stamp: str) -> bool:
    try:
        with open(os.path.join(venv, STAMP)) as f:
            recorded = f.read().strip()
    except OSError:
        return False
    python = os.path.join(venv, "bin", "python")
    healthy = subprocess.call([python, "-c", "import torch, transformers, peft, llama_cpp"]) == 0
    return (recorded == stamp and healthy and os.path.isfile(os.path.join(venv, "llama.cpp", CONVERTER_PARTS[0]))
            and all(os.access(os.path.join(binaries_of(venv), t), os.X_OK) for t in LLAMA_CPP_TARGETS))


def binaries_of(venv: str) -> str:
    """Where the venv keeps llama.cpp's binaries (the stages are given these paths)."""
    return os.path.join(venv, "llama.cpp", "bin")


def cache_dir() -> str:
    return os.environ.get("SAMAI_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "samai")


@contextlib.contextmanager
def cache_locked() -> Iterator[None]:
    """The cache held by this provision alone while it fills it and copies from it: two
    workspaces of one user provisioning at once would each build llama.cpp, and the one that
    finished second would replace the folder the other was copying from."""
    os.makedirs(cache_dir(), exist_ok=True)
    with open(os.path.join(cache_dir(), ".lock"), "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say("waiting for another provision that is using %s" % cache_dir())
            fcntl.flock(f, fcntl.LOCK_EX)
        yield  # the lock goes with the file


def llama_cpp_sdist(pip: list[str]) -> str:
    folder = os.path.join(cache_dir(), "sdist")
    found = glob.glob(os.path.join(folder, "llama_cpp_python-%s.tar.gz" % LLAMA_CPP_VERSION))
    if not found:
        run(pip + ["download", "--no-binary", ":all:", "--no-deps", "--progress-bar", "off", "-d", folder,
                   "%s==%s" % (LLAMA_CPP, LLAMA_CPP_VERSION)])
        found = glob.glob(os.path.join(folder, "llama_cpp_python-%s.tar.gz" % LLAMA_CPP_VERSION))
    return found[0]


def sha256_of_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def build_tools(pip: list[str]) -> tuple[str, str | None]:
    """cmake (3.21 or newer) and ninja: the box's own, else the PyPI packages in the venv."""
    cmake = shutil.which("cmake")
    if cmake is None or cmake_version(cmake) < (3, 21):
        run(pip + ["install", "--progress-bar", "off", "cmake>=3.21", "ninja"])
        bin_dir = os.path.dirname(pip[0])
        return os.path.join(bin_dir, "cmake"), os.path.join(bin_dir, "ninja")
    return cmake, shutil.which("ninja")


def cmake_version(cmake: str) -> tuple[int, int]:
    found = re.search(r"(\d+)\.(\d+)", subprocess.check_output([cmake, "--version"], universal_newlines=True))
    return (int(found.group(1)), int(found.group(2))) if found else (0, 0)


def llama_cpp_binaries(pip: list[str], sdist: str) -> str:
    """The folder of llama-server, llama-quantize and their shared libraries, compiled once per
    source and settings (about 15 minutes on 2 cores), then kept in the cache."""
    tag = hashlib.sha256(json.dumps([sha256_of_file(sdist)] + list(LLAMA_CPP_CMAKE_ARGS + LLAMA_CPP_TARGETS))
                         .encode()).hexdigest()[:12]
    folder = os.path.join(cache_dir(), "llama.cpp", "%s-%s" % (LLAMA_CPP_VERSION, tag))
    if all(os.access(os.path.join(folder, t), os.X_OK) for t in LLAMA_CPP_TARGETS):
        say("llama.cpp's binaries are already built in %s" % folder)
        return folder
    cmake, ninja = build_tools(pip)
    os.makedirs(os.path.dirname(folder), exist_ok=True)
    with tempfile.TemporaryDirectory(dir=os.path.dirname(folder), prefix="build-") as tmp:
        source = extract_vendored(sdist, tmp, lambda rel: True)
        build = os.path.join(tmp, "build")
        say("building %s of llama.cpp (llama-cpp-python %s) with %s (once per box)"
            % (" and ".join(LLAMA_CPP_TARGETS), LLAMA_CPP_VERSION, " ".join(LLAMA_CPP_CMAKE_ARGS)))
        generator = ["-G", "Ninja", "-DCMAKE_MAKE_PROGRAM=" + ninja] if ninja else []
        run([cmake, "-S", source, "-B", build] + generator + list(LLAMA_CPP_CMAKE_ARGS))
        run([cmake, "--build", build, "-j", str(os.cpu_count() or 1), "--target"] + list(LLAMA_CPP_TARGETS))
        built = os.path.join(tmp, "bin")
        os.makedirs(built)
        for name in os.listdir(os.path.join(build, "bin")):
            if name in LLAMA_CPP_TARGETS or name.startswith("lib"):
                copy_keeping_links(os.path.join(build, "bin", name), os.path.join(built, name))
        shutil.rmtree(folder, ignore_errors=True)
        os.rename(built, folder)  # whole or not at all: a cut build leaves no folder behind
    return folder


def copy_keeping_links(src: str, dst: str) -> None:
    if os.path.islink(src):
        os.symlink(os.readlink(src), dst)
    else:
        shutil.copy2(src, dst)


def python_package_wheels(pip: list[str], sdist: str) -> str:
    """The folder holding this version's wheel of the Python package alone (no compiling)."""
    tag = hashlib.sha256(PYTHON_PACKAGE_CMAKE_ARGS.encode()).hexdigest()[:8]
    folder = os.path.join(cache_dir(), "wheels", "%s-%s" % (LLAMA_CPP_VERSION, tag))
    if not glob.glob(os.path.join(folder, "llama_cpp_python-*.whl")):
        env = dict(os.environ, CMAKE_ARGS=PYTHON_PACKAGE_CMAKE_ARGS)
        run(pip + ["wheel", "--no-deps", "--no-cache-dir", "--progress-bar", "off", "-w", folder, sdist], env=env)
    return folder


def give_libraries(venv: str, binaries: str) -> None:
    """llama-cpp-python loads its libraries from llama_cpp/lib in its package: the built ones."""
    python = os.path.join(venv, "bin", "python")
    purelib = subprocess.check_output([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                      universal_newlines=True).strip()
    lib = os.path.join(purelib, "llama_cpp", "lib")
    shutil.rmtree(lib, ignore_errors=True)
    os.makedirs(lib)
    for name in os.listdir(binaries):
        if name.startswith("lib"):
            copy_keeping_links(os.path.join(binaries, name), os.path.join(lib, name))


def install_binaries(venv: str, binaries: str) -> None:
    target = binaries_of(venv)
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(binaries, target, symlinks=True)
    say("llama-server and llama-quantize of llama-cpp-python %s are in %s" % (LLAMA_CPP_VERSION, target))


def extract_vendored(sdist: str, into: str, wanted: Callable[[str], bool]) -> str:
    """The sdist's vendor/llama.cpp, or the parts of it whose path (relative to it) is wanted."""
    with tarfile.open(sdist) as tar:
        prefix = tar.getnames()[0].split("/")[0] + "/vendor/llama.cpp/"
        members = [m for m in tar.getmembers() if m.name.startswith(prefix) and (m.isfile() or m.isdir())
                   and ".." not in m.name.split("/") and not m.name.startswith("/") and wanted(m.name[len(prefix):])]
        tar.extractall(into, members=members)
    return os.path.join(into, prefix)


def unpack_converter(venv: str, sdist: str) -> None:
    target = os.path.join(venv, "llama.cpp")
    with tempfile.TemporaryDirectory() as tmp:
        source = extract_vendored(sdist, tmp, lambda rel: rel.split("/")[0] in CONVERTER_PARTS)
        shutil.rmtree(target, ignore_errors=True)
        shutil.move(source, target)
    say("the converter of llama-cpp-python %s is in %s" % (LLAMA_CPP_VERSION, target))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--venv", default="venv")
    args = p.parse_args()
    stamp = stamp_of(BOX_PACKAGES)
    if already_done(args.venv, stamp):
        say_browser()
        marker("PROVISION_DONE", "%s already has %s" % (args.venv, ", ".join(BOX_PACKAGES)))
        return
    if not os.path.exists(os.path.join(args.venv, "bin", "python")):
        run([sys.executable, "-m", "venv", args.venv])
    pip = [os.path.join(args.venv, "bin", "python"), "-m", "pip"]
    run(pip + ["install", "--progress-bar", "off", "--upgrade", "pip"])
    with cache_locked():
        sdist = llama_cpp_sdist(pip)
        binaries = llama_cpp_binaries(pip, sdist)
        wheels = python_package_wheels(pip, sdist)
        run(pip + ["install", "--progress-bar", "off", "--find-links", wheels] + BOX_PACKAGES)
        give_libraries(args.venv, binaries)
        unpack_converter(args.venv, sdist)  # replaces the venv's llama.cpp folder: the binaries go in after
        install_binaries(args.venv, binaries)
    with open(os.path.join(args.venv, STAMP), "w") as f:
        f.write(stamp + "\n")
    say_browser()
    marker("PROVISION_DONE", "%s: %s" % (args.venv, ", ".join(BOX_PACKAGES)))


def say_browser() -> None:
    from .chromium import BrowserMissing, find_browser

    try:
        say("headless Chromium for cu_eval and rft: %s" % find_browser())
    except BrowserMissing as e:
        say("note: %s (only cu_eval and rft need one)" % e)


if __name__ == "__main__":
    main()
