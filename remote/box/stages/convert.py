"""The convert stage: a merged HF model to an f16 GGUF with llama.cpp's convert_hf_to_gguf.py.

The converter is the one that matches the llama.cpp the box serves with (for tiny: from the
llama-cpp-python sdist that provision unpacked into the venv). The result is checked with the
GGUF checker, and every F32/F16 tensor of it for nan/inf (an f32 weight over 65504 is inf in
f16); a merged model with a nan/inf tensor is refused before converting (every tensor checked).
An image-text model's projector is converted too with --mmproj OUT (playbook §10: two artifacts,
the model and the projector). A SentencePiece vocab trained without a space prefix gets
tokenizer.ggml.add_space_prefix = false where the converter leaves it out.
The merged folder is deleted afterwards when --delete-input says it is an
intermediate (playbook §4: base + merged + f16 must not coexist on a 57 GB disk).

Runs ON the box, in the box venv:
  python -m samai_box.stages.convert --model models/merged --out gguf/tiny-f16.gguf [--delete-input]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from .. import gguf_surgery
from .common import (
    accept_gguf,
    bad_tensors_text,
    delete_intermediate,
    fail,
    gguf_reader,
    marker,
    nonfinite_safetensors,
    refuse_nonfinite_gguf,
    say,
)


def default_converter() -> str:
    return os.path.join(sys.prefix, "llama.cpp", "convert_hf_to_gguf.py")


def converted(args: argparse.Namespace, out: str, extra: list[str], what: str) -> None:
    """The converter's output (with `extra` arguments) checked and moved to out."""
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(args.converter), "gguf-py"))
    tmp = out + ".partial"
    cmd = [sys.executable, args.converter, args.model, "--outfile", tmp, "--outtype", args.outtype] + extra
    say("$ " + " ".join(cmd))
    rc = subprocess.call(cmd, env=env)
    if rc != 0:
        fail("GGUF_BAD", "the converter exited with rc=%d" % rc, rc=1)
    if not extra and adds_space_prefix(tmp) and not hf_adds_space_prefix(args.model):
        drop_space_prefix(tmp)
    refuse_nonfinite_gguf(tmp, "GGUF_BAD", what, rc=1, bad_name=out + ".bad")
    result = accept_gguf(tmp, out)
    say("%s: %d tensors, %d bytes" % (out, result["tensor_count"], os.path.getsize(out)))


def hf_adds_space_prefix(model_dir: str) -> bool:
    """What the model was trained with: transformers' add_prefix_space (True when unsaid, as in
    SentencePiece's default)."""
    try:
        with open(os.path.join(model_dir, "tokenizer_config.json")) as f:
            return json.load(f).get("add_prefix_space", True) is not False
    except (OSError, ValueError):
        return True


def adds_space_prefix(gguf_path: str) -> bool:
    """Whether llama.cpp will put a space before the text: a SentencePiece ("llama") vocab does
    unless tokenizer.ggml.add_space_prefix says false."""
    fields = gguf_reader(gguf_path).fields
    model = fields.get("tokenizer.ggml.model")
    if model is None or bytes(model.parts[-1]).decode("utf-8", "replace") != "llama":
        return False
    flag = fields.get("tokenizer.ggml.add_space_prefix")
    return flag is None or bool(flag.parts[-1][0])


def drop_space_prefix(path: str) -> None:
    """tokenizer.ggml.add_space_prefix = false, through the GGUF surgery tool (written beside, checked,
    renamed). llama.cpp's converter writes the key for Llama-family vocabs only: without it a
    SentencePiece model trained with no prefix gets one before every text piece, and every answer
    of a small model changes."""
    key = "tokenizer.ggml.add_space_prefix"
    fixed = path + ".prefix"
    reply = gguf_surgery.handle({"op": "set_kv", "workspace": os.path.dirname(os.path.abspath(path)),
                                 "path": os.path.abspath(path), "out": os.path.abspath(fixed),
                                 "set": {key: False}, "types": {key: "bool"}})
    if not reply.get("ok"):
        fail("GGUF_BAD", "could not set %s=false: %s" % (key, reply.get("failure") or reply.get("error")), rc=1)
    os.replace(fixed, path)
    say("%s=false set: the tokenizer the model was trained with adds no space prefix" % key)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--outtype", default="f16")
    p.add_argument("--converter", default=default_converter())
    p.add_argument("--mmproj", metavar="OUT", help="an image-text model's projector too, into OUT (--mmproj)")
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
    converted(args, args.out, [], "the converted GGUF")
    if args.mmproj:
        converted(args, args.mmproj, ["--mmproj"], "the converted projector")
    if args.delete_input:
        delete_intermediate(args.model)
    marker("CONVERT_DONE", "%s in %.0f s" % (args.out, time.time() - started))


if __name__ == "__main__":
    main()
