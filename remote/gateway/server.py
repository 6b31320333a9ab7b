"""The gateway server: settings, fault plan and payload runner in one place, and ways to start it."""

from __future__ import annotations

import resource
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
from samai.remote.gateway.limits import ConnectionSlots, Limits, fit_to_open_files
from samai.remote.gateway.protocol import (
    DEFAULT_HARD_CUT_S,
    DEFAULT_MAX_BODY,
    DEFAULT_TOKEN_ENV,
    Settings,
    normalize_prefix,
)
from samai.remote.gateway.runner import PayloadRunner, child_environment

# A burst of new connections waits in the kernel's queue, where it costs no descriptor, rather than being dropped
# (the standard library listens with a queue of 5).
LISTEN_BACKLOG = 128


class EnvelopeServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = LISTEN_BACKLOG

    def __init__(self, settings: Settings, *, standing_fault: Fault | None = None,
                 log_stream: TextIO | None = None) -> None:
        if ":" in settings.host:
            self.address_family = socket.AF_INET6
        super().__init__((settings.host, settings.port), EnvelopeHandler)
        self.settings = settings
        self.faults = FaultPlan(standing_fault)
        self.runner = PayloadRunner(child_environment(settings.token, settings.token_env))
        self.slots = ConnectionSlots(settings.limits)
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

    # -- the connection limits (samai.remote.gateway.limits)

    def process_request(self, request, client_address) -> None:
        self.make_pending(request, client_address[0], wait_s=self.settings.limits.header_timeout_s)
        super().process_request(request, client_address)

    def make_pending(self, conn: socket.socket, client: str, *, wait_s: float) -> None:
        """CONN waits up to WAIT_S seconds for its request line and headers."""
        for cap in self.slots.admit(conn, client, wait_s=wait_s):
            self.log(f"- - - closed the oldest pending connection: a new one was over the cap of {cap}")

    def service_actions(self) -> None:
        overdue = self.slots.drop_overdue()
        if overdue:
            self.log(f"- - - closed {overdue} connection(s) whose request line and headers did not arrive in time")

    def shutdown_request(self, request) -> None:
        self.slots.release(request)
        super().shutdown_request(request)

    def release(self) -> None:
        """Wake waiting handlers, kill running payloads, close the listening socket."""
        self.stopping.set()
        self.runner.kill_all()
        self.server_close()


def build_server(token: str, *, host: str = "127.0.0.1", port: int = 0, prefix: str = "",
                 token_env: str = DEFAULT_TOKEN_ENV, hard_cut_s: float = DEFAULT_HARD_CUT_S,
                 max_body: int = DEFAULT_MAX_BODY, faults: bool = False, fault: str | None = None,
                 limits: Limits | None = None, log_stream: TextIO | None = None) -> EnvelopeServer:
    """A server, not yet serving. LIMITS shrink to fit the process's open-file limit (ValueError if they cannot)."""
    if not token:
        raise ValueError("an envelope server needs a token")
    if fault is not None and not faults:
        raise ValueError("a standing fault needs faults enabled")
    if fault is not None and fault not in FAULT_MODES:
        raise ValueError(f"unknown fault mode {fault!r}")
    fitted = fit_to_open_files(limits or Limits(), open_file_limit())
    settings = Settings(token, host, port, normalize_prefix(prefix), token_env, hard_cut_s, max_body, faults, fitted)
    return EnvelopeServer(settings, standing_fault=Fault(fault) if fault else None, log_stream=log_stream)


def open_file_limit() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return sys.maxsize if soft == resource.RLIM_INFINITY else soft


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
