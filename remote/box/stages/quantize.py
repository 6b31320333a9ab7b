"""The quantize stage: an f16 GGUF to the configured type, checked, the f16 deleted if intermediate.

With --llama-quantize PATH the llama.cpp binary does it; without it, or when that binary is
missing (said in the log), llama-cpp-python's llama_model_quantize in the box venv. The result
must pass the GGUF checker, with the expected tensor count and last tensor name when given (playbook §5). An input GGUF
with a nan/inf in an F32/F16 tensor is refused; the output's F32/F16 tensors (norms, and any
left unquantized) are checked the same way; quantized blocks are not decoded (the checker vets
the file's structure).

Runs ON the box, in the box venv:
  python -m samai_box.stages.quantize --in gguf/tiny-f16.gguf --out gguf/tiny-q8_0.gguf --type Q8_0 [--delete-input]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time

from .common import accept_gguf, delete_intermediate, fail, marker, refuse_nonfinite_gguf, say


def quantize_with_library(src: str, dst: str, qtype: str) -> int:
    import ctypes

    import llama_cpp

    ftype = getattr(llama_cpp, "LLAMA_FTYPE_MOSTLY_" + qtype.upper(), None)
    if ftype is None:
        fail("QUANT_REFUSED", "llama-cpp-python knows no type %s" % qtype, rc=2)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    return llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--in", dest="src", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--type", default="Q8_0")
    p.add_argument("--llama-quantize", help="path of llama.cpp's llama-quantize binary")
    p.add_argument("--expect-tensors", type=int)
    p.add_argument("--last-tensor")
    p.add_argument("--delete-input", action="store_true")
    args = p.parse_args()
    if not os.path.isfile(args.src):
        fail("QUANT_REFUSED", "needs %s: missing (run convert first)" % args.src, rc=2)
    refuse_nonfinite_gguf(args.src, "QUANT_REFUSED", "the input", rc=2)
    started = time.time()
    tmp = args.out + ".partial"
    if args.llama_quantize and not os.access(args.llama_quantize, os.X_OK):
        say("no llama-quantize at %s: quantizing with llama-cpp-python's llama_model_quantize" % args.llama_quantize)
        args.llama_quantize = None
    if args.llama_quantize:
        rc = subprocess.call([args.llama_quantize, args.src, tmp, args.type])
    else:
        rc = quantize_with_library(args.src, tmp, args.type)
    if rc != 0:
        fail("GGUF_BAD", "quantizing to %s failed with rc=%d" % (args.type, rc), rc=1)
    refuse_nonfinite_gguf(tmp, "GGUF_BAD", "the quantized GGUF", rc=1, bad_name=args.out + ".bad")
    result = accept_gguf(tmp, args.out, expect_tensors=args.expect_tensors, expect_last=args.last_tensor)
    say("%s: %s, %d tensors, %d bytes" % (args.out, args.type, result["tensor_count"], os.path.getsize(args.out)))
    if args.delete_input:
        delete_intermediate(args.src)
    marker("QUANT_DONE", "%s in %.0f s" % (args.out, time.time() - started))


if __name__ == "__main__":
    main()
