"""The eval stage: ask an OpenAI-compatible server every question and count what came back.

The answer text is `content` + `reasoning_content`: llama.cpp moves an unclosed <think> into
reasoning_content and leaves content empty, which once scored a working model 0 % (§6).
`--answer-from content` reads content alone, as the client of that incident did (to reproduce
it, or to measure what such a client sees). The counts that expose such a fake zero (empty
content, truncated answers, no prediction) are in the summary next to the accuracy. max_tokens
defaults to 2048: too few cut thinking short.

Writes OUT/items.jsonl (id, prompt, gold, pred, correct, finish_reason, content,
reasoning_content) and OUT/summary.json (n, correct, accuracy, pred_none, truncated,
empty_content), then prints EVAL_RC=N (0: done; 1: accuracy under --min-accuracy; 2: errors).
With --push-to TARGET the report folder is pushed there once written (§8: reports are milestones).
For a base model, --prompt-format text sends each prompt as a text to continue (/v1/completions),
--stop where to end it, and --extract first-word scores the answer's first word.

An item may ask about an image: "image": "PATH", relative to the eval set's folder and inside it
(the data is untrusted: an absolute path, a way out or a symlink out is that item's error). It is
sent in the chat message as a base64 data URL, its long side capped at --image-cap px (images.py),
and its line in items.jsonl gets the image's record: path, width, height, sent_width,
sent_height, sent_bytes, resized. An image item needs the chat format.

Runs ON the box:
  python3 -m samai_box.stages.eval --url http://127.0.0.1:18080 --data data/eval.jsonl --out runs/eval/NAME
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import sys
import time
import urllib.error
import urllib.request
from typing import Any, Mapping

from .common import marker, push_milestone, say, write_json
from .images import IMAGE_CAP, ImageError, chat_content, inside

NUMBER = re.compile(r"-?\d+")
WORD = re.compile(r"\w+")


def ask(url: str, prompt: Any, args: argparse.Namespace) -> tuple[dict[str, Any], str | None]:
    """(message, finish_reason): a chat turn (prompt: its content, a text or a list of parts), or
    for --prompt-format text (a base model) the text that continues the prompt (/v1/completions),
    as a message's content."""
    if args.prompt_format == "text":
        path, request = "/v1/completions", {"prompt": prompt}
    else:
        path, request = "/v1/chat/completions", {"messages": [{"role": "user", "content": prompt}]}
    if args.stop:
        request["stop"] = args.stop
    choice = first_choice(url, path, dict(request, max_tokens=args.max_tokens, temperature=0), args.timeout)
    message = {"content": choice.get("text") or ""} if args.prompt_format == "text" else choice["message"]
    return message, choice.get("finish_reason")


def first_choice(url: str, path: str, request: Mapping[str, Any], timeout: float) -> dict[str, Any]:
    """The first choice of an OpenAI-compatible server's answer to request."""
    body = json.dumps(request).encode()
    req = urllib.request.Request(url.rstrip("/") + path, data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        choice = json.loads(r.read())["choices"][0]
    if not isinstance(choice, dict):
        raise ValueError("the server's choice is not an object")
    return choice


def prediction(content: str, reasoning: str, extract: str = "number") -> str | None:
    """The answer: the last number (or, with extract "first-word", the first word) of content once
    any thinking is cut away, else of the reasoning (an unclosed <think> leaves all of it there),
    else None."""
    answer = content.rsplit("</think>", 1)[-1] if "</think>" in content else content.split("<think>", 1)[0]
    for text in (answer, content + "\n" + reasoning):
        if extract == "first-word":
            found = WORD.findall(text)[:1]
        else:
            found = NUMBER.findall(text)
        if found:
            return found[-1]
    return None


def image_file(data_file: str, name: Any) -> str:
    """The path of an item's image: inside the eval set's folder (images.inside)."""
    return inside(os.path.dirname(os.path.abspath(data_file)), name)


def question(item: Mapping[str, Any], args: argparse.Namespace) -> tuple[Any, dict[str, Any] | None]:
    """(what is asked, the image's record or None): the prompt, or the chat content that asks
    it about the item's image."""
    if item.get("image") is None:
        return item["prompt"], None
    if args.prompt_format == "text":
        raise ImageError("image %r: an image item needs --prompt-format chat" % (item["image"],))
    content, record = chat_content(image_file(args.data, item["image"]), item["prompt"], args.image_cap)
    return content, dict(record, path=item["image"])


def evaluate(item: Mapping[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    asked, image = question(item, args)
    message, finish = ask(args.url, asked, args)
    # llama-server names the split-off thinking reasoning_content; vLLM names it reasoning
    content = message.get("content") or ""
    reasoning = message.get("reasoning_content") or message.get("reasoning") or ""
    pred = prediction(content, reasoning if args.answer_from == "joined" else "", args.extract)
    row = {"id": item["id"], "prompt": item["prompt"], "gold": item["gold"], "pred": pred,
           "correct": pred == str(item["gold"]), "finish_reason": finish, "content": content,
           "reasoning_content": reasoning}
    if image is not None:
        row["image"] = image
    return row


def unreachable(e: BaseException) -> str | None:
    """Why the server cannot be reached at all (refused, reset, no such host), or None for an
    error of one answer (an HTTP error status, a timeout, a reply that is not what was asked)."""
    if isinstance(e, urllib.error.HTTPError):
        return None
    reason = e.reason if isinstance(e, urllib.error.URLError) else e
    if isinstance(reason, (ConnectionError, socket.gaierror)):
        return reason.strerror or str(reason)
    return None


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    n = len(rows)
    correct = sum(1 for r in rows if r["correct"])
    return {"n": n, "correct": correct, "accuracy": correct / n if n else None,
            "pred_none": sum(1 for r in rows if r["pred"] is None),
            "truncated": sum(1 for r in rows if r["finish_reason"] == "length"),
            "empty_content": sum(1 for r in rows if not r["content"].strip())}


def pixels(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("at least 1 px, not %d" % value)
    return value


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--max-tokens", type=int, default=2048)
    p.add_argument("--timeout", type=float, default=120)
    p.add_argument("--min-accuracy", type=float, default=0.0)
    p.add_argument("--prompt-format", choices=("chat", "text"), default="chat",
                   help="chat: each prompt as a chat message; text: as a text to continue (a base model)")
    p.add_argument("--extract", choices=("number", "first-word"), default="number",
                   help="what of the answer is compared with gold: its last number, or its first word")
    p.add_argument("--stop", action="append", default=[], metavar="TEXT",
                   help="where the server stops the answer (repeatable; a base model goes on otherwise)")
    p.add_argument("--push-to", metavar="TARGET", help="push the run's report (OUT) there once written (§8)")
    p.add_argument("--answer-from", choices=("joined", "content"), default="joined",
                   help="joined: content + reasoning_content (the fix); content: content alone, as a client "
                        "that ignores reasoning_content reads it")
    p.add_argument("--image-cap", type=pixels, default=IMAGE_CAP, metavar="PX",
                   help="an image's long side is resized to at most this before it is sent (default %(default)s)")
    args = p.parse_args()
    started = time.time()
    try:
        with open(args.data) as f:
            items = [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError) as e:
        marker("EVAL_RC=2", "cannot read the eval set %s: %s (fetch makes it)" % (args.data, e))
        sys.exit(2)
    os.makedirs(args.out, exist_ok=True)
    rows, errors, down = [], 0, None
    with open(os.path.join(args.out, "items.jsonl"), "w") as out:
        for i, item in enumerate(items, 1):
            try:
                row = evaluate(item, args)
            except (urllib.error.URLError, OSError, ValueError, KeyError, ImageError) as e:
                down = unreachable(e)
                if down is not None:  # every other item would fail the same way: say it once, stop
                    errors += len(items) - i + 1
                    say("cannot reach the server at %s: %s; stopped at item %d of %d (the rest not asked)"
                        % (args.url, down, i, len(items)))
                    break
                errors += 1
                say("item %s: %s" % (item.get("id"), e))
                continue
            rows.append(row)
            out.write(json.dumps(row) + "\n")
            if i % 10 == 0 or i == len(items):
                say("eval %d/%d, %d correct" % (i, len(items), sum(1 for r in rows if r["correct"])))
    summary = dict(summarize(rows), errors=errors, seconds=round(time.time() - started, 1),
                   answer_from=args.answer_from, max_tokens=args.max_tokens)
    if down is not None:
        summary["unreachable"] = args.url  # the reason is said once, above
    write_json(os.path.join(args.out, "summary.json"), summary)
    if down is None or rows:  # with no answer at all, the reason above and the marker below say it all
        say(json.dumps(summary))
    rc = 2 if errors else 1 if (summary["accuracy"] or 0) < args.min_accuracy else 0
    if args.push_to and rows:
        push_milestone(args.push_to, args.out, "eval-" + os.path.basename(os.path.normpath(args.out)))
    if down is not None:
        marker("EVAL_RC=%d" % rc, "server unreachable at %s: %d of %d items asked" % (args.url, len(rows), len(items)))
    else:
        marker("EVAL_RC=%d" % rc, "accuracy %s on %d items" % (summary["accuracy"], summary["n"]))
    sys.exit(rc)


if __name__ == "__main__":
    main()
