"""Real receivers on loopback for the watcher's notifications, each with its apprise URL: an HTTP
server for apprise's JSON webhook, an ntfy-compatible endpoint (what a self-hosted ntfy reads),
and a real SMTP server (aiosmtpd) that asks for a login over plain text. Each records what it
got and waits on a condition, never a fixed sleep."""

from __future__ import annotations

import email
import email.policy
import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

PASSWORD = "s3cret-Pa55w0rd-xyz"  # the receivers' password: no log, stdout, audit line or ps listing may hold it


@dataclass(frozen=True)
class Received:
    title: str
    body: str
    raw: Any  # the request's JSON, or the email message
    headers: dict[str, str] = field(default_factory=dict)


class Inbox:
    def __init__(self) -> None:
        self.got: list[Received] = []
        self._changed = threading.Condition()

    def add(self, item: Received) -> None:
        with self._changed:
            self.got.append(item)
            self._changed.notify_all()

    def wait_for(self, count: int, timeout: float = 30.0) -> list[Received]:
        with self._changed:
            if not self._changed.wait_for(lambda: len(self.got) >= count, timeout):
                raise AssertionError(f"{len(self.got)} of {count} messages after {timeout} s: "
                                     f"{[r.title for r in self.got]}")
            return list(self.got)

    def titles(self) -> list[str]:
        with self._changed:
            return [r.title for r in self.got]


class HttpReceiver(Inbox):
    """JSON webhook (apprise json://) or ntfy (apprise ntfy://, private mode: a JSON publish at /)."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.fail_next = 0  # answer 500 to this many requests
        self.failed = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if receiver.fail_next > 0:
                    receiver.fail_next -= 1
                    receiver.failed += 1
                    self.send_response(500)
                    self.end_headers()
                    return
                payload = json.loads(data)
                title = payload.get("title", "")
                body = payload.get("message", "")
                receiver.add(Received(title, body, payload, dict(self.headers.items())))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b'{"id":"x","event":"message"}' if receiver.kind == "ntfy" else b"{}")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        if self.kind == "ntfy":  # basic auth, as a protected self-hosted ntfy asks
            return f"ntfy://watch:{PASSWORD}@127.0.0.1:{self.port}/samai-alerts?mode=private"
        return f"json://127.0.0.1:{self.port}/hook"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)


class SmtpReceiver(Inbox):
    """aiosmtpd's Controller on loopback, taking a login over plain text (apprise mailto://, mode insecure)."""

    def __init__(self) -> None:
        from aiosmtpd.controller import Controller
        from aiosmtpd.smtp import AuthResult, LoginPassword

        super().__init__()
        receiver = self
        self.logins: list[tuple[bytes, bytes]] = []

        class Handler:
            async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802 (aiosmtpd's)
                msg = email.message_from_bytes(envelope.content, policy=email.policy.default)
                part = msg.get_body(("plain", "html"))
                body = part.get_content() if part is not None else ""
                receiver.add(Received(str(msg["subject"] or ""), body, msg,
                                      {"from": envelope.mail_from, "to": ",".join(envelope.rcpt_tos)}))
                return "250 OK"

        def authenticator(server: Any, session: Any, envelope: Any, mechanism: str, data: Any) -> Any:
            ok = isinstance(data, LoginPassword) and data.password == PASSWORD.encode()
            if isinstance(data, LoginPassword):
                self.logins.append((data.login, data.password))
            return AuthResult(success=ok)

        self.port = free_port()
        self.controller = Controller(Handler(), hostname="127.0.0.1", port=self.port, authenticator=authenticator,
                                     auth_required=True, auth_require_tls=False)
        self.controller.start()

    @property
    def url(self) -> str:
        return (f"mailto://watch:{PASSWORD}@127.0.0.1:{self.port}?smtp=127.0.0.1&mode=insecure"
                f"&from=watch@samai.example&to=ops@samai.example")

    def close(self) -> None:
        self.controller.stop()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def json_receiver() -> Iterator[HttpReceiver]:
    r = HttpReceiver("json")
    yield r
    r.close()


@pytest.fixture
def ntfy_receiver() -> Iterator[HttpReceiver]:
    r = HttpReceiver("ntfy")
    yield r
    r.close()


@pytest.fixture
def smtp_receiver() -> Iterator[SmtpReceiver]:
    r = SmtpReceiver()
    yield r
    r.close()
