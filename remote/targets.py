"""Target URLs → Transports.

A transport's module is imported only when a URL needs it: asyncssh and httpx take longer to
import than the rest of the console's start-up, and most runs need at most one of them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from samai.remote.local import LocalTransport
from samai.remote.transport import Transport, TransportError

if TYPE_CHECKING:
    from samai.remote.ssh import SshOptions


class TargetError(Exception):
    """The target URL is malformed or names a transport this build cannot open."""


def scheme(url: str) -> str:
    """The transport a target URL names: local, ssh, envelope+http or envelope+https ("" if none)."""
    if url == "local":
        return "local"
    return url.split("://", 1)[0] if "://" in url else ""


def open_transport(url: str, ssh: SshOptions | None = None, token_env: str | None = None) -> Transport:
    kind = scheme(url)
    if kind == "local":
        return LocalTransport()
    if kind == "ssh":
        from samai.remote.ssh import SshTarget, SshTransport  # asyncssh: only for an ssh target

        try:
            return SshTransport(SshTarget.parse(url), ssh)
        except TransportError as e:
            raise TargetError(str(e)) from e
    if kind in ("envelope+http", "envelope+https"):
        from samai.remote.envelope import DEFAULT_TOKEN_ENV, EnvelopeTransport  # httpx: only for a gateway

        try:
            return EnvelopeTransport(url, token_env=token_env or DEFAULT_TOKEN_ENV)
        except TransportError as e:
            raise TargetError(str(e)) from e
    raise TargetError(f"target {url!r}: expected local, ssh://user@host[:port] or envelope+http(s)://host[:port]")
