"""Running one payload: a child interpreter in a session of its own, killed with its group at the deadline."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

# After the child exits, how long its pipes may stay open (a detached grandchild inherited them) before we stop
# reading.
DRAIN_GRACE_S = 0.5

# Separate globals and locals, as the real gateway has: they are what make its traps reproduce here.
RUNNER = r"""
import linecache, sys, traceback
source = sys.stdin.buffer.read()
# So tracebacks show the payload's lines.
linecache.cache["<payload>"] = (len(source), None, source.decode("utf-8", "replace").splitlines(True), "<payload>")
try:
    exec(compile(source, "<payload>", "exec"), {"__name__": "__payload__", "__builtins__": __builtins__}, {})
except Exception as exc:
    # tb_next: leave out the runner's own frame.
    traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next)
    sys.exit(1)
"""


@dataclass(frozen=True)
class Outcome:
    rc: int | None  # None: killed at the deadline
    stdout: bytes
    stderr: bytes
    elapsed_s: float

    @property
    def timed_out(self) -> bool:
        return self.rc is None


def child_environment(token: str, token_env: str) -> dict[str, str]:
    """The server's environment minus anything that would hand the token to the payload."""
    return {name: value for name, value in os.environ.items() if name != token_env and value != token}


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def has_exited(proc: subprocess.Popen) -> bool:
    """Whether the child exited, WITHOUT reaping it: while it is a zombie its pid (= its group id) can't be reused,
    so killing its group afterwards cannot hit a stranger."""
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def feed_source(proc: subprocess.Popen, source: bytes) -> None:
    assert proc.stdin is not None  # started with stdin=PIPE
    try:
        proc.stdin.write(source)
        proc.stdin.close()
    except BrokenPipeError:
        pass  # the child died before reading; its rc and stderr say why


def collect_output(proc: subprocess.Popen, deadline: float) -> tuple[bytes, bytes] | None:
    """Read the child's stdout and stderr until it exits; None if the deadline came first."""
    assert proc.stdout is not None and proc.stderr is not None  # started with both piped
    out, err = bytearray(), bytearray()
    buffers = {proc.stdout.fileno(): out, proc.stderr.fileno(): err}
    exited_at = None
    with selectors.DefaultSelector() as selector:
        for fd in buffers:
            selector.register(fd, selectors.EVENT_READ)
        while True:
            now = time.monotonic()
            if now >= deadline:
                return None
            if exited_at is None and has_exited(proc):
                exited_at = now
            if exited_at is not None and (not selector.get_map() or now - exited_at >= DRAIN_GRACE_S):
                break
            for key, _ in selector.select(min(0.05, deadline - now)):
                chunk = os.read(key.fd, 65536)
                if chunk:
                    buffers[key.fd] += chunk
                else:
                    selector.unregister(key.fd)
    return bytes(out), bytes(err)


class PayloadRunner:
    """Runs payloads in child processes and remembers the live ones, so a stopping server can kill them."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self._live: set[subprocess.Popen] = set()
        self._lock = threading.Lock()

    def run(self, source: bytes, timeout_s: float) -> Outcome:
        started = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-c", RUNNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True, env=self.env)
        with self._lock:
            self._live.add(proc)
        try:
            feed_source(proc, source)
            output = collect_output(proc, started + timeout_s)
        finally:
            kill_group(proc.pid)  # the timed-out child, or what an exited one left behind in its group
            proc.wait()
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
            with self._lock:
                self._live.discard(proc)
        elapsed = time.monotonic() - started
        if output is None:
            return Outcome(None, b"", b"", elapsed)
        return Outcome(proc.returncode, output[0], output[1], elapsed)

    def kill_all(self) -> None:
        with self._lock:
            for proc in self._live:
                kill_group(proc.pid)
