"""Target URLs → Transports."""

from __future__ import annotations

from samai.remote.envelope import DEFAULT_TOKEN_ENV, EnvelopeTransport
from samai.remote.local import LocalTransport
from samai.remote.ssh import SshOptions, SshTarget, SshTransport
from samai.remote.transport import Transport, TransportError


class TargetError(Exception):
    """The target URL is malformed or names a transport this build cannot open."""


def open_transport(url: str, ssh: SshOptions | None = None, token_env: str = DEFAULT_TOKEN_ENV) -> Transport:
    if url == "local":
        return LocalTransport()
    scheme = url.split("://", 1)[0] if "://" in url else ""
    if scheme == "ssh":
        try:
            return SshTransport(SshTarget.parse(url), ssh)
        except TransportError as e:
            raise TargetError(str(e)) from e
    if scheme in ("envelope+http", "envelope+https"):
        try:
            return EnvelopeTransport(url, token_env=token_env)
        except TransportError as e:
            raise TargetError(str(e)) from e
    raise TargetError(f"target {url!r}: expected local, ssh://user@host[:port] or envelope+http(s)://host[:port]")
