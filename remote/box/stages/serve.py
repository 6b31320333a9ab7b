"""The serve stage: the restart chain that the playbook learned the hard way (§6).

1. the port must be free: the console stops its listeners before it fires this stage (each by
   pid and start time, confirmed by the operator and written to the audit log); a port still
   held here is PORT_BUSY and nothing is touched: this stage never signals a process itself
2. the port is verified free
3. the server starts as this chain's child, in its process group (stopping the stage stops it):
   llama-server with --reasoning-format none; `python -m llama_cpp.server` (no reasoning split,
   no --reasoning-format) only without --llama-server, or with --python-server-fallback when the
   binary is missing, and then said as SERVE_FALLBACK
4. exactly one listener on the port, and it is ours
5. health: llama-server /health 200 {"status":"ok"} (503 while loading); llama_cpp.server /v1/models
6. smoke: one question whose answer CONTENT is checked (17*23= -> 391), not just "ok"; for an
   image-text model (--mmproj, playbook §10) asked about --smoke-image (the red square -> red)
Then HEALTH_OK / SMOKE_OK, and the stage runs as long as the server does; with --smoke-only
(a GGUF checked after surgery, on --port 0: a free one) it stops the server and ends there.

Runs ON the box, in the box venv:
  python -m samai_box.stages.serve --model gguf/tiny-q8_0.gguf --port 18080 [--llama-server PATH]
      [--python-server-fallback] [--reasoning-format FORMAT]
  python -m samai_box.stages.serve --engine vllm --model models/merged --port 18080  (vLLM installed)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any, Callable

from ..procs import list_pids
from ..sockets import listening_sockets, socket_owners
from .common import SMOKE_ANSWER, SMOKE_QUESTION, fail, marker, say
from .images import chat_content


def holders(port: int) -> list[int | None]:
    """pids listening on the TCP port (None for a socket whose owner this user cannot see)."""
    socks = dict((inode, s) for inode, s in listening_sockets([]).items() if s["port"] == port)
    owners = socket_owners(socks.keys(), list_pids())
    return sorted(set(owners.get(inode) for inode in socks), key=lambda p: p or 0)


def monitoring(llama_server: str | None) -> tuple[list[str], str]:
    """The flags that turn on the server's monitoring endpoints, as its own --help offers them
    (builds differ: /metrics is off by default; /slots is on by default in newer builds, behind
    --slots in older ones), and what was enabled, in words for the stage's log."""
    if not llama_server:
        return [], "none: llama_cpp.server has no /metrics or /slots"
    try:
        done = subprocess.run([llama_server, "--help"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=30)
        helped = done.stdout.decode("utf-8", "replace")
    except (OSError, subprocess.TimeoutExpired) as e:
        return [], "unknown: %s --help did not answer (%s); /metrics stays off" % (llama_server, type(e).__name__)
    options = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", helped))
    flags, said = [], []
    if "--metrics" in options:
        flags.append("--metrics")
        said.append("/metrics (--metrics)")
    else:
        said.append("no /metrics in this build's --help")
    slots_line = next((line for line in helped.splitlines() if re.search(r"(?<![\w-])--slots\b", line)), "")
    if "--slots" in options and "default: enabled" not in slots_line:
        flags.append("--slots")
        said.append("/slots (--slots)")
    elif "--slots" in options or "--slots-endpoint-disable" in options:
        said.append("/slots (on by default)")
    else:
        said.append("no /slots in this build's --help")
    return flags, ", ".join(said)


def server_command(args: argparse.Namespace, monitoring_flags: list[str] | None = None) -> list[str]:
    if args.engine == "vllm":  # its /metrics is always on; it has no /slots
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", args.model,
                "--host", args.host, "--port", str(args.port), "--max-model-len", str(args.ctx)]
    if args.llama_server:
        return ([args.llama_server, "-m", args.model, "--host", args.host, "--port", str(args.port),
                 "-c", str(args.ctx)] + list(monitoring_flags or [])
                + (["--reasoning-format", args.reasoning_format] if args.reasoning_format else [])
                + (["--mmproj", args.mmproj] if args.mmproj else [])
                + (["--image-max-tokens", str(args.image_max_tokens)] if args.image_max_tokens else []))
    return [sys.executable, "-m", "llama_cpp.server", "--model", args.model, "--host", args.host,
            "--port", str(args.port), "--n_ctx", str(args.ctx)]


def vllm_problem(args: argparse.Namespace) -> None:
    """vLLM serves from this environment or not at all: said, never guessed."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        fail("SERVE_REFUSED", "--engine vllm: vLLM is not installed in %s (pip install vllm in the box "
             "environment; it needs a GPU it supports)" % sys.executable, rc=2)
    if args.mmproj or args.smoke_image:
        fail("SERVE_REFUSED", "--engine vllm takes no --mmproj or --smoke-image here: serve the image-text "
             "model with llama-server", rc=2)
    args.llama_server = None


def projector_problem(args: argparse.Namespace) -> str | None:
    """Why an image-text model cannot be served as asked, or None."""
    if args.smoke_image and not args.mmproj:
        return "--smoke-image needs --mmproj: without its projector the model cannot see the image"
    for what, path in (("the projector", args.mmproj), ("the smoke image", args.smoke_image)):
        if path and not os.path.isfile(path):
            return "needs %s %s: missing (run convert first)" % (what, path)
    if args.mmproj and not args.llama_server:
        return "--mmproj needs llama-server (--llama-server): llama_cpp.server is not set up for this projector"
    return None


def free_port(host: str) -> int:
    """A port nothing listens on now (the server binds it a moment later)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def get(url: str, timeout: float = 5) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read()


def healthy(args: argparse.Namespace) -> bool:
    """llama-server answers /health (503 while loading); llama_cpp.server has only /v1/models."""
    base = "http://%s:%d" % (args.host, args.port)
    try:
        if args.engine == "vllm":
            return get(base + "/health")[0] == 200  # vLLM's /health: 200 and no body once it serves
        if args.llama_server:
            status, body = get(base + "/health")
            return status == 200 and json.loads(body).get("status") == "ok"
        status, body = get(base + "/v1/models")
        return status == 200 and bool(json.loads(body).get("data"))
    except (urllib.error.URLError, OSError, ValueError):
        return False


def ask(args: argparse.Namespace, question: str, max_tokens: int) -> str:
    """The answer's text. A chat model is asked in a chat; a base model (--prompt-format text)
    continues the text, as /v1/completions does."""
    if args.prompt_format == "text":
        return post(args, "/v1/completions", {"prompt": question, "max_tokens": max_tokens, "temperature": 0})["text"]
    content = chat_content(args.smoke_image, question)[0] if args.smoke_image else question
    message = post(args, "/v1/chat/completions", {"messages": [{"role": "user", "content": content}],
                                                  "max_tokens": max_tokens, "temperature": 0})["message"]
    # llama.cpp may put an unclosed <think> into reasoning_content and leave content empty
    return (message.get("content") or "") + "\n" + (message.get("reasoning_content") or message.get("reasoning") or "")


def post(args: argparse.Namespace, path: str, request: dict[str, Any]) -> Any:
    req = urllib.request.Request("http://%s:%d%s" % (args.host, args.port, path), data=json.dumps(request).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())["choices"][0]


def wait_for(predicate: Callable[[], object], seconds: float, proc: subprocess.Popen[bytes]) -> bool:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if proc.poll() is not None:
            return False
        if predicate():
            return True
        time.sleep(0.2)
    return False


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--ctx", type=int, default=256)
    p.add_argument("--engine", choices=("llama.cpp", "vllm"), default="llama.cpp",
                   help="vllm: serve the model (a Hugging Face folder or id) with vLLM's OpenAI server, "
                        "where vLLM is installed in this environment")
    p.add_argument("--llama-server", help="path of llama.cpp's llama-server (default: llama_cpp.server)")
    p.add_argument("--python-server-fallback", action="store_true",
                   help="serve with llama_cpp.server when --llama-server is missing (said as SERVE_FALLBACK)")
    p.add_argument("--reasoning-format", default="none",
                   help="llama-server's --reasoning-format ('' for the server's default, which splits <think> "
                        "into reasoning_content: the playbook's fake 0 %%)")
    p.add_argument("--mmproj", help="an image-text model's projector GGUF (llama-server --mmproj)")
    p.add_argument("--image-max-tokens", type=int, help="llama-server's cap on an image's tokens")
    p.add_argument("--smoke-image", help="ask the smoke question about this image (needs --mmproj)")
    p.add_argument("--server-log", default="logs/server.log")
    p.add_argument("--smoke-question", default=SMOKE_QUESTION)
    p.add_argument("--smoke-answer", default=SMOKE_ANSWER)
    p.add_argument("--smoke-max-tokens", type=int, default=2048, help="room for a thinking model to close </think>")
    p.add_argument("--prompt-format", choices=("chat", "text"), default="chat",
                   help="chat: the smoke question as a chat message; text: as a text to continue (a base model)")
    p.add_argument("--load-timeout", type=float, default=120)
    p.add_argument("--smoke-only", action="store_true", help="stop the server once the smoke answer is checked")
    args = p.parse_args()
    if args.port == 0:
        args.port = free_port(args.host)
    if args.engine == "vllm":
        vllm_problem(args)
    elif not os.path.isfile(args.model):
        fail("SERVE_REFUSED", "needs %s: missing (run quantize first)" % args.model, rc=2)
    why = projector_problem(args)
    if why:
        fail("SERVE_REFUSED", why, rc=2)
    if args.llama_server and not os.access(args.llama_server, os.X_OK):
        if not args.python_server_fallback or args.mmproj:
            fail("SERVE_REFUSED", "no llama-server at %s (run provision)" % args.llama_server, rc=2)
        marker("SERVE_FALLBACK", "no llama-server at %s: serving with llama_cpp.server, which has no reasoning "
               "split and no --reasoning-format" % args.llama_server)
        args.llama_server = None

    held = holders(args.port)
    if held:
        fail("PORT_BUSY", "port %d is held by pid %s; fire serve from the console, whose confirmed plan stops "
             "it by pid" % (args.port, ", ".join(str(h) for h in held)))
    say("port %d is free" % args.port)

    os.makedirs(os.path.dirname(os.path.abspath(args.server_log)), exist_ok=True)
    flags, enabled = monitoring(args.llama_server) if args.engine != "vllm" else ([], "/metrics (vLLM: always on)")
    marker("SERVE_MONITORING", enabled)
    cmd = server_command(args, flags)
    say("$ " + " ".join(cmd))
    with open(args.server_log, "ab") as log, open(os.devnull, "rb") as devnull:
        proc = subprocess.Popen(cmd, stdin=devnull, stdout=log, stderr=subprocess.STDOUT)
    if not wait_for(lambda: holders(args.port), args.load_timeout, proc):
        fail("SERVE_FAILED", "the server (pid %d) never listened on port %d; see %s"
             % (proc.pid, args.port, args.server_log))
    listening = holders(args.port)
    if listening != [proc.pid]:
        proc.terminate()
        fail("PORT_BUSY", "expected exactly one listener (pid %d) on port %d, found %s"
             % (proc.pid, args.port, listening))
    if not wait_for(lambda: healthy(args), args.load_timeout, proc):
        fail("SERVE_FAILED", "no healthy answer from pid %d within %.0f s" % (proc.pid, args.load_timeout))
    marker("HEALTH_OK", "pid %d port %d" % (proc.pid, args.port))
    answer = ask(args, args.smoke_question, max_tokens=args.smoke_max_tokens)
    if args.smoke_answer.lower() not in answer.lower():  # a real model may say "Red."
        proc.terminate()
        fail("SMOKE_FAIL", "%s expected %s, the server said %r" % (args.smoke_question, args.smoke_answer, answer))
    marker("SMOKE_OK", "%s -> %s" % (args.smoke_question, answer.strip()))
    if args.smoke_only:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        say("the server (pid %d) stopped: --smoke-only" % proc.pid)
        return
    rc = proc.wait()  # the stage lives as long as the server; stopping the stage stops it
    how = "killed by %s" % signal_name(-rc) if rc < 0 else "exited with rc %d" % rc
    fail("SERVER_DIED", "%s pid %d %s; its last words (%s): %s"
         % (engine_name(args, cmd), proc.pid, how, args.server_log,
            last_line(args.server_log) or "none"), rc=128 - rc if rc < 0 else rc or 1)


def engine_name(args: argparse.Namespace, cmd: list[str]) -> str:
    if args.engine == "vllm":
        return "vllm"
    return os.path.basename(cmd[0]) if args.llama_server else "llama_cpp.server"


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return "signal %d" % number


def last_line(path: str, look_back: int = 4096) -> str:
    """The last non-empty line of the server's log (it is this stage's own file), shortened."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - look_back))
            lines = [line for line in f.read().decode("utf-8", "replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return lines[-1].strip()[:200] if lines else ""


if __name__ == "__main__":
    main()
