"""The gateway server: settings, fault plan and payload runner in one place, and ways to start it."""

from __future__ import annotations

import socket
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from http.server import ThreadingHTTPServer
from typing import TextIO

from samai.remote.gateway.faults import FAULT_MODES, Fault, FaultPlan
from samai.remote.gateway.handler import EnvelopeHandler
from samai.remote.gateway.protocol import (
    DEFAULT_HARD_CUT_S,
    DEFAULT_MAX_BODY,
    DEFAULT_TOKEN_ENV,
    Settings,
    normalize_prefix,
)
from samai.remote.gateway.runner import PayloadRunner, child_environment


class EnvelopeServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, settings: Settings, *, standing_fault: Fault | None = None,
                 log_stream: TextIO | None = None) -> None:
        if ":" in settings.host:
            self.address_family = socket.AF_INET6
        super().__init__((settings.host, settings.port), EnvelopeHandler)
        self.settings = settings
        self.faults = FaultPlan(standing_fault)
        self.runner = PayloadRunner(child_environment(settings.token, settings.token_env))
        self.stopping = threading.Event()
        self.log_stream = log_stream if log_stream is not None else sys.stderr
        self._log_lock = threading.Lock()

    @property
    def url(self) -> str:
        """http://HOST:PORT, without the prefix."""
        host, port = self.server_address[:2]
        host = host.decode() if isinstance(host, bytes) else str(host)  # a str for an inet socket
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    def log(self, line: str) -> None:
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")[:-4] + "Z"
        with self._log_lock:
            self.log_stream.write(f"{stamp} {line}\n")
            self.log_stream.flush()

    def release(self) -> None:
        """Wake waiting handlers, kill running payloads, close the listening socket."""
        self.stopping.set()
        self.runner.kill_all()
        self.server_close()


def build_server(token: str, *, host: str = "127.0.0.1", port: int = 0, prefix: str = "",
                 token_env: str = DEFAULT_TOKEN_ENV, hard_cut_s: float = DEFAULT_HARD_CUT_S,
                 max_body: int = DEFAULT_MAX_BODY, faults: bool = False, fault: str | None = None,
                 log_stream: TextIO | None = None) -> EnvelopeServer:
    if not token:
        raise ValueError("an envelope server needs a token")
    if fault is not None and not faults:
        raise ValueError("a standing fault needs faults enabled")
    if fault is not None and fault not in FAULT_MODES:
        raise ValueError(f"unknown fault mode {fault!r}")
    settings = Settings(token, host, port, normalize_prefix(prefix), token_env, hard_cut_s, max_body, faults)
    return EnvelopeServer(settings, standing_fault=Fault(fault) if fault else None, log_stream=log_stream)


@contextmanager
def serve(token: str, **options) -> Iterator[EnvelopeServer]:
    """An envelope server answering in a background thread for the duration of the block (options: build_server's).
    Port 0 (the default here) picks a free port: read it from server.url."""
    server = build_server(token, **options)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True,
                              name="envelope-server")
    thread.start()
    try:
        yield server
    finally:
        server.stopping.set()
        server.shutdown()
        thread.join()
        server.release()
