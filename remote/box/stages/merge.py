"""The merge stage: the adapter folded into the base, but only an adapter that finished training.

Refuses (MERGE_REFUSED, exit 2) when TRAIN_NAN exists, TRAIN_DONE is missing or final/ is
missing: the playbook's NaN run had its untrained adapter merged as if it were final (§9).
Files are not evidence enough: every tensor of the adapter is checked for nan/inf before the
merge (exit 2), and every tensor of the merged model before it is saved (exit 1); the refusal
names the first bad tensors and their count.
An image-text model is merged whole (playbook §10: the ConditionalGeneration stack, vision tower
and merger kept as they were, which is checked), its image processor saved beside it.

Runs ON the box, in the box venv:
  python -m samai_box.stages.merge --base models/base --train-dir runs/train --out models/merged
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from typing import Any

from . import vision
from .common import bad_tensors_text, fail, marker, nonfinite_safetensors, nonfinite_state, say


def image_tensors(model: Any) -> list[str]:
    """The names of a model's vision tower and merger tensors (none for a text model)."""
    return sorted(n for n in model.state_dict() if vision.group_of(n) in vision.IMAGE_GROUPS)


def gate(train_dir: str) -> str | None:
    """The reason merging must not happen, or None."""
    if os.path.exists(os.path.join(train_dir, "TRAIN_NAN")):
        return "%s/TRAIN_NAN exists: that run was stopped by the NaN guard" % train_dir
    if not os.path.exists(os.path.join(train_dir, "TRAIN_DONE")):
        return "%s/TRAIN_DONE is missing: training did not finish" % train_dir
    if not os.path.isdir(os.path.join(train_dir, "final")):
        return "%s/final is missing: there is no finished adapter" % train_dir
    return None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", required=True)
    p.add_argument("--train-dir", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    why = gate(args.train_dir)
    if why:
        fail("MERGE_REFUSED", why, rc=2)

    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoTokenizer

    started = time.time()
    adapter = os.path.join(args.train_dir, "final")
    bad, total = nonfinite_safetensors(adapter)
    if bad:
        fail("MERGE_REFUSED", "the adapter: " + bad_tensors_text(bad, total, adapter), rc=2)
    say("%s: all %d adapter tensors finite" % (adapter, total))
    multimodal = vision.is_multimodal(args.base)
    kind = AutoModelForImageTextToText if multimodal else AutoModelForCausalLM
    base = kind.from_pretrained(args.base, dtype=torch.float32)
    image_side = image_tensors(base)
    merged = PeftModel.from_pretrained(base, adapter).merge_and_unload()
    if image_tensors(merged) != image_side:
        fail("MERGE_REFUSED", "the merged model lost image tensors: %d of %d vision/merger tensors kept (nothing "
             "saved)" % (len(image_tensors(merged)), len(image_side)), rc=1)
    bad, total = nonfinite_state(merged.state_dict().items())
    if bad:
        fail("MERGE_REFUSED", "the merged model (nothing saved): " + bad_tensors_text(bad, total, args.out), rc=1)
    tmp = args.out + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    merged.save_pretrained(tmp, safe_serialization=True)
    if multimodal:
        vision.save_processor(*vision.load_processor(args.base), tmp)
    else:
        AutoTokenizer.from_pretrained(args.base).save_pretrained(tmp)
    spm_model = os.path.join(args.base, "tokenizer.model")
    if os.path.exists(spm_model):  # llama.cpp's converter reads a SentencePiece vocab from it
        shutil.copy(spm_model, tmp)
    shutil.rmtree(args.out, ignore_errors=True)
    os.replace(tmp, args.out)  # a merged folder exists only once it is whole
    say("merged %s + %s/final" % (args.base, args.train_dir))
    marker("MERGE_DONE", "%s in %.0f s" % (args.out, time.time() - started))


if __name__ == "__main__":
    main()
