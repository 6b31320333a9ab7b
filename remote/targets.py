"""Target URLs → Transports.

A target URL is checked in full here, before any transport sees it: whatever the operator types
(or a config holds) either opens a transport or is refused with a TargetError that names the
URL and the reason, never another exception (a half-typed IPv6 literal, a port out of range).

A transport's module is imported only when a URL needs it: asyncssh and httpx take longer to
import than the rest of the console's start-up, and most runs need at most one of them."""

from __future__ import annotations

import ipaddress
import re
from typing import TYPE_CHECKING
from urllib.parse import SplitResult, urlsplit

from samai.remote.local import LocalTransport
from samai.remote.transport import Transport, TransportError

if TYPE_CHECKING:
    from samai.remote.ssh import SshOptions

KINDS = ("ssh", "envelope+http", "envelope+https")
EXPECTED = "expected local, ssh://[user@]host[:port] or envelope+http(s)://host[:port][/prefix]"
_HOST = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")  # a DNS name or an IPv4 address
_USER = re.compile(r"[A-Za-z0-9._][A-Za-z0-9._-]*")  # a POSIX user name
_PREFIX = re.compile(r"(?:/(?:[A-Za-z0-9._~!$&'()*+,;=:@-]|%[0-9A-Fa-f]{2})*)*")  # an http path
_BRACKETED = re.compile(r"(?:[^@]*@)?\[[^\]]*\](?::[0-9]*)?")  # userinfo@[IPv6]:port, nothing after
_PASSWORD = re.compile(r"(://[^/@]*?:)[^/@]*@")


class TargetError(Exception):
    """The target URL is malformed or names a transport this build cannot open."""


def scheme(url: str) -> str:
    """The transport a target URL names: local, ssh, envelope+http or envelope+https ("" if none)."""
    if url == "local":
        return "local"
    return url.split("://", 1)[0] if "://" in url else ""


def check_target(url: str) -> str:
    """The transport kind of a well-formed target URL; TargetError (saying why) for any other text."""
    if not isinstance(url, str):
        raise TargetError(f"target {url!r}: not text")
    if url == "local":
        return "local"
    try:
        return _check(url)
    except TargetError as e:
        raise TargetError(_PASSWORD.sub(r"\1***@", str(e))) from None  # a password is not repeated


def _check(url: str) -> str:
    if not (url.isascii() and url.isprintable()) or " " in url:
        raise TargetError(f"target {url!r}: spaces, control characters and non-ASCII text have no place in it")
    kind = scheme(url)
    if kind not in KINDS:
        raise TargetError(f"target {url!r}: {EXPECTED}")
    try:
        parts = urlsplit(url.removeprefix("envelope+"))
        port = parts.port
    except ValueError as e:  # an unclosed [ of an IPv6 literal, a port that is no number
        raise TargetError(f"target {url!r}: {e}") from None
    if "[" in parts.netloc and not _BRACKETED.fullmatch(parts.netloc):
        raise TargetError(f"target {url!r}: only a :port may follow an IPv6 literal's ]")
    _check_host(url, parts.hostname)
    if port == 0:
        raise TargetError(f"target {url!r}: port 0 cannot be connected to")
    if parts.query or parts.fragment or url.endswith(("?", "#")):
        raise TargetError(f"target {url!r}: a query or fragment means nothing here; {EXPECTED}")
    if kind == "ssh":
        _check_ssh(url, parts)
    else:
        _check_envelope(url, parts)
    return kind


def _check_host(url: str, host: str | None) -> None:
    if not host:
        raise TargetError(f"target {url!r}: no host; {EXPECTED}")
    if ":" in host:  # urlsplit gives an IPv6 literal without its brackets
        try:
            ipaddress.IPv6Address(host)
        except ValueError as e:
            raise TargetError(f"target {url!r}: {e}") from None
    elif not _HOST.fullmatch(host):
        raise TargetError(f"target {url!r}: {host!r} is not a host name or an IP address")


def _check_ssh(url: str, parts: SplitResult) -> None:
    if parts.path not in ("", "/"):
        raise TargetError(f"target {url!r}: an ssh target has no path; expected ssh://[user@]host[:port]")
    if parts.password is not None:
        raise TargetError(f"target {url!r}: no password in the URL: use a key or the ssh agent")
    if parts.username is not None and not _USER.fullmatch(parts.username):
        raise TargetError(f"target {url!r}: {parts.username!r} is not a user name")


def _check_envelope(url: str, parts: SplitResult) -> None:
    if "@" in parts.netloc:
        raise TargetError(f"target {url!r}: no user or password in a gateway URL: the token comes from "
                          "the environment")
    if not _PREFIX.fullmatch(parts.path):
        raise TargetError(f"target {url!r}: {parts.path!r} is not a URL path")


def open_transport(url: str, ssh: SshOptions | None = None, token_env: str | None = None) -> Transport:
    kind = check_target(url)
    if kind == "local":
        return LocalTransport()
    if kind == "ssh":
        from samai.remote.ssh import SshTarget, SshTransport  # asyncssh: only for an ssh target

        try:
            return SshTransport(SshTarget.parse(url), ssh)
        except TransportError as e:
            raise TargetError(str(e)) from e
    from samai.remote.envelope import DEFAULT_TOKEN_ENV, EnvelopeTransport  # httpx: only for a gateway

    try:
        return EnvelopeTransport(url, token_env=token_env or DEFAULT_TOKEN_ENV)
    except TransportError as e:
        raise TargetError(str(e)) from e
