"""The replies the gateway sends, and their bytes on the wire."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from http import HTTPStatus

from samai.remote.gateway.runner import Outcome


@dataclass
class Reply:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = ()
    close: bool = False  # close the connection after sending


def json_reply(status: int, document: dict, *, headers: tuple[tuple[str, str], ...] = (), close=False) -> Reply:
    return Reply(status, json.dumps(document).encode(), headers=headers, close=close)


def encode_stream(data: bytes, respenc: str | None) -> str:
    if respenc == "b64url":
        return base64.urlsafe_b64encode(data).decode("ascii")
    return data.decode("utf-8", "replace")


def outcome_reply(outcome: Outcome, respenc: str | None, timeout_s: float) -> Reply:
    if outcome.timed_out:
        return json_reply(504, {"error": "timeout", "after_s": timeout_s})
    return json_reply(200, {"rc": outcome.rc, "stdout": encode_stream(outcome.stdout, respenc),
                            "stderr": encode_stream(outcome.stderr, respenc),
                            "elapsed_s": round(outcome.elapsed_s, 3)})


def render_head(reply: Reply) -> bytes:
    phrase = HTTPStatus(reply.status).phrase
    lines = [f"HTTP/1.1 {reply.status} {phrase}", f"Content-Type: {reply.content_type}",
             f"Content-Length: {len(reply.body)}"]
    lines += [f"{name}: {value}" for name, value in reply.headers]
    if reply.close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
