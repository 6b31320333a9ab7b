"""The convert stage: a merged HF model to an f16 GGUF with llama.cpp's convert_hf_to_gguf.py.

The converter is the one that matches the llama.cpp the box serves with (for tiny: from the
llama-cpp-python sdist that provision unpacked into the venv). The result is checked with the
GGUF checker, and every F32/F16 tensor of it for nan/inf (an f32 weight over 65504 is inf in
f16); a merged model with a nan/inf tensor is refused before converting (every tensor checked).
The merged folder is deleted afterwards when --delete-input says it is an
intermediate (playbook §4: base + merged + f16 must not coexist on a 57 GB disk).

Runs ON the box, in the box venv:
  python -m samai_box.stages.convert --model models/merged --out gguf/tiny-f16.gguf [--delete-input]
"""

import argparse
import os
import subprocess
import sys
import time

from .common import (
    accept_gguf,
    bad_tensors_text,
    delete_intermediate,
    fail,
    marker,
    nonfinite_safetensors,
    refuse_nonfinite_gguf,
    say,
)


def default_converter():
    return os.path.join(sys.prefix, "llama.cpp", "convert_hf_to_gguf.py")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--outtype", default="f16")
    p.add_argument("--converter", default=default_converter())
    p.add_argument("--delete-input", action="store_true")
    args = p.parse_args()
    if not os.path.isdir(args.model):
        fail("CONVERT_REFUSED", "needs %s: missing (run merge first)" % args.model, rc=2)
    if not os.path.isfile(args.converter):
        fail("CONVERT_REFUSED", "no converter at %s (provision unpacks it)" % args.converter, rc=2)
    bad, total = nonfinite_safetensors(args.model)
    if bad:
        fail("CONVERT_REFUSED", bad_tensors_text(bad, total, args.model), rc=2)
    say("%s: all %d tensors finite" % (args.model, total))
    started = time.time()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(args.converter), "gguf-py"))
    tmp = args.out + ".partial"
    cmd = [sys.executable, args.converter, args.model, "--outfile", tmp, "--outtype", args.outtype]
    say("$ " + " ".join(cmd))
    rc = subprocess.call(cmd, env=env)
    if rc != 0:
        fail("GGUF_BAD", "the converter exited with rc=%d" % rc, rc=1)
    refuse_nonfinite_gguf(tmp, "GGUF_BAD", "the converted GGUF", rc=1, bad_name=args.out + ".bad")
    result = accept_gguf(tmp, args.out)
    say("%s: %d tensors, %d bytes" % (args.out, result["tensor_count"], os.path.getsize(args.out)))
    if args.delete_input:
        delete_intermediate(args.model)
    marker("CONVERT_DONE", "%s in %.0f s" % (args.out, time.time() - started))


if __name__ == "__main__":
    main()
