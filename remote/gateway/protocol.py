"""What the protocol fixes: the defaults, a server's settings, and what an /execute query asks for."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from urllib.parse import parse_qs

from samai.remote.gateway.limits import Limits

DEFAULT_PORT = 8765
DEFAULT_TOKEN_ENV = "SAMAI_ENVELOPE_TOKEN"
DEFAULT_TIMEOUT_S = 60.0
DEFAULT_HARD_CUT_S = 180.0
DEFAULT_MAX_BODY = 4 * 1024 * 1024


@dataclass(frozen=True)
class Settings:
    token: str
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    prefix: str = ""
    token_env: str = DEFAULT_TOKEN_ENV
    hard_cut_s: float = DEFAULT_HARD_CUT_S
    max_body: int = DEFAULT_MAX_BODY
    faults: bool = False
    limits: Limits = field(default_factory=Limits)


def normalize_prefix(prefix: str) -> str:
    prefix = prefix.strip().rstrip("/")
    return prefix if not prefix or prefix.startswith("/") else "/" + prefix


def parse_content_length(text: str) -> int | None:
    """A Content-Length value as a number of bytes; None unless it is all ASCII digits (int() alone would also take
    a sign, spaces, underscores and other scripts' digits)."""
    if not (text.isascii() and text.isdigit()):
        return None
    try:
        return int(text)
    except ValueError:  # more digits than int() converts: no body is that long
        return None


@dataclass(frozen=True)
class ExecuteParams:
    timeout_s: float
    respenc: str | None


def parse_execute_query(query: str, hard_cut_s: float) -> ExecuteParams:
    """The query's timeout (capped by the hard cut) and respenc; ValueError says what is wrong."""
    params = parse_qs(query, keep_blank_values=True)
    respenc = params.get("respenc", [None])[-1]
    if respenc not in (None, "b64url"):
        raise ValueError("respenc must be b64url or absent")
    raw_timeout = params.get("timeout", [None])[-1]
    timeout_s = DEFAULT_TIMEOUT_S
    if raw_timeout is not None:
        try:
            timeout_s = float(raw_timeout)
        except ValueError:
            raise ValueError("timeout must be a number of seconds") from None
        if not math.isfinite(timeout_s) or timeout_s <= 0:
            raise ValueError("timeout must be a positive number of seconds")
    return ExecuteParams(min(timeout_s, hard_cut_s), respenc)
