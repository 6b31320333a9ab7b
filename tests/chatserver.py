"""A loopback server that answers OpenAI chat and text completions as llama-server does, with one
configurable message, and keeps every request's body: for tests of the eval stage's requests."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class ChatServer(ThreadingHTTPServer):
    def __init__(self, message: dict | None = None, finish_reason: str = "stop") -> None:
        super().__init__(("127.0.0.1", 0), ChatHandler)
        self.message = message or {"role": "assistant", "content": "red"}
        self.finish_reason = finish_reason
        self.bodies: list[dict] = []
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class ChatHandler(BaseHTTPRequestHandler):
    server: ChatServer

    def do_POST(self) -> None:  # noqa: N802 (the http.server name)
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        with self.server.lock:
            self.server.bodies.append(body)
        finish = self.server.finish_reason
        if self.path == "/v1/chat/completions":
            choice = {"index": 0, "finish_reason": finish, "message": self.server.message}
        elif self.path == "/v1/completions":  # --prompt-format text
            choice = {"index": 0, "finish_reason": finish, "text": self.server.message.get("content", "")}
        else:
            self.send_error(404)
            return
        reply = json.dumps({"choices": [choice]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args: object) -> None:
        pass  # keep the test output quiet


@contextmanager
def serving(**kw) -> Iterator[ChatServer]:
    server = ChatServer(**kw)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
