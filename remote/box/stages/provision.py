"""The provision stage: the box's own venv, with the box extra and llama.cpp's converter.

Idempotent: a stamp in the venv records what was installed; a second run with the same list
and a working venv does nothing. pip's own output is the progress in the log.

llama-cpp-python is built from its sdist once per box into ~/.cache/samai (or $SAMAI_CACHE),
for a portable CPU (GGML_NATIVE=OFF): a build for the build machine's every instruction set
dies of SIGILL where the CPU advertises more than the VM lets it run (AMX, seen here). The
converter (convert_hf_to_gguf.py with gguf-py and conversion/) comes from the same sdist, so it
matches the compiled library.

Runs ON the box with any python3 >= 3.8:  python3 -m samai_box.stages.provision --venv venv
"""

import argparse
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile

from .common import fail, marker, say

LLAMA_CPP = "llama-cpp-python"
LLAMA_CPP_VERSION = "0.3.36"
LLAMA_CPP_CMAKE_ARGS = "-DGGML_NATIVE=OFF"
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
]
CONVERTER_PARTS = ("convert_hf_to_gguf.py", "gguf-py", "conversion")
STAMP = ".samai-provisioned"


def run(cmd, **kw):
    say("$ " + " ".join(cmd))
    rc = subprocess.call(cmd, **kw)
    if rc != 0:
        fail("PROVISION_FAILED", "%s exited with rc=%d" % (" ".join(cmd[:4]), rc), rc=rc)


def stamp_of(packages):
    return hashlib.sha256(json.dumps(sorted(packages) + [LLAMA_CPP_CMAKE_ARGS]).encode()).hexdigest()[:16]


def already_done(venv, stamp):
    try:
        with open(os.path.join(venv, STAMP)) as f:
            recorded = f.read().strip()
    except OSError:
        return False
    python = os.path.join(venv, "bin", "python")
    healthy = subprocess.call([python, "-c", "import torch, transformers, peft, llama_cpp"]) == 0
    return recorded == stamp and healthy and os.path.isfile(os.path.join(venv, "llama.cpp", CONVERTER_PARTS[0]))


def cache_dir():
    return os.environ.get("SAMAI_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "samai")


def llama_cpp_sdist(pip):
    folder = os.path.join(cache_dir(), "sdist")
    found = glob.glob(os.path.join(folder, "llama_cpp_python-%s.tar.gz" % LLAMA_CPP_VERSION))
    if not found:
        run(pip + ["download", "--no-binary", ":all:", "--no-deps", "--progress-bar", "off", "-d", folder,
                   "%s==%s" % (LLAMA_CPP, LLAMA_CPP_VERSION)])
        found = glob.glob(os.path.join(folder, "llama_cpp_python-%s.tar.gz" % LLAMA_CPP_VERSION))
    return found[0]


def llama_cpp_wheels(pip, sdist):
    """The folder holding this version's portable wheel, built once (about 10 minutes on 2 cores)."""
    tag = hashlib.sha256(LLAMA_CPP_CMAKE_ARGS.encode()).hexdigest()[:8]
    folder = os.path.join(cache_dir(), "wheels", "%s-%s" % (LLAMA_CPP_VERSION, tag))
    if not glob.glob(os.path.join(folder, "llama_cpp_python-*.whl")):
        say("building llama-cpp-python %s with %s (once per box)" % (LLAMA_CPP_VERSION, LLAMA_CPP_CMAKE_ARGS))
        env = dict(os.environ, CMAKE_ARGS=LLAMA_CPP_CMAKE_ARGS)
        run(pip + ["wheel", "--no-deps", "--no-cache-dir", "--progress-bar", "off", "-w", folder, sdist], env=env)
    return folder


def unpack_converter(venv, sdist):
    target = os.path.join(venv, "llama.cpp")
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(sdist) as tar:
            prefix = tar.getnames()[0].split("/")[0] + "/vendor/llama.cpp/"
            members = [m for m in tar.getmembers() if m.name.startswith(prefix)
                       and m.name[len(prefix):].split("/")[0] in CONVERTER_PARTS and (m.isfile() or m.isdir())]
            tar.extractall(tmp, members=members)
        shutil.rmtree(target, ignore_errors=True)
        shutil.move(os.path.join(tmp, prefix), target)
    say("the converter of llama-cpp-python %s is in %s" % (LLAMA_CPP_VERSION, target))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--venv", default="venv")
    args = p.parse_args()
    stamp = stamp_of(BOX_PACKAGES)
    if already_done(args.venv, stamp):
        marker("PROVISION_DONE", "%s already has %s" % (args.venv, ", ".join(BOX_PACKAGES)))
        return
    if not os.path.exists(os.path.join(args.venv, "bin", "python")):
        run([sys.executable, "-m", "venv", args.venv])
    pip = [os.path.join(args.venv, "bin", "python"), "-m", "pip"]
    run(pip + ["install", "--progress-bar", "off", "--upgrade", "pip"])
    sdist = llama_cpp_sdist(pip)
    wheels = llama_cpp_wheels(pip, sdist)
    run(pip + ["install", "--progress-bar", "off", "--find-links", wheels] + BOX_PACKAGES)
    unpack_converter(args.venv, sdist)
    with open(os.path.join(args.venv, STAMP), "w") as f:
        f.write(stamp + "\n")
    marker("PROVISION_DONE", "%s: %s" % (args.venv, ", ".join(BOX_PACKAGES)))


if __name__ == "__main__":
    main()
