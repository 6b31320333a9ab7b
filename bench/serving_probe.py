"""The probe's cost per poll with two serving ports, one of them stopped (SIGSTOP), against the
same poll without them, interleaved in one run:

    python bench/serving_probe.py [--runs 30]

The answering port serves a real llama-server's recorded answers (tests/data/serving); the other
is a real HTTP server stopped with SIGSTOP. Both go through the persistent probe as the console
polls it: the stopped server's request is waited on once, then only said. Target: at most
x1.2 of the poll without, and no poll past the serving budget on top of it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from harness import argument_parser, interleaved_async, print_figure, scratch_folder

from samai.remote.boxapi import SERVING_BUDGET_S, Box
from samai.remote.local import LocalTransport

RECORDED = Path(__file__).resolve().parent.parent / "tests" / "data" / "serving" / "llamacpp"


def recorded_site(folder: Path) -> None:
    """/health, /metrics, /slots and /props as the real llama-server answered them when busy."""
    for path, name in (("health", "health.json"), ("metrics", "metrics.txt"), ("slots", "slots.json"),
                       ("props", "props.json")):
        (folder / path).write_bytes((RECORDED / f"busy.{name}").read_bytes())


def http_server(folder: Path) -> tuple[subprocess.Popen, int]:
    """A real HTTP server in its own process (not this one's GIL) serving folder, once it listens."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                             "--directory", str(folder)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while True:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc, port
        time.sleep(0.05)


async def main(runs: int) -> None:
    with scratch_folder("samai-bench-serving-") as folder:
        (folder / "site").mkdir()
        (folder / "ws").mkdir()
        recorded_site(folder / "site")
        answering, answering_port = http_server(folder / "site")
        stopped, stopped_port = http_server(folder / "site")
        os.kill(stopped.pid, signal.SIGSTOP)
        ports = [answering_port, stopped_port]
        box = Box(LocalTransport(), str(folder / "ws"), python=sys.executable)
        try:
            await box.snapshot(writers=True)
            first = await box.snapshot(writers=True, serving=ports)  # the stopped server's one wait
            assert first.serving[0].get("/metrics").status == 200, first.serving

            async def without() -> None:  # as the TUI polls: processes, listeners and writers
                await box.snapshot(writers=True)

            async def with_serving() -> None:
                await box.snapshot(writers=True, serving=ports)

            times = await interleaved_async(runs, {"without": without, "serving": with_serving})
        finally:
            await box.close()
            os.kill(stopped.pid, signal.SIGCONT)
            for proc in (answering, stopped):
                proc.kill()
                proc.wait()
    print(f"probe poll, {runs} runs each, interleaved ({os.cpu_count()} CPUs); ports {ports[0]} answering, "
          f"{ports[1]} stopped")
    for name in ("without", "serving"):
        median, p95, slowest = (1000 * f for f in (times.median(name), times.percentile(name, 0.95),
                                                   max(times.seconds[name])))
        print(f"{name:<8} median {median:7.1f} ms   p95 {p95:7.1f} ms   max {slowest:7.1f} ms")
    over = max(times.seconds["serving"]) - times.median("without")
    print(f"the slowest poll with serving: {1000 * over:.0f} ms over the median without "
          f"(the serving budget is {1000 * SERVING_BUDGET_S:.0f} ms)")
    print_figure("serving / without", times.median("serving"), times.median("without"), at_most=1.2)


if __name__ == "__main__":
    asyncio.run(main(argument_parser(__doc__, runs=30).parse_args().runs))
