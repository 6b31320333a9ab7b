"""What a watcher can believe of what the watchers keep on the box: a key kept on the machine the
watcher runs on (never on the box) seals the ledger a leader leaves and signs each heartbeat.

Any process on the box can write WORKSPACE/.samai/watch/. What it cannot do is seal a ledger or
sign a beat with a key it never saw: a watcher believes a ledger's "sent" (what not to send
again, what to resolve, the hour's count) only when this key sealed it, and stands by quietly
only for a leader whose live beat this key signed. Watchers on several machines trust each other
when they hold the same key file (copy it; it is created on first use)."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

from samai.remote.model import WatcherBeat

KEY_FILE = "watch.key"  # in the console's state folder
HEX_KEY = re.compile(r"[0-9a-f]{64}")
SKEW_S = 60.0  # how far two watchers' clocks may disagree
MAX_SEALED = 200 * 1024  # characters of a sealed ledger's data (the box reads at most 256 KiB of the file)


class TrustError(ValueError):
    """The key file is there but is no key: said, never replaced (it may be one copied on purpose)."""


def key_path() -> Path:
    from samai.console.core.paths import state_dir

    return state_dir() / KEY_FILE


@dataclass(frozen=True)
class Opened:
    """A ledger as read from the box: its contents, and whether this watcher's key sealed them."""

    data: dict
    trusted: bool
    why: str  # why not trusted ("" when trusted)


@dataclass(frozen=True)
class Trust:
    key: bytes
    id: str  # names the key in what it seals (not secret: the first bytes of its hash)

    @classmethod
    def of(cls, key: bytes) -> Trust:
        return cls(key, hashlib.sha256(key).hexdigest()[:16])

    @classmethod
    def load(cls, path: Path | None = None) -> Trust:
        """This machine's key, made on first use (mode 0600)."""
        path = path or key_path()
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            except FileExistsError:  # another watcher made it meanwhile: read theirs
                pass
            else:
                with os.fdopen(fd, "w") as f:
                    f.write(secrets.token_hex(32) + "\n")
        try:
            text = path.read_text("ascii", errors="replace").strip()
        except OSError as e:
            raise TrustError(f"the watch key {path} cannot be read: {e.strerror}") from None
        if not HEX_KEY.fullmatch(text):
            raise TrustError(f"{path} is not a watch key (64 hex digits on one line): fix it or remove it "
                             f"(a new one is made)")
        return cls.of(bytes.fromhex(text))

    def _mac(self, *parts: object) -> str:
        return hmac.new(self.key, json.dumps(parts).encode(), hashlib.sha256).hexdigest()

    def seal(self, data: dict) -> dict:
        """The ledger as it is written on the box."""
        text = json.dumps(data, separators=(",", ":"))
        return {"sealed": 1, "key": self.id, "data": text, "mac": self._mac("ledger", text)}

    def open(self, raw: dict) -> Opened:
        """A ledger read from the box. Trusted only when this key sealed it; otherwise its contents
        as far as they parse (what may be used of them, the caller decides)."""
        data, key, mac = raw.get("data"), raw.get("key"), raw.get("mac")
        if raw.get("sealed") != 1 or not isinstance(data, str):
            return Opened(raw, False, "not sealed")
        contents = _object(data)
        if key != self.id:
            return Opened(contents, False, f"sealed with another key ({str(key)[:16]})")
        if not isinstance(mac, str) or not hmac.compare_digest(mac, self._mac("ledger", data)):
            return Opened(contents, False, "its seal does not match its contents")
        return Opened(contents, True, "")

    def sign_beat(self, watcher: str, at: float) -> dict[str, object]:
        """What a heartbeat carries to show that a watcher holding this key wrote it, at `at`."""
        return {"at": at, "key": self.id, "mac": self._mac("beat", watcher, at)}

    def signed(self, beat: WatcherBeat, now: float, within: float) -> bool:
        """Whether a watcher holding this key wrote this beat within `within` seconds of now
        (an old beat copied forward by someone else is not a live one)."""
        return (beat.key == self.id and beat.at is not None and abs(now - beat.at) <= within + SKEW_S
                and hmac.compare_digest(beat.mac, self._mac("beat", beat.id, beat.at)))


def contents(raw: dict) -> dict:
    """A ledger's contents, sealed or not, unverified (for a view of what the watchers sent)."""
    data = raw.get("data")
    return _object(data) if raw.get("sealed") == 1 and isinstance(data, str) else raw


def _object(text: str) -> dict:
    if len(text) > MAX_SEALED:
        return {}
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}
