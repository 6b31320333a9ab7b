"""Make the tiny pipeline's base model: the stand-in for weights downloaded from a hub.

A real Llama architecture (transformers LlamaForCausalLM) with a character-level SentencePiece
tokenizer, fully trained on multiplication facts with their thinking
("17*23=<think>17*20+17*3=340+51</think>391") so that it knows them;
the LoRA stage then teaches it the chat format. Writes the model, the tokenizer and a
manifest.json (size and sha256 of every file) into --out, for the fetch stage to download.

Runs ON the box, in the box venv: python -m samai_box.stages.pretrain --out source/tiny-base
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any, Callable, Sequence

from .common import CHAT_TEMPLATE, cpu_threads, fact_text, facts, marker, messages, say, sha256_of, write_json


def build_tokenizer(out: str, texts: list[str], special: Sequence[str] = (), chat_template: str = CHAT_TEMPLATE) -> Any:
    """A character-level SentencePiece model: its vocabulary is the characters of the texts and
    the chat format plus the 256 byte-fallback pieces (BPE with no room for merges), so every
    character is one token; `special` tokens are whole pieces, never split.
    tokenizer.model stays in the model folder: llama.cpp's converter reads the vocab from it."""
    import sentencepiece as spm
    from transformers import LlamaTokenizer

    corpus = os.path.join(out, "corpus.txt")
    with open(corpus, "w") as f:
        f.write("\n".join(texts) + "\nQA\n")
    chars = sorted(set("".join(texts) + "QA"))
    spm.SentencePieceTrainer.train(
        input=corpus, model_prefix=os.path.join(out, "tokenizer"), model_type="bpe",
        vocab_size=len(chars) + 3 + 256 + len(special), character_coverage=1.0, add_dummy_prefix=False,
        byte_fallback=True, user_defined_symbols=list(special), unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2)
    os.remove(corpus)
    os.remove(os.path.join(out, "tokenizer.vocab"))
    # No space prefix on either side: llama.cpp reads add_prefix_space from tokenizer_config.json,
    # and a prefix the model never saw in training would change every answer. Byte fallback
    # lets any character through llama.cpp's SPM tokenizer instead of failing on it.
    # The vocabulary is given piece by piece in the SentencePiece model's order: transformers' own
    # reading of tokenizer.model can number the pieces otherwise (it dropped "=" and moved "A" and
    # "Q" of the VLM's vocabulary), and llama.cpp numbers them as the model file does.
    sp = spm.SentencePieceProcessor(model_file=os.path.join(out, "tokenizer.model"))
    tok = LlamaTokenizer(vocab={sp.id_to_piece(i): i for i in range(sp.get_piece_size())}, merges=[],
                         add_bos_token=True, add_eos_token=False, add_prefix_space=False)
    if special:
        tok.add_special_tokens({"additional_special_tokens": list(special)})
    tok.chat_template = chat_template
    tok.pad_token = tok.unk_token  # batches are padded; padding is masked out of every loss
    return tok


def write_manifest(folder: str) -> None:
    """manifest.json: what the fetch stage downloads from this folder (subfolders too) and checks."""
    walked = (os.path.relpath(os.path.join(top, n), folder).replace(os.sep, "/")
              for top, _, names in os.walk(folder) for n in names)
    files = sorted(n for n in walked if n != "manifest.json")
    write_json(os.path.join(folder, "manifest.json"), {"files": [
        {"path": n, "size": os.path.getsize(os.path.join(folder, n)), "sha256": sha256_of(os.path.join(folder, n))}
        for n in files]})


def write_data(folder: str, pairs: list[tuple[int, int]]) -> None:
    """The chat-formatted fine-tuning set and the eval set (question, gold answer)."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "train.jsonl"), "w") as f:
        for a, b in pairs:
            f.write(json.dumps({"messages": messages(a, b)}) + "\n")
    with open(os.path.join(folder, "eval.jsonl"), "w") as f:
        for i, (a, b) in enumerate(pairs):
            f.write(json.dumps({"id": i, "prompt": "%d*%d=" % (a, b), "gold": str(a * b)}) + "\n")
    write_manifest(folder)


def train(model: Any, batch: Callable[[int], dict[str, Any]], steps: int, lr: float) -> float:
    """Every weight trained for `steps` steps on batch(step) (the model's keyword arguments)."""
    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)
    model.train()
    for step in range(1, steps + 1):
        loss = model(**batch(step)).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad()
        if step % max(1, steps // 20) == 0 or step == steps:
            say("pretrain step %d/%d loss %.4f" % (step, steps, loss.item()))
    return loss.item()


def parser(doc: str, hidden: int, steps: int) -> argparse.ArgumentParser:
    """The options every pretrain stage takes (the model's size, the run's length)."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--data-out", help="also write the fine-tuning and eval sets here")
    p.add_argument("--hidden", type=int, default=hidden)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--again", action="store_true", help="make it even if --out already holds one")
    return p


def begin(args: argparse.Namespace) -> float | None:
    """When the making starts (seeded, on cpu_threads() threads, --out made), or None when --out holds
    a model already: made once, like downloaded weights."""
    import torch

    if os.path.isfile(os.path.join(args.out, "manifest.json")) and not args.again:
        marker("PRETRAIN_DONE", "%s already made (--again to make it anew)" % args.out)
        return None
    torch.manual_seed(args.seed)
    torch.set_num_threads(cpu_threads())
    os.makedirs(args.out, exist_ok=True)
    return time.time()


def main() -> None:
    p = parser(__doc__, hidden=128, steps=500)
    p.add_argument("--facts", type=int, default=64)
    args = p.parse_args()
    started = begin(args)
    if started is None:
        return
    from transformers import LlamaConfig, LlamaForCausalLM

    texts = [fact_text(a, b) for a, b in facts(args.facts)]
    tok = build_tokenizer(args.out, texts)
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=args.hidden, intermediate_size=args.hidden * 2 + args.hidden // 2,
        num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.heads // 2,
        max_position_embeddings=96, rms_norm_eps=1e-5, bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id, tie_word_embeddings=False)
    model = LlamaForCausalLM(config)
    say("tiny llama: %d parameters, vocab %d, %d facts" % (model.num_parameters(), len(tok), len(texts)))
    enc = tok([t + tok.eos_token for t in texts], padding=True, return_tensors="pt")
    facts_batch = dict(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],
                       labels=enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100))
    loss = train(model, lambda step: facts_batch, args.steps, args.lr)
    model.save_pretrained(args.out, safe_serialization=True)
    tok.save_pretrained(args.out)
    write_manifest(args.out)
    if args.data_out:
        write_data(args.data_out, facts(args.facts))
    marker("PRETRAIN_DONE", "%s loss=%.4f in %.0f s" % (args.out, loss, time.time() - started))


if __name__ == "__main__":
    main()
