"""The train stage: a LoRA on a frozen base with the HF Trainer, guarded the way the playbook paid for.

- chat-formatted data; every token before the assistant's answer is labelled -100 (prefix mask)
- fp16 is refused for a frozen-base LoRA: its GradScaler turns grad_norm into nan and the run
  silently learns nothing (playbook §9); bf16 or fp32 only
- a loss is logged every step; the NaN guard watches the whole run: it stops the run when 3 of
  the first 4 logged steps have loss 0/nan or grad_norm nan (the playbook's early trip), or when
  --nan-patience logged steps in a row are sick (loss 0/nan/inf, grad_norm nan/inf or exactly 0:
  a run that diverged or whose gradients died later on); it writes TRAIN_NAN, exits non-zero and
  never writes final/
- a run that ends sick without tripping (its last logged step sick: nan, a hidden NaN or a
  grad_norm of 0) is judged the same way: final/ and TRAIN_DONE are written only by a run that ends healthy
- success writes OUT/final (the adapter) and only then OUT/TRAIN_DONE
- with --push-to TARGET, every --push-every'th epoch's adapter is saved to OUT/milestones/epoch-N
  and pushed there at once (§8), unless the run is sick at that moment
- --diverge-after N and --kill-gradients-after N reproduce the two ways a run dies after its
  first steps, with real optimizer steps: a huge learning rate from step N on (loss and
  grad_norm go nan), or lora_dropout 1.0 from step N on (grad_norm exactly 0, loss flat)
- poison files of an earlier run (final/, TRAIN_DONE, TRAIN_NAN) make it refuse to start
- Trainer checkpoints go to OUT/checkpoints/checkpoint-STEP (every --save-steps optimizer steps,
  else every epoch; the newest --save-total-limit kept), each whole or absent: written into a
  temporary sibling, sealed with its completeness record (samai_complete.json, written last) and
  renamed into place, the old ones deleted only after (wholesave.py; SAMAI_FAULT_SAVE is its test
  hook); --resume-from CHECKPOINT continues a dead run from one of them with the Trainer's own
  resume_from_checkpoint: the global step, the optimizer, the scheduler and the RNG state go on
  where they were

Runs ON the box, in the box venv:
  python -m samai_box.stages.train --base models/base --data data/train.jsonl --out runs/train
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Any, Callable, List, Tuple

from . import vision
from .common import cpu_threads, fail, marker, push_milestone, say
from .wholesave import Faults, whole_saving_trainer

POISON = ("final", "TRAIN_DONE", "TRAIN_NAN")
GUARD_WINDOW, GUARD_BAD = 4, 3
NAN_PATIENCE = 5  # sick logged steps in a row that stop the run after the early window
SAVE_TOTAL_LIMIT = 3  # checkpoints kept: a resume needs one that is whole and before the first anomaly
TEXT_TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
DIVERGE_LR = 1e6  # --diverge-after's learning rate: AdamW moves every weight by about this much
# What a setup gives the Trainer: (LoRA model, examples, collator, what saves the tokenizer and processor).
Setup = Tuple[Any, List[Any], Callable[[Any], Any], Callable[[str], Any]]


def bad_step(loss: float | None, grad_norm: float | None) -> bool:
    """Loss 0 or nan, or grad_norm nan: the signatures of a run that is not learning."""
    loss_bad = loss is None or loss == 0 or not math.isfinite(loss)
    return loss_bad or (grad_norm is not None and not math.isfinite(grad_norm))


def sick_step(loss: float | None, grad_norm: float | None) -> bool:
    """bad_step, or a gradient that is exactly 0: nothing reaches the trained weights."""
    return bad_step(loss, grad_norm) or grad_norm == 0


def why_not_healthy(steps: list[tuple[float | None, float | None]]) -> str | None:
    """The reason a finished run is not fit to be saved, or None. steps: (loss, grad_norm) as logged."""
    if not steps:
        return "no training step was logged"
    loss, grad_norm = steps[-1]
    if sick_step(loss, grad_norm):  # a grad_norm of 0 included: gradients that died for good
        return "the last logged step is sick: loss %s grad_norm %s" % (loss, grad_norm)
    return None


def load_examples(path: str, tok: Any) -> list[dict[str, list[int]]]:
    """input_ids and labels with the prompt (everything before the answer) masked out."""
    examples = []
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            msgs = json.loads(line)["messages"]
            prompt = tok.apply_chat_template(msgs[:-1], add_generation_prompt=True, tokenize=False)
            full = tok.apply_chat_template(msgs, tokenize=False)
            # the template writes the BOS itself: the tokenizer must not add a second one
            ids = tok(full, add_special_tokens=False)["input_ids"]
            n_prompt = len(tok(prompt, add_special_tokens=False)["input_ids"])
            examples.append({"input_ids": ids, "labels": [-100] * n_prompt + ids[n_prompt:]})
    return examples


def pad_batch(pad_id: int) -> Callable[[list[dict[str, list[int]]]], dict[str, Any]]:
    import torch

    def collate(batch: list[dict[str, list[int]]]) -> dict[str, Any]:
        width = max(len(b["input_ids"]) for b in batch)
        ids = [b["input_ids"] + [pad_id] * (width - len(b["input_ids"])) for b in batch]
        labels = [b["labels"] + [-100] * (width - len(b["labels"])) for b in batch]
        mask = [[1] * len(b["input_ids"]) + [0] * (width - len(b["input_ids"])) for b in batch]
        return {"input_ids": torch.tensor(ids), "labels": torch.tensor(labels), "attention_mask": torch.tensor(mask)}

    return collate


def make_progress(started: float) -> Any:
    from transformers import TrainerCallback

    class ProgressLine(TrainerCallback):
        """One tqdm-style line per logged step (the Trainer's own bar is off: its carriage returns
        would fill the log): the console reads step/total and the time left from it."""

        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
                   **kwargs: Any) -> None:
            if state.max_steps:
                say(progress_line(state.global_step, state.max_steps, time.time() - started))

    return ProgressLine()


def progress_line(done: int, total: int, elapsed: float) -> str:
    """`train 12/80 [00:03<00:17, 4.00it/s]`, as tqdm writes its bar."""
    rate = done / elapsed if elapsed > 0 and done else 0.0
    left = clock((total - done) / rate) if rate else "?"
    return "train %d/%d [%s<%s, %.2fit/s]" % (done, total, clock(elapsed), left, rate)


def clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return "%d:%02d:%02d" % (hours, minutes, secs) if hours else "%02d:%02d" % (minutes, secs)


def make_guard(out: str, patience: int = NAN_PATIENCE) -> Any:
    from transformers import TrainerCallback

    class NanGuard(TrainerCallback):
        """Stops the run, before anything more is saved, when it is not learning: 3 of its first 4
        logged steps bad, or `patience` sick logged steps in a row at any point of the run."""

        def __init__(self) -> None:
            self.seen: list[bool] = []
            self.steps: list[tuple[float | None, float | None]] = []  # (loss, grad_norm) of every logged step
            self.sick_run: list[int] = []  # global steps of the current run of sick steps
            self.tripped = False

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            """A resumed run is read on from the steps it continues: the checkpoint's log history
            (the Trainer loads it before this) counts towards the first steps and a sick run."""
            for entry in getattr(state, "log_history", None) or []:
                if isinstance(entry, dict) and "loss" in entry:
                    self.observe(entry, int(entry.get("step") or 0))

        def observe(self, logs: dict[str, Any], step: int) -> tuple[float | None, float | None]:
            loss, grad_norm = _number(logs.get("loss")), _number(logs.get("grad_norm"))
            self.steps.append((loss, grad_norm))
            if len(self.seen) < GUARD_WINDOW:
                self.seen.append(bad_step(loss, grad_norm))
            self.sick_run = self.sick_run + [step] if sick_step(loss, grad_norm) else []
            return loss, grad_norm

        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
                   **kwargs: Any) -> None:
            if not logs or "loss" not in logs:
                return
            loss, grad_norm = self.observe(logs, state.global_step)
            if self.tripped:
                return
            if sum(self.seen) >= GUARD_BAD:
                self.trip(control, state, loss, grad_norm, "%d of the first %d logged steps had loss 0/nan or "
                          "grad_norm nan" % (sum(self.seen), len(self.seen)))
            elif len(self.sick_run) >= patience:
                self.trip(control, state, loss, grad_norm,
                          "%d logged steps in a row from step %d had loss 0/nan/inf or grad_norm nan/inf/0 "
                          "(last: loss %s grad_norm %s)" % (len(self.sick_run), self.sick_run[0], loss, grad_norm))

        def trip(self, control: Any, state: Any, loss: float | None, grad_norm: float | None, why: str) -> None:
            self.tripped = True
            write_nan_marker(out, "step %d: loss %s grad_norm %s: %s" % (state.global_step, loss, grad_norm, why))
            marker("TRAIN_NAN", why)
            control.should_training_stop = True
            control.should_save = False

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self.tripped:  # runs after the Trainer's own flow callback: no checkpoint of a sick run
                control.should_save = False

        def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self.tripped:
                control.should_save = False

    return NanGuard()


def make_milestones(out: str, target: str, every: int, guard: Any) -> Any:
    """§8: the adapter of every `every`-th epoch saved to OUT/milestones/epoch-N and pushed at once,
    so that a box lost mid-run keeps it; never while the NaN guard has tripped or sees sick steps."""
    from transformers import TrainerCallback

    class Milestones(TrainerCallback):
        def on_epoch_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
            epoch = int(round(state.epoch or 0))
            if guard.tripped or guard.sick_run or epoch % every or model is None:
                return
            folder = os.path.join(out, "milestones", "epoch-%d" % epoch)
            model.save_pretrained(folder)
            push_milestone(target, folder, "epoch-%d" % epoch)

    return Milestones()


def write_nan_marker(out: str, text: str) -> None:
    with open(os.path.join(out, "TRAIN_NAN"), "w") as f:
        f.write(text + "\n")


def cut_adapter(model: Any) -> None:
    """lora_dropout 1.0: every LoRA layer's input is zeroed, so its gradients are exactly 0 while
    they still require grad (a frozen adapter would make backward fail, not train silently)."""
    import torch

    for module in model.modules():
        drop = getattr(module, "lora_dropout", None)
        if isinstance(drop, torch.nn.ModuleDict):
            for key in list(drop.keys()):
                drop[key] = torch.nn.Dropout(p=1.0)


def make_breaker(diverge_after: int | None, kill_after: int | None, diverge_lr: float) -> Any:
    """For the guard's own tests: a run that dies after its first steps, through real optimizer steps."""
    from transformers import TrainerCallback

    class Breaker(TrainerCallback):
        def __init__(self) -> None:
            self.killed = False

        def on_step_begin(self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None,
                          **kwargs: Any) -> None:
            if diverge_after is not None and state.global_step >= diverge_after and optimizer is not None:
                # set before every optimizer step: the scheduler resets it after each one
                for group in optimizer.param_groups:
                    group["lr"] = diverge_lr
            if kill_after is not None and state.global_step >= kill_after and not self.killed:
                self.killed = True
                say("the adapter's input dropped (dropout 1.0) from step %d on (--kill-gradients-after)"
                    % (state.global_step + 1))
                cut_adapter(model)

    return Breaker()


def _number(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def inject_nan(model: Any) -> None:
    """For the guard's own test: poison the LoRA weights so every loss is nan."""
    import torch

    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.fill_(float("nan"))


def lora_config(args: argparse.Namespace, default_targets: str | list[str]) -> Any:
    """--lora-regex as peft's regex (a str, matched against the whole module name), else the
    --lora-targets names (a list, matched as name suffixes), else the default of the model kind."""
    from peft import LoraConfig

    targets = args.lora_regex or (args.lora_targets.split(",") if args.lora_targets else default_targets)
    say("LoRA r=%d on %s" % (args.lora_r, targets if isinstance(targets, str) else ",".join(targets)))
    return LoraConfig(r=args.lora_r, lora_alpha=args.lora_r * 2, lora_dropout=0.0, task_type="CAUSAL_LM",
                      target_modules=targets)


def text_setup(args: argparse.Namespace) -> Setup:
    """(LoRA model, examples, collator, what saves the tokenizer) for a causal LM."""
    import torch
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.base)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(args.base, dtype=torch.float32),
                           lora_config(args, TEXT_TARGETS.split(",")))
    say("%d trainable parameters" % sum(p.numel() for p in model.parameters() if p.requires_grad))
    return model, load_examples(args.data, tok), pad_batch(tok.pad_token_id), tok.save_pretrained


def vision_setup(args: argparse.Namespace) -> Setup:
    """The same for an image-text model (playbook §10): LoRA on the language model only, the
    vision tower and merger frozen explicitly, and both asserted before a step is taken: a LoRA
    target inside the vision side or a trainable vision parameter is TRAIN_REFUSED."""
    import torch
    from peft import get_peft_model
    from transformers import AutoModelForImageTextToText

    tok, image_processor = vision.load_processor(args.base)
    base = AutoModelForImageTextToText.from_pretrained(args.base, dtype=torch.float32)
    model = get_peft_model(base, lora_config(args, vision.LORA_REGEX))
    vision.freeze_vision(model)
    say("trainable parameters by part: %s" % ", ".join("%s %d" % kv for kv in vision.trainable_by_group(model).items()))
    why = vision.why_vision_not_frozen(model)
    if why:
        fail("TRAIN_REFUSED", why, rc=2)
    examples = vision.load_examples(args.data)

    def collate(batch: list[tuple[Any, list[dict[str, Any]]]]) -> dict[str, Any]:
        return vision.encode(tok, image_processor, batch)

    return model, examples, collate, lambda folder: vision.save_processor(tok, image_processor, folder)


def checkpoint_step(folder: str) -> int:
    name = os.path.basename(os.path.normpath(folder))
    return int(name.split("-", 1)[1]) if name.startswith("checkpoint-") and name[11:].isdigit() else -1


def resumable(out: str, given: str) -> str:
    """The checkpoint to resume from, refused unless it is a checkpoint-STEP folder of this run's
    OUT/checkpoints holding the Trainer's state (the console judges it whole before it asks)."""
    folder = os.path.realpath(given)  # relative: to the stage's folder, the workspace
    root = os.path.realpath(os.path.join(out, "checkpoints"))
    if os.path.dirname(folder) != root or checkpoint_step(folder) < 0:
        fail("TRAIN_REFUSED", "--resume-from %s is not a checkpoint-STEP folder in %s" % (given, root), rc=2)
    if not os.path.isfile(os.path.join(folder, "trainer_state.json")):
        fail("TRAIN_REFUSED", "--resume-from %s holds no trainer_state.json: not a whole checkpoint" % given, rc=2)
    return folder


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--epochs", type=float, default=20)
    p.add_argument("--lr", type=float, default=5e-3)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument("--lora-targets", help="module names, comma-separated (default: %s; for a VLM --lora-regex's "
                   "default)" % TEXT_TARGETS)
    p.add_argument("--lora-regex", help="a regex the whole module name must match (a VLM's default: %s)"
                   % vision.LORA_REGEX)
    p.add_argument("--fp16", action="store_true", help="refused: see the module's notes")
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--deepspeed", help="a DeepSpeed config file, passed through to the Trainer")
    p.add_argument("--inject-nan", action="store_true", help="poison the LoRA weights (tests the NaN guard)")
    p.add_argument("--nan-patience", type=int, default=NAN_PATIENCE,
                   help="sick logged steps in a row (after the first 4) that stop the run (default %d)" % NAN_PATIENCE)
    p.add_argument("--diverge-after", type=int, metavar="N",
                   help="from step N on, train with --diverge-lr (tests the NaN guard on a run that diverges)")
    p.add_argument("--diverge-lr", type=float, default=DIVERGE_LR)
    p.add_argument("--kill-gradients-after", type=int, metavar="N",
                   help="from step N on, drop the adapter's input (tests the guard on gradients that die)")
    p.add_argument("--max-steps", type=int, default=-1, help="stop after this many optimizer steps")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--push-to", metavar="TARGET", help="push each milestone adapter there (push's --to)")
    p.add_argument("--push-every", type=int, default=1, metavar="N", help="every N epochs (default 1)")
    p.add_argument("--save-steps", type=int, metavar="N",
                   help="a checkpoint every N optimizer steps (default: each epoch)")
    p.add_argument("--save-total-limit", type=int, default=SAVE_TOTAL_LIMIT, metavar="K",
                   help="the newest K checkpoints kept (default %d)" % SAVE_TOTAL_LIMIT)
    p.add_argument("--resume-from", metavar="CHECKPOINT",
                   help="a checkpoint-STEP folder under OUT/checkpoints to continue from")
    args = p.parse_args()

    if args.fp16:
        fail("TRAIN_REFUSED", "fp16=True with a frozen base: the GradScaler makes grad_norm nan and the run "
                              "never learns (playbook §9); use --bf16 or fp32", rc=2)
    poison = [n for n in POISON if os.path.exists(os.path.join(args.out, n))]
    if poison:
        fail("TRAIN_REFUSED", "poison files from an earlier run in %s: %s; clear them first (restart does)"
             % (args.out, ", ".join(poison)), rc=2)
    if args.push_every < 1:
        fail("TRAIN_REFUSED", "--push-every must be at least 1", rc=2)
    if args.nan_patience < 1:
        fail("TRAIN_REFUSED", "--nan-patience must be at least 1", rc=2)
    if not os.path.isfile(args.data):
        fail("TRAIN_REFUSED", "no training data at %s" % args.data, rc=2)
    if args.save_steps is not None and args.save_steps < 1:
        fail("TRAIN_REFUSED", "--save-steps must be at least 1", rc=2)
    if args.save_total_limit < 1:
        fail("TRAIN_REFUSED", "--save-total-limit must be at least 1", rc=2)
    resume = resumable(args.out, args.resume_from) if args.resume_from else None

    import torch
    from transformers import TrainingArguments, set_seed

    started = time.time()
    if os.environ.get("WORLD_SIZE"):  # under a launcher (torchrun, DeepSpeed): which rank this node's log is
        say("TRAIN_RANK rank=%s world_size=%s local_rank=%s" % (os.environ.get("RANK", "?"), os.environ["WORLD_SIZE"],
                                                                 os.environ.get("LOCAL_RANK", "?")))
    set_seed(args.seed)
    torch.set_num_threads(cpu_threads())
    os.makedirs(args.out, exist_ok=True)
    setup = vision_setup if vision.is_multimodal(args.base) else text_setup
    model, examples, collate, save_processor = setup(args)
    if args.inject_nan:
        inject_nan(model)
    guard = make_guard(args.out, args.nan_patience)
    callbacks = [guard, make_progress(started)]
    if args.push_to:
        callbacks.append(make_milestones(args.out, args.push_to, args.push_every, guard))
    if args.diverge_after is not None or args.kill_gradients_after is not None:
        callbacks.append(make_breaker(args.diverge_after, args.kill_gradients_after, args.diverge_lr))
    training = TrainingArguments(
        output_dir=os.path.join(args.out, "checkpoints"), num_train_epochs=args.epochs, max_steps=args.max_steps,
        per_device_train_batch_size=args.batch, learning_rate=args.lr, lr_scheduler_type="cosine",
        warmup_steps=5, logging_steps=1, logging_first_step=True,
        save_strategy="steps" if args.save_steps else "epoch", save_steps=args.save_steps or 500,
        save_total_limit=args.save_total_limit,
        fp16=False, bf16=args.bf16, deepspeed=args.deepspeed, report_to=[], seed=args.seed,
        use_cpu=not torch.cuda.is_available(), dataloader_num_workers=0, disable_tqdm=True)
    trainer = whole_saving_trainer()(model=model, args=training, train_dataset=examples, data_collator=collate,
                                     callbacks=callbacks)
    trainer.faults = Faults.from_env(lambda: trainer.state.global_step)
    if resume:
        marker("TRAIN_RESUMED", "from %s (step %d)" % (resume, checkpoint_step(resume)))
    trainer.train(resume_from_checkpoint=resume)
    if guard.tripped:
        say("training stopped by the NaN guard; no final/ written")
        sys.exit(3)
    sick = why_not_healthy(guard.steps)
    if sick:
        write_nan_marker(args.out, "after %d steps: %s" % (trainer.state.global_step, sick))
        marker("TRAIN_NAN", "the run ended sick: %s; no final/ written" % sick)
        sys.exit(3)
    final = os.path.join(args.out, "final")
    model.save_pretrained(final)
    save_processor(final)
    with open(os.path.join(args.out, "TRAIN_DONE"), "w") as f:
        f.write("%d steps in %.0f s\n" % (trainer.state.global_step, time.time() - started))
    marker("TRAIN_DONE", "%s after %d steps in %.0f s" % (final, trainer.state.global_step, time.time() - started))


if __name__ == "__main__":
    main()
