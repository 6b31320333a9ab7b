"""The probe's cost per poll with two serving ports, one of them stopped (SIGSTOP), against the
same poll without them, interleaved in one run:

    python bench/serving_probe.py [--runs 30] [--llama-server BIN --model GGUF]

With --llama-server both ports are real llama-servers serving the model (the answering one with
--metrics, as the serve stage starts it); without, each is a real HTTP server, one serving a real
llama-server's recorded answers (tests/data/serving). Both go through the persistent probe as the
console polls it: the stopped server's request is waited on once, then only said; /props is
asked at the first read, as the console asks it. Each is timed against two polls without
serving, interleaved with it: the bare poll of an empty workspace (processes, listeners, writers)
and the console's own poll of the tiny pipeline mid-run (ConsoleState's request, probe_cost.py's
workspace). Target: at most x1.2 of the poll without, and no poll past the serving budget on top
of it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from harness import Timings, argument_parser, interleaved_async, print_figure, scratch_folder
from probe_cost import Console, make_workspace

from samai.remote.boxapi import SERVING_BUDGET_S, Box
from samai.remote.local import LocalTransport

RECORDED = Path(__file__).resolve().parent.parent / "tests" / "data" / "serving" / "llamacpp"


def recorded_site(folder: Path) -> None:
    """/health, /metrics, /slots and /props as the real llama-server answered them when busy."""
    for path, name in (("health", "health.json"), ("metrics", "metrics.txt"), ("slots", "slots.json"),
                       ("props", "props.json")):
        (folder / path).write_bytes((RECORDED / f"busy.{name}").read_bytes())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def until_listening(proc: subprocess.Popen, port: int, path: str = "/") -> None:
    """Until the server answers path with 200 (a llama-server answers /health 503 while loading)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"the server on port {port} did not come up (exit {proc.poll()})")


def http_server(folder: Path) -> tuple[subprocess.Popen, int]:
    """A real HTTP server in its own process (not this one's GIL) serving folder, once it listens."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                             "--directory", str(folder)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    until_listening(proc, port, "/health")
    return proc, port


def llama_server(binary: str, model: str, *flags: str) -> tuple[subprocess.Popen, int]:
    port = free_port()
    proc = subprocess.Popen([binary, "-m", model, "--port", str(port), "-c", "256", "-t", "1", *flags],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    until_listening(proc, port, "/health")
    return proc, port


def servers(folder: Path, binary: str | None, model: str | None) -> list[tuple[subprocess.Popen, int]]:
    """The answering server and the one to stop."""
    if binary and model:
        return [llama_server(binary, model, "--metrics"), llama_server(binary, model)]
    (folder / "site").mkdir()
    recorded_site(folder / "site")
    return [http_server(folder / "site"), http_server(folder / "site")]


async def console_poll(workspace: Path) -> dict:
    """The console's own poll request for the tiny pipeline in a workspace as it looks mid-run
    (probe_cost.py's): after the first polls, as ConsoleState asks it from then on."""
    make_workspace(workspace, venv_files=2000)
    console = Console(str(workspace))
    for _ in range(3):  # the logs' history read, the artifacts sized: what the console does once
        await console.poll()
    followers = console.state.followers()
    request = console.state.request(followers)
    console.state.apply(await console.box.snapshot(**request), followers, time.time())
    await console.box.close()
    request = console.state.request(console.state.followers())
    return {k: v for k, v in request.items() if k not in ("serving", "props", "canary")}


async def timed(box: Box, runs: int, request: dict, ports: list[int]) -> Timings:
    await box.snapshot(**request)
    first = await box.snapshot(**request, serving=ports)  # the stopped server's one wait, /props
    assert first.serving[0].get("/metrics").status == 200, first.serving

    async def without() -> None:
        await box.snapshot(**request)

    async def with_serving() -> None:  # /props told once, as the console asks it
        await box.snapshot(**request, serving=ports, props=())

    return await interleaved_async(runs, {"without": without, "serving": with_serving})


async def main(runs: int, binary: str | None, model: str | None) -> None:
    with scratch_folder("samai-bench-serving-") as folder:
        (folder / "ws").mkdir()
        (answering, answering_port), (stopped, stopped_port) = servers(folder, binary, model)
        os.kill(stopped.pid, signal.SIGSTOP)
        ports = [answering_port, stopped_port]
        try:
            polls = {"the bare poll (processes, listeners, writers; empty workspace)": {"writers": True},
                     "the console's poll (tiny pipeline, mid-run)": await console_poll(folder / "tiny")}
            figures = {}
            for label, request in polls.items():
                box = Box(LocalTransport(), str(folder / ("tiny" if "console" in label else "ws")),
                          python=sys.executable)
                try:
                    figures[label] = await timed(box, runs, request, ports)
                finally:
                    await box.close()
        finally:
            os.kill(stopped.pid, signal.SIGCONT)
            for proc in (answering, stopped):
                proc.kill()
                proc.wait()
    kind = "real llama-servers" if binary else "HTTP servers of recorded answers"
    print(f"probe poll, {runs} runs each, interleaved ({os.cpu_count()} CPUs); {kind}: port {ports[0]} "
          f"answering, {ports[1]} stopped")
    for label, times in figures.items():
        print(f"\n{label}")
        for name in ("without", "serving"):
            median, p95, slowest = (1000 * f for f in (times.median(name), times.percentile(name, 0.95),
                                                       max(times.seconds[name])))
            print(f"{name:<8} median {median:7.1f} ms   p95 {p95:7.1f} ms   max {slowest:7.1f} ms")
        over = max(times.seconds["serving"]) - times.median("without")
        print(f"the slowest poll with serving: {1000 * over:.0f} ms over the median without "
              f"(the serving budget is {1000 * SERVING_BUDGET_S:.0f} ms)")
        print_figure("serving / without", times.median("serving"), times.median("without"), at_most=1.2)


if __name__ == "__main__":
    parser = argument_parser(__doc__, runs=30)
    parser.add_argument("--llama-server", help="a llama-server binary: both ports are real servers")
    parser.add_argument("--model", help="the GGUF the llama-servers serve")
    args = parser.parse_args()
    if bool(args.llama_server) != bool(args.model):
        parser.error("--llama-server and --model go together")
    asyncio.run(main(args.runs, args.llama_server, args.model))
