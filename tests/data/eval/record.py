"""Record real chat-completion responses from llama-cpp-python's server (`python -m llama_cpp.server`,
what the pipeline's serve stage runs) as fixtures for `check eval`.

    python tests/data/eval/record.py --python VENV/bin/python --model MODEL.gguf [--chat-format gemma] --out DIR
    python tests/data/eval/record.py --llama-server PATH/llama-server --model THINKING.gguf \
        [--reasoning-format deepseek|none] [--data EVAL.jsonl --limit N] --out DIR

VENV is a venv with llama-cpp-python[server] (the provision stage builds one; so does
`pip install llama-cpp-python[server]`). With --llama-server, llama.cpp's own server is run instead,
by default with --reasoning-format deepseek: the split that moves an unclosed <think> into
reasoning_content. The questions are a few general ones, or the first N of an eval set
(prompt, gold: the tiny pipeline's data/eval.jsonl). Each is asked at temperature 0 once per
--max-tokens value: with room to answer (finish_reason "stop"), and with too few (finish_reason
"length").
Writes OUT/responses.jsonl (each response body as the server sent it, one per line, unchanged)
and OUT/requests.jsonl (what was asked, line for line: messages, max_tokens, and the gold answer).
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

QUESTIONS = [("What is 17*23? Answer with the number only.", "391"),
             ("What is 12+30? Answer with the number only.", "42"),
             ("What is 9*9? Answer with the number only.", "81"),
             ("What is 100-37? Answer with the number only.", "63"),
             ("What is the capital of France? Answer with one word.", "Paris"),
             ("What is 7*8? Answer with the number only.", "56")]
MAX_TOKENS = (48, 3)  # room to answer; too few (finish_reason "length")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, server: subprocess.Popen, deadline_s: float = 300) -> None:
    """/v1/models answers once the model is loaded (llama_cpp.server has no /health; llama-server has both)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            sys.exit(f"the server exited with rc {server.returncode}")
        try:
            with urllib.request.urlopen(url + "/v1/models", timeout=5):
                return
        except (urllib.error.URLError, OSError):
            time.sleep(0.5)
    sys.exit("the server did not answer in time")


def ask(url: str, request: dict) -> bytes:
    body = json.dumps(request).encode()
    req = urllib.request.Request(url + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as reply:
        return reply.read()


def questions_of(data: str | None, limit: int) -> list[tuple[str, str]]:
    if data is None:
        return QUESTIONS
    with open(data) as f:
        items = [json.loads(line) for line in f if line.strip()]
    return [(item["prompt"], str(item["gold"])) for item in items[:limit]]


def record(url: str, out: Path, questions: list[tuple[str, str]], max_tokens_each: list[int]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "responses.jsonl", "wb") as responses, open(out / "requests.jsonl", "w") as requests:
        for max_tokens in max_tokens_each:
            for question, gold in questions:
                request = {"messages": [{"role": "user", "content": question}], "max_tokens": max_tokens,
                           "temperature": 0, "seed": 7}
                body = ask(url, request)
                json.loads(body)  # a reply that is not JSON is not a fixture
                responses.write(body.replace(b"\n", b"") + b"\n")  # a compact body already is one line
                requests.write(json.dumps(dict(request, gold=gold)) + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--python", help="python of a venv with llama-cpp-python[server]")
    which.add_argument("--llama-server", help="llama.cpp's llama-server binary (records the reasoning split)")
    p.add_argument("--model", required=True, help="a chat GGUF model")
    p.add_argument("--chat-format", help="llama_cpp.server's --chat_format (default: the GGUF's template, "
                   "else llama-2); not with --llama-server")
    p.add_argument("--reasoning-format", default="deepseek", help="llama-server's --reasoning-format")
    p.add_argument("--data", help="an eval set (JSONL with prompt and gold) to take the questions from")
    p.add_argument("--limit", type=int, default=8, help="how many questions of --data")
    p.add_argument("--max-tokens", type=int, nargs="+", default=list(MAX_TOKENS))
    p.add_argument("--out", required=True, help="the folder to write the two files into")
    args = p.parse_args()
    port = free_port()
    model = Path(args.model).resolve()
    # run beside the model and name it by its file name: the replies quote it, and no local path belongs there
    if args.llama_server:
        argv = [str(Path(args.llama_server).resolve()), "-m", model.name, "--host", "127.0.0.1", "--port", str(port),
                "-c", "512", "--jinja", "--reasoning-format", args.reasoning_format]
    else:
        argv = [args.python, "-m", "llama_cpp.server", "--model", model.name, "--host", "127.0.0.1",
                "--port", str(port), "--n_ctx", "512"]
    if args.chat_format:
        argv += ["--chat_format", args.chat_format]
    server = subprocess.Popen(argv, cwd=model.parent, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(f"http://127.0.0.1:{port}", server)
        record(f"http://127.0.0.1:{port}", Path(args.out), questions_of(args.data, args.limit), args.max_tokens)
    finally:
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    main()
