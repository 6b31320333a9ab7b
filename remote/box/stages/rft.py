"""The rft stage: one round of rejection-sampling fine-tuning driven by cu_eval's rewards (§10).

1. before: cu_eval on the held-out tasks against the served model (--url).
2. sample: --samples answers per training task at --temperature; the rewarded ones are kept.
3. train: a LoRA on the base with the same train stage (its NaN guard, poison files, the vision
   tower frozen, the language-only regex) on the kept answers beside the original training set
   (--mix: so that the round adds to what the model knew instead of replacing it).
4. merge, convert (the model and its projector), quantize: the same stages, into OUT.
5. serve the round's model on --port with the same serve stage, run cu_eval on the held-out
   tasks against it, then stop that server.
Prints "reward before -> after" and RFT_DONE; OUT/summary.json has both runs' summaries (the
runs themselves are RUNS/rft-NAME-before, -samples and -after, beside cu_eval's), the
counts sampled and kept, and the round's model. The served model is not replaced: serving the
round's model is the operator's choice (its GGUF is in OUT). Each step's own markers (TRAIN_NAN,
GGUF_BAD, SMOKE_FAIL, ...) reach this log as they are; a failed step is RFT_FAILED naming it.

Runs ON the box, in the box venv:
  venv/bin/python -m samai_box.stages.rft --url http://127.0.0.1:18081 --tasks data/cu/tasks.jsonl \\
      --base models/base --mix data/train.jsonl --out runs/rft/NAME --port 18082 ...
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Any

from .chromium import BrowserMissing, find_browser
from .common import fail, marker, say, write_json
from .cu_eval import Asking
from .cu_eval import evaluate as cu_evaluate
from .cu_eval import parser as cu_parser
from .vision import LORA_REGEX, image_of
from .webtasks import answer_text

SERVE_FAILED = ("SMOKE_FAIL", "SERVE_FAILED", "SERVER_DIED", "SERVE_REFUSED", "PORT_BUSY")


def step(name: str, argv: list[str]) -> None:
    """Run one stage of the round to its end, its output into this log; RFT_FAILED if it fails."""
    say("rft: %s: %s" % (name, " ".join(argv[2:])))
    rc = subprocess.call(argv, stdout=sys.stdout, stderr=subprocess.STDOUT)
    if rc != 0:
        fail("RFT_FAILED", "the round's %s step ended with rc=%d (its log is above)" % (name, rc), rc=3)


def module(name: str, *args: str) -> list[str]:
    return [sys.executable, "-m", __package__ + "." + name, *args]


def kept_examples(episodes_file: str, out: str) -> list[dict[str, Any]]:
    """The rewarded episodes as training examples (messages naming an image copied beside them)."""
    images = os.path.join(out, "images")
    os.makedirs(images, exist_ok=True)
    examples: list[dict[str, Any]] = []
    run_dir = os.path.dirname(episodes_file)
    with open(episodes_file) as f:
        for line in f:
            row = json.loads(line)
            if row.get("reward") != 1 or not row.get("shot"):
                continue
            name = "images/rft-%04d.png" % len(examples)
            shutil.copyfile(os.path.join(run_dir, row["shot"]), os.path.join(out, name))
            content = [{"type": "image", "image": name}, {"type": "text", "text": row["instruction"]}]
            examples.append({"messages": [{"role": "user", "content": content},
                                          {"role": "assistant", "content": answer_text(row["answer"]).strip()}]})
    return examples


def mixed_in(mix: str, out: str) -> list[dict[str, Any]]:
    """The original training set's examples, their images copied beside the round's data."""
    folder = os.path.dirname(os.path.abspath(mix))
    examples = []
    with open(mix) as f:
        for i, line in enumerate(f):
            if not line.strip():
                continue
            msgs = json.loads(line)["messages"]
            name = "images/mix-%04d.png" % i
            image_of(msgs, folder).save(os.path.join(out, name))  # read from inside its folder only
            msgs[0]["content"] = [dict(c, image=name) if isinstance(c, dict) and c.get("type") == "image" else c
                                  for c in msgs[0]["content"]]
            examples.append({"messages": msgs})
    return examples


def write_round_data(examples: list[dict[str, Any]], out: str) -> str:
    path = os.path.join(out, "train.jsonl")
    with open(path, "w") as f:
        for example in examples:
            f.write(json.dumps(example) + "\n")
    return path


def serve_round(args: argparse.Namespace, model: str, mmproj: str) -> subprocess.Popen:
    """The round's model served on --port by the serve stage; returned once it answers."""
    argv = module("serve", "--model", model, "--mmproj", mmproj, "--port", str(args.port), "--ctx", str(args.ctx),
                  "--llama-server", args.llama_server, "--server-log", os.path.join(args.out, "server.log"),
                  *args.serve_arg)
    say("rft: serve: %s" % " ".join(argv[2:]))
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        sys.stdout.write(line)
        sys.stdout.flush()
        if line.startswith(SERVE_FAILED):
            break
        if line.startswith("SMOKE_OK"):  # the serve stage asks its smoke question of every model
            proc.stdout.close()  # what it says from now on is its server's end, which this round causes
            return proc
    stop(proc)
    fail("RFT_FAILED", "the round's model did not come up on port %d (its log is above)" % args.port, rc=3)


def stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(15)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def cu_run(args: argparse.Namespace, url: str, out: str, split: str, samples: int,
           temperature: float) -> dict[str, Any]:
    run_args = argparse.Namespace(**vars(args))
    run_args.split, run_args.samples = split, samples
    say("rft: cu_eval %s on %s (%d sample(s) per task, temperature %g) -> %s" % (split, url, samples, temperature, out))
    asking = Asking(url, args.max_tokens, temperature, args.request_timeout, args.image_cap)
    summary = cu_evaluate(run_args, asking, out)
    say("rft: %s: success rate %s on %d episodes (%d parse failures, %d of them missed, %d errors)"
        % (os.path.basename(out), summary["success_rate"], summary["n"], summary["parse_failures"], summary["missed"],
           summary["errors"]))
    return summary


def parser() -> argparse.ArgumentParser:
    p = cu_parser()
    p.description = __doc__.splitlines()[0]
    p.set_defaults(samples=4, temperature=1.0)  # of the sampling; the two evals run greedy, once per task
    p.add_argument("--base", required=True)
    p.add_argument("--runs", default="runs/cu", help="where the round's cu runs go (RUNS/rft-NAME-before, "
                   "-samples, -after), beside cu_eval's, for the eval pane and check eval")
    p.add_argument("--mix", help="the original training set, trained on beside the kept answers")
    p.add_argument("--epochs", default="10")
    p.add_argument("--lora-regex", default=LORA_REGEX)
    p.add_argument("--llama-server", required=True)
    p.add_argument("--llama-quantize", required=True)
    p.add_argument("--quant-type", default="Q8_0")
    p.add_argument("--port", type=int, required=True, help="where the round's model is served for its eval")
    p.add_argument("--ctx", type=int, default=512)
    p.add_argument("--serve-arg", action="append", default=[], metavar="ARG",
                   help="passed to the serve stage (repeatable; e.g. --serve-arg=--image-max-tokens --serve-arg=64)")
    p.add_argument("--train-arg", action="append", default=[], metavar="ARG",
                   help="passed to the train stage (repeatable; e.g. --train-arg=--bf16)")
    p.add_argument("--convert-arg", action="append", default=[], metavar="ARG",
                   help="passed to the convert stage (repeatable; e.g. --convert-arg=--converter --convert-arg=PATH)")
    return p


def main() -> None:
    args = parser().parse_args()
    started = time.time()
    try:
        args.browser_path = find_browser(args.browser)
    except BrowserMissing as e:
        fail("RFT_FAILED", str(e), rc=2)
    os.makedirs(args.out, exist_ok=True)
    runs = os.path.join(args.runs, "rft-" + os.path.basename(os.path.normpath(args.out)))
    before = cu_run(args, args.url, runs + "-before", "heldout", 1, 0.0)
    sampled = cu_run(args, args.url, runs + "-samples", "train", args.samples, args.temperature)
    data = os.path.join(args.out, "data")
    kept = kept_examples(os.path.join(runs + "-samples", "episodes.jsonl"), data)
    say("rft: kept %d of %d sampled answers (rewarded)" % (len(kept), sampled["n"]))
    if not kept:
        fail("RFT_FAILED", "no sampled answer was rewarded: nothing to train on (try more --samples or a higher "
             "--temperature)", rc=1)
    train_file = write_round_data(kept + (mixed_in(args.mix, data) if args.mix else []), data)
    train_dir, merged = os.path.join(args.out, "train"), os.path.join(args.out, "merged")
    f16, mmproj = os.path.join(args.out, "vlm-f16.gguf"), os.path.join(args.out, "vlm-mmproj-f16.gguf")
    model = os.path.join(args.out, "vlm-%s.gguf" % args.quant_type.lower())
    step("train", module("train", "--base", args.base, "--data", train_file, "--out", train_dir, "--epochs",
                         args.epochs, "--nan-patience", "5", "--lora-regex", args.lora_regex, *args.train_arg))
    step("merge", module("merge", "--base", args.base, "--train-dir", train_dir, "--out", merged))
    step("convert", module("convert", "--model", merged, "--out", f16, "--mmproj", mmproj, "--delete-input",
                           *args.convert_arg))
    step("quantize", module("quantize", "--in", f16, "--out", model, "--type", args.quant_type, "--llama-quantize",
                            args.llama_quantize, "--delete-input"))
    server = serve_round(args, model, mmproj)
    try:
        after = cu_run(args, "http://127.0.0.1:%d" % args.port, runs + "-after", "heldout", 1, 0.0)
    finally:
        stop(server)
    summary = {"before": before, "after": after, "sampled": sampled["n"], "kept": len(kept),
               "sample_success_rate": sampled["success_rate"], "model": model, "mmproj": mmproj,
               "seconds": round(time.time() - started, 1)}
    write_json(os.path.join(args.out, "summary.json"), summary)
    say("rft: reward per round: round 0 (served) %s, round 1 %s on the held-out tasks"
        % (before["success_rate"], after["success_rate"]))
    marker("RFT_DONE", "held-out success %s -> %s; kept %d of %d samples; the round's model is %s"
           % (before["success_rate"], after["success_rate"], len(kept), sampled["n"], model))


if __name__ == "__main__":
    main()
