"""The eval stage: ask an OpenAI-compatible server every question and count what came back.

The answer text is `content` + `reasoning_content`: llama.cpp moves an unclosed <think> into
reasoning_content and leaves content empty, which once scored a working model 0 % (§6). The
counts that expose such a fake zero (empty content, truncated answers, no prediction) are in
the summary next to the accuracy. max_tokens defaults to 2048: too few cut thinking short.

Writes OUT/items.jsonl (id, prompt, gold, pred, correct, finish_reason, content,
reasoning_content) and OUT/summary.json (n, correct, accuracy, pred_none, truncated,
empty_content), then prints EVAL_RC=N (0: done; 1: accuracy under --min-accuracy; 2: errors).

Runs ON the box:
  python3 -m samai_box.stages.eval --url http://127.0.0.1:18080 --data data/eval.jsonl --out runs/eval/NAME
"""

import argparse
import json
import os
import re
import socket
import sys
import time
import urllib.error
import urllib.request

from .common import marker, say, write_json

NUMBER = re.compile(r"-?\d+")


def chat(url, prompt, max_tokens, timeout):
    body = json.dumps({"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
                       "temperature": 0}).encode()
    req = urllib.request.Request(url.rstrip("/") + "/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        choice = json.loads(r.read())["choices"][0]
    return choice["message"], choice.get("finish_reason")


def prediction(content, reasoning):
    """The answer's number: the last one in content once any thinking is cut away, else the last
    one of the reasoning (an unclosed <think> leaves all of it there), else None."""
    answer = content.rsplit("</think>", 1)[-1] if "</think>" in content else content.split("<think>", 1)[0]
    for text in (answer, content + "\n" + reasoning):
        found = NUMBER.findall(text)
        if found:
            return found[-1]
    return None


def evaluate(item, args):
    message, finish = chat(args.url, item["prompt"], args.max_tokens, args.timeout)
    content, reasoning = message.get("content") or "", message.get("reasoning_content") or ""
    pred = prediction(content, reasoning)
    return {"id": item["id"], "prompt": item["prompt"], "gold": item["gold"], "pred": pred,
            "correct": pred == str(item["gold"]), "finish_reason": finish, "content": content,
            "reasoning_content": reasoning}


def unreachable(e):
    """Why the server cannot be reached at all (refused, reset, no such host), or None for an
    error of one answer (an HTTP error status, a timeout, a reply that is not what was asked)."""
    if isinstance(e, urllib.error.HTTPError):
        return None
    reason = e.reason if isinstance(e, urllib.error.URLError) else e
    if isinstance(reason, (ConnectionError, socket.gaierror)):
        return reason.strerror or str(reason)
    return None


def summarize(rows):
    n = len(rows)
    correct = sum(1 for r in rows if r["correct"])
    return {"n": n, "correct": correct, "accuracy": correct / n if n else None,
            "pred_none": sum(1 for r in rows if r["pred"] is None),
            "truncated": sum(1 for r in rows if r["finish_reason"] == "length"),
            "empty_content": sum(1 for r in rows if not r["content"].strip())}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--max-tokens", type=int, default=2048)
    p.add_argument("--timeout", type=float, default=120)
    p.add_argument("--min-accuracy", type=float, default=0.0)
    args = p.parse_args()
    started = time.time()
    with open(args.data) as f:
        items = [json.loads(line) for line in f if line.strip()]
    os.makedirs(args.out, exist_ok=True)
    rows, errors, down = [], 0, None
    with open(os.path.join(args.out, "items.jsonl"), "w") as out:
        for i, item in enumerate(items, 1):
            try:
                row = evaluate(item, args)
            except (urllib.error.URLError, OSError, ValueError, KeyError) as e:
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
    summary = dict(summarize(rows), errors=errors, seconds=round(time.time() - started, 1))
    if down is not None:
        summary["unreachable"] = args.url  # the reason is said once, above
    write_json(os.path.join(args.out, "summary.json"), summary)
    if down is None or rows:  # with no answer at all, the reason above and the marker below say it all
        say(json.dumps(summary))
    rc = 2 if errors else 1 if (summary["accuracy"] or 0) < args.min_accuracy else 0
    if down is not None:
        marker("EVAL_RC=%d" % rc, "server unreachable at %s: %d of %d items asked" % (args.url, len(rows), len(items)))
    else:
        marker("EVAL_RC=%d" % rc, "accuracy %s on %d items" % (summary["accuracy"], summary["n"]))
    sys.exit(rc)


if __name__ == "__main__":
    main()
